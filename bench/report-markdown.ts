/**
 * Writes a run's figures into a Markdown document (`npm run bench -- --report
 * docs/performance.md`): the part between the `bench:begin` and `bench:end` markers is
 * replaced, everything else (the hand-written conclusions) is kept. A document without
 * the markers gets the block after its first heading. So the document always holds the
 * latest full run and nothing older.
 */
import { readFile, writeFile } from 'node:fs/promises';
import type { BenchReport, ScenarioResult, ServerStats, TargetCheck } from './report.js';

const BEGIN =
  '<!-- bench:begin: written by `npm run bench -- --report docs/performance.md`; edit ' +
  'outside the markers -->';
const END = '<!-- bench:end -->';

/** Replaces the generated block of `path` (creating the file if needed) with `report`'s figures. */
export async function writeMarkdownReport(
  path: string,
  report: BenchReport,
  argv: readonly string[],
): Promise<void> {
  const existing = await readFile(path, 'utf8').catch(() => '# Performance\n');
  const block = `${BEGIN}\n${markdownBlock(report, argv)}\n${END}`;
  const start = existing.indexOf('<!-- bench:begin');
  const end = existing.indexOf(END);
  let next: string;
  if (start !== -1 && end > start) {
    next = existing.slice(0, start) + block + existing.slice(end + END.length);
  } else {
    const firstLineEnd = existing.indexOf('\n');
    next =
      firstLineEnd === -1
        ? `${existing}\n\n${block}\n`
        : `${existing.slice(0, firstLineEnd + 1)}\n${block}\n${existing.slice(firstLineEnd + 1)}`;
  }
  await writeFile(path, next);
}

const fixed = (value: number | undefined, digits: number): string =>
  value !== undefined && Number.isFinite(value) ? value.toFixed(digits) : '-';

/** `main 7.9 · shard 0 4.1 · other 1.2` µs per request. */
function cpuCell(stats: ServerStats | null): string {
  if (stats === null) return '-';
  const parts = Object.entries(stats.cpuUsPerRequest).map(
    ([group, us]) => `${group.replace('tally-shard-', 'shard ')} ${fixed(us, 1)}`,
  );
  return parts.length === 0 ? '-' : parts.join(' · ');
}

function spread(values: readonly number[]): string {
  if (values.length === 0) return '';
  const sorted = [...values].sort((a, b) => a - b);
  return ` (${fixed(sorted[0], 2)}–${fixed(sorted.at(-1), 2)})`;
}

function scenarioRow(s: ScenarioResult): string {
  const tally = s.tally;
  return (
    `| \`${s.name}\` | ${s.connections} | ${fixed(s.bare.reqPerSec, 0)} ` +
    `| ${fixed(tally?.reqPerSec, 0)} | ` +
    `**${fixed(s.ratio ?? undefined, 2)}×**${spread(s.ratioByRound)} ` +
    `| ${fixed(tally?.latencyMsP50, 2)} / ${fixed(tally?.latencyMsP99, 2)} ` +
    `| ${cpuCell(tally)} | ${cpuCell(s.bare)} |`
  );
}

function targetLine(s: ScenarioResult, t: TargetCheck): string {
  const status = t.pass === null ? 'not judged' : t.pass ? 'met' : '**not met**';
  return (
    `- \`${s.name}\` at ${s.connections} ` +
    `connections: ${t.description}: ${status}${t.note === undefined ? '' : ` (${t.note})`}`
  );
}

/** The command's options as a reader would repeat them (a `--json <file>` is the caller's own). */
function shown(argv: readonly string[]): string {
  const kept = argv.filter((arg, i) => arg !== '--json' && argv[i - 1] !== '--json');
  return kept.length === 0 ? '' : ` -- ${kept.join(' ')}`;
}

function markdownBlock(report: BenchReport, argv: readonly string[]): string {
  const o = report.options;
  const judged = report.scenarios.flatMap((s) =>
    s.targets.filter((t) => t.pass !== null).map((t) => targetLine(s, t)),
  );
  return [
    '## Latest run',
    '',
    `${report.startedAt.slice(0, 10)}, ` +
      `Node ${report.node}, ${report.availableParallelism} cores ` +
      `(${report.cpuModel}), ${report.platform}; ` +
      `load average ${fixed(report.loadAverage1mAtStart, 2)} ` +
      `before, ${fixed(report.loadAverage1m, 2)} after. ` +
      `Load generator: ${report.loadGenerator} on the same machine, ` +
      `loopback. ${String(o['rounds'])} rounds of ${String(o['durationSec'])} s per server, ` +
      `bare and Tally alternated; ${report.tally.note}.`,
    '',
    `Command: \`npm run bench${shown(argv)}\``,
    '',
    "The ratio is the median over rounds of Tally's requests per second divided by the bare",
    "uWebSockets.js server's in the same round (range in brackets). CPU is µs per answered request",
    'by thread over the measured segments: `main` is the front end, `shard N` a shard ' +
      'worker, `other`',
    "V8's GC and compiler threads, libuv's pool and LMDB's writer.",
    '',
    '| scenario | connections | bare req/s | Tally req/s | Tally ÷ bare | Tally p50 / p99 ' +
      'ms | Tally CPU µs per request | bare CPU µs per request |',
    '|---|---|---|---|---|---|---|---|',
    ...report.scenarios.map(scenarioRow),
    '',
    'Targets:',
    '',
    ...(judged.length === 0 ? ['- none judged in this run'] : judged),
  ].join('\n');
}
