/**
 * Turns load segments into the benchmark's results: per-server statistics, the
 * Tally/bare ratio, target checks, a printed table and the JSON written by `--json`.
 *
 * req/s counts 2xx responses only, so a server that answers errors fast cannot look
 * fast; non-2xx and connection errors are reported beside it. Latency percentiles are
 * over 2xx responses, from the 10 µs histogram in latency-histogram.ts. `dropped`
 * counts requests that were never answered (connections the server closed).
 *
 * Targets are checked once every scenario has run, because some compare two scenarios
 * (`has` with rate limiting on against `has-unlimited` with it off). A target's verdict
 * is on the whole run; beside it stands the same ratio round by round (each round's
 * segments ran back to back), because on a shared 2-core machine one run's ratio moves
 * by ±10–20% and a verdict is worth only as much as the spread under it.
 */
import { writeFile } from 'node:fs/promises';
import { LatencyHistogram } from './latency-histogram.js';
import type { SegmentResult } from './load.js';
import type { Scenario, Target } from './scenarios.js';

export interface ServerStats {
  readonly requests2xx: number;
  readonly durationSec: number;
  readonly reqPerSec: number;
  readonly latencyMsP50: number;
  readonly latencyMsP99: number;
  readonly latencyMsMax: number;
  readonly non2xx: number;
  readonly errors: number;
  readonly timeouts: number;
  /** Requests that were written and never answered (see SegmentResult.dropped). */
  readonly dropped: number;
  readonly statusCodes: Readonly<Record<string, number>>;
  readonly segments: number;
  /** 2xx req/s of each segment, in the order measured (segment r belongs to round r). */
  readonly reqPerSecBySegment: readonly number[];
  /** p99 latency of each segment's 2xx responses, in the same order. */
  readonly latencyMsP99BySegment: readonly number[];
  /**
   * CPU µs per 2xx request by thread group over the measured segments: `main`, each
   * `tally-shard-N`, `other` (thread-cpu.ts). Empty where /proc could not be read.
   */
  readonly cpuUsPerRequest: Readonly<Record<string, number>>;
}

export interface TargetCheck {
  readonly description: string;
  /** null when the target does not apply to this run's parameters (or Tally did not run). */
  readonly pass: boolean | null;
  readonly note?: string;
}

/** One scenario's measurements, before its targets are checked. */
export interface MeasuredScenario {
  readonly scenario: Scenario;
  readonly connections: number;
  readonly pipelining: number;
  readonly bare: ServerStats;
  /**
   * The bare server that adds the three rate-limit lines (bare-server.ts), measured in the
   * same segments as `bare`; null unless a target of the group is judged net of them.
   */
  readonly headerControl: ServerStats | null;
  /** Which Tally process `tally` was measured on (tallies.ts). */
  readonly tallyLabel: string;
  readonly tally: ServerStats | null;
  /**
   * The scenario this one was interleaved with, whose bare segments it shares; null when measured
   * alone.
   */
  readonly bareSharedWith: string | null;
}

export interface ScenarioResult {
  readonly name: string;
  readonly method: string;
  readonly path: string;
  readonly connections: number;
  readonly pipelining: number;
  readonly bare: ServerStats;
  readonly headerControl: ServerStats | null;
  readonly bareSharedWith: string | null;
  readonly tallyLabel: string;
  readonly tally: ServerStats | null;
  /**
   * The median over rounds of tally req/s ÷ bare req/s in that round: the figure a target is judged
   * by.
   */
  readonly ratio: number | null;
  /**
   * The same ratio per round (tally's segment r ÷ bare's segment r); empty when tally did not run.
   */
  readonly ratioByRound: readonly number[];
  readonly targets: readonly TargetCheck[];
}

export interface BenchReport {
  readonly startedAt: string;
  readonly node: string;
  readonly availableParallelism: number;
  /** Other work on the machine skews every number; a high value means "rerun". */
  readonly loadAverage1mAtStart: number;
  readonly loadAverage1m: number;
  readonly cpuModel: string;
  readonly platform: string;
  readonly loadGenerator: string;
  readonly options: Readonly<Record<string, unknown>>;
  readonly tally: { readonly ran: boolean; readonly note: string };
  /**
   * The rate-limited Tally answered `x-ratelimit-limit` with the bench's huge limit (tallies.ts).
   */
  readonly rateLimitHeaderSeen: boolean;
  /** The rate-limit-off Tally sent that header anyway (it should not); null when it did not run. */
  readonly rateLimitOffHeaderSeen: boolean | null;
  readonly scenarios: readonly ScenarioResult[];
}

/**
 * Merges the alternating segments of one server into one set of statistics; `cpuSeconds` by thread
 * group over them.
 */
