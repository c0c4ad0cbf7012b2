/**
 * A snapshot's copy runs in slices between batches: each slice ends at its budget of work
 * units or at its deadline on the clock, whichever comes first, and copies at least one
 * customer (or one read of keys), so a copy always finishes and holds the thread briefly
 * however slow a unit is. An online snapshot's copy reads the idempotency keys after the
 * customers, a unit a key, and writes them in frames of their own.
 */
import { describe, expect, it, vi } from 'vitest';
import { newCustomer, type CustomerSnapshot, type CustomerState } from '../actors/customer.js';
import type { CustomerKeys, KeysAtCut } from '../actors/idempotency-keys.js';
import { ShardCopy } from '../actors/shard-export.js';
import { SNAPSHOT_FRAME_KEYS } from '../storage/snapshot-file.js';

function customerList(count: number): CustomerState[] {
  return Array.from({ length: count }, (_, i) => newCustomer('test', `c-${i}`, 1_000 + i));
}

/** `count` customers in one map, as a shard holds an environment's customers. */
function customers(count: number): Map<string, CustomerState>[] {
  return [new Map(customerList(count).map((customer) => [customer.id, customer]))];
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
    expect(copied.map((c) => c.id)).toEqual(customerList(10).map((c) => c.id));
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
    // A clock that moves a millisecond each time it is read: with a deadline 3.5 ms ahead,
    // the clock, not the budget, ends the slice. It is read before each customer after the
    // first: 0, 1, 2 and 3 let the second to the fifth through, 4 stops the sixth.
    let nowMs = 0;
    const clock = vi.spyOn(performance, 'now').mockImplementation(() => nowMs++);
    try {
      const copy = new ShardCopy(customers(20), (items) => copied.push(...items));
      expect(copy.step(1_000, 3.5)).toBe(false);
      expect(copied).toHaveLength(5);
      expect(copy.done).toBe(5);
    } finally {
      clock.mockRestore();
    }
  });
});

/** A cut of `count` keys, one customer each, that records how many each read gave. */
function keysCut(count: number): KeysAtCut & { reads: number[] } {
  let next = 0;
  const reads: number[] = [];
  return {
    reads,
    get done() {
      return next === count;
    },
    read(budget) {
      const end = Math.min(count, next + budget);
      reads.push(end - next);
      const items: CustomerKeys[] = [];
      for (; next < end; next++) items.push(['test', `c-${next}`, [[`d-${next}`, '1', next]]]);
      return items;
    },
    close() {},
  };
}

describe('ShardCopy cut', () => {
  it('takes the cut without reading a customer, however many there are', () => {
    let yielded = 0;
    const map = customers(1_000)[0] as Map<string, CustomerState>;
    const counted = {
      size: map.size,
      *values() {
        for (const customer of map.values()) {
          yielded++;
          yield customer;
        }
      },
    };
    const copied: CustomerSnapshot[] = [];
    const copy = new ShardCopy([counted], (items) => copied.push(...items));
    expect(copy.total).toBe(1_000);
    expect(yielded).toBe(0);
    expect(copy.step(100)).toBe(false);
    expect(yielded).toBe(100);
  });

  it('copies the customers of the cut, each once, and none added after it', () => {
    const [test, live] = [...customers(6), new Map<string, CustomerState>()] as Map<
      string,
      CustomerState
    >[];
    const liveCustomer = newCustomer('live', 'l-0', 5);
    live?.set(liveCustomer.id, liveCustomer);
    const copied: CustomerSnapshot[] = [];
    const copy = new ShardCopy(
      [test as Map<string, CustomerState>, live as Map<string, CustomerState>],
      (items) => copied.push(...items),
    );
    expect(copy.total).toBe(7);
    expect(copy.step(2)).toBe(false);
    // Written before its turn: copied then, as of the cut, and not again.
    const written = test?.get('c-4') as CustomerState;
    copy.capture(written);
    // Created after the cut, in both maps: not part of the copy.
    for (const [map, customer] of [
      [test, newCustomer('test', 'c-new', 7)],
      [live, newCustomer('live', 'l-new', 8)],
    ] as const) {
      map?.set(customer.id, customer);
      copy.created(customer);
    }
    while (!copy.step(2)) {
      /* to the end */
    }
    expect(copied.map((c) => c.id).sort()).toEqual(
      ['c-0', 'c-1', 'c-2', 'c-3', 'c-4', 'c-5', 'l-0'].sort(),
    );
    expect(copy.done).toBe(7);
  });

  it('runs beside a copy in the other lane, and again after its own, each whole', () => {
    const maps = customers(5);
    const first: CustomerSnapshot[] = [];
    const other: CustomerSnapshot[] = [];
    const copy = new ShardCopy(maps, (items) => first.push(...items));
    const beside = new ShardCopy(maps, (items) => other.push(...items), undefined, 1);
    copy.step(2);
    // A write to a customer neither copy has reached: each copies it once, as of its cut.
    const written = maps[0]?.get('c-3') as CustomerState;
    copy.capture(written);
    beside.capture(written);
    let left = 2;
    while (left > 0) left = Number(!copy.step(1)) + Number(!beside.step(1));
    const ids = customerList(5).map((c) => c.id);
    expect(first.map((c) => c.id).sort()).toEqual(ids);
    expect(other.map((c) => c.id).sort()).toEqual(ids);
    // The next copy in the first lane is not fooled by the marks the last one left.
    const again: CustomerSnapshot[] = [];
    const next = new ShardCopy(maps, (items) => again.push(...items));
    while (!next.step(100)) {
      /* to the end */
    }
    expect(again.map((c) => c.id)).toEqual(ids);
  });

  it('ends its last slice with the last customer of the cut', () => {
    const copy = new ShardCopy(customers(8), () => undefined);
    expect(copy.step(4)).toBe(false);
    expect(copy.step(4)).toBe(true);
  });
});

