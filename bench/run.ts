/**
 * Tally's HTTP benchmark (`npm run bench`; `--tiny` inside `npm test`).
 *
 * What it measures: requests per second and latency of Tally's hottest routes (`has`,
 * `balance`, durable `consume`) over loopback HTTP/1.1 keep-alive, as a ratio of a bare
 * uWebSockets.js server (bench/bare-server.ts) measured in the same run under the same
 * load shape. The two are alternated in segments (bare, tally, tally, bare, …) so both
 * see the same machine conditions, and each gets its own warm-up first. Requests are
 * pre-built and spread over 10,000 customers, one disjoint slice per connection.
 * `consume` is the durable path: each 2xx means the usage was journaled before the reply.
 *
 * Why no pipelining by default: uWS does not support HTTP pipelining behind an async
 * response (uNetworking/uWebSockets.js#277, "wontfix"): when a pipelined request arrives
 * while the previous response on that connection is still pending, it closes the
 * connection. Every Tally response is async (a shard round trip, a durable write), so a
 * pipelined run measures reconnects, and autocannon hides them (it reconnects silently
 * and counts no error); the `dropped` column exposes them. Browsers and HTTP client
 * libraries do not pipeline, so one request in flight per connection is also the
 * realistic shape. `--pipelining 10` still works for the bare server.
 *
 * What it does not measure: a real network (latency, bandwidth, loss), TLS, connection
 * churn, large bodies, a big or cold database, or a server with the machine to itself.
 * The load generator (autocannon, in this process, one thread) shares the cores with the
 * servers and is the bottleneck for the bare server (wrk drives the same bare server
 * several times faster), so the ratio is "Tally as a fraction of what this harness can
 * drive", and a ratio near 1 means "at least the harness's ceiling", not "as fast as uWS".
 *
 * The exit code is 0 unless something errored (a server would not start, a preflight
 * request failed, autocannon broke): targets are printed as PASS/FAIL markers only.
 * Both child servers are stopped on every exit path, including SIGINT and SIGTERM.
 */
import { createRequire } from 'node:module';
import { availableParallelism, cpus, loadavg } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type autocannon from 'autocannon';
import { startChild, stopAll, type Child } from './children.js';
import { runSegment, type LoadShape, type SegmentResult } from './load.js';
import { parseOptions, USAGE, type BenchOptions } from './options.js';
import { formatReport, scenarioResult, summarize, writeJson, type BenchReport, type ScenarioResult } from './report.js';
import { buildRequests, sliceForConnections, type BenchKeys, type Scenario } from './scenarios.js';
import { makeDataDir, removeDataDir, startTally, tallyBuilt, type TallyServer } from './tally-server.js';

const benchDir = dirname(fileURLToPath(import.meta.url));
const BARE_SCRIPT = join(benchDir, 'bare-server.js');
const TALLY_SCRIPT = join(benchDir, '..', 'src', 'main.js');
/** Sent to the bare server when Tally is not running; it ignores them. */
const PLACEHOLDER_KEYS: BenchKeys = { server: 'sk_test_bench', client: 'ck_test_bench' };

interface Target {
  readonly label: 'bare' | 'tally';
  readonly child: Child;
  readonly baseUrl: string;
}

function assertAlive(target: Target): void {
  const { exitCode, signalCode } = target.child.process;
  if (exitCode === null && signalCode === null) return;
  throw new Error(`${target.label} died during the run (code ${exitCode}, signal ${signalCode})\n--- output ---\n${target.child.outputTail()}`);
}

/** Sends the scenario's first request once with fetch and throws unless it answers 2xx. */
async function preflight(target: Target, request: autocannon.Request): Promise<void> {
  const init: RequestInit = { method: request.method ?? 'GET', headers: request.headers as Record<string, string> };
  if (request.body !== undefined) init.body = request.body;
  const response = await fetch(`${target.baseUrl}${request.path ?? '/'}`, init);
  const text = await response.text();
  if (!response.ok) throw new Error(`preflight ${init.method} ${request.path} on ${target.label} answered ${response.status}: ${text}`);
}

/** Warm-up for each target, then `rounds` alternating measured segments (ABBA order). */
async function measure(
  targets: readonly Target[],
  slices: autocannon.Request[][],
  shape: LoadShape,
  options: BenchOptions,
): Promise<Map<Target, SegmentResult[]>> {
  const segments = new Map<Target, SegmentResult[]>(targets.map((t) => [t, []]));
  for (const target of targets) {
    await runSegment(target.baseUrl, slices, { ...shape, durationSec: options.warmupSec });
    assertAlive(target);
  }
  const segmentSec = options.durationSec / options.rounds;
  for (let round = 0; round < options.rounds; round++) {
    const order = round % 2 === 0 ? targets : [...targets].reverse();
    for (const target of order) {
      segments.get(target)?.push(await runSegment(target.baseUrl, slices, { ...shape, durationSec: segmentSec }));
      assertAlive(target);
    }
  }
  return segments;
}

