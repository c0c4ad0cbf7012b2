/**
 * A fixed-bucket histogram, cheap enough for the request hot path and for a shard
 * worker's commit loop, and plain enough to cross a thread as data.
 *
 * Recording is one short scan over a handful of sorted upper bounds and three
 * increments; there is no allocation, no label lookup and no clock. The bounds are fixed
 * at construction, so every series of one metric shares them and the exporter can
 * render Prometheus buckets (cumulative, `le`) straight from the counts. It lives in
 * `actors/` (and imports nothing) because both the shard worker and the front end use it.
 */

/** A histogram as shipped between threads: per-bucket counts (not cumulative). */
export interface HistogramData {
  /** Upper bounds, ascending; an observation lands in the first bucket whose bound is ≥ it. */
  readonly bounds: readonly number[];
  /** One count per bound plus a last one for the values above every bound (+Inf). */
  readonly counts: readonly number[];
  readonly sum: number;
  readonly count: number;
}

export class Histogram {
  readonly bounds: readonly number[];
  private readonly counts: Float64Array;
  sum = 0;
  count = 0;

  /** Throws if the bounds are empty or not strictly ascending (a programming error). */
  constructor(bounds: readonly number[]) {
    if (bounds.length === 0) throw new Error('a histogram needs at least one bucket bound');
    for (let i = 1; i < bounds.length; i++) {
      if (!((bounds[i] as number) > (bounds[i - 1] as number)))
        throw new Error('histogram bounds must ascend strictly');
    }
    this.bounds = [...bounds];
    this.counts = new Float64Array(bounds.length + 1);
  }

  observe(value: number): void {
    const bounds = this.bounds;
    let i = 0;
    // Linear on purpose: with ~15 bounds and most values in the low buckets this beats a
    // binary search, and it compiles to a tight loop.
    while (i < bounds.length && value > (bounds[i] as number)) i++;
    this.counts[i] = (this.counts[i] as number) + 1;
    this.sum += value;
    this.count++;
  }

  /** Adds another histogram's observations (same bounds: a programming error otherwise). */
  absorb(other: HistogramData): void {
    if (other.counts.length !== this.counts.length)
      throw new Error('histograms of different bounds cannot be added');
    other.counts.forEach((count, i) => (this.counts[i] = (this.counts[i] as number) + count));
    this.sum += other.sum;
    this.count += other.count;
  }

  data(): HistogramData {
    return {
      bounds: this.bounds,
      counts: Array.from(this.counts),
      sum: this.sum,
      count: this.count,
    };
  }
}

/**
 * Journal flush latency buckets (milliseconds, append issued → durable): an fsync here
 * takes ~0.5 ms under load, a slow disk tens of ms, a stalled one seconds.
 */
export const JOURNAL_FLUSH_BOUNDS_MS: readonly number[] = [
  0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000,
];

/** Events per journal record (group commit size): one up to a full batch of commands and more. */
export const JOURNAL_BATCH_EVENTS_BOUNDS: readonly number[] = [
  1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
];
