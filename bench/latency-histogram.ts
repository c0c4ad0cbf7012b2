/**
 * A fixed-resolution latency histogram for the benchmark.
 *
 * autocannon's own histogram has 1 ms resolution (its lowest discernible value is 1), too
 * coarse for a "p99 ≤ 2 ms" target, and its results cannot be merged across the
 * alternating segments of one scenario without its internals. This one records every
 * 2xx response time (from autocannon's `response` event, which it emits anyway) into
 * 10 µs buckets up to LATENCY_MS_MAX, merges by adding counts, and reports percentiles as
 * the upper edge of the bucket that holds them (so they never under-report).
 */

const BUCKET_US = 10;
/** Anything slower lands in the overflow bucket and is reported as this value. */
const LATENCY_MS_MAX = 2_000;
const BUCKET_COUNT = (LATENCY_MS_MAX * 1_000) / BUCKET_US + 1;

export class LatencyHistogram {
  private readonly counts = new Float64Array(BUCKET_COUNT);
  private total = 0;
  private maxMs = 0;

  record(latencyMs: number): void {
    const bucket = Math.min(Math.floor((latencyMs * 1_000) / BUCKET_US), BUCKET_COUNT - 1);
    this.counts[bucket] = (this.counts[bucket] ?? 0) + 1;
    this.total += 1;
    if (latencyMs > this.maxMs) this.maxMs = latencyMs;
  }

  merge(other: LatencyHistogram): void {
    for (let i = 0; i < BUCKET_COUNT; i++)
      this.counts[i] = (this.counts[i] ?? 0) + (other.counts[i] ?? 0);
    this.total += other.total;
    this.maxMs = Math.max(this.maxMs, other.maxMs);
  }

  get count(): number {
    return this.total;
  }

  get max(): number {
    return this.maxMs;
  }

  /** The latency (ms) at quantile q in [0, 1]; NaN when nothing was recorded. */
  quantileMs(q: number): number {
    if (this.total === 0) return Number.NaN;
    const rank = Math.max(1, Math.ceil(q * this.total));
    let seen = 0;
    for (let i = 0; i < BUCKET_COUNT; i++) {
      seen += this.counts[i] ?? 0;
      if (seen >= rank) return Math.min(((i + 1) * BUCKET_US) / 1_000, this.maxMs);
    }
    return this.maxMs;
  }
}
