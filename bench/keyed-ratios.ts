/** What `bench:keyed` (keyed-pairs.ts) reports of its runs, apart from the runs. */

export interface KeyedRun {
  readonly perSec: number;
  /** CPU µs per consume by thread group (thread-cpu.ts). */
  readonly cpuUsPerRequest: Readonly<Record<string, number>>;
}

/** Each pair's keyed ÷ unkeyed throughput, in pair order, and their median. */
export function pairRatios(
  unkeyed: readonly KeyedRun[],
  keyed: readonly KeyedRun[],
): { readonly ratios: readonly number[]; readonly median: number } {
  const pairs = Math.min(unkeyed.length, keyed.length);
  if (pairs === 0) throw new Error('no complete pair of runs');
  const ratios = Array.from(
    { length: pairs },
    (_, i) => (keyed[i] as KeyedRun).perSec / (unkeyed[i] as KeyedRun).perSec,
  );
  const sorted = [...ratios].sort((a, b) => a - b);
  const middle = Math.floor(pairs / 2);
  const median =
    pairs % 2 === 1
      ? (sorted[middle] as number)
      : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
  return { ratios, median };
}
