/**
 * CPU time per thread of a server process, from `/proc/<pid>/task/<tid>/stat`, grouped the
 * way Tally names its threads: the front end (`tally-main`), each shard worker
 * (`tally-shard-N`), and everything else (V8's GC and compiler threads, libuv's pool,
 * LMDB's writer). Sampled before and after a measured segment, the difference divided by
 * the requests answered is CPU per request per thread: steadier than throughput on a
 * shared machine, and it says which thread a change made cheaper.
 *
 * A process whose threads carry no such names (the bare server) has its main thread
 * (tid = pid) counted as `main`. Linux only: elsewhere every sample is empty.
 */
import fs from 'node:fs';

/**
 * Kernel clock ticks per second in /proc's time fields (USER_HZ; 100 on every Linux build in use).
 */
const TICKS_PER_SEC = 100;

export type ThreadTicks = ReadonlyMap<string, number>;

/**
 * utime + stime (ticks) of every thread of `pid`, by group name ('main', 'tally-shard-0', …,
 * 'other').
 */
export function sampleThreads(pid: number): ThreadTicks {
  const ticks = new Map<string, number>();
  let tids: string[];
  try {
    tids = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    return ticks;
  }
  for (const tid of tids) {
    const group = groupOf(pid, tid);
    const stat = readOrNull(`/proc/${pid}/task/${tid}/stat`);
    if (group === null || stat === null) continue; // the thread ended meanwhile
    // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const used = Number(fields[11]) + Number(fields[12]);
    ticks.set(group, (ticks.get(group) ?? 0) + used);
  }
  return ticks;
}

function groupOf(pid: number, tid: string): string | null {
  const name = readOrNull(`/proc/${pid}/task/${tid}/comm`)?.trim();
  if (name === undefined) return null;
  if (name === 'tally-main' || tid === String(pid)) return 'main';
  return name.startsWith('tally-shard-') ? name : 'other';
}

function readOrNull(file: string): string | null {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch {
    return null;
  }
}

/** CPU seconds per group between two samples (threads that appeared meanwhile count from zero). */
export function cpuSecondsBetween(before: ThreadTicks, after: ThreadTicks): Map<string, number> {
  const seconds = new Map<string, number>();
  for (const [group, ticks] of after)
    seconds.set(group, Math.max(0, ticks - (before.get(group) ?? 0)) / TICKS_PER_SEC);
  return seconds;
}

/** Adds `more` into `total`, group by group. */
export function addCpu(total: Map<string, number>, more: ReadonlyMap<string, number>): void {
  for (const [group, value] of more) total.set(group, (total.get(group) ?? 0) + value);
}

/** CPU µs per request of each thread group, from its CPU seconds over `requests` requests. */
export function cpuUsPerRequest(
  cpu: ReadonlyMap<string, number>,
  requests: number,
): Record<string, number> {
  return Object.fromEntries(
    [...cpu].map(([group, seconds]) => [group, (seconds * 1e6) / Math.max(1, requests)]),
  );
}

/** The machine's CPU time so far, in ticks: all of it, and what the hypervisor took (steal). */
export interface MachineTicks {
  readonly total: number;
  readonly steal: number;
  /** Ticks no thread ran (idle, and idle waiting for the disk). */
  readonly idle: number;
}

/**
 * The first line of `/proc/stat` (every CPU summed): null where there is none. Steal is
 * time a virtual CPU was ready to run but the host ran something else; on a shared
 * machine it moves throughput by tens of percent while the process's own CPU per request
 * barely changes.
 */
export function sampleMachine(): MachineTicks | null {
  const line = readOrNull('/proc/stat')?.split('\n')[0];
  if (line === undefined || !line.startsWith('cpu ')) return null;
  const fields = line.trim().split(/\s+/).slice(1).map(Number);
  // user nice system idle iowait irq softirq steal (guest time is already in user).
  const total = fields.slice(0, 8).reduce((sum, value) => sum + value, 0);
  return { total, steal: fields[7] ?? 0, idle: (fields[3] ?? 0) + (fields[4] ?? 0) };
}

/**
 * The share of the machine's CPU time between two samples that `part` counts, in percent (0
 * when a sample is missing or no time passed).
 */
function sharePercent(
  before: MachineTicks | null,
  after: MachineTicks | null,
  part: 'steal' | 'idle',
): number {
  if (before === null || after === null || after.total <= before.total) return 0;
  return (100 * (after[part] - before[part])) / (after.total - before.total);
}

/** The share of the machine's CPU time the host took between two samples, in percent. */
export function stealPercent(before: MachineTicks | null, after: MachineTicks | null): number {
  return sharePercent(before, after, 'steal');
}

/**
 * The share of the machine's CPU time no thread used between two samples, in percent: a
 * server that leaves cores idle under load is bound by how long a request waits on each
 * thread of its path in turn, not by the CPU left.
 */
export function idlePercent(before: MachineTicks | null, after: MachineTicks | null): number {
  return sharePercent(before, after, 'idle');
}
