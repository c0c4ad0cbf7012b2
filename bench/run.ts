/**
 * Tally's HTTP benchmark (`npm run bench`; `--tiny` inside `npm test`).
 *
 * Rate limiting: the bench's Tally runs with the limiter on and a limit of 10^9 requests
 * per minute per key, so every request pays for the accounting and the `X-RateLimit-*`
 * headers but none is ever refused. The `has-unlimited` scenario sends the same requests
 * as `has` to a second Tally with rate limiting off (started only when that scenario is
 * selected), and when both are selected they are measured in the same alternating
 * segments (bare, bare + rate-limit headers, tally, tally-rl-off, then reversed, …)
 * against one shared bare ceiling; the `has` target "tally >= 0.95 x has-unlimited's
 * tally req/s" is the limiter's price, measured under the same machine conditions. The
 * two Tallies' replies differ by three header lines, and the load generator pays to
 * parse them too (autocannon parses in JavaScript: a bare server that adds the same
 * lines answers 8–12% less here). That cost is the generator's, not the limiter's, so the target
 * is judged net of it: on ÷ off, divided by (bare with the lines ÷ bare) measured in the
 * same segments. The report prints the raw ratio beside the net one. The JSON report's
 * `rateLimitHeaderSeen` says whether the rate-limited Tally really sent the header.
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
 * Every child server is stopped on every exit path, including SIGINT and SIGTERM.
 */
import { createRequire } from 'node:module';
import { availableParallelism, cpus, loadavg } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type autocannon from 'autocannon';
import { runMain, startChild, stopAll, stopOnSignals, type Child } from './children.js';
import { runSegment as runAutocannonSegment, type LoadShape, type SegmentResult } from './load.js';
import { runWrkSegment, wrkAvailable } from './wrk.js';
import { parseOptions, USAGE, type BenchOptions } from './options.js';
import {
  formatReport,
  scenarioResults,
  summarize,
  writeJson,
  type BenchReport,
  type MeasuredScenario,
  type ScenarioResult,
} from './report.js';
import { writeMarkdownReport } from './report-markdown.js';
import { addCpu, cpuSecondsBetween, sampleThreads } from './thread-cpu.js';
import { buildRequests, sliceForConnections, type BenchKeys, type Scenario } from './scenarios.js';
import { RATE_LIMIT_HUGE, TALLY_INSTANCES, startTallies, type Tallies } from './tallies.js';
import { removeDataDir } from './tally-server.js';

const benchDir = dirname(fileURLToPath(import.meta.url));
const BARE_SCRIPT = join(benchDir, 'bare-server.js');
const TALLY_SCRIPT = join(benchDir, '..', 'src', 'main.js');
/** Sent to the bare server when Tally is not running; it ignores them. */
const PLACEHOLDER_KEYS: BenchKeys = { server: 'sk_test_bench', client: 'ck_test_bench' };

interface Target {
  readonly label: string;
  readonly child: Child;
  readonly baseUrl: string;
  /**
   * One request list per connection, built with this server's own keys (each Tally has its own).
   */
  readonly slices: autocannon.Request[][];
}

function assertAlive(target: Target): void {
  const { exitCode, signalCode } = target.child.process;
  if (exitCode === null && signalCode === null) return;
  throw new Error(
    `${target.label} died during the run (code ${exitCode}, signal ${signalCode})\n--- ` +
      `output ---\n${target.child.outputTail()}`,
  );
}

/**
 * Sends the target's first request once with fetch and throws unless it answers 2xx; returns the
 * response's headers.
 */
async function preflight(target: Target): Promise<globalThis.Headers> {
  const request = target.slices[0]?.[0];
  if (request === undefined) throw new Error(`${target.label}: no requests built`);
  const init: RequestInit = {
    method: request.method ?? 'GET',
    headers: request.headers as Record<string, string>,
  };
  if (request.body !== undefined) init.body = request.body;
  const response = await fetch(`${target.baseUrl}${request.path ?? '/'}`, init);
  const text = await response.text();
  if (!response.ok)
    throw new Error(
      `preflight ${init.method} ${request.path} on ${target.label} ` +
        `answered ${response.status}: ${text}`,
    );
  return response.headers;
}

/** Whether a selected scenario's target is judged net of the rate-limit headers' parsing cost. */
function needsHeaderControl(scenarios: readonly Scenario[]): boolean {
  return scenarios.some((s) =>
    s.targets.some((t) => t.kind === 'vsScenario' && t.netOfRateLimitHeaders === true),
  );
}

/** The bare server that adds the three rate-limit lines to every reply (bare-server.ts). */
const HEADER_CONTROL_LABEL = 'bare + rate-limit headers';

