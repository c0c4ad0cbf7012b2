/**
 * Idempotency keys off the heap: the key table on a real LMDB environment (lookups, a
 * customer's keys, the sweep), and the shard's window in front of it (a key is found
 * while its record is in flight, and from disk once the window has let it go).
 */
import { describe, expect, it } from 'vitest';
import type { Command, Event } from '../actors/customer.js';
import {
  IdempotencyKeys,
  NO_STORED_KEYS,
  scopeDigest,
  type IdempotencyPut,
} from '../actors/idempotency-keys.js';
import { KeySweeper } from '../actors/idempotency-upkeep.js';
import { Shard } from '../actors/shard.js';
import { ShardStore } from '../storage/journal.js';
import { CONFIG, T0 } from './support/core-fixtures.js';
import { storeFixture } from './support/store-fixture.js';

const fixture = storeFixture('tally-idem-', (dir) => ShardStore.open(dir));
const openStore = (): ShardStore => fixture.openStore(fixture.tempDir());

const tick = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 5));

function put(customerId: string, key: string, atMs: number, amount = '1'): IdempotencyPut {
  return {
    environment: 'test',
    customerId,
    scopeDigest: scopeDigest(`consume\u0000storage\u0000${key}`),
    fingerprint: amount,
    atMs,
  };
}

/** Stores `puts` in one transaction, beside a journal record, as the worker does. */
async function store(target: ShardStore, puts: readonly IdempotencyPut[]): Promise<void> {
  const { durable } = target.append([]);
  target.idempotency.put(puts);
  await durable;
}

describe('the key table', () => {
  it('answers a key, and a customer its own keys only', async () => {
    const s = openStore();
    await store(s, [put('c-1', 'a', T0), put('c-1', 'b', T0 + 1, '7'), put('c-10', 'a', T0)]);
    expect(s.idempotency.get(put('c-1', 'b', 0))).toEqual({ fingerprint: '7', atMs: T0 + 1 });
    expect(s.idempotency.get(put('c-2', 'b', 0))).toBeUndefined();
    expect(s.idempotency.customerKeys('test', 'c-1').map(([, fp, at]) => [fp, at])).toEqual(
      expect.arrayContaining([
        ['1', T0],
        ['7', T0 + 1],
      ]),
    );
    expect(s.idempotency.customerKeys('test', 'c-1')).toHaveLength(2);
    expect(s.idempotency.customerKeys('live', 'c-1')).toEqual([]);
    expect([s.idempotency.countOf('test'), s.idempotency.countOf('live')]).toEqual([3, 0]);
    expect(s.idempotency.size).toBe(3);
  });

  it('sweeps the keys used before a time, oldest first, a slice at a time', async () => {
    const s = openStore();
    await store(
      s,
      Array.from({ length: 5 }, (_, i) => put('c', `k${i}`, T0 + i * 10)),
    );
    const first = s.idempotency.sweep(T0 + 25, 2, () => false);
    expect(first.scanned).toBe(2);
    expect(first.removed.map((a) => a.scopeDigest)).toEqual([
      put('c', 'k0', 0).scopeDigest,
      put('c', 'k1', 0).scopeDigest,
    ]);
    await first.committed;
    const second = s.idempotency.sweep(T0 + 25, 2, () => false);
    expect(second.removed).toHaveLength(1); // k2; k3 and k4 are younger
    await second.committed;
    expect(s.idempotency.size).toBe(2);
    expect(s.idempotency.get(put('c', 'k0', 0))).toBeUndefined();
    expect(s.idempotency.get(put('c', 'k3', 0))).toEqual({ fingerprint: '1', atMs: T0 + 30 });
    expect(s.idempotency.sweep(T0 + 25, 2, () => false).scanned).toBe(0);
  });

  it('keeps a key used again since (on disk or in memory), dropping its stale expiry', async () => {
    const s = openStore();
    await store(s, [put('c', 'again', T0), put('c', 'pending', T0)]);
    await store(s, [put('c', 'again', T0 + 100)]); // used again after it expired
    const slice = s.idempotency.sweep(
      T0 + 50,
      10,
      (address) => address.scopeDigest === put('c', 'pending', 0).scopeDigest,
    );
    expect(slice.scanned).toBe(2);
    expect(slice.removed).toEqual([]);
    await slice.committed;
    expect(s.idempotency.get(put('c', 'again', 0))?.atMs).toBe(T0 + 100);
    expect(s.idempotency.get(put('c', 'pending', 0))?.atMs).toBe(T0);
    // Their old expiry entries are gone: a later sweep finds only the newer use.
    expect(s.idempotency.sweep(T0 + 200, 10, () => false).removed).toHaveLength(1);
  });
});

