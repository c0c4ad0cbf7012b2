import { describe, expect, it } from 'vitest';
import {
  held,
  highestHeld,
  ladderGoesOn,
  ladderPeak,
  median,
  medianInterval,
  pairOrder,
  pairRatios,
  quietPairRatios,
  type KeyedRun,
  type LadderStep,
} from '../bench/keyed-ratios.js';
import { idlePercent, sampleMachine, stealPercent } from '../bench/thread-cpu.js';

const run = (perSec: number): KeyedRun => ({ perSec, cpuUsPerRequest: {} });

describe('keyed against unkeyed pairs', () => {
  it('gives each pair’s keyed ÷ unkeyed throughput in pair order, and their median', () => {
    const odd = pairRatios([run(100), run(200), run(50)], [run(80), run(100), run(45)]);
    expect(odd.ratios).toEqual([0.8, 0.5, 0.9]);
    expect(odd.median).toBe(0.8);
    const even = pairRatios([run(100), run(100), run(100), run(100)], [70, 90, 60, 80].map(run));
    expect(even.median).toBeCloseTo(0.75, 10);
  });

  it('takes the median of odd and even counts, and NaN of none', () => {
    expect(median([3, 1, 2])).toBe(2);
    expect(median([20_000, 23_000, 20_000, 21_000])).toBe(20_500);
    expect(median([])).toBeNaN();
  });

  it('gives a 95% interval of the median from order statistics, from six values on', () => {
    // Twelve pairs: the 3rd smallest and the 3rd largest, 1 - 2 * 79 / 4096 of the time.
    const twelve = [0.73, 0.98, 0.91, 1.13, 0.92, 0.85, 0.56, 0.81, 0.93, 0.9, 0.96, 1.03];
    const interval = medianInterval(twelve);
    expect(interval).not.toBeNull();
    expect(interval?.low).toBe(0.81);
    expect(interval?.high).toBe(0.98);
    expect(interval?.coverage).toBeCloseTo(1 - (2 * 79) / 4096, 12);
    // Six: the least and the most (1 - 2 / 64); five reach no 95% interval.
    expect(medianInterval([5, 1, 4, 2, 6, 3])).toEqual({ low: 1, high: 6, coverage: 1 - 2 / 64 });
    expect(medianInterval([1, 2, 3, 4, 5])).toBeNull();
    expect(medianInterval([])).toBeNull();
    // Every interval covers at least 95%, and one rank further in would not.
    for (let n = 6; n <= 60; n++) {
      const values = Array.from({ length: n }, (_, i) => i + 1);
      const found = medianInterval(values);
      expect(found?.coverage).toBeGreaterThanOrEqual(0.95);
      const k = found?.low as number;
      expect(found?.high).toBe(n + 1 - k);
      expect(1 - 2 * binomialAtMost(n, k)).toBeLessThan(0.95);
    }
  });

  it('takes the quiet pairs apart: both runs at most 5% steal, a run without a figure not', () => {
    const at = (perSec: number, stealPercent?: number): KeyedRun => ({
      ...run(perSec),
      ...(stealPercent === undefined ? {} : { stealPercent }),
    });
    const unkeyed = [at(100, 1), at(100, 9), at(100, 5), at(100, 0), at(100)];
    const keyed = [at(80, 5), at(120, 0), at(90, 2), at(70, 6), at(60, 0)];
    const quiet = quietPairRatios(unkeyed, keyed);
    expect(quiet.pairs).toEqual([1, 3]);
    expect(quiet.ratios).toEqual([0.8, 0.9]);
    expect(quiet.median).toBeCloseTo(0.85, 10);
    expect(quietPairRatios(unkeyed, keyed, 10).pairs).toEqual([1, 2, 3, 4]);
    expect(quietPairRatios(unkeyed, keyed, 0).median).toBeNaN();
  });

  it('runs unkeyed first in odd pairs and keyed first in even ones', () => {
    expect([1, 2, 3, 4].map((pair) => pairOrder(pair).join(' then '))).toEqual([
      'none then unique',
      'unique then none',
      'none then unique',
      'unique then none',
    ]);
  });

  it('pairs only complete pairs, and refuses none', () => {
    expect(pairRatios([run(100), run(100)], [run(90)]).ratios).toEqual([0.9]);
    expect(() => pairRatios([run(100)], [])).toThrow(/no complete pair/);
  });
});

