/**
 * The benchmark's second load generator: one wrk run against one server, reduced to the
 * same `SegmentResult` autocannon segments give (`--driver wrk`).
 *
 * Why: autocannon parses every response in JavaScript on one of the machine's two cores,
 * so response *size* — e.g. the three `X-RateLimit-*` headers — costs the load generator
 * as much as the server, and its ceiling (~60–90k req/s here) sits well below the bare
 * server's. wrk (C, one thread here) drives the same bare server near 140k req/s, so with
 * it a ratio prices the server, not the client's parser. Both are reported.
 *
 * The pre-built requests become raw HTTP/1.1 request strings in a generated Lua script
 * that cycles through them (all connections share the cycle: wrk's `request()` does not
 * know its connection, so the per-connection disjoint slices of the autocannon path
 * become one interleaved sequence over the same 10,000 customers). wrk reports latency as
 * percentiles only; the histogram is rebuilt from 1,000 evenly spaced quantiles, which
 * preserves p50/p99 to the quantile grid.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type autocannon from 'autocannon';
import { trackChild } from './children.js';
import { LatencyHistogram } from './latency-histogram.js';
import type { LoadShape, SegmentResult } from './load.js';

const QUANTILES = 1000;

function rawRequest(request: autocannon.Request, host: string): string {
  const body = request.body === undefined ? '' : String(request.body);
  const headers = Object.entries((request.headers ?? {}) as Record<string, string>)
    .map(([name, value]) => `${name}: ${value}\r\n`)
    .join('');
  const length = body === '' ? '' : `content-length: ${Buffer.byteLength(body)}\r\n`;
  return (
    `${request.method ?? 'GET'} ${request.path ?? '/'} ` +
    `HTTP/1.1\r\nhost: ${host}\r\n${headers}${length}\r\n${body}`
  );
}

function luaString(text: string): string {
  const escaped = text
    .replace(/\\/g, '\\\\')
    .replace(/"/g, '\\"')
    .replace(/\r/g, '\\r')
    .replace(/\n/g, '\\n');
  return `"${escaped}"`;
}

function script(requests: readonly string[]): string {
  return (
    `local requests = {
${requests.map(luaString).join(',\n')}
}
local n = #requests
local i = 0
request = function()
  i = i % n + 1
  return requests[i]
end
done = function(summary, latency, requests)
  local q = {}
  for k = 1, ${QUANTILES} do q[k] = latency:percentile((k - 0.5) * 100 / ${QUANTILES}) end
  io.write("WRK_JSON{\\"requests\\":" .. summary.requests .. ",\\"durationUs\\":" .. ` +
    `summary.duration ..
    ",\\"status\\":" .. summary.errors.status .. ",\\"connect\\":" .. summary.errors.connect ..
    ",\\"read\\":" .. summary.errors.read .. ",\\"write\\":" .. summary.errors.write ..
    ",\\"timeout\\":" .. summary.errors.timeout .. ",\\"maxUs\\":" .. latency.max ..
    ",\\"quantilesUs\\":[" .. table.concat(q, ",") .. "]}\\n")
end
`
  );
}

interface WrkSummary {
  readonly requests: number;
  readonly durationUs: number;
  readonly status: number;
  readonly connect: number;
  readonly read: number;
  readonly write: number;
  readonly timeout: number;
  readonly maxUs: number;
  readonly quantilesUs: readonly number[];
}

/** The requests a second wrk printed (its `Requests/sec:` line), or NaN where it printed none. */
export function requestsPerSecOf(stdout: string): number {
  const match = /^Requests\/sec:\s+([\d.]+)/m.exec(stdout);
  return match === null ? Number.NaN : Number(match[1]);
}

/**
 * The summary a script's `done` printed on its `WRK_JSON` line, parsed; throws with all of
 * wrk's output when there is none.
 */
export function wrkSummaryOf(stdout: string): unknown {
  const line = stdout.split('\n').find((l) => l.startsWith('WRK_JSON'));
  if (line === undefined) throw new Error(`wrk printed no summary:\n${stdout}`);
  return JSON.parse(line.slice('WRK_JSON'.length));
}

