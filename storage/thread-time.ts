/**
 * The calling thread's time on a core, from Linux's `/proc/thread-self/schedstat` (its first
 * field: nanoseconds run). A stretch of work timed by the clock also counts the time the
 * thread waited for a core while others ran; this is the part it ran. Null where the file
 * is missing (other systems, or a kernel without schedstats).
 */
import { readFileSync } from 'node:fs';

const SCHEDSTAT = '/proc/thread-self/schedstat';

let available = true;

/** Milliseconds the calling thread has run on a core since it started, or null. */
export function threadRunMs(): number | null {
  if (!available) return null;
  try {
    const text = readFileSync(SCHEDSTAT, 'latin1');
    const end = text.indexOf(' ');
    const ns = Number(end < 0 ? text : text.slice(0, end));
    if (Number.isFinite(ns)) return ns / 1e6;
  } catch {
    // Fall through: not Linux, or no schedstats.
  }
  available = false;
  return null;
}

/** `threadRunMs()` now less `since` (ms), or null when either is unknown. */
export function threadRunMsSince(since: number | null): number | null {
  if (since === null) return null;
  const now = threadRunMs();
  return now === null ? null : now - since;
}
