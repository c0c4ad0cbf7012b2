/** What `bench:keyed` (keyed-pairs.ts) reports of its runs, apart from the runs. */

export interface KeyedRun {
  readonly perSec: number;
  /** CPU µs per consume by thread group (thread-cpu.ts). */
  readonly cpuUsPerRequest: Readonly<Record<string, number>>;
  /** The share of the machine's CPU the host took meanwhile (steal), in percent. */
  readonly stealPercent?: number;
  /** The share of the machine's CPU no thread used meanwhile, in percent. */
  readonly idlePercent?: number;
  /** wrk's own CPU per consume, in µs (it shares the machine). */
  readonly loadCpuUsPerRequest?: number;
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
  return { ratios, median: median(ratios) };
}

/**
 * The order of pair `pair`'s runs (from 1): unkeyed first in odd pairs, keyed first in even
 * ones, so a machine that speeds up or slows down through the pairs favours neither kind.
 */
export function pairOrder(pair: number): readonly ('none' | 'unique')[] {
  return pair % 2 === 1 ? ['none', 'unique'] : ['unique', 'none'];
}

/**
 * The most steal (percent) a run may have seen and still count as quiet: on a shared
 * machine a run the host took more from is slower for that alone, and a pair whose runs
 * saw different steal says little about keys.
 */
export const QUIET_STEAL_PERCENT = 5;

/**
 * The ratios of the pairs whose two runs both saw at most `maxSteal` percent of steal (a
 * run with no steal figure is not counted quiet), in pair order, with their pair numbers
 * (from 1) and their median (NaN for none).
 */
export function quietPairRatios(
  unkeyed: readonly KeyedRun[],
  keyed: readonly KeyedRun[],
  maxSteal = QUIET_STEAL_PERCENT,
): {
  readonly pairs: readonly number[];
  readonly ratios: readonly number[];
  readonly median: number;
} {
  const quiet = (run: KeyedRun): boolean =>
    run.stealPercent !== undefined && run.stealPercent <= maxSteal;
  const { ratios: all } = pairRatios(unkeyed, keyed);
  const pairs = all.flatMap((_, i) =>
    quiet(unkeyed[i] as KeyedRun) && quiet(keyed[i] as KeyedRun) ? [i + 1] : [],
  );
  const ratios = pairs.map((pair) => all[pair - 1] as number);
  return { pairs, ratios, median: median(ratios) };
}

/** The median of `values` (the mean of the middle two for an even count); NaN for none. */
export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1
    ? (sorted[middle] as number)
    : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}

/**
 * A 95% interval for the median of the distribution `values` are drawn from, free of any
 * assumption about its shape: the k-th smallest and k-th largest value, with k the largest
 * such that fewer than k of n values fall below the median with probability at most 2.5%
 * (binomial, one half each). Twelve pairs give the 3rd and 10th (96.1%), six the least and
 * the most (96.9%); under six no interval reaches 95%: null. A median whose interval lies
 * above a target holds it robustly; one whose interval straddles it says no more than that
 * the pairs cannot tell.
 */
export function medianInterval(
  values: readonly number[],
): { readonly low: number; readonly high: number; readonly coverage: number } | null {
  const n = values.length;
  // Grow k while P(Binomial(n, 1/2) <= k), the chance that no more than k fall below the
  // median, stays within 2.5%; `below` is P(... <= k - 1) for the k reached.
  let k = 0;
  let below = 0;
  let term = 0.5 ** n;
  while (k < n && below + term <= 0.025) {
    below += term;
    term = (term * (n - k)) / (k + 1);
    k += 1;
  }
  if (k === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return {
    low: sorted[k - 1] as number,
    high: sorted[n - k] as number,
    coverage: 1 - 2 * below,
  };
}

/** One step of a paced ladder: the rate asked for and what got through. */
export interface LadderStep {
  readonly askedPerSec: number;
  readonly perSec: number;
}

/** The share of the rate asked for a step must get through for the ladder to go on. */
export const HELD_SHARE = 0.97;

/** Whether a step's rate held: at least HELD_SHARE of it got through. */
export function held(step: LadderStep): boolean {
  return step.perSec >= HELD_SHARE * step.askedPerSec;
}

/** Steps in a row that must fall behind to end a ladder: one slow moment does not. */
export const MISSES_TO_STOP = 2;

/** Whether a paced ladder goes on after `steps`: not its last MISSES_TO_STOP all behind. */
export function ladderGoesOn(steps: readonly LadderStep[]): boolean {
  const last = steps.slice(-MISSES_TO_STOP);
  return last.length < MISSES_TO_STOP || last.some(held);
}

/**
 * The highest rate a paced ladder held (a step that got HELD_SHARE of it through), or null
 * if none held: the rate to pace a soak at, where the peak may be a step that fell behind.
 */
export function highestHeld(steps: readonly LadderStep[]): number | null {
  let highest: number | null = null;
  for (const step of steps)
    if (held(step) && (highest === null || step.askedPerSec > highest)) highest = step.askedPerSec;
  return highest;
}

/**
 * The most a paced ladder got through: the highest rate of any step (a server keeps up
 * until the rate asked for passes what it can sustain; past that, steps get less
 * through and the ladder stops). Null for no step.
 */
export function ladderPeak<Step extends LadderStep>(steps: readonly Step[]): Step | null {
  let peak: Step | null = null;
  for (const step of steps) if (peak === null || step.perSec > peak.perSec) peak = step;
  return peak;
}
