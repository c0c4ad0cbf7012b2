import { describe, expect, it } from 'vitest';
import { pairRatios, type KeyedRun } from '../bench/keyed-ratios.js';

const run = (perSec: number): KeyedRun => ({ perSec, cpuUsPerRequest: {} });

describe('keyed against unkeyed pairs', () => {
  it('gives each pair’s keyed ÷ unkeyed throughput in pair order, and their median', () => {
    const odd = pairRatios([run(100), run(200), run(50)], [run(80), run(100), run(45)]);
    expect(odd.ratios).toEqual([0.8, 0.5, 0.9]);
    expect(odd.median).toBe(0.8);
    const even = pairRatios([run(100), run(100), run(100), run(100)], [70, 90, 60, 80].map(run));
    expect(even.median).toBeCloseTo(0.75, 10);
  });

  it('pairs only complete pairs, and refuses none', () => {
    expect(pairRatios([run(100), run(100)], [run(90)]).ratios).toEqual([0.9]);
    expect(() => pairRatios([run(100)], [])).toThrow(/no complete pair/);
  });
});