describe('a paced ladder', () => {
  const step = (askedPerSec: number, perSec: number): LadderStep => ({ askedPerSec, perSec });

  it('holds a step that gets at least 97% of its rate through', () => {
    expect(held(step(20_000, 19_400))).toBe(true);
    expect(held(step(20_000, 19_399))).toBe(false);
    expect(held(step(20_000, 20_050))).toBe(true);
  });

  it('goes on until two steps in a row fall behind', () => {
    const fine = step(16_000, 16_000);
    const behind = step(17_000, 15_000);
    expect(ladderGoesOn([])).toBe(true);
    expect(ladderGoesOn([fine])).toBe(true);
    expect(ladderGoesOn([behind])).toBe(true);
    expect(ladderGoesOn([fine, behind])).toBe(true);
    expect(ladderGoesOn([fine, behind, fine])).toBe(true);
    expect(ladderGoesOn([fine, behind, behind])).toBe(false);
    expect(ladderGoesOn([behind, behind])).toBe(false);
  });

  it('names the highest rate held, which may lie below the peak', () => {
    // The peak (20,724 through) was asked 22,000/s and fell behind; 20,000/s held.
    const steps = [step(20_000, 19_657), step(21_000, 20_350), step(22_000, 20_724)];
    expect(highestHeld(steps)).toBe(20_000);
    expect(highestHeld([step(20_000, 19_000)])).toBeNull();
    expect(highestHeld([])).toBeNull();
  });

  it('peaks at the step that got the most through, held or not', () => {
    const steps = [step(16_000, 15_990), step(17_000, 16_980), step(18_000, 17_100)];
    expect(ladderPeak(steps)).toBe(steps[2]);
    const fell = [step(20_000, 19_900), step(21_000, 19_700)];
    expect(ladderPeak(fell)).toBe(fell[0]);
    expect(ladderPeak([])).toBeNull();
  });
});

describe("the machine's ticks: the host's share (steal) and the unused share (idle)", () => {
  it('is the steal ticks over all ticks between two samples, in percent', () => {
    const at = (total: number, steal: number) => ({ total, steal, idle: 0 });
    expect(stealPercent(at(1_000, 10), at(1_400, 70))).toBe(15);
    expect(stealPercent(at(1_000, 10), at(1_000, 10))).toBe(0);
    expect(stealPercent(null, at(1_400, 70))).toBe(0);
  });

  it('and the share no thread used (idle) is the idle ticks over all ticks, in percent', () => {
    const at = (total: number, idle: number) => ({ total, steal: 0, idle });
    expect(idlePercent(at(1_000, 300), at(1_400, 400))).toBe(25);
    expect(idlePercent(at(1_000, 300), at(1_000, 300))).toBe(0);
    expect(idlePercent(at(1_000, 300), null)).toBe(0);
  });

  it('reads the machine’s ticks from /proc/stat, rising with time', () => {
    const before = sampleMachine();
    expect(before).not.toBeNull();
    const end = Date.now() + 50;
    while (Date.now() < end); // busy for five ticks
    const after = sampleMachine();
    expect((after?.total ?? 0) - (before?.total ?? 0)).toBeGreaterThan(0);
    expect(after?.steal).toBeGreaterThanOrEqual(before?.steal ?? 0);
    expect(after?.idle).toBeGreaterThanOrEqual(before?.idle ?? 0);
    expect((after?.idle ?? 0) - (before?.idle ?? 0)).toBeLessThanOrEqual(
      (after?.total ?? 0) - (before?.total ?? 0),
    );
  });
});

/** P(Binomial(n, 1/2) <= k), summed exactly enough for n up to 60. */
function binomialAtMost(n: number, k: number): number {
  let sum = 0;
  let choose = 1;
  for (let j = 0; j <= k; j++) {
    sum += choose;
    choose = (choose * (n - j)) / (j + 1);
  }
  return sum / 2 ** n;
}
