/**
 * Garbage-collection pauses of one thread (one V8 isolate), from a `perf_hooks` GC
 * observer: a histogram of pause lengths and the longest since start.
 *
 * Why it exists: every shard worker and the front end have a heap of their own, and a
 * major GC of a heap holding millions of state objects stops that thread's requests for
 * as long as it runs; only the thread itself can see its collections. Each worker ships
 * its numbers with its stats reply, the front end adds its own, and the metrics route
 * exports them (`tally_gc_pause_seconds`). Observing costs one entry per collection.
 */
import { PerformanceObserver } from 'node:perf_hooks';
import { Histogram, type HistogramData } from './histogram.js';

/** Pause buckets (ms): a scavenge takes well under a millisecond, a stall hundreds. */
export const GC_PAUSE_BOUNDS_MS: readonly number[] = [
  0.5, 1, 2, 5, 10, 15, 20, 30, 50, 100, 250, 1000,
];

/** A thread's GC pauses as they cross to the front end. */
export interface GcPauseStats {
  readonly pausesMs: HistogramData;
  readonly pauseMsMax: number;
}

export class GcPauses {
  private readonly pauses = new Histogram(GC_PAUSE_BOUNDS_MS);
  private pauseMsMax = 0;
  private readonly observer = new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      this.pauses.observe(entry.duration);
      if (entry.duration > this.pauseMsMax) this.pauseMsMax = entry.duration;
    }
  });

  /** Starts observing this thread's collections. */
  constructor() {
    this.observer.observe({ entryTypes: ['gc'] });
  }

  stats(): GcPauseStats {
    return { pausesMs: this.pauses.data(), pauseMsMax: this.pauseMsMax };
  }
}