/**
 * Warm-up for each target, then `rounds` measured segments per target, in order on even
 * rounds and reversed on odd ones (bare, tally, tally-rl-off, tally-rl-off, tally, bare,
 * …), so over each pair of rounds every target's mean position in time is the same and
 * a linear drift in machine conditions cancels out.
 */
async function measure(
  targets: readonly Target[],
  shape: LoadShape,
  options: BenchOptions,
): Promise<Map<Target, Measured>> {
  const measured = new Map<Target, Measured>(
    targets.map((t) => [t, { segments: [], cpuSeconds: new Map() }]),
  );
  const runSegment = options.driver === 'wrk' ? runWrkSegment : runAutocannonSegment;
  for (const target of targets) {
    await runSegment(target.baseUrl, target.slices, { ...shape, durationSec: options.warmupSec });
    assertAlive(target);
  }
  for (let round = 0; round < options.rounds; round++) {
    const order = round % 2 === 0 ? targets : [...targets].reverse();
    for (const target of order) {
      const pid = target.child.process.pid ?? 0;
      const before = sampleThreads(pid);
      const segment = await runSegment(target.baseUrl, target.slices, {
        ...shape,
        durationSec: options.durationSec,
      });
      const entry = measured.get(target);
      entry?.segments.push(segment);
      if (entry !== undefined)
        addCpu(entry.cpuSeconds, cpuSecondsBetween(before, sampleThreads(pid)));
      assertAlive(target);
    }
  }
  return measured;
}

/** One target's segments, and its threads' CPU seconds over them (thread-cpu.ts groups). */
interface Measured {
  readonly segments: SegmentResult[];
  readonly cpuSeconds: Map<string, number>;
}

/**
 * Selected scenarios in measurement groups: one that names another selected scenario in
 * `interleaveWith` joins its group; every other scenario is a group of its own.
 */
function groupScenarios(scenarios: readonly Scenario[]): Scenario[][] {
  const selected = new Set(scenarios.map((s) => s.name));
  const groups = new Map<string, Scenario[]>();
  for (const scenario of scenarios) {
    const lead =
      scenario.interleaveWith !== undefined && selected.has(scenario.interleaveWith)
        ? scenario.interleaveWith
        : scenario.name;
    groups.set(lead, [...(groups.get(lead) ?? []), scenario]);
  }
  return [...groups.values()];
}

/**
 * The group's one load shape at `connections`; interleaved scenarios must agree on it (a SCENARIOS
 * bug otherwise).
 */
function groupShape(
  group: readonly Scenario[],
  options: BenchOptions,
  connections: number,
): LoadShape {
  const shapes = group.map(
    (s) => `${s.connections ?? connections}x${s.pipelining ?? options.pipelining}`,
  );
  if (new Set(shapes).size !== 1)
    throw new Error(
      `interleaved scenarios ${group.map((s) => s.name).join(', ')} differ in load ` +
        `shape: ${shapes.join(', ')}`,
    );
  const first = group[0];
  if (first === undefined) throw new Error('empty scenario group');
  return {
    connections: first.connections ?? connections,
    pipelining: first.pipelining ?? options.pipelining,
    durationSec: options.durationSec,
  };
}

function makeTarget(
  label: string,
  child: Child,
  scenario: Scenario,
  keys: BenchKeys,
  connections: number,
): Target {
  const slices = sliceForConnections(buildRequests(scenario, keys), connections);
  return { label, child, baseUrl: `http://127.0.0.1:${child.port}`, slices };
}

function tallyTarget(
  scenario: Scenario,
  tallies: Tallies,
  connections: number,
): Target | undefined {
  const server = tallies.servers.get(scenario.tally);
  return (
    server &&
    makeTarget(
      TALLY_INSTANCES[scenario.tally].label,
      server.child,
      scenario,
      server.keys,
      connections,
    )
  );
}

/**
 * Measures one group: the bare ceiling (sent the lead scenario's requests, with its
 * Tally's keys, byte for byte) and each scenario's Tally, interleaved in one `measure`.
 * Every scenario of the group reports the same bare statistics.
 */