export function summarize(
  segments: readonly SegmentResult[],
  cpuSeconds: ReadonlyMap<string, number> = new Map(),
): ServerStats {
  const latency = new LatencyHistogram();
  const statusCodes: Record<string, number> = {};
  let durationSec = 0;
  let requests2xx = 0;
  let non2xx = 0;
  let errors = 0;
  let timeouts = 0;
  let dropped = 0;
  for (const segment of segments) {
    latency.merge(segment.latency);
    durationSec += segment.durationSec;
    requests2xx += segment.ok2xx;
    non2xx += segment.non2xx;
    errors += segment.errors;
    timeouts += segment.timeouts;
    dropped += segment.dropped;
    for (const [code, count] of Object.entries(segment.statusCodes))
      statusCodes[code] = (statusCodes[code] ?? 0) + count;
  }
  return {
    requests2xx,
    durationSec,
    reqPerSec: durationSec > 0 ? requests2xx / durationSec : 0,
    latencyMsP50: latency.quantileMs(0.5),
    latencyMsP99: latency.quantileMs(0.99),
    latencyMsMax: latency.max,
    non2xx,
    errors,
    timeouts,
    dropped,
    statusCodes,
    segments: segments.length,
    reqPerSecBySegment: segments.map((segment) =>
      segment.durationSec > 0 ? segment.ok2xx / segment.durationSec : 0,
    ),
    latencyMsP99BySegment: segments.map((segment) => segment.latency.quantileMs(0.99)),
    cpuUsPerRequest:
      requests2xx > 0
        ? Object.fromEntries(
            [...cpuSeconds]
              .sort(([a], [b]) => groupOrder(a) - groupOrder(b) || a.localeCompare(b))
              .map(([group, sec]) => [group, (sec * 1e6) / requests2xx]),
          )
        : {},
  };
}

/** main first, then the shard workers, then the rest. */
function groupOrder(group: string): number {
  return group === 'main' ? 0 : group === 'other' ? 2 : 1;
}

interface LoadShapeOfResult {
  readonly connections: number;
  readonly pipelining: number;
}

/** Tally statistics by scenario name, for targets that compare two scenarios. */
type PeerTallies = ReadonlyMap<string, ServerStats | null>;

/** The two bare ceilings of a scenario's group: without and with the rate-limit lines. */
interface Ceilings {
  readonly bare: ServerStats;
  readonly headerControl: ServerStats | null;
}

/**
 * Segment r of `numerator` ÷ segment r of `denominator`, for the rounds both have (a zero
 * denominator: skipped).
 */
export function roundRatios(numerator: ServerStats, denominator: ServerStats): number[] {
  const ratios: number[] = [];
  const rounds = Math.min(
    numerator.reqPerSecBySegment.length,
    denominator.reqPerSecBySegment.length,
  );
  for (let r = 0; r < rounds; r++) {
    const below = denominator.reqPerSecBySegment[r] ?? 0;
    if (below > 0) ratios.push((numerator.reqPerSecBySegment[r] ?? 0) / below);
  }
  return ratios;
}

/** The median of `values` (NaN for none). */
export function medianOf(values: readonly number[]): number {
  return values.length === 0 ? Number.NaN : median([...values].sort((a, b) => a - b));
}

function median(sorted: readonly number[]): number {
  const middle = sorted.length / 2;
  return sorted.length % 2 === 1
    ? (sorted[Math.floor(middle)] ?? 0)
    : ((sorted[middle - 1] ?? 0) + (sorted[middle] ?? 0)) / 2;
}

/**
 * How a target fared round by round: "rounds: 3 of 4 >= 0.4, median 0.420x, 0.370x-0.450x"
 * for a minimum (`unit` 'x'), "rounds: 1 of 4 <= 2, median 2.31 ms, ..." for a maximum.
 * Empty when there are no rounds.
 */
export function roundsNote(
  values: readonly number[],
  bound: { readonly min: number } | { readonly max: number },
  unit: 'x' | ' ms' = 'x',
): string {
  if (values.length === 0) return '';
  const sorted = [...values].sort((a, b) => a - b);
  const digits = unit === 'x' ? 3 : 2;
  const show = (value: number): string => `${fixed(value, digits)}${unit}`;
  const [met, test] =
    'min' in bound
      ? [values.filter((value) => value >= bound.min).length, `>= ${bound.min}`]
      : [values.filter((value) => value <= bound.max).length, `<= ${bound.max}`];
  return (
    `rounds: ${met} of ${values.length} ${test}, ` +
    `median ${show(median(sorted))}, ${show(sorted[0] ?? 0)}-${show(sorted.at(-1) ?? 0)}`
  );
}

