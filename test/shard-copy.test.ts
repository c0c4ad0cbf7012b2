/**
 * A snapshot's copy runs in slices between batches: each slice ends at its budget of work
 * units or at its deadline on the clock, whichever comes first, and copies at least one
 * customer, so a copy always finishes and holds the thread briefly however slow a unit is.
 */
import { describe, expect, it } from 'vitest';
import { newCustomer, type CustomerSnapshot, type CustomerState } from '../actors/customer.js';
import { ShardCopy } from '../actors/shard-export.js';

function customers(count: number): CustomerState[] {
  return Array.from({ length: count }, (_, i) => newCustomer('test', `c-${i}`, 1_000 + i));
}

/** Steps `copy` until it is done; the number of customers each slice copied. */
function slices(copy: ShardCopy, step: () => boolean, copied: () => number): number[] {
  const sizes: number[] = [];
  let before = copied();
  for (let turn = 0; turn < 1_000; turn++) {
    const finished = step();
    sizes.push(copied() - before);
    before = copied();
    if (finished) return sizes;
  }
  throw new Error(`the copy of ${copy.total} customers did not finish in 1,000 slices`);
}

describe('ShardCopy slices', () => {
  it('copies as many customers as the units allow when the clock is not the bound', () => {
    const copied: CustomerSnapshot[] = [];
    const copy = new ShardCopy(customers(10), (items) => copied.push(...items));
    // A customer without meters is one unit.
    const sizes = slices(
      copy,
      () => copy.step(4),
      () => copied.length,
    );
    expect(sizes).toEqual([4, 4, 2]);
    expect(copied.map((c) => c.id)).toEqual(customers(10).map((c) => c.id));
  });

  it('ends a slice at its deadline, after one customer at least', () => {
    const copied: CustomerSnapshot[] = [];
    const copy = new ShardCopy(customers(5), (items) => copied.push(...items));
    // A deadline already past: each slice copies exactly one customer, whatever the budget.
    const sizes = slices(
      copy,
      () => copy.step(1_000, performance.now() - 1),
      () => copied.length,
    );
    expect(sizes).toEqual([1, 1, 1, 1, 1]);
    expect(new Set(copied.map((c) => c.id)).size).toBe(5);
    expect(copy.done).toBe(5);
  });

  it('stops copying once the deadline passes mid-slice', () => {
    const copied: CustomerSnapshot[] = [];
    // Each customer's keys take a millisecond to read (`keysOf` runs as it is copied), so
    // with a deadline 3.5 ms ahead the clock, not the budget, ends the slice: after at least
    // one customer, and by the fourth (the clock is checked before each).
    const copy = new ShardCopy(
      customers(20),
      (items) => copied.push(...items),
      () => {
        const until = performance.now() + 1;
        while (performance.now() < until) {
          /* a read that costs a millisecond */
        }
        return [];
      },
    );
    copy.step(1_000, performance.now() + 3.5);
    expect(copied.length).toBeGreaterThanOrEqual(1);
    expect(copied.length).toBeLessThanOrEqual(4);
    expect(copy.done).toBe(copied.length);
  });
});
