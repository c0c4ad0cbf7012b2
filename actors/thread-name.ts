/**
 * Names the calling thread in the kernel's process table (`/proc/<pid>/task/<tid>/comm`),
 * so `top -H`, `ps -L` and the benchmark's per-thread CPU accounting can tell the front
 * end from the shard workers (otherwise every thread of a Node process is "node").
 * Linux only; elsewhere, or if the kernel refuses, the name stays as it was.
 */
import fs from 'node:fs';

/** Longest thread name the kernel keeps (16 bytes with the terminating NUL). */
const THREAD_NAME_LENGTH_MAX = 15;

export function nameThisThread(name: string): void {
  try {
    fs.writeFileSync('/proc/thread-self/comm', name.slice(0, THREAD_NAME_LENGTH_MAX));
  } catch {
    // Not Linux, or /proc unavailable: a name is a convenience, never a requirement.
  }
}