async function runScenario(scenario: Scenario, bare: Target, tally: Target | undefined, options: BenchOptions, keys: BenchKeys): Promise<ScenarioResult> {
  const connections = scenario.connections ?? options.connections;
  const pipelining = scenario.pipelining ?? options.pipelining;
  const requests = buildRequests(scenario, keys);
  const first = requests[0];
  if (first === undefined) throw new Error('no requests built');
  const targets = tally === undefined ? [bare] : [bare, tally];
  for (const target of targets) await preflight(target, first);
  process.stderr.write(`bench: ${scenario.name} (${connections} connections x pipelining ${pipelining}) ...\n`);
  const shape = { connections, pipelining, durationSec: options.durationSec };
  const segments = await measure(targets, sliceForConnections(requests, connections), shape, options);
  const tallySegments = tally === undefined ? undefined : segments.get(tally);
  return scenarioResult(scenario, { connections, pipelining }, summarize(segments.get(bare) ?? []), tallySegments === undefined ? null : summarize(tallySegments));
}

function autocannonVersion(): string {
  try {
    const pkg = createRequire(import.meta.url)('autocannon/package.json') as { version?: string };
    return `autocannon ${pkg.version ?? '?'}`;
  } catch {
    return 'autocannon (version unknown)';
  }
}

function reportShell(options: BenchOptions, tallyNote: string, tallyRan: boolean, scenarios: ScenarioResult[], loadAverage1mAtStart: number): BenchReport {
  return {
    startedAt: new Date().toISOString(),
    node: process.version,
    availableParallelism: availableParallelism(),
    loadAverage1mAtStart,
    loadAverage1m: loadavg()[0] ?? Number.NaN,
    cpuModel: cpus()[0]?.model ?? 'unknown cpu',
    platform: `${process.platform}-${process.arch}`,
    loadGenerator: autocannonVersion(),
    options: {
      durationSec: options.durationSec,
      warmupSec: options.warmupSec,
      rounds: options.rounds,
      connections: options.connections,
      pipelining: options.pipelining,
      workers: options.workers ?? null,
      tiny: options.tiny,
      full: options.full,
    },
    tally: { ran: tallyRan, note: tallyNote },
    scenarios,
  };
}

async function maybeStartTally(options: BenchOptions, dataDirs: string[]): Promise<TallyServer | undefined> {
  if (!tallyBuilt(TALLY_SCRIPT)) return undefined;
  const dataDir = await makeDataDir();
  dataDirs.push(dataDir);
  return startTally(TALLY_SCRIPT, dataDir, options.workers);
}

async function bench(options: BenchOptions, dataDirs: string[]): Promise<void> {
  const loadAverage1m = loadavg()[0] ?? Number.NaN;
  const bareChild = await startChild('bare', BARE_SCRIPT, { PORT: '0' });
  const bare: Target = { label: 'bare', child: bareChild, baseUrl: `http://127.0.0.1:${bareChild.port}` };
  const server = await maybeStartTally(options, dataDirs);
  const tally: Target | undefined = server && { label: 'tally', child: server.child, baseUrl: server.baseUrl };
  const tallyNote = server === undefined
    ? `NOT RUN: ${TALLY_SCRIPT} does not exist (run npm run build once the server exists); bare only`
    : `TALLY_WORKERS=${options.workers ?? '(default)'}, fresh data dir`;
  if (server === undefined) process.stderr.write(`bench: tally ${tallyNote}\n`);
  const results: ScenarioResult[] = [];
  for (const scenario of options.scenarios) {
    results.push(await runScenario(scenario, bare, tally, options, server?.keys ?? PLACEHOLDER_KEYS));
  }
  const report = reportShell(options, tallyNote, server !== undefined, results, loadAverage1m);
  process.stdout.write(`${formatReport(report)}\n`);
  if (options.jsonPath !== undefined) await writeJson(options.jsonPath, report);
}

async function cleanup(dataDirs: readonly string[]): Promise<void> {
  await stopAll();
  await Promise.all(dataDirs.map(removeDataDir));
}

async function main(): Promise<void> {
  let parsed: BenchOptions | 'help';
  try {
    parsed = parseOptions(process.argv.slice(2));
  } catch (error) {
    throw new Error(`${error instanceof Error ? error.message : String(error)}\n${USAGE}`);
  }
  if (parsed === 'help') {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  const dataDirs: string[] = [];
  const onSignal = (signal: NodeJS.Signals, code: number) => {
    process.stderr.write(`bench: ${signal}, stopping servers\n`);
    void cleanup(dataDirs).finally(() => process.exit(code));
  };
  process.once('SIGINT', () => onSignal('SIGINT', 130));
  process.once('SIGTERM', () => onSignal('SIGTERM', 143));
  try {
    await bench(parsed, dataDirs);
  } finally {
    await cleanup(dataDirs);
  }
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    process.stderr.write(`bench failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
    process.exit(1);
  },
);
