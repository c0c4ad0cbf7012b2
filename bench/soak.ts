/**
 * The soak benchmark (`npm run bench:soak -- --minutes N [--rate R]`): sustained durable
 * consumes, each with a unique idempotency key (as AI and API products send a request id
 * with every call), against one Tally for N minutes, while a probe sends one `has` every
 * 20 ms and measures its latency.
 *
 * It answers what a 5-second bench cannot: does memory stay flat as keys accumulate, do
 * snapshots or garbage collection stall reads, does the error count stay at zero. Every
 * 15 s it records RSS, idempotency entries in memory, snapshots taken, the probe's
 * p99/p999/max and the load's progress; at the end wrk's own latency and errors. With
 * `--report docs/performance.md` the table and an SVG plot of RSS and probe latency over
 * time go into the document's soak section (between its `soak:` markers).
 *
 * Load: wrk (one thread, `--connections`, default 128) with a Lua script that cycles over
 * 10,000 customers and numbers its keys; `--rate R` spaces each connection's requests so
 * the total approaches R per second (wrk's `delay`), otherwise it runs flat out.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { stopAll } from './children.js';
import { LatencyHistogram } from './latency-histogram.js';
import { plotSoak, type SoakWindow } from './soak-plot.js';
import { makeDataDir, removeDataDir, startTally, type TallyServer } from './tally-server.js';
import { wrkAvailable } from './wrk.js';

const MAIN_SCRIPT = join(dirname(fileURLToPath(import.meta.url)), '..', 'src', 'main.js');
const PROBE_INTERVAL_MS = 20;
const WINDOW_MS = 15_000;
const CUSTOMERS = 10_000;

interface SoakOptions {
  readonly minutes: number;
  readonly rate: number | null;
  readonly connections: number;
  readonly workers: number | undefined;
  readonly reportPath: string | undefined;
}

export interface SoakResult {
  readonly startedAt: string;
  readonly node: string;
  readonly options: SoakOptions;
  readonly windows: readonly SoakWindow[];
  readonly load: {
    readonly requests: number;
    readonly errors: number;
    readonly non2xx: number;
    readonly msP99: number;
    readonly perSec: number;
  };
}

function parse(argv: readonly string[]): SoakOptions {
  const { values } = parseArgs({
    args: [...argv],
    strict: true,
    options: {
      minutes: { type: 'string' },
      rate: { type: 'string' },
      connections: { type: 'string' },
      workers: { type: 'string' },
      report: { type: 'string' },
    },
  });
  const positive = (name: string, raw: string | undefined, fallback: number): number => {
    const value = raw === undefined ? fallback : Number(raw);
    if (!Number.isFinite(value) || value <= 0)
      throw new Error(`--${name} must be a positive number, got ${JSON.stringify(raw)}`);
    return value;
  };
  return {
    minutes: positive('minutes', values.minutes, 30),
    rate: values.rate === undefined ? null : positive('rate', values.rate, 1),
    connections: Math.round(positive('connections', values.connections, 128)),
    workers:
      values.workers === undefined ? undefined : Math.round(positive('workers', values.workers, 1)),
    reportPath: values.report,
  };
}

/**
 * wrk's Lua: unique keys, customers in turn, optional spacing; prints a JSON summary at the end.
 */
function loadScript(key: string, delayMs: number): string {
  return (
    `local run = "${Date.now().toString(36)}"
local i = 0
local headers = { ["x-tally-key"] = "${key}", ["content-type"] = "application/json" }
request = function()
  i = i + 1
  local body = '{"customerId":"soak-' .. (i % ${CUSTOMERS}) .. ` +
    `'","amount":1,"idempotencyKey":"' .. run .. '-' .. i .. '"}'
  return wrk.format("POST", "/v1/usage/api_calls/consume", headers, body)
end
${delayMs > 0 ? `delay = function() return ${delayMs} end` : ''}
done = function(summary, latency, requests)
  io.write("WRK_JSON{\\"requests\\":" .. summary.requests .. ",\\"durationUs\\":" .. ` +
    `summary.duration ..
    ",\\"status\\":" .. summary.errors.status .. ",\\"errors\\":" .. ` +
    `(summary.errors.connect + summary.errors.read + summary.errors.write + ` +
    `summary.errors.timeout) ..
    ",\\"p99Us\\":" .. latency:percentile(99) .. "}\\n")
end
`
  );
}

