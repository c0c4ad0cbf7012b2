/**
 * An SVG line chart of a soak run: RSS (MiB, left axis), the probe's p99 and max latency
 * and the bare server's probe p99 (ms, right axis) against time, because a curve shows
 * "flat" or "climbing" faster than a table. Plain SVG text, no dependencies.
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
const HEIGHT = 300;
const PAD = { left: 56, right: 56, top: 24, bottom: 36 };

function scale(values: readonly number[]): number {
  const max = Math.max(1, ...values.filter(Number.isFinite));
  const magnitude = 10 ** Math.floor(Math.log10(max));
  return Math.ceil(max / magnitude) * magnitude;
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

export function plotSoak(windows: readonly SoakWindow[]): string {
  const plotW = WIDTH - PAD.left - PAD.right;
  const plotH = HEIGHT - PAD.top - PAD.bottom;
  const endSec = Math.max(1, ...windows.map((w) => w.atSec));
  const rssMax = scale(windows.map((w) => w.rssMiB));
  const msMax = scale(windows.map((w) => w.probeMsMax));
  const x = (sec: number): number => PAD.left + (sec / endSec) * plotW;
  const y = (value: number, max: number): number =>
    PAD.top + plotH - (Math.min(value, max) / max) * plotH;
  const axis = (label: string, max: number, side: 'left' | 'right'): string => {
    const at = side === 'left' ? PAD.left - 6 : WIDTH - PAD.right + 6;
    const anchor = side === 'left' ? 'end' : 'start';
    return (
      [0, 0.5, 1]
        .map(
          (f) =>
            `<text x="${at}" y="${y(max * f, max) + 4}" text-anchor="${anchor}" ` +
            `font-size="11">${(max * f).toFixed(0)}</text>`,
        )
        .join('') +
      `<text x="${at}" y="${PAD.top - 8}" text-anchor="${anchor}" font-size="11">${label}</text>`
    );
  };
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${HEIGHT}" ` +
      `font-family="sans-serif">`,
    `<rect width="${WIDTH}" height="${HEIGHT}" fill="white"/>`,
    `<rect x="${PAD.left}" y="${PAD.top}" width="${plotW}" height="${plotH}" fill="none" ` +
      `stroke="#999"/>`,
    axis('RSS MiB', rssMax, 'left'),
    axis('probe ms', msMax, 'right'),
    `<text x="${WIDTH / 2}" y="${HEIGHT - 8}" text-anchor="middle" font-size="11">seconds ` +
      `(0–${endSec})</text>`,
    polyline(
      windows.map((w) => [x(w.atSec), y(w.rssMiB, rssMax)]),
      '#1f77b4',
    ),
    polyline(
      windows.map((w) => [x(w.atSec), y(w.ownMiBMedian, rssMax)]),
      '#1f77b4',
      '2 2',
    ),
    polyline(
      windows.map((w) => [x(w.atSec), y(w.probeMsP99, msMax)]),
      '#d62728',
    ),
    polyline(
      windows.map((w) => [x(w.atSec), y(w.probeMsMax, msMax)]),
      '#ff9896',
      '4 3',
    ),
    polyline(
      windows.map((w) => [x(w.atSec), y(w.bareProbeMsP99, msMax)]),
      '#7f7f7f',
      '1 3',
    ),
    `<text x="${PAD.left + 8}" y="${PAD.top + 14}" font-size="11" fill="#1f77b4">RSS ` +
      `(dotted: its own, median)</text>`,
    `<text x="${PAD.left + 168}" y="${PAD.top + 14}" font-size="11" fill="#d62728">probe ` +
      `p99</text>`,
    `<text x="${PAD.left + 240}" y="${PAD.top + 14}" font-size="11" fill="#ff9896">probe ` +
      `max</text>`,
    `<text x="${PAD.left + 310}" y="${PAD.top + 14}" font-size="11" fill="#7f7f7f">bare ` +
      `server's probe p99</text>`,
    '</svg>',
    '',
  ].join('\n');
}
