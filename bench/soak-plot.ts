/**
 * An SVG chart of a soak run in two panels against time: memory (the process's own and all
 * of RSS) above, the probe's latency (its p99 and max, the bare server's p99) below,
 * because a curve shows "flat" or "climbing" faster than a table. Plain SVG text, no
 * dependencies.
 */
/** One 15-second window of a soak run (figures from bucket counts are bucket bounds). */
export interface SoakWindow {
  readonly atSec: number;
  readonly rssMiB: number;
  /** Of it, pages backed by files (LMDB's memory-mapped data files, mostly). */
  readonly rssFileMiB: number;
  /**
   * The process's own memory (RSS less file-backed pages, MiB) read every second of the
   * window: the median of those readings (the window's level) and the highest (a moment's
   * peak, such as the half second an era's image is written).
   */
  readonly ownMiBMedian: number;
  readonly ownMiBMax: number;
  /** V8 heaps in use at the end of the window, every thread's together. */
  readonly heapMiB: number;
  /** Idempotency keys held in memory (not yet sealed), and kept in all (runs and memory). */
  readonly memoryKeys: number;
  readonly keptKeys: number;
  /** Sealed runs of keys, and the memory their filters take (MiB), every shard's together. */
  readonly runs: number;
  readonly filterMiB: number;
  /** Automatic shard snapshots stored in the window. */
  readonly snapshots: number;
  /** Of those: the longest (cut to stored) and the longest hold of a shard's thread, ms. */
  readonly snapshotMsMax: number | null;
  readonly snapshotPauseMsMax: number | null;
  /** The longest hold less the thread's waits for a core (null: none, or unknown). */
  readonly snapshotWorkMsMax: number | null;
  /**
   * The latest snapshot's storing transaction, by the clock and less the waits (null: no
   * snapshot, or unknown): a longer hold was a slice of the copy.
   */
  readonly snapshotStoreMs: number | null;
  readonly snapshotStoreWorkMs: number | null;
  readonly probeMsP99: number;
  readonly probeMsP999: number;
  readonly probeMsMax: number;
  /** Every answered probe's latency in the window (ms): the soak's p99 is over all of them. */
  readonly probeLatenciesMs: readonly number[];
  readonly probeFailures: number;
  /** The same probe of an idle bare uWebSockets.js server at the same time (probe.ts). */
  readonly bareProbeMsP99: number;
  readonly bareProbeMsMax: number;
  /** Every answered probe of the bare server in the window (ms), as `probeLatenciesMs`. */
  readonly bareProbeLatenciesMs: readonly number[];
  /**
   * The share of the machine's CPU time the host took in the window (steal, from
   * `/proc/stat`, in percent; NaN where there is none to read).
   */
  readonly stealPercent: number;
  /** Consumes answered in the window, their p99 (server side, ms) and non-2xx answers. */
  readonly loadRequests: number;
  readonly loadMsP99: number;
  readonly loadNon2xx: number;
  /**
   * The longest garbage-collection pause in the window of a thread answering requests (the
   * front ends, the shards; not the webhook delivery thread) (ms, bucket bound).
   */
  readonly gcPauseMsMax: number;
  /**
   * The longest pause since start of those threads, by their own gauges (ms; null: none):
   * the process's start, the warm-up and the 5-second run included.
   */
  readonly gcLongestMs: number | null;
  /**
   * The longest pause of those threads that came after the soak's first scrape, from the
   * threads whose own longest changed since then (ms, exact; null: none did).
   */
  readonly gcLongestInSoakMs: number | null;
}

const WIDTH = 720;
const HEIGHT = 420;
const PAD = { left: 56, right: 56, top: 24, bottom: 36 };
/** The space between the memory panel (above) and the probe panel (below). */
const GAP = 30;

/** A round number at or above the largest of `values` (at least `least`). */
function scale(values: readonly number[], least = 1): number {
  const max = Math.max(least, ...values.filter(Number.isFinite));
  const magnitude = 10 ** Math.floor(Math.log10(max));
  return Math.ceil(max / magnitude) * magnitude;
}

/** An axis figure: three significant digits at most (3.5, 0.25, 200; not 0.3 for 0.25). */
function figure(value: number): string {
  return String(Number(value.toPrecision(3)));
}

function polyline(
  points: ReadonlyArray<readonly [number, number]>,
  color: string,
  dash = '',
): string {
  const text = points.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(' ');
  return (
    `<polyline fill="none" stroke="${color}" ` +
    `stroke-width="2"${dash === '' ? '' : ` stroke-dasharray="${dash}"`} points="${text}"/>`
  );
}