describe('ShardCopy with idempotency keys', () => {
  it('copies the customers first, then the keys, a unit a key, a frame each slice', () => {
    const copied: CustomerSnapshot[] = [];
    const frames: CustomerKeys[][] = [];
    const cut = keysCut(SNAPSHOT_FRAME_KEYS + 1000);
    const copy = new ShardCopy(customers(10), (items) => copied.push(...items), {
      cut,
      sink: (items) => frames.push(items),
    });
    // The first slice: ten customers, then keys for the 490 units left, written before the
    // slice ends (nothing it read is held across batches).
    expect(copy.step(500)).toBe(false);
    expect(copied).toHaveLength(10);
    expect(cut.reads.reduce((a, b) => a + b, 0)).toBe(490);
    expect(frames.map((frame) => frame.length)).toEqual([490]);
    let turns = 1;
    while (!copy.step(500)) turns++;
    // 10 + 5,096 units at 500 a slice: eleven slices, a frame each.
    expect(turns + 1).toBe(11);
    expect(frames.map((frame) => frame.length)).toEqual([490, ...Array(9).fill(500), 106]);
    expect(frames.flat().map((item) => item[1])).toEqual(
      Array.from({ length: SNAPSHOT_FRAME_KEYS + 1000 }, (_, i) => `c-${i}`),
    );
  });

  it('writes a frame once it holds SNAPSHOT_FRAME_KEYS, however large a slice', () => {
    const frames: CustomerKeys[][] = [];
    const cut = keysCut(SNAPSHOT_FRAME_KEYS + 1000);
    const copy = new ShardCopy([], () => undefined, { cut, sink: (items) => frames.push(items) });
    expect(copy.step(100_000)).toBe(true);
    // Reads of 256 at most: the first frame ends at the read that takes it past the bound.
    expect(frames).toHaveLength(2);
    expect(frames[0]?.length).toBeGreaterThanOrEqual(SNAPSHOT_FRAME_KEYS);
    expect(frames[0]?.length).toBeLessThan(SNAPSHOT_FRAME_KEYS + 256);
    expect(frames.flat()).toHaveLength(SNAPSHOT_FRAME_KEYS + 1000);
  });

  it('ends a slice of keys at its deadline, after one read at least', () => {
    const cut = keysCut(1000);
    const copy = new ShardCopy([], () => undefined, { cut, sink: () => undefined });
    expect(copy.step(1_000, performance.now() - 1)).toBe(false);
    expect(cut.reads).toEqual([256]);
    while (!copy.step(1_000)) {
      /* to the end */
    }
    expect(cut.done).toBe(true);
  });
});
