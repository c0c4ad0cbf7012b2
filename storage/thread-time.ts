/**
 * How long the calling thread has waited for a core, from Linux's
 * `/proc/thread-self/schedstat` (its second field: nanoseconds spent runnable in a run
 * queue). A stretch of work timed by the clock also counts the time the thread waited while
 * other threads had the cores; the clock less this wait is the stretch's own work (and any
 * blocking on I/O). The wait is added up each time the thread gets a core back, so it is
 * exact when read from the running thread. (The first field, the time run, is brought up
 * to date only at the scheduler's ticks, milliseconds apart, so it cannot time a slice of
 * a few milliseconds.) Null where the file is missing: other systems, or a kernel without
 * scheduler statistics.
 */
import { readFileSync } from 'node:fs';

const SCHEDSTAT = '/proc/thread-self/schedstat';

let available = true;

/** Milliseconds the calling thread has waited for a core since it started, or null. */
export function threadWaitMs(): number | null {
  if (!available) return null;
  try {
    const fields = readFileSync(SCHEDSTAT, 'latin1').split(' ');
    const ns = Number(fields[1]);
    if (fields.length >= 2 && Number.isFinite(ns)) return ns / 1e6;
  } catch {
    // Fall through: not Linux, or no scheduler statistics.
  }
  available = false;
  return null;
}

/** `threadWaitMs()` now less `since` (ms), or null when either is unknown. */
export function threadWaitMsSince(since: number | null): number | null {
  if (since === null) return null;
  const now = threadWaitMs();
  return now === null ? null : now - since;
}

/** A stretch's clock time less the thread's waits for a core in it (null: unknown). */
export function lessWaits(clockMs: number, waitedMs: number | null): number | null {
  return waitedMs === null ? null : Math.max(0, clockMs - waitedMs);
}