/** One panel's frame and the y of a value on it (0 at its bottom, `max` at its top). */
interface Panel {
  readonly top: number;
  readonly height: number;
}

function yOn(panel: Panel, value: number, max: number): number {
  return panel.top + panel.height - (Math.min(value, max) / max) * panel.height;
}

function axis(panel: Panel, label: string, max: number, side: 'left' | 'right'): string {
  const at = side === 'left' ? PAD.left - 6 : WIDTH - PAD.right + 6;
  const anchor = side === 'left' ? 'end' : 'start';
  return (
    [0, 0.5, 1]
      .map(
        (f) =>
          `<text x="${at}" y="${yOn(panel, max * f, max) + 4}" text-anchor="${anchor}" ` +
          `font-size="11">${figure(max * f)}</text>`,
      )
      .join('') +
    `<text x="${at}" y="${panel.top - 8}" text-anchor="${anchor}" font-size="11">${label}</text>`
  );
}

function legend(panel: Panel, items: ReadonlyArray<readonly [string, string, number]>): string {
  return items
    .map(
      ([text, color, dx]) =>
        `<text x="${PAD.left + dx}" y="${panel.top + 14}" font-size="11" fill="${color}">` +
        `${text}</text>`,
    )
    .join('');
}

/**
 * Two panels over the same seconds. Above, memory: the process's own (each window's median
 * of its readings, solid, and its highest reading, dashed; MiB, left axis) and all of RSS
 * (GiB, right axis), which grows with LMDB's file pages as the data grows and is drawn on
 * a scale of its own so that the own memory's level is not flattened by it. Below, the
 * probe: its p99 and max and the bare server's p99 (ms).
 */
export function plotSoak(windows: readonly SoakWindow[]): string {
  const plotW = WIDTH - PAD.left - PAD.right;
  const panelH = (HEIGHT - PAD.top - PAD.bottom - GAP) / 2;
  const memory: Panel = { top: PAD.top, height: panelH };
  const probe: Panel = { top: PAD.top + panelH + GAP, height: panelH };
  const endSec = Math.max(1, ...windows.map((w) => w.atSec));
  const ownMax = scale(windows.map((w) => w.ownMiBMax));
  const rssGiB = windows.map((w) => w.rssMiB / 1024);
  const rssMax = scale(rssGiB, 0.1);
  const msMax = scale(windows.map((w) => w.probeMsMax));
  const x = (sec: number): number => PAD.left + (sec / endSec) * plotW;
  const line = (
    panel: Panel,
    values: readonly number[],
    max: number,
    color: string,
    dash = '',
  ): string =>
    polyline(
      values.map((value, i) => [x((windows[i] as SoakWindow).atSec), yOn(panel, value, max)]),
      color,
      dash,
    );
  const frame = (panel: Panel): string =>
    `<rect x="${PAD.left}" y="${panel.top}" width="${plotW}" height="${panel.height}" ` +
    `fill="none" stroke="#999"/>`;
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${HEIGHT}" ` +
      `font-family="sans-serif">`,
    `<rect width="${WIDTH}" height="${HEIGHT}" fill="white"/>`,
    frame(memory),
    frame(probe),
    axis(memory, 'own MiB', ownMax, 'left'),
    axis(memory, 'RSS GiB', rssMax, 'right'),
    axis(probe, 'probe ms', msMax, 'left'),
    `<text x="${WIDTH / 2}" y="${HEIGHT - 8}" text-anchor="middle" font-size="11">seconds ` +
      `(0–${endSec})</text>`,
    line(
      memory,
      windows.map((w) => w.ownMiBMedian),
      ownMax,
      '#1f77b4',
    ),
    line(
      memory,
      windows.map((w) => w.ownMiBMax),
      ownMax,
      '#9ecae1',
      '4 3',
    ),
    line(memory, rssGiB, rssMax, '#7f7f7f', '1 3'),
    line(
      probe,
      windows.map((w) => w.probeMsP99),
      msMax,
      '#d62728',
    ),
    line(
      probe,
      windows.map((w) => w.probeMsMax),
      msMax,
      '#ff9896',
      '4 3',
    ),
    line(
      probe,
      windows.map((w) => w.bareProbeMsP99),
      msMax,
      '#7f7f7f',
      '1 3',
    ),
    legend(memory, [
      ['own memory (median)', '#1f77b4', 8],
      ['highest reading', '#9ecae1', 136],
      ['all of RSS, with file pages (right)', '#7f7f7f', 240],
    ]),
    legend(probe, [
      ['probe p99', '#d62728', 8],
      ['probe max', '#ff9896', 80],
      ["bare server's probe p99", '#7f7f7f', 152],
    ]),
    '</svg>',
    '',
  ].join('\n');
}