describe("the shard's window in front of the table", () => {
  function shardOver(
    s: ShardStore,
    replies: Map<number, [string, string]>,
    window: number,
    clock: () => number = () => T0,
  ) {
    let appends = 0;
    const shard = new Shard({
      journal: {
        append: (events, index, audits, keys) => {
          appends++;
          const result = s.append(
            events,
            index.map((e) => ({
              environment: e.environment,
              id: e.id,
              json: Buffer.from(JSON.stringify(e.view)),
            })),
            audits,
          );
          s.idempotency.put(keys);
          return result;
        },
      },
      clock,
      reply: (id, outcome, body) => replies.set(id, [outcome, body]),
      flush: () => undefined,
      fatal: (error) => {
        throw error;
      },
      storedKeys: s.idempotency,
      idempotencyWindow: window,
    });
    shard.setConfig('test', 1, CONFIG);
    return { shard, appends: () => appends };
  }

  const consume = (key: string, amount = 1): Command => ({
    op: 'consume',
    environment: 'test',
    customerId: 'c',
    key: 'storage',
    amountMicros: BigInt(amount) * 1_000_000n,
    idempotencyKey: key,
  });

  it('finds a key in flight in memory, and one it let go on disk', async () => {
    const s = openStore();
    const replies = new Map<number, [string, string]>();
    const { shard, appends } = shardOver(s, replies, 2);
    // A retry decided while the first record is still on its way: found in the window.
    shard.handleBatch([{ id: 1, command: consume('k0') }]);
    shard.handleBatch([{ id: 2, command: consume('k0') }]);
    expect(appends()).toBe(1);
    for (let i = 1; i < 6; i++) shard.handleBatch([{ id: 10 + i, command: consume(`k${i}`) }]);
    while (replies.size < 7) await tick();
    expect(JSON.parse(replies.get(2)?.[1] as string)).toMatchObject({ consumed: 1 });
    expect(shard.idempotencyWindowEntries).toBeLessThanOrEqual(2);
    expect(s.idempotency.size).toBe(6);
    // k0 left the window long ago: the retry reads it from the table.
    const before = appends();
    shard.handleBatch([{ id: 100, command: consume('k0') }]);
    shard.handleBatch([{ id: 101, command: consume('k0', 2) }]);
    while (!replies.has(101)) await tick();
    expect(appends()).toBe(before);
    expect(JSON.parse(replies.get(100)?.[1] as string)).toMatchObject({ consumed: 6 });
    expect(replies.get(101)).toEqual([
      'rejected',
      expect.stringContaining('idempotency_key_reused'),
    ]);
    const events: Event[] = [];
    s.replay(0, (_seq, batch) => events.push(...(batch as Event[])));
    expect(events.filter((e) => e.type === 'consumed')).toHaveLength(6);
  });

  it('sweeps expired keys while the shard serves; a swept key is new again', async () => {
    const s = openStore();
    const replies = new Map<number, [string, string]>();
    let now = T0;
    const { shard, appends } = shardOver(s, replies, 8, () => now);
    for (let i = 0; i < 3; i++) shard.handleBatch([{ id: i, command: consume(`k${i}`) }]);
    while (replies.size < 3) await tick();
    const sweeper = new KeySweeper(s.idempotency, shard, () => now, 5);
    sweeper.start();
    await tick();
    expect(s.idempotency.size).toBe(3); // not expired yet: nothing goes
    now = T0 + 24 * 3_600_000 + 1;
    while (s.idempotency.size > 0) await tick();
    sweeper.stop();
    expect(sweeper.removed).toBe(3);
    const before = appends();
    shard.handleBatch([{ id: 10, command: consume('k0') }]);
    while (!replies.has(10)) await tick();
    expect(appends()).toBe(before + 1);
    expect(JSON.parse(replies.get(10)?.[1] as string)).toMatchObject({ consumed: 4 });
    expect(s.idempotency.size).toBe(1);
  });
});

describe('the window in front of the table', () => {
  const address = (key: string) => put('c', key, T0);
  const remember = (keys: IdempotencyKeys, key: string, append: number, atMs = T0) =>
    keys.remember({ ...put('c', key, atMs) }, append);

  it('lets the oldest committed keys go beyond its budget, never one in flight', () => {
    const keys = new IdempotencyKeys(NO_STORED_KEYS, 2);
    for (let i = 1; i <= 4; i++) remember(keys, `k${i}`, i);
    // None committed: all four stay, whatever the budget.
    expect(keys.size).toBe(4);
    keys.committed(3);
    // k1..k3 are committed; the two oldest go, k3 (committed) and k4 (in flight) stay.
    expect(keys.size).toBe(2);
    expect(keys.lookup(address('k1'))).toBeNull();
    expect(keys.lookup(address('k3'))).toMatchObject({ fingerprint: '1' });
    expect(keys.lookup(address('k4'))).toMatchObject({ fingerprint: '1' });
  });

  it('counts a key used again from its newest use', () => {
    const keys = new IdempotencyKeys(NO_STORED_KEYS, 2);
    remember(keys, 'a', 1, T0);
    remember(keys, 'b', 2, T0 + 1);
    remember(keys, 'a', 3, T0 + 2);
    keys.committed(3);
    expect(keys.size).toBe(2);
    remember(keys, 'c', 4, T0 + 3);
    keys.committed(4);
    // b is the oldest use now: it goes, and a (used again at 3) stays.
    expect(keys.lookup(address('b'))).toBeNull();
    expect(keys.lookup(address('a'))).toMatchObject({ atMs: T0 + 2 });
    expect(keys.lookup(address('c'))).toMatchObject({ atMs: T0 + 3 });
  });

  it('stays within its budget over many uses, sweeps and reuses of the same keys', () => {
    const keys = new IdempotencyKeys(NO_STORED_KEYS, 64);
    let append = 0;
    for (let round = 0; round < 2000; round++) {
      for (let i = 0; i < 50; i++) remember(keys, `k${(round * 37 + i) % 500}`, ++append);
      keys.committed(append);
      const swept = address(`k${round % 500}`);
      keys.swept(swept);
      expect(keys.lookup(swept)).toBeNull();
      keys.sweepCommitted(swept);
      expect(keys.size).toBeLessThanOrEqual(64);
    }
    // The newest 64 uses are the ones held.
    const newest = `k${(1999 * 37 + 49) % 500}`;
    expect(keys.lookup(address(newest))).not.toBeNull();
  });
});
