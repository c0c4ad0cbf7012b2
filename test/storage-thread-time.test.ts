import { existsSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { lessWaits, threadWaitMs, threadWaitMsSince } from '../storage/thread-time.js';

const linux = existsSync('/proc/thread-self/schedstat');

/** Works on this thread for `ms` of the clock. */
function spin(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end);
}

describe('a thread’s waits for a core', () => {
  it.runIf(linux)('count while other threads have the cores, not while it sleeps', async () => {
    const idle = threadWaitMs();
    expect(idle).not.toBeNull();
    await sleep(100);
    expect(threadWaitMsSince(idle)).toBeLessThan(20);

    // Twice as many spinning threads as cores: this one waits about half the time it spins.
    const stop = new Int32Array(new SharedArrayBuffer(4));
    const spinners = Array.from(
      { length: 2 * availableParallelism() },
      () =>
        new Worker(
          'const { workerData } = require("node:worker_threads");' +
            'while (Atomics.load(workerData, 0) === 0);',
          { eval: true, workerData: stop },
        ),
    );
    try {
      await Promise.all(spinners.map((w) => new Promise((resolve) => w.once('online', resolve))));
      const started = threadWaitMs();
      const clockStart = performance.now();
      spin(300);
      const clock = performance.now() - clockStart;
      const waited = threadWaitMsSince(started);
      expect(waited).toBeGreaterThan(30);
      expect(waited).toBeLessThan(clock);
      expect(lessWaits(clock, waited)).toBeCloseTo(clock - (waited ?? 0), 6);
    } finally {
      Atomics.store(stop, 0, 1);
      await Promise.all(spinners.map((w) => w.terminate()));
    }
  });

  it('are unknown where there is nothing to subtract from', () => {
    expect(threadWaitMsSince(null)).toBeNull();
    expect(lessWaits(4, null)).toBeNull();
    expect(lessWaits(4, 1.5)).toBe(2.5);
  });
});