/**
 * What wrk printed, run as `command` (wrk itself, or a wrapper such as `nice`) with `args`;
 * rejects with its stderr if it fails. The child is tracked, so a benchmark stopped by a
 * signal stops it too.
 */
export function wrkOutput(command: string, args: readonly string[]): Promise<string> {
  return new Promise<string>((resolve, reject) =>
    trackChild(
      execFile(command, args, { maxBuffer: 16 * 1024 * 1024 }, (error, out, err) =>
        error ? reject(new Error(`wrk failed: ${err || error.message}`)) : resolve(out),
      ),
    ),
  );
}

/** The machine check: wrk's plain GETs of a bare server, as `npm run bench` runs it. */
const MACHINE_CHECK_CONNECTIONS = 256;
const MACHINE_CHECK_SEC = 5;

/**
 * Runs the machine check against the bare server on `port`: the requests a second wrk (one
 * thread) gets with plain GETs, that is how fast this machine runs now (on a shared machine
 * it moves by tens of percent from day to day).
 */
export async function machineCheck(port: number): Promise<number> {
  const args = ['-t1', `-c${MACHINE_CHECK_CONNECTIONS}`, `-d${MACHINE_CHECK_SEC}s`];
  return requestsPerSecOf(await wrkOutput('wrk', [...args, `http://127.0.0.1:${port}/`]));
}

/** How the machine check ran and what it got, for a report. */
export function machineCheckText(reqPerSec: number): string {
  return (
    `a bare uWebSockets.js server answered ${reqPerSec.toFixed(0)} req/s (wrk, ` +
    `${MACHINE_CHECK_CONNECTIONS} connections, ${MACHINE_CHECK_SEC} s)`
  );
}

/** Whether wrk is installed (the driver is optional; CI does not need it). */
export function wrkAvailable(): Promise<boolean> {
  return new Promise((resolve) =>
    execFile('wrk', ['--version'], (error) =>
      resolve(error === null || (error as { code?: unknown }).code !== 'ENOENT'),
    ),
  );
}

/**
 * Runs wrk (one thread) against `baseUrl` for `shape.durationSec` with `shape.connections`
 * connections, cycling through every request of `slices`. Rejects if wrk fails or prints
 * no summary; non-2xx answers and socket errors are counted, not thrown.
 */
export async function runWrkSegment(
  baseUrl: string,
  slices: readonly autocannon.Request[][],
  shape: LoadShape,
): Promise<SegmentResult> {
  if (shape.pipelining !== 1)
    throw new Error('the wrk driver sends one request at a time per connection (pipelining 1)');
  const host = new URL(baseUrl).host;
  // Interleave the slices back into customer order, so consecutive requests hit different
  // connections' customers.
  const requests: string[] = [];
  for (let i = 0; requests.length < slices.reduce((n, s) => n + s.length, 0); i++) {
    for (const slice of slices) {
      const request = slice[i];
      if (request !== undefined) requests.push(rawRequest(request, host));
    }
  }
  const dir = await mkdtemp(join(tmpdir(), 'tally-wrk-'));
  try {
    const file = join(dir, 'requests.lua');
    await writeFile(file, script(requests));
    const durationSec = Math.max(1, Math.round(shape.durationSec));
    const args = [
      '-t1',
      `-c${shape.connections}`,
      `-d${durationSec}s`,
      '--timeout',
      '10s',
      '-s',
      file,
      baseUrl,
    ];
    const summary = wrkSummaryOf(await wrkOutput('wrk', args)) as WrkSummary;
    const latency = new LatencyHistogram();
    // Each quantile stands for an equal share of the 2xx answers.
    for (const us of summary.quantilesUs) latency.record(us / 1000);
    latency.record(summary.maxUs / 1000); // so the report's max is wrk's max
    const errors = summary.connect + summary.read + summary.write + summary.timeout;
    const non2xx = summary.status;
    return {
      durationSec: summary.durationUs / 1e6,
      ok2xx: summary.requests - non2xx,
      dropped: 0,
      non2xx,
      errors,
      timeouts: summary.timeout,
      statusCodes: non2xx > 0 ? { 'non-2xx': non2xx } : {},
      latency,
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
