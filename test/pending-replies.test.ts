import { describe, expect, it } from 'vitest';
import { FRONT_ENDS_MAX } from '../shared/limits.js';
import { PendingReplies, SLOTS_MAX } from '../src/pending-replies.js';

describe('PendingReplies', () => {
  it('hands each handler back once, by the id it gave, whatever the order of replies', () => {
    const pending = new PendingReplies<string>(3);
    const ids = ['a', 'b', 'c', 'd'].map((h) => [h, pending.add(h)] as const);
    expect(new Set(ids.map(([, id]) => id)).size).toBe(4);
    expect(pending.size).toBe(4);
    for (const index of [2, 0, 3, 1]) {
      const [handler, id] = ids[index] as (typeof ids)[number];
      expect(id % FRONT_ENDS_MAX).toBe(3);
      expect(pending.take(id)).toBe(handler);
      expect(pending.take(id)).toBeUndefined();
    }
    expect(pending.size).toBe(0);
  });

  it('refuses a repeated id after its slot was taken again, and ids of other front ends', () => {
    const pending = new PendingReplies<string>(0);
    const first = pending.add('first');
    expect(pending.take(first)).toBe('first');
    const second = pending.add('second');
    // The slot is reused (nothing else waits), under a new id.
    expect(second).not.toBe(first);
    expect(Math.floor(second / FRONT_ENDS_MAX) % SLOTS_MAX).toBe(
      Math.floor(first / FRONT_ENDS_MAX) % SLOTS_MAX,
    );
    expect(pending.take(first)).toBeUndefined();
    expect(pending.take(second + 1)).toBeUndefined();
    for (const bad of [-FRONT_ENDS_MAX, 1.5, Number.NaN, 2 ** 60]) {
      expect(pending.take(bad)).toBeUndefined();
    }
    expect(pending.take(second)).toBe('second');
  });

  it('keeps slots no wider than the most requests ever waiting at once', () => {
    const pending = new PendingReplies<number>(1);
    const seen = new Set<number>();
    let waiting: number[] = [];
    for (let i = 0; i < 10_000; i++) {
      waiting.push(pending.add(i));
      if (waiting.length === 128) {
        for (const id of waiting) {
          seen.add(Math.floor(id / FRONT_ENDS_MAX) % SLOTS_MAX);
          expect(pending.take(id)).toBeTypeOf('number');
        }
        waiting = [];
      }
    }
    expect(seen.size).toBe(128);
  });

  it('rejects a front end number out of range', () => {
    expect(() => new PendingReplies(FRONT_ENDS_MAX)).toThrow(/front end/);
    expect(() => new PendingReplies(-1)).toThrow(/front end/);
  });
});