async function runGroup(
  group: readonly Scenario[],
  bareChild: Child,
  controlChild: Child | null,
  tallies: Tallies,
  options: BenchOptions,
  connections: number,
): Promise<MeasuredScenario[]> {
  const shape = groupShape(group, options, connections);
  const lead = group[0];
  if (lead === undefined) throw new Error('empty scenario group');
  const tallyTargets = group.map((s) => tallyTarget(s, tallies, shape.connections));
  const bareKeys = tallies.servers.get(lead.tally)?.keys ?? PLACEHOLDER_KEYS;
  const bare = makeTarget('bare', bareChild, lead, bareKeys, shape.connections);
  const control =
    controlChild !== null && needsHeaderControl(group)
      ? makeTarget(HEADER_CONTROL_LABEL, controlChild, lead, bareKeys, shape.connections)
      : null;
  const targets = [
    bare,
    ...(control === null ? [] : [control]),
    ...tallyTargets.filter((t) => t !== undefined),
  ];
  for (const target of targets) {
    const headers = await preflight(target);
    if (target === control && headers.get('x-ratelimit-limit') !== String(RATE_LIMIT_HUGE)) {
      throw new Error(
        `${HEADER_CONTROL_LABEL} sent no x-ratelimit-limit: ${RATE_LIMIT_HUGE} header`,
      );
    }
  }
  const names = group.map((s) => s.name).join(' + ');
  process.stderr.write(
    `bench: ${names} (${shape.connections} connections x ` +
      `pipelining ${shape.pipelining}; ${targets.map((t) => t.label).join(', ')}) ...\n`,
  );
  const measured = await measure(targets, shape, options);
  const stats = (target: Target): ReturnType<typeof summarize> =>
    summarize(measured.get(target)?.segments ?? [], measured.get(target)?.cpuSeconds);
  const bareStats = stats(bare);
  const controlStats = control === null ? null : stats(control);
  return group.map((scenario, i) => {
    const target = tallyTargets[i];
    const tally = target === undefined ? null : stats(target);
    const bareSharedWith = i === 0 ? null : lead.name;
    return {
      scenario,
      connections: shape.connections,
      pipelining: shape.pipelining,
      bare: bareStats,
      headerControl: controlStats,
      tallyLabel: TALLY_INSTANCES[scenario.tally].label,
      tally,
      bareSharedWith,
    };
  });
}

function autocannonVersion(): string {
  try {
    const pkg = createRequire(import.meta.url)('autocannon/package.json') as { version?: string };
    return `autocannon ${pkg.version ?? '?'}`;
  } catch {
    return 'autocannon (version unknown)';
  }
}

function reportShell(
  options: BenchOptions,
  tallies: Tallies,
  scenarios: ScenarioResult[],
  loadAverage1mAtStart: number,
): BenchReport {
  return {
    startedAt: new Date().toISOString(),
    node: process.version,
    availableParallelism: availableParallelism(),
    loadAverage1mAtStart,
    loadAverage1m: loadavg()[0] ?? Number.NaN,
    cpuModel: cpus()[0]?.model ?? 'unknown cpu',
    platform: `${process.platform}-${process.arch}`,
    loadGenerator: options.driver === 'wrk' ? 'wrk (1 thread)' : autocannonVersion(),
    options: {
      durationSec: options.durationSec,
      warmupSec: options.warmupSec,
      rounds: options.rounds,
      connections: options.connectionsList,
      pipelining: options.pipelining,
      workers: options.workers ?? null,
      tiny: options.tiny,
      full: options.full,
    },
    tally: { ran: tallies.servers.size > 0, note: tallies.note },
    rateLimitHeaderSeen: tallies.rateLimitHeaderSeen,
    rateLimitOffHeaderSeen: tallies.rateLimitOffHeaderSeen,
    scenarios,
  };
}

async function bench(options: BenchOptions, dataDirs: string[]): Promise<void> {
  if (options.driver === 'wrk' && !(await wrkAvailable())) {
    throw new Error(
      'wrk is not installed: `apt-get install wrk` (Debian, Ubuntu), or run with --driver ' +
        'autocannon',
    );
  }
  const loadAverage1m = loadavg()[0] ?? Number.NaN;
  const bareChild = await startChild('bare', BARE_SCRIPT, { PORT: '0' });
  const controlChild = needsHeaderControl(options.scenarios)
    ? await startChild('bare-rl', BARE_SCRIPT, {
        PORT: '0',
        RATE_LIMIT_HEADERS: String(RATE_LIMIT_HUGE),
      })
    : null;
  const tallies = await startTallies(TALLY_SCRIPT, options, dataDirs);
  if (tallies.servers.size === 0) process.stderr.write(`bench: tally ${tallies.note}\n`);
  const measured: MeasuredScenario[] = [];
  for (const connections of options.connectionsList) {
    for (const group of groupScenarios(options.scenarios)) {
      if (group.some((s) => s.connections !== undefined && s.connections !== connections)) continue;
      measured.push(
        ...(await runGroup(group, bareChild, controlChild, tallies, options, connections)),
      );
    }
  }
  const report = reportShell(options, tallies, scenarioResults(measured), loadAverage1m);
  process.stdout.write(`${formatReport(report)}\n`);
  if (options.jsonPath !== undefined) await writeJson(options.jsonPath, report);
  if (options.reportPath !== undefined)
    await writeMarkdownReport(options.reportPath, report, process.argv.slice(2));
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
  stopOnSignals('bench', () => cleanup(dataDirs));
  try {
    await bench(parsed, dataDirs);
  } finally {
    await cleanup(dataDirs);
  }
}

runMain('bench', main);