async function runLoad(server: TallyServer, options: SoakOptions): Promise<SoakResult['load']> {
  const dir = await mkdtemp(join(tmpdir(), 'tally-soak-'));
  try {
    const delayMs =
      options.rate === null
        ? 0
        : Math.max(1, Math.round((1000 * options.connections) / options.rate));
    const file = join(dir, 'soak.lua');
    await writeFile(file, loadScript(server.keys.server, delayMs));
    const args = [
      '-t1',
      `-c${options.connections}`,
      `-d${Math.round(options.minutes * 60)}s`,
      '--timeout',
      '10s',
      '-s',
      file,
      server.baseUrl,
    ];
    const stdout = await new Promise<string>((resolve, reject) =>
      execFile('wrk', args, { maxBuffer: 16 * 1024 * 1024 }, (error, out, err) =>
        error ? reject(new Error(`wrk failed: ${err || error.message}`)) : resolve(out),
      ),
    );
    const line = stdout.split('\n').find((l) => l.startsWith('WRK_JSON'));
    if (line === undefined) throw new Error(`wrk printed no summary:\n${stdout}`);
    const s = JSON.parse(line.slice('WRK_JSON'.length)) as {
      requests: number;
      durationUs: number;
      status: number;
      errors: number;
      p99Us: number;
    };
    return {
      requests: s.requests,
      errors: s.errors,
      non2xx: s.status,
      msP99: s.p99Us / 1000,
      perSec: s.requests / (s.durationUs / 1e6),
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Sum of a Prometheus gauge's samples in the metrics text. */
function gaugeSum(text: string, name: string): number {
  let sum = 0;
  for (const line of text.split('\n'))
    if (line.startsWith(`${name}{`) || line.startsWith(`${name} `))
      sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  return sum;
}

async function scrape(server: TallyServer, adminKey: string): Promise<string> {
  const response = await fetch(`${server.baseUrl}/v1/admin/metrics`, {
    headers: { 'x-tally-key': adminKey },
  });
  return response.text();
}

async function rssMiB(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  return Number(/^VmRSS:\s+(\d+) kB$/m.exec(status)?.[1] ?? 0) / 1024;
}

/** Probes `has` every 20 ms until `stop`; the caller reads and resets `window` every 15 s. */
function startProbe(server: TallyServer): {
  window: () => { histogram: LatencyHistogram; failures: number };
  stop: () => Promise<void>;
} {
  let histogram = new LatencyHistogram();
  let failures = 0;
  let running = true;
  const loop = (async () => {
    for (let n = 0; running; n++) {
      const started = performance.now();
      try {
        const response = await fetch(
          `${server.baseUrl}/v1/entitlements/sso/has?customerId=probe-${n % 100}`,
          { headers: { 'x-tally-key': server.keys.client } },
        );
        await response.arrayBuffer();
        if (response.ok) histogram.record(performance.now() - started);
        else failures++;
      } catch {
        failures++;
      }
      await new Promise((resolve) =>
        setTimeout(resolve, Math.max(0, PROBE_INTERVAL_MS - (performance.now() - started))),
      );
    }
  })();
  return {
    window: () => {
      const taken = { histogram, failures };
      histogram = new LatencyHistogram();
      failures = 0;
      return taken;
    },
    stop: async () => {
      running = false;
      await loop;
    },
  };
}

async function soak(options: SoakOptions, dataDir: string): Promise<SoakResult> {
  const server = await startTally(MAIN_SCRIPT, 'tally', dataDir, {
    TALLY_RATE_LIMIT_SERVER: '0',
    TALLY_RATE_LIMIT_CLIENT: '0',
    ...(options.workers === undefined ? {} : { TALLY_WORKERS: String(options.workers) }),
  });
  const adminKey = (
    JSON.parse(await readFile(join(dataDir, 'bootstrap-keys.json'), 'utf8')) as { admin: string }
  ).admin;
  const pid = server.child.process.pid ?? 0;
  const probe = startProbe(server);
  const started = Date.now();
  const windows: SoakWindow[] = [];
  let lastAge: number | null = null;
  const timer = setInterval(() => {
    void (async () => {
      const metrics = await scrape(server, adminKey);
      const age = gaugeSum(metrics, 'tally_shard_snapshot_age_seconds');
      const { histogram, failures } = probe.window();
      windows.push({
        atSec: Math.round((Date.now() - started) / 1000),
        rssMiB: await rssMiB(pid),
        idempotencyEntries: gaugeSum(metrics, 'tally_shard_idempotency_entries'),
        // The age of the newest snapshot fell: one was taken in this window.
        snapshots: lastAge !== null && age < lastAge ? 1 : 0,
        probeMsP99: histogram.quantileMs(0.99),
        probeMsP999: histogram.quantileMs(0.999),
        probeMsMax: histogram.max,
        probeFailures: failures,
      });
      lastAge = age;
      const w = windows.at(-1);
      if (w !== undefined)
        process.stderr.write(
          `soak ${w.atSec}s: RSS ${w.rssMiB.toFixed(0)} MiB, ` +
            `keys ${w.idempotencyEntries}, probe p99 ${w.probeMsP99.toFixed(2)} ms ` +
            `max ${w.probeMsMax.toFixed(1)} ms\n`,
        );
    })();
  }, WINDOW_MS);
  try {
    const load = await runLoad(server, options);
    return {
      startedAt: new Date(started).toISOString(),
      node: process.version,
      options,
      windows,
      load,
    };
  } finally {
    clearInterval(timer);
    await probe.stop();
  }
}

/** The soak table and plot, between the document's soak markers (added at its end when missing). */
async function writeReport(path: string, result: SoakResult, svgPath: string): Promise<void> {
  const begin =
    '<!-- soak:begin: written by `npm run bench:soak -- --report docs/performance.md`; ' +
    'edit outside the markers -->';
  const end = '<!-- soak:end -->';
  const o = result.options;
  const last = result.windows.at(-1);
  const block = [
    begin,
    '## Soak',
    '',
    `${result.startedAt.slice(0, 10)}, Node ${result.node}: ${o.minutes} min of durable ` +
      `consumes with a unique idempotency key each, ` +
      `wrk ${o.connections} ` +
      `connections${o.rate === null ? ' flat out' : ` at about ${o.rate}/s`}, a \`has\` ` +
      `probe every ${PROBE_INTERVAL_MS} ms. ` +
      `Load: ${result.load.perSec.toFixed(0)} consumes/s, ` +
      `p99 ${result.load.msP99.toFixed(1)} ms, ${result.load.errors} socket ` +
      `errors, ${result.load.non2xx} non-2xx.`,
    '',
    `![RSS and probe latency over the soak](${svgPath.split('/').pop() ?? svgPath})`,
    '',
    '| at | RSS MiB | idempotency keys in memory | snapshots | probe p99 ms | p999 ms | ' +
      'max ms | probe failures |',
    '|---|---|---|---|---|---|---|---|',
    ...result.windows.map(
      (w) =>
        `| ${w.atSec} s | ${w.rssMiB.toFixed(0)} | ${w.idempotencyEntries} ` +
        `| ${w.snapshots} | ${w.probeMsP99.toFixed(2)} | ${w.probeMsP999.toFixed(2)} ` +
        `| ${w.probeMsMax.toFixed(1)} | ${w.probeFailures} |`,
    ),
    '',
    last === undefined
      ? ''
      : `At the end: RSS ${last.rssMiB.toFixed(0)} MiB with ${last.idempotencyEntries} keys ` +
        `held in memory.`,
    end,
  ].join('\n');
  const existing = await readFile(path, 'utf8').catch(() => '# Performance\n');
  const from = existing.indexOf('<!-- soak:begin');
  const to = existing.indexOf(end);
  const next =
    from !== -1 && to > from
      ? existing.slice(0, from) + block + existing.slice(to + end.length)
      : `${existing.trimEnd()}\n\n${block}\n`;
  await writeFile(path, next);
  await writeFile(svgPath, plotSoak(result.windows));
}

async function main(): Promise<void> {
  const options = parse(process.argv.slice(2));
  if (!(await wrkAvailable()))
    throw new Error('wrk is not installed: `apt-get install wrk` (Debian, Ubuntu)');
  const dataDir = await makeDataDir();
  try {
    const result = await soak(options, dataDir);
    process.stdout.write(`${JSON.stringify(result.load)}\n`);
    if (options.reportPath !== undefined)
      await writeReport(options.reportPath, result, join(dirname(options.reportPath), 'soak.svg'));
  } finally {
    await stopAll();
    await removeDataDir(dataDir);
  }
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    process.stderr.write(
      `soak failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
    );
    process.exit(1);
  },
);
