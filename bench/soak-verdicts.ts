/**
 * What the soak benchmark judges at its end (soak.ts): whether its targets held over the
 * windows it recorded, one line per target for the console and the report.
 */
import { quantileOf } from './probe.js';
import type { SoakWindow } from './soak-plot.js';

/** What wrk reports of a run, as far as the targets go. */
interface LoadFigures {
  readonly errors: number;
  readonly non2xx: number;
  readonly msP99: number;
}

/** The load's p99 may be at most this many times its p99 in the 5-second run before it. */
const LOAD_P99_FACTOR = 3;

/**
 * The soak's targets, one line each, judged over the windows after warm-up (the first third)
 * or, for maxima, over all of them; the load's p99 against `baseline`'s, the same load run
 * for five seconds before the soak (as the 5-second bench runs it).
 */
export function verdicts(
  windows: readonly SoakWindow[],
  load: LoadFigures,
  baseline: LoadFigures,
): string[] {
  const after = windows.slice(Math.floor(windows.length / 3));
  if (after.length === 0) return ['Too short to judge the targets.'];
  const spread = (values: readonly number[]): number =>
    (Math.max(...values) - Math.min(...values)) / Math.min(...values);
  const rssSpread = spread(after.map((w) => w.rssMiB));
  // The process's own memory: resident pages not backed by a file (heaps, buffers). Pages
  // of LMDB's mapped data files are the kernel's page cache, shared and dropped under
  // pressure; they grow with the data read and written, so they are reported beside it.
  // Flat is judged on the windows' levels (the median of each window's readings, one a
  // second): a moment's peak is printed beside it, with the window it fell in.
  const levels = after.map((w) => w.ownMiBMedian);
  const ownSpread = spread(levels);
  const peak = after.reduce((top, w) => (w.ownMiBMax > top.ownMiBMax ? w : top));
  // The target is the p99 of the soak's probes after warm-up; the worst window's beside it.
  const probeP99 = quantileOf(
    after.flatMap((w) => w.probeLatenciesMs),
    0.99,
  );
  const windowP99 = Math.max(...after.map((w) => w.probeMsP99));
  const probeMax = Math.max(...windows.map((w) => w.probeMsMax));
  // The bare server's p99, judged as the probe's: what the machine alone adds to its tail.
  const bareP99 = quantileOf(
    after.flatMap((w) => w.bareProbeLatenciesMs),
    0.99,
  );
  const bareWindowP99 = Math.max(...after.map((w) => w.bareProbeMsP99));
  const bareMax = Math.max(...windows.map((w) => w.bareProbeMsMax));
  const steals = windows.map((w) => w.stealPercent).filter((p) => !Number.isNaN(p));
  const steal =
    steals.length === 0
      ? ''
      : `; the host took ${(steals.reduce((sum, p) => sum + p, 0) / steals.length).toFixed(1)}% ` +
        `of the machine's CPU time during the soak (steal; at most ` +
        `${Math.max(...steals).toFixed(1)}% in a window)`;
  // The pauses judged are the soak's own, counted in the windows' histograms: 20 ms is a
  // bucket bound, so "at most 20 ms" is exact. A thread's own gauge is its longest since the
  // process started (the warm-up and the 5-second run included); one that rose during the
  // soak is one of the soak's pauses to the tenth of a millisecond.
  const gcMax = Math.max(...windows.map((w) => w.gcPauseMsMax));
  const gauges = windows.flatMap((w) => (w.gcLongestMs === null ? [] : [w.gcLongestMs]));
  const risen = windows.flatMap((w) => (w.gcLongestInSoakMs === null ? [] : [w.gcLongestInSoakMs]));
  const gcExact =
    risen.length === 0
      ? ''
      : `; of the pauses that set a thread's record during the soak, the longest: ` +
        `${max1(risen)} ms`;
  const gcSinceStart =
    gauges.length === 0
      ? ''
      : `; since the process started (the warm-up and the 5-second run included), by the ` +
        `threads' own gauges: ${max1(gauges)} ms`;
  const pauses = windows.flatMap((w) =>
    w.snapshotPauseMsMax === null ? [] : [w.snapshotPauseMsMax],
  );
  const pauseMax = Math.max(0, ...pauses);
  const overFive = pauses.filter((ms) => ms > 5).length;
  // Judged less the thread's waits for a core, when every window with snapshots knows
  // them: a slice timed by the clock also counts the time other threads had the cores.
  const works = windows.flatMap((w) =>
    w.snapshotPauseMsMax === null ? [] : [w.snapshotWorkMsMax],
  );
  const workMax =
    works.length > 0 && works.every((ms) => ms !== null)
      ? Math.max(0, ...(works as number[]))
      : null;
  const errors =
    load.errors +
    load.non2xx +
    baseline.errors +
    baseline.non2xx +
    windows.reduce((sum, w) => sum + w.probeFailures, 0);
  const loadFactor = load.msP99 / baseline.msP99;
  const mark = (ok: boolean): string => (ok ? 'held' : 'missed');
  return [
    `Memory of its own (RSS less file-backed pages) after warm-up within ` +
      `${(ownSpread * 100).toFixed(1)}% (target 10%; ${Math.min(...levels).toFixed(0)}–` +
      `${Math.max(...levels).toFixed(0)} MiB, each window's median of its readings once a ` +
      `second): ${mark(ownSpread <= 0.1)}; the highest reading ${peak.ownMiBMax.toFixed(0)} MiB ` +
      `(the window ending at ${peak.atSec} s); all of RSS within ` +
      `${(rssSpread * 100).toFixed(1)}% (file-backed pages: LMDB's page cache).`,
    `Probe p99 ${probeP99.toFixed(2)} ms after warm-up (target 5 ms; at most ` +
      `${windowP99.toFixed(2)} ms in a 15-second window) and max ${probeMax.toFixed(1)} ms ` +
      `(target 50 ms): ${mark(probeP99 <= 5 && probeMax <= 50)}; ` +
      `an idle bare uWebSockets.js server probed the same way at the same time: p99 ` +
      `${bareP99.toFixed(2)} ms (at most ${bareWindowP99.toFixed(2)} ms in a window), max ` +
      `${bareMax.toFixed(1)} ms (the machine's share)${steal}.`,
    `Load p99 ${load.msP99.toFixed(1)} ms against ${baseline.msP99.toFixed(1)} ms in a ` +
      `5-second run of the same load before the soak: ${loadFactor.toFixed(2)}× (target ` +
      `${LOAD_P99_FACTOR}×): ${mark(loadFactor <= LOAD_P99_FACTOR)}.`,
    `Longest GC pause of a thread answering requests during the soak at most ${gcMax} ms by ` +
      `the histograms' buckets (target 20 ms): ${mark(gcMax <= 20)}${gcExact}${gcSinceStart}.`,
    pauses.length === 0
      ? 'No automatic snapshot was stored during the run (TALLY_SNAPSHOT_EVERY_BATCHES ' +
        'makes them more frequent).'
      : workMax === null
        ? `Longest hold of a shard's thread by a snapshot ${pauseMax.toFixed(1)} ms ` +
          `(target about 5 ms): ${mark(pauseMax <= 5)}${holdSource(windows, 'clock')}.`
        : `Longest hold of a shard's thread by a snapshot ${workMax.toFixed(2)} ms less its ` +
          `waits for a core (target about 5 ms): ${mark(workMax <= 5)}` +
          `${holdSource(windows, 'work')}; by the clock, waits included, ` +
          `${pauseMax.toFixed(1)} ms (${overFive} of ${pauses.length} snapshot windows over 5 ms).`,
    `Errors (socket, non-2xx, probe failures; the 5-second run's included): ${errors} ` +
      `(target 0): ${mark(errors === 0)}.`,
  ];
}

/**
 * Which part of a snapshot the longest hold was, judged by the clock or less the waits: the
 * transaction that stored it (its window's storing figure is the hold), else a slice of
 * the copy. Empty where the window does not say.
 */
function holdSource(windows: readonly SoakWindow[], by: 'clock' | 'work'): string {
  let longest: { readonly held: number; readonly stored: number | null } | null = null;
  for (const w of windows) {
    const held = by === 'clock' ? w.snapshotPauseMsMax : w.snapshotWorkMsMax;
    const stored = by === 'clock' ? w.snapshotStoreMs : w.snapshotStoreWorkMs;
    if (held !== null && (longest === null || held > longest.held)) longest = { held, stored };
  }
  if (longest === null || longest.stored === null) return '';
  return longest.stored >= longest.held
    ? ' (the transaction that stored it)'
    : ' (a slice of the copy)';
}

/** The largest of `values`, to a tenth. */
function max1(values: readonly number[]): string {
  return Math.max(...values).toFixed(1);
}