function checkVsScenario(
  target: Extract<Target, { kind: 'vsScenario' }>,
  tally: ServerStats | null,
  peers: PeerTallies,
  ceilings: Ceilings,
): TargetCheck {
  const net = target.netOfRateLimitHeaders === true;
  const description =
    `tally >= ${target.min} x ${target.scenario}'s tally req/s ` +
    `(${target.what}${net ? ', net of the load generator parsing the three headers' : ''})`;
  const peer = peers.get(target.scenario);
  if (tally === null || peer === null)
    return { description, pass: null, note: 'tally did not run' };
  if (peer === undefined)
    return { description, pass: null, note: `${target.scenario} did not run` };
  if (peer.reqPerSec === 0)
    return { description, pass: false, note: `${target.scenario} had no 2xx` };
  const ratio = medianOf(roundRatios(tally, peer));
  if (!net) {
    const rounds = roundsNote(roundRatios(tally, peer), { min: target.min });
    return {
      description,
      pass: ratio >= target.min,
      note: `median ${fixed(ratio, 3)}x${rounds === '' ? '' : `; ${rounds}`}`,
    };
  }
  const control = ceilings.headerControl;
  if (control === null || control.reqPerSec === 0 || ceilings.bare.reqPerSec === 0)
    return { description, pass: null, note: 'the header control did not run' };
  const harnessByRound = roundRatios(control, ceilings.bare);
  const harness = medianOf(harnessByRound);
  const netByRound = roundRatios(tally, peer).flatMap((r, i) => {
    const h = harnessByRound[i];
    return h === undefined || h === 0 ? [] : [r / h];
  });
  const netRatio = medianOf(netByRound);
  const rounds = roundsNote(netByRound, { min: target.min });
  return {
    description,
    pass: netRatio >= target.min,
    note:
      `median net ${fixed(netRatio, 3)}x (raw ${fixed(ratio, 3)}x, bare with the headers vs ` +
      `without ${fixed(harness, 3)}x)${rounds === '' ? '' : `; net ${rounds}`}`,
  };
}

function checkTarget(
  target: Target,
  tally: ServerStats | null,
  ratio: number | null,
  ratioByRound: readonly number[],
  measured: LoadShapeOfResult & Ceilings,
  peers: PeerTallies,
): TargetCheck {
  if (target.kind === 'vsScenario') return checkVsScenario(target, tally, peers, measured);
  if (target.kind === 'ratio') {
    const description =
      `median tally/bare ` +
      `>= ${target.min}` +
      `${target.atConnections === undefined ? '' : ` at ${target.atConnections} connections`}`;
    if (ratio === null) return { description, pass: null, note: 'tally did not run' };
    if (target.atConnections !== undefined && measured.connections !== target.atConnections)
      return { description, pass: null, note: `ran at ${measured.connections}` };
    const rounds = roundsNote(ratioByRound, { min: target.min });
    return {
      description,
      pass: ratio >= target.min,
      ...(rounds === '' ? {} : { note: `measured ${fixed(ratio, 3)}x; ${rounds}` }),
    };
  }
  const description =
    `tally p99 <= ${target.maxMs} ms at ${target.atConnections} connections x ` +
    `pipelining ${target.atPipelining}`;
  if (tally === null) return { description, pass: null, note: 'tally did not run' };
  if (
    measured.connections !== target.atConnections ||
    measured.pipelining !== target.atPipelining
  ) {
    return {
      description,
      pass: null,
      note: `ran at ${measured.connections}x${measured.pipelining}`,
    };
  }
  const rounds = roundsNote(tally.latencyMsP99BySegment, { max: target.maxMs }, ' ms');
  return {
    description,
    pass: tally.latencyMsP99 <= target.maxMs,
    ...(rounds === '' ? {} : { note: `measured ${fixed(tally.latencyMsP99, 2)} ms; ${rounds}` }),
  };
}

function scenarioResult(measured: MeasuredScenario, peers: PeerTallies): ScenarioResult {
  const { scenario, bare, tally } = measured;
  const ratioByRound = tally === null ? [] : roundRatios(tally, bare);
  const ratio = ratioByRound.length === 0 ? null : medianOf(ratioByRound);
  return {
    name: scenario.name,
    method: scenario.method,
    path: scenario.path,
    connections: measured.connections,
    pipelining: measured.pipelining,
    bare,
    headerControl: measured.headerControl,
    bareSharedWith: measured.bareSharedWith,
    tallyLabel: measured.tallyLabel,
    tally,
    ratio,
    ratioByRound,
    targets: scenario.targets.map((t) =>
      checkTarget(t, tally, ratio, ratioByRound, measured, peers),
    ),
  };
}

