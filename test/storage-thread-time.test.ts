import { existsSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { threadRunMs, threadRunMsSince } from '../storage/thread-time.js';

const linux = existsSync('/proc/thread-self/schedstat');

describe('a thread’s time on a core', () => {
  it.runIf(linux)('grows while the thread works and not while it waits', async () => {
    const start = threadRunMs();
    expect(start).not.toBeNull();
    // Work until the thread has run 20 ms more (a clock budget ends a reading that never moves).
    const deadline = performance.now() + 5_000;
    let ran = 0;
    while (ran < 20 && performance.now() < deadline) ran = threadRunMsSince(start) ?? 0;
    expect(ran).toBeGreaterThanOrEqual(20);

    const idle = threadRunMs();
    const clockStart = performance.now();
    await sleep(100);
    const clock = performance.now() - clockStart;
    expect(clock).toBeGreaterThanOrEqual(99);
    expect(threadRunMsSince(idle)).toBeLessThan(clock / 2);
  });

  it('is null where there is nothing to subtract from', () => {
    expect(threadRunMsSince(null)).toBeNull();
  });
});