/** Ratios and target checks for every measured scenario (a target may compare two of them). */
export function scenarioResults(measured: readonly MeasuredScenario[]): ScenarioResult[] {
  const peers: PeerTallies = new Map(measured.map((m) => [m.scenario.name, m.tally]));
  return measured.map((m) => scenarioResult(m, peers));
}

const fixed = (value: number, digits: number): string =>
  Number.isFinite(value) ? value.toFixed(digits) : '-';

function marker(check: TargetCheck): string {
  const status = check.pass === null ? 'n/a' : check.pass ? 'PASS' : 'FAIL';
  return `[${status}] ${check.description}${check.note === undefined ? '' : ` (${check.note})`}`;
}

function row(cells: readonly string[], widths: readonly number[]): string {
  return cells
    .map((cell, i) => (i < 2 ? cell.padEnd(widths[i] ?? 0) : cell.padStart(widths[i] ?? 0)))
    .join('  ');
}

function statsCells(
  scenario: ScenarioResult,
  server: 'bare' | 'headerControl' | 'tally',
): string[] {
  const stats = scenario[server];
  const load = `${scenario.connections}x${scenario.pipelining}`;
  const shared = scenario.bareSharedWith === null ? '' : ` (same as ${scenario.bareSharedWith})`;
  const label =
    server === 'tally'
      ? scenario.tallyLabel
      : server === 'bare'
        ? `bare${shared}`
        : `bare + rate-limit headers${shared}`;
  const head = [server === 'bare' ? scenario.name : '', `${label} ${scenario.method}`, load];
  if (stats === null) return [...head, 'not run', '-', '-', '-', '-', '-', '-', '-'];
  const ratio =
    server === 'tally' && scenario.ratio !== null
      ? `${fixed(scenario.ratio, 2)}x`
      : server === 'headerControl' && scenario.bare.reqPerSec > 0
        ? `${fixed(stats.reqPerSec / scenario.bare.reqPerSec, 2)}x`
        : '';
  return [
    ...head,
    fixed(stats.reqPerSec, 0),
    fixed(stats.latencyMsP50, 2),
    fixed(stats.latencyMsP99, 2),
    String(stats.non2xx),
    String(stats.errors),
    String(stats.dropped),
    ratio,
    Object.entries(stats.cpuUsPerRequest)
      .map(([group, us]) => `${group.replace('tally-shard-', 'shard')} ${fixed(us, 1)}`)
      .join(' '),
  ];
}

function rateLimitLine(report: BenchReport): string {
  const on = report.rateLimitHeaderSeen
    ? 'x-ratelimit-limit header seen on tally'
    : 'NO x-ratelimit-limit header on tally (limiter not in this build?)';
  if (report.rateLimitOffHeaderSeen === null) return on;
  const off = report.rateLimitOffHeaderSeen
    ? 'but ALSO on tally-rl-off (limiter not off!)'
    : 'none on tally-rl-off';
  return `${on}; ${off}`;
}

/** The results table, then the target checks, as printable text. */
export function formatReport(report: BenchReport): string {
  const header = [
    'scenario',
    'server',
    'conn x pipe',
    'req/s (2xx)',
    'p50 ms',
    'p99 ms',
    'non-2xx',
    'errors',
    'dropped',
    'vs bare (median)',
    'cpu us/req by thread',
  ];
  const body = report.scenarios.flatMap((s) => [
    statsCells(s, 'bare'),
    ...(s.headerControl === null ? [] : [statsCells(s, 'headerControl')]),
    statsCells(s, 'tally'),
  ]);
  const widths = header.map((h, i) =>
    Math.max(h.length, ...body.map((cells) => (cells[i] ?? '').length)),
  );
  const lines = [
    `node ${report.node}, ` +
      `availableParallelism ${report.availableParallelism}, ${report.cpuModel}, ${report.platform}`,
    `load average (1 min) before: ${fixed(report.loadAverage1mAtStart, 2)}, ` +
      `after: ${fixed(report.loadAverage1m, 2)}`,
    `load generator: ${report.loadGenerator}, in this process, same machine (loopback)`,
    `tally: ${report.tally.note}`,
    `rate limiting: ${rateLimitLine(report)}`,
    '',
    row(header, widths),
    ...body.map((cells) => row(cells, widths)),
    '',
    'targets (informational; the exit code ignores them):',
    ...report.scenarios.flatMap((s) => s.targets.map((t) => `  ${s.name}: ${marker(t)}`)),
  ];
  return lines.join('\n');
}

export async function writeJson(path: string, report: BenchReport): Promise<void> {
  await writeFile(path, `${JSON.stringify(report, null, 2)}\n`);
}
