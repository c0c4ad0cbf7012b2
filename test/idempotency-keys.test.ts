/**
 * Idempotency keys off the heap: the key store on a real LMDB environment (keys in
 * memory, sealed runs, their filters, restarts at any step of sealing, expiry, the move of
 * the older one-table layout), and the shard over it (a key is found while its record is
 * in flight, once sealed, and its expiry makes it new again).
 */
import { createHash } from 'node:crypto';
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it, vi } from 'vitest';
import type { Command, Event } from '../actors/customer.js';
import { keysOfEvents, scopeDigest, type IdempotencyPut } from '../actors/idempotency-keys.js';
import { KeyUpkeep } from '../actors/idempotency-upkeep.js';
import { Shard } from '../actors/shard.js';
import { decodeRecord, encodeRecord } from '../storage/codec.js';
import {
  ERA_GROUPS,
  eraGroupsFor,
  MAP_FROM_BYTES,
  MAPPED_IMAGE_BYTES as MAPPED,
} from '../storage/idempotency-eras.js';
import {
  BLOCK_KEYS,
  GROUP_RUNS,
  plainId,
  type HashedAddress,
  type KeyCut,
  type KeyStore,
} from '../storage/idempotency-runs.js';
import { KEY_HASHES, KeyFilter, keyHashes } from '../storage/key-filter.js';
import { ERA_ENV_DIR, SHARD_DB_NAMES, ShardStore } from '../storage/journal.js';
import {
  openDurableEnv,
  SHARD_ENV_OPTIONS,
  type BinaryDb,
  type DurableEnv,
} from '../storage/lmdb-env.js';
import { CONFIG, T0 } from './support/core-fixtures.js';
import { storeFixture } from './support/store-fixture.js';

const fixture = storeFixture('tally-idem-', (dir) => ShardStore.open(dir));
const openStore = (dir = fixture.tempDir()): ShardStore => fixture.openStore(dir);

const tick = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 5));
const DAY_MS = 24 * 3_600_000;

function put(customerId: string, key: string, atMs: number, amount = '1'): IdempotencyPut {
  return {
    environment: 'test',
    customerId,
    scopeDigest: scopeDigest(`consume\u0000storage\u0000${key}`),
    fingerprint: amount,
    atMs,
  };
}

/** Keys decided and logged beside a journal record, as the shard and its worker do. */
async function store(target: ShardStore, puts: readonly IdempotencyPut[]): Promise<void> {
  for (const p of puts) target.idempotency.remember(p);
  const { seq, durable } = target.append([]);
  target.idempotency.log(seq, puts);
  await durable;
}

/**
 * Stores `puts` in a fresh store, seals them into one run, checks every key is found, and
 * returns the run's stored blocks as the table holds them, in key order.
 */
async function sealedBlocks(
  puts: readonly IdempotencyPut[],
): Promise<Array<{ key: unknown; value: Buffer }>> {
  const dir = fixture.tempDir();
  const s = openStore(dir);
  await store(s, puts);
  await s.idempotency.seal(PACING);
  expect(puts.every((p) => s.idempotency.get(p)?.atMs === p.atMs)).toBe(true);
  await fixture.closeStore(s);
  const env = openDurableEnv(dir, ['idempotency-runs']);
  try {
    return [...env.dbs['idempotency-runs'].getRange({})].map(({ key, value }) => ({
      key,
      value: Buffer.from(value),
    }));
  } finally {
    await env.root.close();
  }
}

/**
 * Every key of one customer, as an online snapshot's cut of the store reads them (every
 * key, run by run), a later use of a digest over an earlier one.
 */
function customerKeys(
  keys: KeyStore,
  environment: 'test' | 'live',
  customerId: string,
): Array<[string, string, number]> {
  const found = new Map<string, [string, string, number]>();
  const cut = keys.cut();
  while (!cut.done)
    for (const [env, id, list] of cut.read(100))
      if (env === environment && id === customerId) for (const key of list) found.set(key[0], key);
  return [...found.values()];
}

/** Pacing for a store used without a shard: every key remembered is durable already. */
const PACING = {
  pause: (): Promise<void> => new Promise((resolve) => setImmediate(resolve)),
  keysDurable: (): Promise<void> => Promise.resolve(),
};

/** A seal stopped at its pause after `turns` of them, as a crash between slices would. */
async function sealStoppedAfter(s: ShardStore, turns: number): Promise<void> {
  let pauses = 0;
  const stopped = s.idempotency.seal({
    keysDurable: PACING.keysDurable,
    pause: () => (++pauses > turns ? Promise.reject(new Error('stopped')) : PACING.pause()),
  });
  await expect(stopped).rejects.toThrow('stopped');
}

/** A seal started now that waits at `keysDurable` until `finish` lets it go on, and ends. */
function sealHeld(s: ShardStore, runKeys: number): { finish: () => Promise<unknown> } {
  let release = (): void => undefined;
  const held = new Promise<void>((resolve) => {
    release = resolve;
  });
  const sealed = s.idempotency.seal({ pause: PACING.pause, keysDurable: () => held }, runKeys);
  return {
    finish: () => {
      release();
      return sealed;
    },
  };
}

/**
 * Seals `runs` runs of `keys` keys each (three customers'), run n's keys used at T0 + n,
 * counting from run `from`; returns the keys.
 */
async function sealRuns(
  s: ShardStore,
  runs: number,
  keys: number,
  from = 0,
): Promise<IdempotencyPut[]> {
  const all: IdempotencyPut[] = [];
  for (let run = from; run < from + runs; run++) {
    const puts = Array.from({ length: keys }, (_, i) =>
      put(`c-${i % 3}`, `e${run}-${i}`, T0 + run),
    );
    all.push(...puts);
    await store(s, puts);
    await s.idempotency.seal(PACING);
  }
  return all;
}

type RunKey = [number, string, string, string];

/** A stored block's sections: each customer's keys as [digest, fingerprint, atMs]. */
function sectionsOf(
  value: Buffer,
): Array<{ customerId: string; keys: Array<[string, string, number]> }> {
  const decoded = decodeRecord(value);
  if (!decoded.ok) throw new Error('a block does not decode');
  const block = decoded.value as unknown[];
  const sections: Array<{ customerId: string; keys: Array<[string, string, number]> }> = [];
  for (let i = 0; i < block.length; ) {
    const count = block[i + 1] as number;
    const keys: Array<[string, string, number]> = [];
    for (let k = i + 2; k < i + 2 + 3 * count; k += 3)
      keys.push([block[k] as string, block[k + 1] as string, block[k + 2] as number]);
    sections.push({ customerId: block[i] as string, keys });
    i += 2 + 3 * count;
  }
  return sections;
}

/** Keys no test stores: lookups of them miss. */
/**
 * Writes run 1 of `dir` as the layout before blocks sealed it, one entry per key of `keys`
 * (all of the test environment), with its catalog record and its group's filter, the group
 * full (the next run starts a group). Returns the run's counts as its record holds them.
 */
async function writeEntryRun(dir: string, keys: readonly IdempotencyPut[]) {
  const env = openDurableEnv(dir, ['idempotency-runs', 'idempotency-run-catalog']);
  const filter = KeyFilter.sized(keys.length);
  for (const p of keys) {
    await env.dbs['idempotency-runs'].put(
      [1, p.environment, p.customerId, p.scopeDigest],
      encodeRecord([p.fingerprint, p.atMs]),
    );
    keyHashes(p.environment, p.customerId, p.scopeDigest);
    filter.add();
  }
  const times = keys.map((p) => p.atMs);
  const counts = {
    count: keys.length,
    test: keys.length,
    live: 0,
    minAtMs: Math.min(...times),
    maxAtMs: Math.max(...times),
  };
  await env.dbs['idempotency-run-catalog'].put(1, encodeRecord(counts));
  await env.dbs['idempotency-run-catalog'].put(
    ['group', 1],
    encodeRecord([1, keys.length, filter.bytes]),
  );
  await env.root.close();
  return counts;
}

/**
 * Writes run `seq` of `dir` as the layout before sections sealed it: blocks of one
 * customer's keys each ([customerId, digest, fingerprint, atMs, …], up to BLOCK_KEYS, in
 * digest order), with its catalog record (no filter of its own) and, as a group of its
 * own, its group's filter.
 */
async function writeBlockRun(
  dir: string,
  keys: readonly IdempotencyPut[],
  seq: number,
): Promise<void> {
  const env = openDurableEnv(dir, ['idempotency-runs', 'idempotency-run-catalog']);
  const filter = KeyFilter.sized(keys.length);
  const byCustomer = new Map<string, IdempotencyPut[]>();
  for (const p of keys) {
    const list = byCustomer.get(`${p.environment}\u0000${p.customerId}`) ?? [];
    list.push(p);
    byCustomer.set(`${p.environment}\u0000${p.customerId}`, list);
    keyHashes(p.environment, p.customerId, p.scopeDigest);
    filter.add();
  }
  for (const list of byCustomer.values()) {
    list.sort((a, b) => (a.scopeDigest < b.scopeDigest ? -1 : 1));
    for (let at = 0; at < list.length; at += BLOCK_KEYS) {
      const block = list.slice(at, at + BLOCK_KEYS);
      const first = block[0] as IdempotencyPut;
      await env.dbs['idempotency-runs'].put(
        [seq, first.environment, first.customerId, first.scopeDigest],
        encodeRecord([
          first.customerId,
          ...block.flatMap((p) => [p.scopeDigest, p.fingerprint, p.atMs]),
        ]),
      );
    }
  }
  const times = keys.map((p) => p.atMs);
  const live = keys.filter((p) => p.environment === 'live').length;
  const counts = { count: keys.length, test: keys.length - live, live };
  await env.dbs['idempotency-run-catalog'].put(
    seq,
    encodeRecord({
      ...counts,
      minAtMs: Math.min(...times),
      maxAtMs: Math.max(...times),
      blocks: true,
    }),
  );
  await env.dbs['idempotency-run-catalog'].put(
    ['group', seq],
    encodeRecord([seq, keys.length, filter.bytes]),
  );
  await env.root.close();
}

function absentKeys(count: number): IdempotencyPut[] {
  return Array.from({ length: count }, (_, i) => put(`c-${i % 3}`, `no-${i}`, 0));
}

/** Filters probed per lookup of `absent` keys in `target` (each must miss). */
function probesPerMiss(target: ShardStore, absent: readonly IdempotencyPut[]): number {
  const probes = vi.spyOn(KeyFilter.prototype, 'mayContain');
  try {
    for (const p of absent) expect(target.idempotency.get(p)).toBeUndefined();
    return probes.mock.calls.length / absent.length;
  } finally {
    probes.mockRestore();
  }
}

/** The eras stored whole in `dir`'s shard (their heads' first run seqs). */
function storedEras(dir: string): number[] {
  return storedEraKeys(dir)
    .filter(([, index]) => index === ERA_HEAD)
    .map(([first]) => first);
}

/** Where an era's head is stored (its image at -2; an earlier release's heads at 0). */
const ERA_HEAD = -1;

function storedEraKeys(dir: string): Array<[number, number]> {
  const [env, table] = openEraTable(join(dir, ERA_ENV_DIR));
  try {
    return [...table.getKeys({})] as Array<[number, number]>;
  } finally {
    void env.root.close();
  }
}

/** The era table of the environment at `dir`, opened. */
function openEraTable(dir: string): [DurableEnv<'idempotency-run-eras'>, BinaryDb] {
  const env = openDurableEnv(dir, ['idempotency-run-eras']);
  return [env, env.dbs['idempotency-run-eras']];
}

const fingerprints = (keys: KeyStore, puts: readonly IdempotencyPut[]) =>
  puts.map((p) => keys.get(p)?.fingerprint ?? null);

describe('the scope digest', () => {
  it('is the base64url of the first 16 bytes of the scope’s SHA-256, as stored', () => {
    for (let i = 0; i < 5000; i++) {
      const scope = `consume\u0000api_calls\u0000req-${i}-é${i * 31}`;
      const expected = createHash('sha256').update(scope).digest().subarray(0, 16);
      expect(scopeDigest(scope)).toBe(expected.toString('base64url'));
    }
  });
});

describe('the key filter', () => {
  it('never forgets a key it holds, and takes few others for one', () => {
    const filter = KeyFilter.sized(20_000);
    for (let i = 0; i < 20_000; i++) {
      keyHashes('live', `c-${i % 100}`, scopeDigest(`k${i}`));
      filter.add();
    }
    let held = 0;
    let taken = 0;
    for (let i = 0; i < 20_000; i++) {
      keyHashes('live', `c-${i % 100}`, scopeDigest(`k${i}`));
      if (filter.mayContain()) held++;
      keyHashes('live', `c-${i % 100}`, scopeDigest(`other${i}`));
      if (filter.mayContain()) taken++;
    }
    expect(held).toBe(20_000);
    expect(taken / 20_000).toBeLessThan(0.015);
    // Stored and read back, it answers the same.
    const copy = KeyFilter.fromBytes(Buffer.from(filter.bytes));
    keyHashes('live', 'c-7', scopeDigest('k7'));
    expect(copy.mayContain()).toBe(true);
    expect(KEY_HASHES.length).toBe(2);
  });

  it('hashes a key as the filters on disk were built: the same two numbers, always', () => {
    // Filters are stored: hashes that changed would make a stored filter miss its own keys.
    const cases: Array<[Parameters<typeof keyHashes>, number, number]> = [
      [['test', 'soak-1', 'AbCdEfGhIjKlMnOpQrStUw'], 1542797141, -874265417],
      [['live', 'c-0', '-_09azAZ-_09azAZ-_09aA'], -1123250636, 1921331264],
      [['test', '', 'abc'], -939653652, 2055910454],
      [['live', 'ü-kunde', 'é€\u0000xyzxyzxyz'], -1454827862, 2062879481],
      [['test', 'x', ''], 1175668303, -1340439777],
    ];
    for (const [key, first, second] of cases) {
      keyHashes(...key);
      expect([KEY_HASHES[0], KEY_HASHES[1]]).toEqual([first, second]);
    }
  });

  it('reads ahead the word of each key’s first bit, and nothing of an empty filter', () => {
    const filter = KeyFilter.sized(1_000);
    const hashes = new Int32Array(6);
    for (let i = 0; i < 3; i++) {
      keyHashes('test', `c-${i}`, scopeDigest(`ahead${i}`));
      hashes.set(KEY_HASHES, 2 * i);
    }
    expect(filter.readAhead(hashes, 3)).toBe(0);
    // One key added: the word read for it holds its first bit, which `add` set.
    KEY_HASHES.set(hashes.subarray(2, 4));
    filter.add();
    const firstBit = 1 << ((hashes[3] as number) & 31);
    expect(filter.readAhead(hashes.subarray(2, 4), 1) & firstBit).toBe(firstBit);
    // Only the first `count` keys are read.
    expect(filter.readAhead(hashes, 1) & firstBit).toBe(
      filter.readAhead(hashes.subarray(0, 2), 1) & firstBit,
    );
  });
});

describe('the key store', () => {
  it('finds a key in memory, then in its run; a customer gets its own keys only', async () => {
    const s = openStore();
    const puts = [put('c-1', 'a', T0), put('c-1', 'b', T0 + 1, '7'), put('c-10', 'a', T0)];
    await store(s, puts);
    expect(s.idempotency.inMemory).toBe(3);
    expect(fingerprints(s.idempotency, puts)).toEqual(['1', '7', '1']);
    const run = await s.idempotency.seal(PACING);
    expect(run).toMatchObject({ count: 3, test: 3, live: 0, minAtMs: T0, maxAtMs: T0 + 1 });
    expect(s.idempotency.inMemory).toBe(0);
    expect(fingerprints(s.idempotency, puts)).toEqual(['1', '7', '1']);
    expect(s.idempotency.get(put('c-2', 'b', 0))).toBeUndefined();
    expect(customerKeys(s.idempotency, 'test', 'c-1').map(([, fp, at]) => [fp, at])).toEqual(
      expect.arrayContaining([
        ['1', T0],
        ['7', T0 + 1],
      ]),
    );
    expect(customerKeys(s.idempotency, 'test', 'c-1')).toHaveLength(2);
    expect(customerKeys(s.idempotency, 'live', 'c-1')).toEqual([]);
    expect([s.idempotency.countOf('test'), s.idempotency.countOf('live')]).toEqual([3, 0]);
    expect(s.idempotency.size).toBe(3);
    expect(await s.idempotency.seal(PACING)).toBeNull(); // nothing waiting
  });

  it('holds keys in memory apart by customer and environment, newer uses over older', async () => {
    const s = openStore();
    const live = (p: IdempotencyPut): IdempotencyPut => ({ ...p, environment: 'live' });
    // Past the first 1,024 slots the columns grow; every key stays where it was put.
    const many = Array.from({ length: 3000 }, (_, i) => put(`c-${i % 7}`, `k-${i}`, T0 + i));
    const shared = [
      put('c-1', 'same', T0),
      put('c-2', 'same', T0, '2'),
      live(put('c-1', 'same', T0, '3')),
    ];
    await store(s, [...many, ...shared]);
    expect(s.idempotency.inMemory).toBe(3003);
    expect(fingerprints(s.idempotency, shared)).toEqual(['1', '2', '3']);
    expect(s.idempotency.get(put('c-3', 'same', 0))).toBeUndefined();
    expect(s.idempotency.get(live(put('c-2', 'same', 0)))).toBeUndefined();
    for (const p of [many[0], many[1500], many[2999]])
      expect(s.idempotency.get(p as IdempotencyPut)).toMatchObject({
        atMs: (p as IdempotencyPut).atMs,
      });
    // A newer use of a key a customer holds replaces it (no second entry).
    await store(s, [put('c-2', 'same', T0 + 5, '9')]);
    expect(s.idempotency.inMemory).toBe(3003);
    expect(s.idempotency.get(put('c-2', 'same', 0))).toEqual({
      environment: 'test',
      customerId: 'c-2',
      scopeDigest: scopeDigest('consume\u0000storage\u0000same'),
      fingerprint: '9',
      atMs: T0 + 5,
    });
    // A snapshot's cut: each customer's keys, older uses first.
    const held = new Map<string, Array<{ fingerprint: string; atMs: number }>>();
    const cut = s.idempotency.cut();
    while (!cut.done)
      for (const [environment, id, keys] of cut.read(500)) {
        const list = held.get(`${environment}\u0000${id}`) ?? [];
        held.set(`${environment}\u0000${id}`, list);
        for (const [, fingerprint, atMs] of keys) list.push({ fingerprint, atMs });
      }
    expect(held.get('live\u0000c-1')?.map((p) => p.fingerprint)).toEqual(['3']);
    expect(held.get('test\u0000c-2')?.at(-1)).toMatchObject({ fingerprint: '9', atMs: T0 + 5 });
    expect(
      held
        .get('test\u0000c-0')
        ?.map((p) => p.atMs)
        .slice(0, 3),
    ).toEqual([T0, T0 + 7, T0 + 14]);
    const run = await s.idempotency.seal(PACING);
    expect(run).toMatchObject({ count: 3003, test: 3002, live: 1 });
    expect(fingerprints(s.idempotency, shared)).toEqual(['1', '9', '3']);
  });

  it('answers keys across many runs, newest use first, absent ones absent', async () => {
    const s = openStore();
    const all: IdempotencyPut[] = [];
    for (let run = 0; run < 4; run++) {
      const puts = Array.from({ length: 3000 }, (_, i) =>
        put(`c-${i % 37}`, `r${run}-${i}`, T0 + run),
      );
      all.push(...puts);
      await store(s, puts);
      await s.idempotency.seal(PACING);
    }
    // A key of the first run used again later, with another amount: the newer use answers.
    const again = put('c-1', 'r0-1', T0 + 10, '9');
    await store(s, [again]);
    await s.idempotency.seal(PACING);
    expect(s.idempotency.runs).toHaveLength(5);
    expect(s.idempotency.get(again)).toEqual({ fingerprint: '9', atMs: T0 + 10 });
    const found = all.filter((p) => s.idempotency.get(p) !== undefined);
    expect(found).toHaveLength(all.length);
    // Keys never stored: a filter's false positive reads a run and still finds nothing.
    for (let i = 0; i < 20_000; i++)
      expect(s.idempotency.get(put(`c-${i % 37}`, `never-${i}`, 0))).toBeUndefined();
    expect(customerKeys(s.idempotency, 'test', 'c-1')).toHaveLength(
      all.filter((p) => p.customerId === 'c-1').length,
    );
  });

  it("reads an online snapshot's cut of every key once, in slices of any size", async () => {
    const s = openStore();
    const line = (p: IdempotencyPut): string =>
      [p.environment, p.customerId, p.scopeDigest, p.fingerprint, p.atMs].join('|');
    const lines = (items: ReturnType<KeyCut['read']>): string[] =>
      items.flatMap(([environment, customerId, keys]) =>
        keys.map(([scopeDigest, fingerprint, atMs]) =>
          line({ environment, customerId, scopeDigest, fingerprint, atMs }),
        ),
      );
    const readAll = (cut: KeyCut, budget: number): string[] => {
      const read: string[] = [];
      for (let reads = 0; !cut.done; reads++) {
        expect(reads).toBeLessThan(5_000);
        read.push(...lines(cut.read(budget)));
      }
      return read;
    };
    // Three runs over plain ids and ids with their own blocks, both environments, then keys
    // in memory.
    const sealed: IdempotencyPut[] = [];
    for (let run = 0; run < 3; run++) {
      const puts = Array.from({ length: 700 }, (_, i) => ({
        ...put(i % 5 === 0 ? `d-${i % 3}\u0000` : `c-${i % 41}`, `r${run}-${i}`, T0 + run),
        environment: i % 2 === 0 ? ('live' as const) : ('test' as const),
      }));
      sealed.push(...puts);
      await store(s, puts);
      await s.idempotency.seal(PACING);
    }
    const held = Array.from({ length: 300 }, (_, i) => put(`c-${i % 41}`, `h${i}`, T0 + 5));
    await store(s, held);
    const expected = [...sealed, ...held].map(line).sort();
    for (const budget of [1, 7, 1000])
      expect(readAll(s.idempotency.cut(), budget).sort(), `budget ${budget}`).toEqual(expected);
    // A customer's consecutive keys come in one item.
    const items = s.idempotency.cut().read(100_000);
    expect(items.length).toBeLessThan(expected.length / 2);
    // As of the cut: keys stored after it are not in it, and the keys it found in memory
    // stay in it once they are sealed.
    const cut = s.idempotency.cut();
    const first = lines(cut.read(10));
    await store(
      s,
      Array.from({ length: 100 }, (_, i) => put('c-1', `later-${i}`, T0 + 6)),
    );
    await s.idempotency.seal(PACING);
    expect(s.idempotency.inMemory).toBe(0);
    expect([...first, ...readAll(cut, 50)].sort()).toEqual(expected);
    cut.close();
    // A run dropped while a cut reads it (its keys expired) reads as what is left of it.
    const dropping = s.idempotency.cut();
    const head = lines(dropping.read(100));
    expect(await s.idempotency.dropExpired(T0 + 7, PACING)).toHaveLength(4);
    const tail = readAll(dropping, 100);
    expect(head.length + tail.length).toBeLessThan(expected.length);
    for (const key of [...head, ...tail]) expect(expected).toContain(key);
  });

  it('keeps a batch an open cut reads from being used again once sealed', async () => {
    const s = openStore();
    const R = 200;
    const first = [put('c-0', 'first', T0)];
    await store(s, first);
    // Sealed at R keys from here on: the next batch holds 1.25 R, and this first one (1,024
    // slots) is kept for reuse.
    await s.idempotency.seal(PACING, R);
    const atCut = Array.from({ length: R }, (_, i) => put(`c-${i % 9}`, `at-${i}`, T0 + 1));
    await store(s, atCut);
    const cut = s.idempotency.cut();
    await s.idempotency.seal(PACING, R);
    // Enough keys to fill the kept batch: the one after it would be the batch just sealed,
    // its rows written over, were the cut not open.
    await store(
      s,
      Array.from({ length: 1100 }, (_, i) => put(`c-${i % 9}`, `later-${i}`, T0 + 2)),
    );
    const read = new Set<string>();
    while (!cut.done)
      for (const [, id, keys] of cut.read(64))
        for (const [digest, , atMs] of keys) read.add(`${id}|${digest}|${atMs}`);
    cut.close();
    expect([...read].sort()).toEqual(
      [...first, ...atCut].map((p) => `${p.customerId}|${p.scopeDigest}|${p.atMs}`).sort(),
    );
  });

  it('keeps every key through a restart before, during and after sealing', async () => {
    const dir = fixture.tempDir();
    let s = openStore(dir);
    const first = Array.from({ length: 5000 }, (_, i) => put(`c-${i % 10}`, `a${i}`, T0));
    await store(s, first);
    await fixture.closeStore(s);
    // Before: the log brings them back into memory.
    s = openStore(dir);
    expect(s.idempotency.inMemory).toBe(5000);
    expect(fingerprints(s.idempotency, first).every((fp) => fp === '1')).toBe(true);
    // During: stopped after the first slice of the run, as a crash between slices would.
    await sealStoppedAfter(s, 3);
    await fixture.closeStore(s);
    s = openStore(dir);
    expect(s.idempotency.runs).toHaveLength(0);
    expect(s.idempotency.inMemory).toBe(5000);
    const more = [put('c-1', 'later', T0 + 5)];
    await store(s, more);
    // After: a complete seal writes over the interrupted run; the logs are cleared.
    const run = await s.idempotency.seal(PACING);
    expect(run?.count).toBe(5001);
    await fixture.closeStore(s);
    s = openStore(dir);
    expect(s.idempotency.inMemory).toBe(0);
    expect(s.idempotency.runs).toHaveLength(1);
    expect(s.idempotency.size).toBe(5001);
    expect(fingerprints(s.idempotency, [...first, ...more]).every((fp) => fp === '1')).toBe(true);
  });

  it('sets a batch aside when it fills during a seal; each is a run; none is lost', async () => {
    const dir = fixture.tempDir();
    let s = openStore(dir);
    // Runs of 1,024 keys: a batch has room for 1,280 (a quarter more). The first batch (1,024
    // slots, smaller than that) is let go by the first seal, so no spare is left to reuse.
    const R = 1024;
    await store(s, [put('c-0', 'first', T0)]);
    await s.idempotency.seal(PACING, R);
    const sealing = Array.from({ length: 4 }, (_, i) => put(`c-${i % 2}`, `s${i}`, T0 + 1));
    await store(s, sealing);
    const seal = sealHeld(s, R);
    // While the seal waits, 3,000 keys come: two batches fill and are set aside, not grown.
    const during = Array.from({ length: 3000 }, (_, i) => put(`c-${i % 3}`, `d${i}`, T0 + 2));
    await store(s, during);
    expect([s.idempotency.inMemory, s.idempotency.unsealed]).toEqual([3004, 3000]);
    expect(fingerprints(s.idempotency, [...sealing, ...during]).every((fp) => fp === '1')).toBe(
      true,
    );
    await seal.finish();
    expect(s.idempotency.runs.map((run) => run.count)).toEqual([1, 4]);
    expect([s.idempotency.inMemory, s.idempotency.unsealed]).toEqual([3000, 3000]);
    // The next seal writes each batch as a run of its own, oldest first.
    await s.idempotency.seal(PACING, R);
    expect(s.idempotency.runs.map((run) => run.count)).toEqual([1, 4, 1280, 1280, 440]);
    expect(s.idempotency.inMemory).toBe(0);
    expect(fingerprints(s.idempotency, during).every((fp) => fp === '1')).toBe(true);
    await fixture.closeStore(s);
    // A stop before that seal: the sealed log table was cleared, the one the set-aside
    // batches use was not, so a restart finds their keys.
    const dir2 = fixture.tempDir();
    s = openStore(dir2);
    await store(s, [put('c-0', 'first', T0)]);
    await s.idempotency.seal(PACING, R);
    await store(s, sealing);
    const seal2 = sealHeld(s, R);
    await store(s, during);
    await seal2.finish();
    await fixture.closeStore(s);
    s = openStore(dir2);
    expect(s.idempotency.inMemory).toBe(3000);
    expect(fingerprints(s.idempotency, during).every((fp) => fp === '1')).toBe(true);
  });

  it('a seal after an interrupted one finds every key, its blocks starting elsewhere', async () => {
    const dir = fixture.tempDir();
    let s = openStore(dir);
    const first = Array.from({ length: 3000 }, (_, i) => put(`c-${i % 2}`, `a${i}`, T0));
    await store(s, first);
    // Stopped after the first slice of blocks was written (its catalog record never was).
    await sealStoppedAfter(s, 1);
    await fixture.closeStore(s);
    s = openStore(dir);
    // New keys of the same customers shift where the next seal's blocks start.
    const more = Array.from({ length: 400 }, (_, i) => put(`c-${i % 2}`, `b${i}`, T0 + 1));
    await store(s, more);
    await s.idempotency.seal(PACING);
    const all = [...first, ...more];
    expect(all.filter((p) => s.idempotency.get(p) === undefined)).toEqual([]);
    expect(customerKeys(s.idempotency, 'test', 'c-0')).toHaveLength(1700);
  });

  it('puts 16 runs behind one filter that answers for them all, also after a restart', async () => {
    const dir = fixture.tempDir();
    let s = openStore(dir);
    const all: IdempotencyPut[] = [];
    for (let run = 0; run < GROUP_RUNS + 1; run++) {
      const puts = Array.from({ length: 300 }, (_, i) =>
        put(`c-${i % 5}`, `g${run}-${i}`, T0 + run),
      );
      all.push(...puts);
      await store(s, puts);
      await s.idempotency.seal(PACING);
    }
    expect(s.idempotency.groupCount).toBe(2); // 16 runs, and one in a new group
    expect(all.every((p) => s.idempotency.get(p) !== undefined)).toBe(true);
    for (let i = 0; i < 5000; i++)
      expect(s.idempotency.get(put(`c-${i % 5}`, `never-${i}`, 0))).toBeUndefined();
    await fixture.closeStore(s);
    s = openStore(dir);
    expect([s.idempotency.runs.length, s.idempotency.groupCount]).toEqual([GROUP_RUNS + 1, 2]);
    expect(all.every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(true);
    expect(customerKeys(s.idempotency, 'test', 'c-0')).toHaveLength(all.length / 5);
    // The group drops whole once its newest key expired; the newer run stays.
    const dropped = await s.idempotency.dropExpired(T0 + GROUP_RUNS, PACING);
    expect(dropped).toHaveLength(GROUP_RUNS);
    expect(s.idempotency.get(all[0] as IdempotencyPut)).toBeUndefined();
    expect(s.idempotency.get(all.at(-1) as IdempotencyPut)).toBeDefined();
    expect(s.idempotency.size).toBe(300);
  });

  it('reads only the runs whose own filter may hold a key; runs without one always', async () => {
    const dir = fixture.tempDir();
    // Reads of the runs' table counted: every read of a run is one range read.
    const counted = (): { store: ShardStore; reads: () => number } => {
      const env = openDurableEnv(dir, SHARD_DB_NAMES, SHARD_ENV_OPTIONS);
      const runs = env.dbs['idempotency-runs'];
      const getRange = runs.getRange.bind(runs);
      let reads = 0;
      runs.getRange = ((options: Parameters<typeof getRange>[0]) => {
        reads += 1;
        return getRange(options);
      }) as typeof runs.getRange;
      return { store: fixture.adopt(ShardStore.overEnv(env)), reads: () => reads };
    };
    let { store: s, reads } = counted();
    const all: IdempotencyPut[] = [];
    for (let run = 0; run < GROUP_RUNS; run++) {
      const puts = Array.from({ length: 1000 }, (_, i) => put(`c-${i % 7}`, `r${run}-${i}`, T0));
      all.push(...puts);
      await store(s, puts);
      await s.idempotency.seal(PACING, 1000);
    }
    expect(s.idempotency.groupCount).toBe(1);
    const absent = Array.from({ length: 20_000 }, (_, i) => put(`c-${i % 7}`, `no-${i}`, 0));
    const missReads = (target: ShardStore): number => {
      const before = reads();
      for (const p of absent) expect(target.idempotency.get(p)).toBeUndefined();
      return reads() - before;
    };
    // The group's filter says maybe for ~0.6% of them; of its 16 runs, each run's filter
    // then says maybe for a few percent: tens of reads, not the ~1,900 of reading all 16.
    const withFilters = missReads(s);
    expect(withFilters).toBeLessThan(300);
    expect(all.every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(true);
    // Runs stored before runs had filters of their own: their records without one.
    await fixture.closeStore(s);
    const env = openDurableEnv(dir, ['idempotency-run-catalog']);
    const catalog = env.dbs['idempotency-run-catalog'];
    for (const { key, value } of [...catalog.getRange({})]) {
      if (typeof key !== 'number') continue;
      const decoded = decodeRecord(value);
      const { filter, ...rest } = (decoded.ok ? decoded.value : {}) as Record<string, unknown>;
      expect(filter).toBeInstanceOf(Uint8Array);
      await catalog.put(key, encodeRecord(rest));
    }
    await env.root.close();
    ({ store: s, reads } = counted());
    expect(s.idempotency.runs.map((run) => Reflect.get(run, 'filter'))).toEqual(
      Array(GROUP_RUNS).fill(null),
    );
    expect(all.every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(true);
    expect(missReads(s)).toBeGreaterThan(5 * withFilters + 500);
  });

  it('reads ahead the filters a batch’s lookups probe, and answers as before', async () => {
    const s = openStore();
    const reads = vi.spyOn(KeyFilter.prototype, 'readAhead');
    try {
      const keys = [put('c-1', 'ahead-a', T0), put('c-2', 'ahead-b', T0)];
      // No run yet: lookups probe no filter, so nothing is read ahead.
      s.idempotency.readAhead([keys[0] as IdempotencyPut, null]);
      expect(reads).not.toHaveBeenCalled();
      const sealed = await sealRuns(s, GROUP_RUNS + 1, 40);
      expect(s.idempotency.groupCount).toBe(2);
      reads.mockClear(); // sealing reads ahead too (each slice's keys, as it adds them)
      s.idempotency.readAhead([null, keys[0] as IdempotencyPut, null, keys[1] as IdempotencyPut]);
      // Both groups are in the open era: a miss probes the era's filter first, so that
      // filter, and no group's, is read ahead, once, for the two keys.
      expect(s.idempotency.eraCount).toBe(1);
      expect(reads.mock.calls.map(([, count]) => count)).toEqual([2]);
      expect(keys.map((p) => s.idempotency.get(p))).toEqual([undefined, undefined]);
      expect(sealed.every((p) => s.idempotency.get(p)?.atMs === p.atMs)).toBe(true);
    } finally {
      reads.mockRestore();
    }
  });

  it('probes the eras as it reads ahead: a key every era said no to skips them', async () => {
    const s = openStore();
    const sealed = await sealRuns(s, GROUP_RUNS + 1, 40);
    expect(s.idempotency.eraCount).toBe(1);
    const addressOf = (p: IdempotencyPut): HashedAddress =>
      s.idempotency.address(p.environment, p.customerId, p.scopeDigest);
    const absent = Array.from({ length: 64 }, (_, i) => put(`c-${i % 3}`, `probe-${i}`, T0));
    const addresses = absent.map(addressOf);
    s.idempotency.readAhead(addresses);
    const probes = vi.spyOn(KeyFilter.prototype, 'mayContain');
    try {
      let probed = 0;
      for (const address of addresses) {
        probes.mockClear();
        expect(s.idempotency.get(address)).toBeUndefined();
        if (probes.mock.calls.length > 0) probed += 1;
      }
      // Only a key the era's filter takes for one of its own (~0.2%) is probed again.
      expect(probed).toBeLessThan(4);
    } finally {
      probes.mockRestore();
    }
    // A mark holds only until the filters change: a key sealed since it was marked is found.
    const later = absent[0] as IdempotencyPut;
    const marked = addresses[0] as HashedAddress;
    await store(s, [later]);
    await s.idempotency.seal(PACING);
    expect(s.idempotency.inMemory).toBe(0);
    expect(s.idempotency.get(marked)?.atMs).toBe(later.atMs);
    // Keys the era holds are never marked: each is found through the era, as before.
    const held = sealed.map(addressOf);
    s.idempotency.readAhead(held.slice(0, 256));
    expect(
      sealed.every((p, i) => s.idempotency.get(held[i] as HashedAddress)?.atMs === p.atMs),
    ).toBe(true);
    await fixture.closeStore(s);
  });

  it('puts 16 groups behind one era filter, stored when the era closes', async () => {
    const dir = fixture.tempDir();
    let s = openStore(dir);
    const eraRuns = ERA_GROUPS * GROUP_RUNS;
    // Runs of 50 keys make groups of 16 runs, eras of 16 groups: 256 runs, then one more.
    const all = await sealRuns(s, eraRuns, 50);
    expect(storedEras(dir)).toEqual([]);
    all.push(...(await sealRuns(s, 1, 50, eraRuns)));
    expect([s.idempotency.groupCount, s.idempotency.eraCount]).toEqual([ERA_GROUPS + 1, 2]);
    expect(storedEras(dir)).toEqual([1]);
    const absent = absentKeys(5000);
    // Filters probed per absent key: about one per era (17 with a filter per group).
    expect(probesPerMiss(s, absent)).toBeLessThan(3);
    expect(all.every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(true);
    // After a restart: the stored era answers for its groups; the open era was not stored,
    // so its one group is probed by its own filter.
    await fixture.closeStore(s);
    s = openStore(dir);
    expect([s.idempotency.groupCount, s.idempotency.eraCount]).toEqual([ERA_GROUPS + 1, 1]);
    expect(all.every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(true);
    expect(probesPerMiss(s, absent)).toBeLessThan(3);
    // Without the era (a crash before it was stored, or a release before eras): every
    // group by its own filter, each probed. Here the era's head says its filter saw runs up
    // to the second-last only (as if a release before eras had added the last one): the
    // start leaves the era out. A chunk without a head, as a crash part-way through storing
    // an era leaves it, is never read.
    await fixture.closeStore(s);
    const [env, eraTable] = openEraTable(join(dir, ERA_ENV_DIR));
    const head = decodeRecord(eraTable.get([1, ERA_HEAD]) as Buffer);
    const [first, lastRun, ...rest] = (head.ok ? head.value : []) as number[];
    expect([first, lastRun]).toEqual([1, eraRuns]);
    await eraTable.put([1, ERA_HEAD], encodeRecord([first, eraRuns - 1, ...rest]));
    await eraTable.put([eraRuns + 1, 1], encodeRecord(new Uint8Array(64)));
    await env.root.close();
    s = openStore(dir);
    expect([s.idempotency.groupCount, s.idempotency.eraCount]).toEqual([ERA_GROUPS + 1, 0]);
    expect(all.every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(true);
    expect(probesPerMiss(s, absent)).toBeGreaterThan(ERA_GROUPS);
    expect(await s.idempotency.dropExpired(T0, PACING)).toEqual([]);
    expect(storedEraKeys(dir)).toEqual([]); // both removed by the first drop
  });

  it('stores the open era at a clean stop: after a restart it answers for its groups', async () => {
    const absent = absentKeys(2000);
    const restarted = async (storeOpen: boolean): Promise<[ShardStore, string]> => {
      const dir = fixture.tempDir();
      const s = openStore(dir);
      // Runs of 20 keys: four groups of 16 runs, all in the open era.
      const all = await sealRuns(s, 4 * GROUP_RUNS, 20);
      expect([s.idempotency.groupCount, s.idempotency.eraCount]).toEqual([4, 1]);
      if (storeOpen) await s.idempotency.storeOpenEra(PACING.pause);
      expect(s.idempotency.openEraGroups).toBe(storeOpen ? null : ERA_GROUPS);
      expect(storedEras(dir)).toEqual(storeOpen ? [1] : []);
      await fixture.closeStore(s);
      const again = openStore(dir);
      expect(all.every((p) => again.idempotency.get(p)?.fingerprint === '1')).toBe(true);
      return [again, dir];
    };
    // Not stored (a crash, or a stop that interrupted a seal): each group by its own filter.
    const [loose] = await restarted(false);
    expect([loose.idempotency.groupCount, loose.idempotency.eraCount]).toEqual([4, 0]);
    expect(probesPerMiss(loose, absent)).toBeGreaterThanOrEqual(4);
    await fixture.closeStore(loose);
    // Stored: one probe a miss, the era's. The start opens it again (it has room), so a
    // new run's group joins it: a restart adds no era for lookups to probe.
    const [s, dir] = await restarted(true);
    expect([s.idempotency.groupCount, s.idempotency.eraCount]).toEqual([4, 1]);
    expect(s.idempotency.openEraGroups).toBe(ERA_GROUPS);
    expect(probesPerMiss(s, absent)).toBeLessThan(1.5);
    const later = await sealRuns(s, 1, 20, 4 * GROUP_RUNS + 1);
    expect([s.idempotency.groupCount, s.idempotency.eraCount]).toEqual([5, 1]);
    expect(later.every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(true);
    expect(probesPerMiss(s, absent)).toBeLessThan(1.5);
    // Its groups expire with it: one drop removes them, their era's image and head.
    const dropped = await s.idempotency.dropExpired(T0 + 4 * GROUP_RUNS + 2, PACING);
    expect(dropped).toHaveLength(4 * GROUP_RUNS + 1);
    expect([s.idempotency.groupCount, s.idempotency.eraCount]).toEqual([0, 0]);
    expect(storedEraKeys(dir)).toEqual([]);
    await fixture.closeStore(s);
  });

  it.each([
    ['in memory', MAP_FROM_BYTES],
    ['on the memory map', 0],
  ] as const)('opens the era a clean stop stored again at each start (%s)', async (_, mapFrom) => {
    const absent = absentKeys(2000);
    const dir = fixture.tempDir();
    const reopened = (): ShardStore => {
      const opened = openStore(dir);
      opened.idempotency.mapErasFrom = mapFrom;
      return opened;
    };
    let s = reopened();
    const all = await sealRuns(s, 2 * GROUP_RUNS, 20);
    let next = 2 * GROUP_RUNS;
    // Three stops and starts, a group sealed after each: one era holds all five groups.
    for (let restart = 1; restart <= 3; restart++) {
      await s.idempotency.storeOpenEra(PACING.pause);
      await fixture.closeStore(s);
      s = reopened();
      expect(allFound(s.idempotency, all)).toBe(true);
      expect(s.idempotency.openEraGroups).toBe(ERA_GROUPS);
      all.push(...(await sealRuns(s, GROUP_RUNS, 20, next)));
      next += GROUP_RUNS;
      expect(shape(s.idempotency)).toEqual([2 + restart, 1, 0]);
      expect(allFound(s.idempotency, all)).toBe(true);
      expect(probesPerMiss(s, absent)).toBeLessThan(1.5);
    }
    // A stop right after a start stores nothing new: the era on disk is the one it opened.
    await s.idempotency.storeOpenEra(PACING.pause);
    await fixture.closeStore(s);
    s = reopened();
    await s.idempotency.storeOpenEra(PACING.pause);
    expect(s.idempotency.openEraGroups).toBe(ERA_GROUPS); // not closed, so not written again
    await fixture.closeStore(s);
    expect(storedEras(dir)).toEqual([1]);
    s = reopened();
    expect(shape(s.idempotency)).toEqual([5, 1, 0]);
    expect(allFound(s.idempotency, all)).toBe(true);
    // A crash after a group joined it: the head on disk still describes the image it
    // stored, which answers for the groups it held; the new group answers by its own filter.
    all.push(...(await sealRuns(s, 1, 20, next)));
    await fixture.closeStore(s);
    s = reopened();
    expect(shape(s.idempotency)).toEqual([6, 1, 1]);
    expect(s.idempotency.openEraGroups).toBeNull();
    expect(allFound(s.idempotency, all)).toBe(true);
    expect(probesPerMiss(s, absent)).toBeLessThan(2.5);
    await fixture.closeStore(s);
  });

  it('removes an opened era’s head before it stores the era again', async () => {
    const dir = fixture.tempDir();
    let s = openStore(dir);
    const all = await sealRuns(s, 2 * GROUP_RUNS, 20);
    await s.idempotency.storeOpenEra(PACING.pause);
    await fixture.closeStore(s);
    s = openStore(dir);
    all.push(...(await sealRuns(s, 1, 20, 2 * GROUP_RUNS)));
    // The stop is cut short at the store's first pause, before the new image is written:
    // the old head is gone already, so no head describes an image other than its own.
    const stopped = { pause: (): Promise<void> => Promise.reject(new Error('stopped')) };
    await expect(s.idempotency.storeOpenEra(stopped.pause)).rejects.toThrow('stopped');
    await fixture.closeStore(s);
    expect(storedEras(dir)).toEqual([]);
    s = openStore(dir);
    // The era's groups answer one by one, as after a crash while it was open.
    await expectRebuiltOverThree(s, all);
    await fixture.closeStore(s);
  });

  it('stores the open era at a stop that cut a seal short: every key is found after', async () => {
    // Two groups sealed, then a batch of 12,000 keys of 7 customers (a seal of many slices)
    // whose seal the stop interrupts at its n-th pause.
    const setUp = async (): Promise<[ShardStore, string, IdempotencyPut[]]> => {
      const dir = fixture.tempDir();
      const s = openStore(dir);
      const sealed = await sealRuns(s, 2 * GROUP_RUNS, 20);
      const batch = Array.from({ length: 12_000 }, (_, i) =>
        put(`c-${i % 7}`, `cut-${i}`, T0 + 99),
      );
      await store(s, batch);
      return [s, dir, [...sealed, ...batch]];
    };
    const pacingStoppedAt = (stopAt: number) => {
      let pauses = 0;
      return {
        count: () => pauses,
        pause: (): Promise<void> =>
          ++pauses >= stopAt ? Promise.reject(new Error('stopped')) : PACING.pause(),
        keysDurable: PACING.keysDurable,
      };
    };
    const [whole] = await setUp();
    const counting = pacingStoppedAt(Number.POSITIVE_INFINITY);
    await whole.idempotency.seal(counting);
    const pauses = counting.count();
    expect(pauses).toBeGreaterThan(20);
    await fixture.closeStore(whole);
    for (const stopAt of [1, Math.round(pauses / 3), Math.round((2 * pauses) / 3), pauses]) {
      const [first, dir, all] = await setUp();
      let s = first;
      await expect(s.idempotency.seal(pacingStoppedAt(stopAt))).rejects.toThrow('stopped');
      await s.idempotency.storeOpenEra(PACING.pause);
      await fixture.closeStore(s);
      s = openStore(dir);
      for (const p of all) expect(s.idempotency.get(p)?.fingerprint).toBe('1');
      // The restart seals the batch again (its keys were logged), and finds them still.
      await s.idempotency.seal(PACING);
      for (const p of all) expect(s.idempotency.get(p)?.fingerprint).toBe('1');
      await fixture.closeStore(s);
      s = openStore(dir);
      for (const p of all) expect(s.idempotency.get(p)?.fingerprint).toBe('1');
      await fixture.closeStore(s);
    }
  });

  /**
   * A store that sealed `runs` runs of 20 keys (groups of 16 runs, in `eras` eras, the last
   * one open) and was opened again without storing the open era, as after a crash.
   */
  const crashedWith = async (
    runs: number,
    eras = 1,
  ): Promise<{ s: ShardStore; dir: string; all: IdempotencyPut[] }> => {
    const dir = fixture.tempDir();
    const first = openStore(dir);
    const all = await sealRuns(first, runs, 20);
    expect(first.idempotency.eraCount).toBe(eras);
    await fixture.closeStore(first);
    expect(storedEras(dir)).toHaveLength(eras - 1);
    return { s: openStore(dir), dir, all };
  };
  const allFound = (keys: KeyStore, puts: readonly IdempotencyPut[]): boolean =>
    puts.every((p) => keys.get(p)?.fingerprint === '1');
  const shape = (keys: KeyStore): number[] => [
    keys.groupCount,
    keys.eraCount,
    keys.groupsOutsideEras,
  ];
  /**
   * Three groups outside any era answer one by one, every key of `all` found; then an era
   * is rebuilt over them and answers for them all.
   */
  const expectRebuiltOverThree = async (
    target: ShardStore,
    all: readonly IdempotencyPut[],
  ): Promise<void> => {
    expect(shape(target.idempotency)).toEqual([3, 0, 3]);
    expect(allFound(target.idempotency, all)).toBe(true);
    expect(await target.idempotency.rebuildEras(T0, PACING)).toBe(3);
    expect(shape(target.idempotency)).toEqual([3, 1, 0]);
    expect(allFound(target.idempotency, all)).toBe(true);
  };

  it.each([
    ['in memory', MAP_FROM_BYTES],
    ['on the memory map', 0],
  ] as const)('rebuilds the era a crash left unstored over its groups (%s)', async (_, mapFrom) => {
    // Four full groups and a fifth of one run: the open era's five groups, never stored.
    const { s, dir, all } = await crashedWith(4 * GROUP_RUNS + 1);
    s.idempotency.mapErasFrom = mapFrom;
    const absent = absentKeys(2000);
    expect(shape(s.idempotency)).toEqual([5, 0, 5]);
    expect(probesPerMiss(s, absent)).toBeGreaterThanOrEqual(5); // each group's own filter
    // Until the era is stored its groups answer one by one: every key found at every turn.
    let pauses = 0;
    let checked = 0;
    const rebuilt = s.idempotency.rebuildEras(T0, {
      pause: () => {
        pauses += 1;
        if (s.idempotency.eraCount === 0 && pauses % 5 === 0) {
          expect(s.idempotency.groupsOutsideEras).toBe(5);
          expect(allFound(s.idempotency, all)).toBe(true);
          const found = absent.slice(0, 100).filter((p) => s.idempotency.get(p) !== undefined);
          expect(found).toEqual([]);
          checked += 1;
        }
        return PACING.pause();
      },
    });
    expect(await rebuilt).toBe(5);
    expect(checked).toBeGreaterThan(5);
    // Stored as a closed era is (image, then head), and it answers for all five groups.
    expect(shape(s.idempotency)).toEqual([5, 1, 0]);
    expect(storedEraKeys(dir)).toEqual([
      [1, ERA_HEAD - 1],
      [1, ERA_HEAD],
    ]);
    expect(s.idempotency.mappedFilterBytes).toBe(mapFrom === 0 ? MAPPED : 0);
    expect(allFound(s.idempotency, all)).toBe(true);
    expect(probesPerMiss(s, absent)).toBeLessThan(1.5); // the era's filter, nearly always
    // Its newest group takes no more runs: the next one starts a group in a new era.
    const later = await sealRuns(s, 1, 20, 4 * GROUP_RUNS + 1);
    expect(shape(s.idempotency)).toEqual([6, 2, 0]);
    expect(allFound(s.idempotency, [...all, ...later])).toBe(true);
    // A restart (a crash again: the new era is not stored) reads the rebuilt era back.
    await fixture.closeStore(s);
    const again = openStore(dir);
    expect(shape(again.idempotency)).toEqual([6, 1, 1]);
    expect(again.idempotency.mappedFilterBytes).toBe(mapFrom === 0 ? MAPPED : 0);
    expect(allFound(again.idempotency, [...all, ...later])).toBe(true);
    expect(probesPerMiss(again, absent)).toBeLessThan(2.5); // the era's, the lone group's
    // One group outside an era is one probe either way: nothing to rebuild.
    expect(await again.idempotency.rebuildEras(T0, PACING)).toBe(0);
    expect(storedEras(dir)).toEqual([1]);
    // The era goes with its last group, off the disk.
    expect(await again.idempotency.dropExpired(T0 + 4 * GROUP_RUNS + 1, PACING)).toHaveLength(
      4 * GROUP_RUNS + 1,
    );
    expect(shape(again.idempotency)).toEqual([1, 0, 1]);
    expect(storedEraKeys(dir)).toEqual([]);
  });

  it('voids the marks of keys read ahead clear of every era once a rebuilt one joins', async () => {
    // A closed era of 16 groups, stored, then two groups of the next one, never stored.
    const { s, all } = await crashedWith((ERA_GROUPS + 2) * GROUP_RUNS, 2);
    expect(shape(s.idempotency)).toEqual([ERA_GROUPS + 2, 1, 2]);
    const orphaned = all.slice(ERA_GROUPS * GROUP_RUNS * 20, ERA_GROUPS * GROUP_RUNS * 20 + 200);
    const addresses = orphaned.map((p) =>
      s.idempotency.address(p.environment, p.customerId, p.scopeDigest),
    );
    // The stored era says no to them: marked so, their lookups would skip every era's groups.
    s.idempotency.readAhead(addresses);
    expect(addresses.filter((a) => (a.clearOfEras ?? -1) > 0).length).toBeGreaterThan(190);
    expect(await s.idempotency.rebuildEras(T0, PACING)).toBe(2);
    expect(shape(s.idempotency)).toEqual([ERA_GROUPS + 2, 2, 0]);
    expect(addresses.map((a) => s.idempotency.get(a)?.fingerprint)).toEqual(
      addresses.map(() => '1'),
    );
  });

  it('stores no half-built era: a stop or crash part-way leaves it to the next start', async () => {
    const { s: first, dir, all } = await crashedWith(3 * GROUP_RUNS);
    let s = first;
    // Stopped at its 40th pause (its keys being read): nothing is stored.
    let pauses = 0;
    const stopped = s.idempotency.rebuildEras(T0, {
      pause: () => (++pauses >= 40 ? Promise.reject(new Error('stopped')) : PACING.pause()),
    });
    await expect(stopped).rejects.toThrow('stopped');
    expect(shape(s.idempotency)).toEqual([3, 0, 3]);
    expect(storedEraKeys(dir)).toEqual([]);
    expect(allFound(s.idempotency, all)).toBe(true);
    await fixture.closeStore(s);
    // The next start rebuilds it whole.
    s = openStore(dir);
    expect(shape(s.idempotency)).toEqual([3, 0, 3]);
    expect(await s.idempotency.rebuildEras(T0, PACING)).toBe(3);
    await fixture.closeStore(s);
    // A crash between its image and its head: the image's entry alone, never read, and
    // removed before the next rebuild stores the era again under the same first run.
    const [env, table] = openEraTable(join(dir, ERA_ENV_DIR));
    await table.remove([1, ERA_HEAD]);
    await env.root.close();
    expect(storedEraKeys(dir)).toEqual([[1, ERA_HEAD - 1]]);
    s = openStore(dir);
    await expectRebuiltOverThree(s, all);
    await fixture.closeStore(s);
    s = openStore(dir);
    expect(shape(s.idempotency)).toEqual([3, 1, 0]);
    expect(allFound(s.idempotency, all)).toBe(true);
    expect(probesPerMiss(s, absentKeys(2000))).toBeLessThan(1.5);
  });

  it('leaves out of a rebuilt era the groups that expire before or while it is built', async () => {
    const { s, dir, all } = await crashedWith(5 * GROUP_RUNS);
    // Group n's keys were used at T0 + 16n to T0 + 16n + 15. The first has expired already;
    // the second expires while the era is built (a drop at its 30th pause, which the
    // rebuild waits for: past its first group's runs, before the era is stored).
    let pauses = 0;
    let drop: Promise<unknown> | null = null;
    const rebuilt = s.idempotency.rebuildEras(T0 + GROUP_RUNS, {
      pause: () => {
        if (++pauses !== 30) return PACING.pause();
        const dropping = s.idempotency.dropExpired(T0 + 2 * GROUP_RUNS, PACING);
        drop = dropping;
        return dropping.then(() => PACING.pause());
      },
    });
    expect(await rebuilt).toBe(3);
    expect(drop).not.toBeNull();
    expect(await drop).toHaveLength(2 * GROUP_RUNS);
    expect(shape(s.idempotency)).toEqual([3, 1, 0]);
    const kept = all.slice(2 * GROUP_RUNS * 20);
    expect(allFound(s.idempotency, kept)).toBe(true);
    expect(all.slice(0, 2 * GROUP_RUNS * 20).some((p) => s.idempotency.get(p))).toBe(false);
    // Stored under the first run of the groups it was built over; read back after a restart.
    expect(storedEras(dir)).toEqual([GROUP_RUNS + 1]);
    await fixture.closeStore(s);
    const again = openStore(dir);
    expect(shape(again.idempotency)).toEqual([3, 1, 0]);
    expect(allFound(again.idempotency, kept)).toBe(true);
  });

  it('rebuilds over runs without filters of their own, not runs of a key per entry', async () => {
    const dir = fixture.tempDir();
    // A run as the layout before blocks sealed it (one entry per key), its group full.
    const before = Array.from({ length: 100 }, (_, i) => put(`c-${i % 5}`, `b${i}`, T0));
    await writeEntryRun(dir, before);
    let s = openStore(dir);
    // Then two groups of block runs in an era never stored (a crash), the first group's
    // runs stored without filters of their own (as a release before those sealed them).
    const all = await sealRuns(s, 2 * GROUP_RUNS, 20, 1);
    await fixture.closeStore(s);
    const catalogEnv = openDurableEnv(dir, ['idempotency-run-catalog']);
    const catalog = catalogEnv.dbs['idempotency-run-catalog'];
    for (let seq = 2; seq < 2 + GROUP_RUNS; seq++) {
      const decoded = decodeRecord(catalog.get(seq) as Buffer);
      const record = (decoded.ok ? decoded.value : {}) as Record<string, unknown>;
      const { filter: _filter, ...rest } = record;
      await catalog.put(seq, encodeRecord(rest));
    }
    await catalogEnv.root.close();
    s = openStore(dir);
    expect(shape(s.idempotency)).toEqual([3, 0, 3]);
    const filters = (): boolean[] =>
      s.idempotency.runs.map((run) => Reflect.get(run, 'filter') !== null);
    const sealed = Array(GROUP_RUNS).fill(true);
    expect(filters()).toEqual([false, ...Array(GROUP_RUNS).fill(false), ...sealed]);
    expect(await s.idempotency.rebuildEras(T0, PACING)).toBe(2);
    // The older layout's group stays outside; the block runs got filters in the era.
    expect(shape(s.idempotency)).toEqual([3, 1, 1]);
    expect(filters()).toEqual([false, ...Array(2 * GROUP_RUNS).fill(true)]);
    expect(allFound(s.idempotency, [...before, ...all])).toBe(true);
    expect(probesPerMiss(s, absentKeys(2000))).toBeLessThan(2.5);
    await fixture.closeStore(s);
    s = openStore(dir);
    expect(shape(s.idempotency)).toEqual([3, 1, 1]);
    expect(filters()).toEqual([false, ...Array(2 * GROUP_RUNS).fill(true)]);
    expect(allFound(s.idempotency, [...before, ...all])).toBe(true);
  });

  it('holds as many groups in an era as it is set to: fewer eras for a miss to probe', async () => {
    const dir = fixture.tempDir();
    const s = openStore(dir);
    expect(() => {
      s.idempotency.eraGroups = ERA_GROUPS - 1;
    }).toThrow(`an era holds ${ERA_GROUPS} to ${4 * ERA_GROUPS} groups, not ${ERA_GROUPS - 1}`);
    expect(() => {
      s.idempotency.eraGroups = 4 * ERA_GROUPS + 1;
    }).toThrow('groups, not 65');
    s.idempotency.eraGroups = 2 * ERA_GROUPS;
    // Runs of 20 keys: where an era of the default closes after 16 groups, this one goes on.
    const eraRuns = 2 * ERA_GROUPS * GROUP_RUNS;
    const all = await sealRuns(s, ERA_GROUPS * GROUP_RUNS + 1, 20);
    expect([s.idempotency.groupCount, s.idempotency.eraCount]).toEqual([ERA_GROUPS + 1, 1]);
    all.push(...(await sealRuns(s, ERA_GROUPS * GROUP_RUNS, 20, ERA_GROUPS * GROUP_RUNS + 1)));
    expect([s.idempotency.groupCount, s.idempotency.eraCount]).toEqual([2 * ERA_GROUPS + 1, 2]);
    expect(storedEras(dir)).toEqual([1]);
    expect(all.length).toBe((eraRuns + 1) * 20);
    const probes = vi.spyOn(KeyFilter.prototype, 'mayContain');
    try {
      const absent = Array.from({ length: 2000 }, (_, i) => put(`c-${i % 3}`, `no-${i}`, 0));
      for (const p of absent) expect(s.idempotency.get(p)).toBeUndefined();
      // About one probe per era, two eras for 33 groups.
      expect(probes.mock.calls.length / absent.length).toBeLessThan(3);
    } finally {
      probes.mockRestore();
    }
    expect(all.every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(true);
    await fixture.closeStore(s);
  });

  it("sizes each new era by the keys' rate where the groups are not set", async () => {
    // Runs of 20-200 keys make groups sized for 4,096 keys (the fewest); an era of n groups
    // of them is a day's share of IDEMPOTENCY_ERAS_PER_DAY at 24 × 4,096 × n keys a day.
    const groupsAt = async (keys: number, spanMs: number): Promise<number | null> => {
      const s = openStore();
      s.idempotency.eraGroups = null;
      const puts = Array.from({ length: keys }, (_, i) =>
        put(`c-${i % 3}`, `r-${i}`, T0 + Math.round((i * spanMs) / (keys - 1))),
      );
      await store(s, puts);
      await s.idempotency.seal(PACING);
      expect(puts.every((p) => s.idempotency.get(p)?.atMs === p.atMs)).toBe(true);
      const groups = s.idempotency.openEraGroups;
      await fixture.closeStore(s);
      return groups;
    };
    // 2 keys a second: eras of the least.
    expect(await groupsAt(20, 10_000)).toBe(ERA_GROUPS);
    // 50 keys a second: 4.32 million a day, 44 groups of 4,096 for a 24th of it.
    expect(await groupsAt(200, 4_000)).toBe(44);
    // 1,000 keys in a millisecond count as a second's: at the most, 64.
    expect(await groupsAt(1_000, 1)).toBe(4 * ERA_GROUPS);
    // Set, the number holds whatever the rate.
    const s = openStore();
    expect(s.idempotency.eraGroups).toBe(ERA_GROUPS);
    await sealRuns(s, 1, 1_000);
    expect(s.idempotency.openEraGroups).toBe(ERA_GROUPS);
    await fixture.closeStore(s);
  });

  it("counts the runs sealed in the hour before a batch toward the keys' rate", async () => {
    // One full group of runs (16 of 125 keys over 40 s: 50 keys a second), then a restart,
    // then a batch of 20 keys over 10 s (2 a second) opens a new group and a new era.
    const eraAfter = async (batchFromMs: number): Promise<number | null> => {
      const dir = fixture.tempDir();
      let s = openStore(dir);
      for (let run = 0; run < GROUP_RUNS; run++) {
        const at = T0 + run * 2_500;
        await store(
          s,
          Array.from({ length: 125 }, (_, i) => put(`c-${i % 3}`, `g${run}-${i}`, at + i * 20)),
        );
        await s.idempotency.seal(PACING);
      }
      await fixture.closeStore(s);
      s = openStore(dir);
      s.idempotency.eraGroups = null;
      const batch = Array.from({ length: 20 }, (_, i) =>
        put(`c-${i % 3}`, `b-${i}`, batchFromMs + Math.round((i * 10_000) / 19)),
      );
      await store(s, batch);
      await s.idempotency.seal(PACING);
      expect(s.idempotency.groupCount).toBe(2);
      const groups = s.idempotency.openEraGroups;
      await fixture.closeStore(s);
      return groups;
    };
    // 2,020 keys over 51 s: ~39.6 a second, 3.42 million a day, 35 groups of 4,096 keys.
    expect(await eraAfter(T0 + 41_000)).toBe(35);
    // Two hours on, those runs are out of the hour: the batch's 2 a second alone.
    expect(await eraAfter(T0 + 2 * 3_600_000)).toBe(ERA_GROUPS);
  });

  it('eraGroupsFor: a 24th of a day of keys at the rate, from 16 to 64 groups', () => {
    expect(eraGroupsFor(Number.NaN, 4096)).toBe(ERA_GROUPS);
    expect(eraGroupsFor(0, 4096)).toBe(ERA_GROUPS);
    // 16 groups of 2^21 keys hold a 24th of a day at ~9,300 keys a second; 64 at ~37,300.
    const perDay = (perSecond: number): number => perSecond * 86_400;
    expect(eraGroupsFor(perDay(9_000), 1 << 21)).toBe(ERA_GROUPS);
    expect(eraGroupsFor(perDay(20_000), 1 << 21)).toBe(35);
    expect(eraGroupsFor(perDay(35_000), 1 << 21)).toBe(61);
    expect(eraGroupsFor(perDay(50_000), 1 << 21)).toBe(4 * ERA_GROUPS);
  });

  it('drops an era with its last group; reads one part of whose groups expired', async () => {
    const dir = fixture.tempDir();
    let s = openStore(dir);
    const eraRuns = ERA_GROUPS * GROUP_RUNS;
    const all = await sealRuns(s, eraRuns + 1, 20);
    expect(storedEras(dir)).toEqual([1]);
    // Half the era's groups expire: the era stays on disk, and answers after a restart.
    const half = (ERA_GROUPS / 2) * GROUP_RUNS;
    expect(await s.idempotency.dropExpired(T0 + half, PACING)).toHaveLength(half);
    expect(storedEras(dir)).toEqual([1]);
    await fixture.closeStore(s);
    s = openStore(dir);
    expect([s.idempotency.groupCount, s.idempotency.eraCount]).toEqual([ERA_GROUPS / 2 + 1, 1]);
    const kept = all.slice(half * 20);
    expect(kept.every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(true);
    expect(all.slice(0, half * 20).some((p) => s.idempotency.get(p) !== undefined)).toBe(false);
    // Its last group expires: the era leaves memory and disk with it.
    expect(await s.idempotency.dropExpired(T0 + eraRuns, PACING)).toHaveLength(half);
    expect([s.idempotency.groupCount, s.idempotency.eraCount]).toEqual([1, 0]);
    expect(storedEraKeys(dir)).toEqual([]);
    expect(s.idempotency.get(all.at(-1) as IdempotencyPut)?.fingerprint).toBe('1');
  });

  it('reads closed eras from the memory map; the next era reuses their memory', async () => {
    const dir = fixture.tempDir();
    let s = openStore(dir);
    s.idempotency.mapErasFrom = 0; // eras this small are otherwise kept in memory
    const eraRuns = ERA_GROUPS * GROUP_RUNS;
    const all = await sealRuns(s, eraRuns + 1, 20);
    // The first era is on the map (an image padded to MAPPED_IMAGE_BYTES), the second open.
    expect([s.idempotency.eraCount, s.idempotency.mappedFilterBytes]).toEqual([2, MAPPED]);
    const ownWithOne = s.idempotency.filterBytes;
    all.push(...(await sealRuns(s, eraRuns, 20, eraRuns + 1)));
    expect([s.idempotency.eraCount, s.idempotency.mappedFilterBytes]).toEqual([3, 2 * MAPPED]);
    // Two eras on the map, the worker's own memory as with one: the third era took the
    // second's buffer (the second took the first's).
    expect(s.idempotency.filterBytes).toBe(ownWithOne);
    const absent = Array.from({ length: 2000 }, (_, i) => put(`c-${i % 3}`, `no-${i}`, 0));
    const answers = (keys: KeyStore, kept = all): void => {
      expect(kept.every((p) => keys.get(p)?.fingerprint === '1')).toBe(true);
      expect(absent.some((p) => keys.get(p) !== undefined)).toBe(false);
    };
    answers(s.idempotency);
    // After a restart both are read from the map again, their runs' filters with them.
    await fixture.closeStore(s);
    s = openStore(dir);
    expect([s.idempotency.eraCount, s.idempotency.mappedFilterBytes]).toEqual([2, 2 * MAPPED]);
    answers(s.idempotency);
    // The groups of the stored eras and the open era's one (by its own filter) only.
    expect(s.idempotency.filterBytes).toBeLessThan(ownWithOne);
    // Its last group expired, the first era leaves the map and the disk.
    expect(await s.idempotency.dropExpired(T0 + eraRuns, PACING)).toHaveLength(eraRuns);
    expect([s.idempotency.eraCount, s.idempotency.mappedFilterBytes]).toEqual([1, MAPPED]);
    expect(storedEras(dir)).toEqual([eraRuns + 1]);
    answers(s.idempotency, all.slice(eraRuns * 20));
    expect(all.slice(0, eraRuns * 20).some((p) => s.idempotency.get(p) !== undefined)).toBe(false);
  });

  it('reads an era an earlier release stored in chunks, into memory', async () => {
    const dir = fixture.tempDir();
    let s = openStore(dir);
    const eraRuns = ERA_GROUPS * GROUP_RUNS;
    const all = await sealRuns(s, eraRuns + 1, 20);
    await fixture.closeStore(s);
    // The stored image rewritten as such a release stored the era: head at 0, then chunks,
    // in the shard environment's own table (eras had no environment of their own then).
    const [eraEnv, eraTable] = openEraTable(join(dir, ERA_ENV_DIR));
    const head = decodeRecord(eraTable.get([1, ERA_HEAD]) as Buffer);
    const [first, lastRun, capacity, layout] = (head.ok ? head.value : []) as [
      number,
      number,
      number,
      [number, number],
    ];
    const image = Buffer.from(eraTable.getBinary([1, ERA_HEAD - 1]) as Buffer);
    await eraTable.clearAsync();
    await eraEnv.root.close();
    const filter = image.subarray(40, 40 + layout[1]);
    const half = filter.byteLength / 2;
    const [env, oldTable] = openEraTable(dir);
    await oldTable.put([1, 0], encodeRecord([first, lastRun, capacity, 2]));
    await oldTable.put([1, 1], encodeRecord(filter.subarray(0, half)));
    await oldTable.put([1, 2], encodeRecord(filter.subarray(half)));
    await env.root.close();
    s = openStore(dir);
    expect([s.idempotency.eraCount, s.idempotency.mappedFilterBytes]).toEqual([1, 0]);
    expect(all.every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(true);
    const probes = vi.spyOn(KeyFilter.prototype, 'mayContain');
    try {
      expect(s.idempotency.get(put('c-0', 'absent', 0))).toBeUndefined();
      expect(probes.mock.calls.length).toBeLessThan(3); // the era's filter answers
    } finally {
      probes.mockRestore();
    }
  });

  it('writes eras to a file of their own; reads and drops older ones in the shard’s', async () => {
    const dir = fixture.tempDir();
    let s = openStore(dir);
    s.idempotency.mapErasFrom = 0; // an image padded to 32 MiB, as a busy shard's
    const eraRuns = ERA_GROUPS * GROUP_RUNS;
    const all = await sealRuns(s, eraRuns + 1, 20);
    expect([s.idempotency.eraCount, s.idempotency.mappedFilterBytes]).toEqual([2, MAPPED]);
    await fixture.closeStore(s);
    // The image went to its own file: the journal's syncs never write it back.
    const bytes = (at: string): number => statSync(join(at, 'data.mdb')).size;
    expect(bytes(join(dir, ERA_ENV_DIR))).toBeGreaterThan(MAPPED);
    expect(bytes(dir)).toBeLessThan(MAPPED / 4);
    // As a release before stored it: the same entries in the shard environment's own table.
    const [eraEnv, eraTable] = openEraTable(join(dir, ERA_ENV_DIR));
    const entries = [...eraTable.getRange({})].map(({ key, value }) => ({
      key,
      value: Buffer.from(value),
    }));
    expect(entries.map(({ key }) => key)).toEqual([
      [1, ERA_HEAD - 1],
      [1, ERA_HEAD],
    ]);
    await eraTable.clearAsync();
    await eraEnv.root.close();
    const [env, oldTable] = openEraTable(dir);
    for (const { key, value } of entries) await oldTable.put(key, value);
    await env.root.close();
    s = openStore(dir);
    s.idempotency.mapErasFrom = 0;
    expect([s.idempotency.eraCount, s.idempotency.mappedFilterBytes]).toEqual([1, MAPPED]);
    const absent = Array.from({ length: 500 }, (_, i) => put(`c-${i % 3}`, `no-${i}`, 0));
    const probes = vi.spyOn(KeyFilter.prototype, 'mayContain');
    try {
      expect(absent.some((p) => s.idempotency.get(p) !== undefined)).toBe(false);
      expect(probes.mock.calls.length / absent.length).toBeLessThan(3); // the era answers
    } finally {
      probes.mockRestore();
    }
    expect(all.every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(true);
    // Eras closed from now on go to their own environment (the group open at the stop
    // fills up alone; the next era starts after it); the old era leaves the shard's table
    // with its last group.
    all.push(...(await sealRuns(s, eraRuns + GROUP_RUNS, 20, eraRuns + 1)));
    expect(storedEras(dir)).toEqual([eraRuns + GROUP_RUNS + 1]);
    expect(await s.idempotency.dropExpired(T0 + eraRuns, PACING)).toHaveLength(eraRuns);
    expect(s.idempotency.eraCount).toBe(2);
    await fixture.closeStore(s);
    const [after, afterTable] = openEraTable(dir);
    try {
      expect([...afterTable.getKeys({})]).toEqual([]);
    } finally {
      await after.root.close();
    }
    s = openStore(dir);
    expect(all.slice(eraRuns * 20).every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(
      true,
    );
  });

  it('drops a group of runs once all its keys expired, key by key off the disk', async () => {
    const dir = fixture.tempDir();
    const s = openStore(dir);
    const old = Array.from({ length: 4800 }, (_, i) => put('c', `old${i}`, T0 + i));
    for (let run = 0; run < GROUP_RUNS; run++) {
      await store(s, old.slice(run * 300, run * 300 + 300));
      await s.idempotency.seal(PACING);
    }
    const young = [put('c', 'young', T0 + DAY_MS)];
    await store(s, young);
    await s.idempotency.seal(PACING);
    expect(await s.idempotency.dropExpired(T0 + 4799, PACING)).toEqual([]); // one key left
    const dropped = await s.idempotency.dropExpired(T0 + 4800, PACING);
    expect(dropped).toHaveLength(GROUP_RUNS);
    expect(dropped.reduce((sum, run) => sum + run.test, 0)).toBe(4800);
    expect(s.idempotency.get(old[0] as IdempotencyPut)).toBeUndefined();
    expect(s.idempotency.get(young[0] as IdempotencyPut)?.atMs).toBe(T0 + DAY_MS);
    expect(s.idempotency.size).toBe(1);
    await fixture.closeStore(s);
    const env = openDurableEnv(dir, ['idempotency-runs']);
    const left = Array.from(env.dbs['idempotency-runs'].getKeys({}));
    await env.root.close();
    expect(left).toHaveLength(1);
  });

  it('stores a customer’s keys in blocks, telling apart ids that share a long prefix', async () => {
    const s = openStore();
    // Ids of 64 characters or more are stored unescaped: one with a NUL after another's
    // whole id sorts among that one's blocks.
    const long = 'x'.repeat(70);
    const ids = [long, `${long}\u0000A`, `${long}\u0000z`, 'c-short'];
    const puts = Array.from({ length: 800 }, (_, i) => put(ids[i % 4] as string, `k${i}`, T0 + i));
    await store(s, puts);
    await s.idempotency.seal(PACING);
    for (const p of puts) {
      expect(s.idempotency.get(p)).toEqual({ fingerprint: '1', atMs: p.atMs });
      // The same key text under each other id: not that customer's.
      for (const other of ids)
        if (other !== p.customerId)
          expect(s.idempotency.get({ ...p, customerId: other })).toBeUndefined();
    }
    for (const id of ids) expect(customerKeys(s.idempotency, 'test', id)).toHaveLength(200);
  });

  it('tells ids that sort by their characters from those that may not', () => {
    for (const id of ['c', 'cus_123', 'é-1', 'x'.repeat(300), '中文-ä', '\u001c', '\ud7ff'])
      expect(plainId(id)).toBe(true);
    const others = ['', 'a\u0000b', '\u0001x', 'a\u001bb', 'kunde-🙂', '\ud800', 'x\ue000'];
    for (const id of [...others, `${'x'.repeat(70)}\u0000`]) expect(plainId(id)).toBe(false);
  });

  it('finds every key of ids plain and not sealed side by side, and no other', async () => {
    const dir = fixture.tempDir();
    let s = openStore(dir);
    // Ids that start one another, long ones, ones outside ASCII; and ids that lmdb-js
    // escapes or writes raw so that they sort among others' keys.
    const plain = ['ab', 'abc', 'ab-', 'a', 'b', 'y'.repeat(64), `${'y'.repeat(64)}z`, 'é', '中'];
    const odd = [
      'ab\u0001',
      '\u0002lead',
      'ab\u0000z',
      `${'y'.repeat(64)}\u0000`,
      'kunde-🙂',
      'x\ue000',
      'x🙂',
    ];
    const many = Array.from({ length: 300 }, (_, i) => `p-${(i * 7919) % 1000}`);
    const ids = [...plain, ...odd, ...many];
    // In both environments: one to three keys each of the many; 80 each of the others,
    // so that blocks start among their keys, where ids that sort apart from their text
    // would be found in the wrong block.
    const puts = ids.flatMap((id, c) =>
      Array.from({ length: c < plain.length + odd.length ? 80 : 1 + (c % 3) }, (_, i) => ({
        ...put(id, `s${c}-${i}`, T0 + c),
        environment: (c + i) % 2 === 0 ? ('live' as const) : ('test' as const),
      })),
    );
    await store(s, puts);
    await s.idempotency.seal(PACING);
    expect(s.idempotency.runs.map((run) => run.sections)).toEqual([true]);
    expect(s.idempotency.inMemory).toBe(0);
    const check = (target: ShardStore): void => {
      for (const p of puts)
        expect(target.idempotency.get(p)).toEqual({ fingerprint: '1', atMs: p.atMs });
      // Every filter saying maybe: each absent key's block is read, and holds it not.
      const maybe = vi.spyOn(KeyFilter.prototype, 'mayContain').mockReturnValue(true);
      try {
        for (const p of puts) {
          for (const other of [...plain, ...odd])
            if (other !== p.customerId)
              expect(target.idempotency.get({ ...p, customerId: other })).toBeUndefined();
          const environment = p.environment === 'live' ? 'test' : 'live';
          const elsewhere = puts.some(
            (q) =>
              q.customerId === p.customerId &&
              q.environment === environment &&
              q.scopeDigest === p.scopeDigest,
          );
          if (!elsewhere) expect(target.idempotency.get({ ...p, environment })).toBeUndefined();
        }
      } finally {
        maybe.mockRestore();
      }
      for (const id of [...plain, ...odd, ...many.slice(0, 40)])
        for (const environment of ['live', 'test'] as const)
          expect(
            customerKeys(target.idempotency, environment, id)
              .map(([digest]) => digest)
              .sort(),
          ).toEqual(
            puts
              .filter((p) => p.customerId === id && p.environment === environment)
              .map((p) => p.scopeDigest)
              .sort(),
          );
    };
    check(s);
    await fixture.closeStore(s);
    s = openStore(dir);
    check(s);
  });

  it('reads runs sealed in blocks of one customer (the layout before sections)', async () => {
    const dir = fixture.tempDir();
    const before = Array.from({ length: 900 }, (_, i) => ({
      ...put(i % 3 === 0 ? `c-${i % 7}` : `d-${i % 50}\u0000`, `o${i}`, T0 + i),
      environment: i % 2 === 0 ? ('live' as const) : ('test' as const),
    }));
    // Two runs, each a group of its own (an era is rebuilt over two groups or more).
    await writeBlockRun(dir, before.slice(0, 450), 1);
    await writeBlockRun(dir, before.slice(450), 2);
    const s = openStore(dir);
    expect(s.idempotency.runs.map((run) => [run.blocks, run.sections])).toEqual([
      [true, false],
      [true, false],
    ]);
    const after = Array.from({ length: 300 }, (_, i) => put(`c-${i % 7}`, `n${i}`, T0 + DAY_MS));
    await store(s, after);
    await s.idempotency.seal(PACING);
    expect(s.idempotency.runs.map((run) => run.sections)).toEqual([false, false, true]);
    for (const p of [...before, ...after])
      expect(s.idempotency.get(p)).toEqual({ fingerprint: '1', atMs: p.atMs });
    expect(s.idempotency.get(put('c-0', 'o1', 0))).toBeUndefined();
    for (const id of ['c-3', 'd-7\u0000'])
      for (const environment of ['live', 'test'] as const)
        expect(customerKeys(s.idempotency, environment, id).length).toBe(
          [...before, ...after].filter((p) => p.customerId === id && p.environment === environment)
            .length,
        );
    // An era rebuilt over its group reads its blocks back, every key hashed as sealed.
    expect(await s.idempotency.rebuildEras(T0, PACING)).toBe(2);
    for (const p of before) expect(s.idempotency.get(p)?.atMs).toBe(p.atMs);
  });

  it('merges a batch sorted in several chunks: each block in digest order', async () => {
    const puts = Array.from({ length: 10_000 }, (_, i) => put(`c-${i % 3}`, `m${i}`, T0 + i));
    const digests = (await sealedBlocks(puts)).flatMap(({ value }) =>
      sectionsOf(value).flatMap((section) => section.keys.map((key) => key[0])),
    );
    // Customer by customer, every digest after the one before: 313+ blocks, none overlapping.
    const perCustomer = [0, 1, 2].map((c) =>
      puts.filter((p) => p.customerId === `c-${c}`).map((p) => p.scopeDigest),
    );
    expect(digests).toEqual(perCustomer.flatMap((list) => [...list].sort()));
  });

  it('ranks many customers in merged chunks: blocks of 32 keys, in key order', async () => {
    // 1,500 customers (three chunks of the seal's customer sort), ids in no order, some
    // sharing long prefixes or outside ASCII, in both environments.
    const ids = Array.from({ length: 1500 }, (_, i) =>
      i % 5 === 0 ? `é-${(i * 7919) % 1500}` : `c-${(i * 104_729) % 100_003}`,
    );
    // Three keys each, used round by round: a customer's keys lie apart in the batch.
    const puts = [0, 1, 2].flatMap((round) =>
      ids.map((id, i) => ({
        ...put(id, `k${round}-${i}`, T0 + i),
        environment: i % 2 === 0 ? ('live' as const) : ('test' as const),
      })),
    );
    const blocks = await sealedBlocks(puts);
    const stored = blocks.flatMap(({ key, value }) => {
      const environment = (key as RunKey)[1];
      return sectionsOf(value).flatMap(({ customerId, keys }) =>
        keys.map(([digest]) => `${environment === 'live' ? 0 : 1} ${customerId} ${digest}`),
      );
    });
    // The blocks as LMDB orders their keys hold every key in the order the keys sort.
    const expected = puts.map(
      (p) => `${p.environment === 'live' ? 0 : 1} ${p.customerId} ${p.scopeDigest}`,
    );
    expect(stored).toEqual(expected.sort());
    // Every block full but the last of each environment: customers share blocks.
    const sizes = blocks.map(({ value }) => sectionsOf(value).flatMap((x) => x.keys).length);
    expect(sizes.filter((size) => size !== BLOCK_KEYS)).toHaveLength(2);
    expect(blocks).toHaveLength(Math.ceil(2250 / BLOCK_KEYS) + Math.ceil(2250 / BLOCK_KEYS));
  });

  it('writes each block byte for byte as the store encodes the same values', async () => {
    // Blocks are built from the keys' parts, not encoded from objects: every text and number
    // form the encoder has must come out as it writes it. Ids short, long (32 characters or
    // more) and outside ASCII; fingerprints short, long and outside ASCII; times beyond
    // 32 bits and small; customers with from 1 to 40 keys (array headers of both sizes).
    const ids = ['c', 'x'.repeat(31), 'y'.repeat(32), 'z'.repeat(300), 'é', 'kunde-🙂'];
    const fingerprints = ['1', '1000000', '9'.repeat(31), '8'.repeat(32), '9'.repeat(40), 'ü5'];
    const times = [T0, 0, 5, 31, 32, 64, 127, 200, 70_000, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 1.5];
    const puts = ids.flatMap((id, c) =>
      Array.from({ length: [1, 4, 5, 33, 40, 2][c] as number }, (_, i) => ({
        ...put(id, `b${c}-${i}`, times[(c + i) % times.length] as number),
        fingerprint: fingerprints[(c * 7 + i) % fingerprints.length] as string,
        environment: i % 3 === 0 ? ('live' as const) : ('test' as const),
      })),
    );
    const blocks = await sealedBlocks(puts);
    let keys = 0;
    for (const { value } of blocks) {
      const decoded = decodeRecord(value);
      expect(decoded.ok).toBe(true);
      const block = (decoded as { ok: true; value: unknown[] }).value;
      keys += sectionsOf(value).flatMap((section) => section.keys).length;
      expect(Buffer.compare(value, encodeRecord(block))).toBe(0);
    }
    expect(keys).toBe(puts.length);
    // Sections of several customers in one block, and the id outside plain text alone.
    expect(blocks.some(({ value }) => sectionsOf(value).length > 1)).toBe(true);
    const own = blocks.filter(({ key }) => String((key as RunKey)[1]).endsWith('+own'));
    expect(own.map(({ key }) => (key as RunKey)[2])).toEqual(['kunde-🙂', 'kunde-🙂']);
  });

  it('looks a key up by the hashes its address carries, computed once', async () => {
    const s = openStore();
    const sealed = Array.from({ length: 50 }, (_, i) => put(`c-${i % 5}`, `h${i}`, T0 + i));
    await store(s, sealed);
    await s.idempotency.seal(PACING);
    const held = put('c-1', 'held', T0 + 99);
    await store(s, [held]);
    let missedByOtherHashes = 0;
    for (const p of [...sealed, held]) {
      const address = s.idempotency.address(p.environment, p.customerId, p.scopeDigest);
      keyHashes(p.environment, p.customerId, p.scopeDigest);
      expect([address.first, address.second]).toEqual([KEY_HASHES[0], KEY_HASHES[1]]);
      s.idempotency.readAhead([null, address]);
      expect(s.idempotency.get(address)?.atMs).toBe(p.atMs);
      // The hashes it carries are the ones used: others miss it (but where a filter says
      // maybe for them, and the run is read).
      const other = { ...address, first: address.first ^ 0x5555, second: address.second ^ 0x5555 };
      if (s.idempotency.get(other) === undefined) missedByOtherHashes += 1;
    }
    expect(missedByOtherHashes).toBeGreaterThan(45);
    const elsewhere: HashedAddress = {
      ...s.idempotency.address('test', 'c-1', held.scopeDigest),
      first: 7,
    };
    expect(s.idempotency.get(elsewhere)).toBeUndefined();
    await fixture.closeStore(s);
  });

  it('writes each log entry byte for byte as the store encodes the same values', async () => {
    // Log entries are written value by value, not encoded from a list: every form of text
    // and number must come out as the encoder writes it, with and without a journal record.
    const ids = ['c', 'x'.repeat(31), 'y'.repeat(32), 'z'.repeat(300), 'é', 'kunde-🙂'];
    const fingerprints = ['1', '1000000', '9'.repeat(31), '8'.repeat(32), 'ü5'];
    const times = [T0, 0, 5, 64, 127, 200, 70_000, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 1.5, -3];
    const puts = Array.from({ length: 40 }, (_, i) => ({
      ...put(ids[i % ids.length] as string, `l${i}`, times[i % times.length] as number),
      fingerprint: fingerprints[i % fingerprints.length] as string,
      environment: i % 3 === 0 ? ('live' as const) : ('test' as const),
    }));
    const dir = fixture.tempDir();
    const s = openStore(dir);
    await store(s, puts.slice(0, 3)); // an entry of 16 values (an array's longer header)
    await store(s, puts.slice(3, 5));
    await store(s, puts.slice(5));
    s.idempotency.log(null, puts.slice(0, 2)); // keys migrated: no journal record
    await s.append([]).durable;
    await fixture.closeStore(s);
    const env = openDurableEnv(dir, ['idempotency-log-0']);
    try {
      const entries = [...env.dbs['idempotency-log-0'].getRange({})];
      expect(entries).toHaveLength(4);
      const logged: unknown[] = [];
      for (const { value } of entries) {
        const decoded = decodeRecord(value);
        expect(decoded.ok).toBe(true);
        const list = (decoded as { ok: true; value: unknown[] }).value;
        expect(Buffer.compare(Buffer.from(value), encodeRecord(list))).toBe(0);
        logged.push(...list.slice(list.length % 5));
      }
      const expected = [...puts, ...puts.slice(0, 2)].flatMap((p) => [
        p.environment,
        p.customerId,
        p.scopeDigest,
        p.fingerprint,
        p.atMs,
      ]);
      expect(logged).toEqual(expected);
    } finally {
      await env.root.close();
    }
  });

  it('reads runs sealed a key per entry (the layout before blocks) beside block runs', async () => {
    const dir = fixture.tempDir();
    // A run as the layout before blocks sealed it: catalog, group filter, one entry per key.
    const before = Array.from({ length: 500 }, (_, i) => put(`c-${i % 5}`, `b${i}`, T0 + i));
    const counts = await writeEntryRun(dir, before);
    expect(counts).toEqual({ count: 500, test: 500, live: 0, minAtMs: T0, maxAtMs: T0 + 499 });
    const s = openStore(dir);
    expect(s.idempotency.runs).toEqual([
      { seq: 1, ...counts, blocks: false, sections: false, filter: null },
    ]);
    const after = Array.from({ length: 500 }, (_, i) => put(`c-${i % 5}`, `a${i}`, T0 + DAY_MS));
    await store(s, after);
    await s.idempotency.seal(PACING);
    expect(s.idempotency.runs.map((run) => run.blocks)).toEqual([false, true]);
    for (const p of [...before, ...after])
      expect(s.idempotency.get(p)).toEqual({ fingerprint: '1', atMs: p.atMs });
    expect(s.idempotency.get(put('c-0', 'b1', 0))).toBeUndefined(); // b1 is c-1's
    expect(customerKeys(s.idempotency, 'test', 'c-0')).toHaveLength(200);
    // Expired, the older run goes like any other.
    expect(await s.idempotency.dropExpired(T0 + 500, PACING)).toHaveLength(1);
    expect(before.every((p) => s.idempotency.get(p) === undefined)).toBe(true);
    expect(after.every((p) => s.idempotency.get(p) !== undefined)).toBe(true);
  });

  it('moves the key table of the layout before runs into runs, expired keys left', async () => {
    const dir = fixture.tempDir();
    const env = openDurableEnv(dir, ['idempotency', 'idempotency-expiry']);
    const keys = Array.from({ length: 3000 }, (_, i) => put(`c-${i % 7}`, `k${i}`, T0 + i));
    for (const p of keys) {
      const key = [p.environment, p.customerId, p.scopeDigest];
      await env.dbs.idempotency.put(key, encodeRecord([p.fingerprint, p.atMs]));
      await env.dbs['idempotency-expiry'].put([p.atMs, ...key], Buffer.from([0]));
    }
    await env.root.close();
    const s = openStore(dir);
    expect(s.idempotency.tableSize).toBe(3000);
    expect(await s.idempotency.migrateTable(T0 + 1000, PACING)).toBe(2000);
    expect(s.idempotency.tableSize).toBe(0);
    expect(s.idempotency.runs).toHaveLength(1);
    expect(s.idempotency.get(keys[999] as IdempotencyPut)).toBeUndefined();
    expect(s.idempotency.get(keys[1000] as IdempotencyPut)).toEqual({
      fingerprint: '1',
      atMs: T0 + 1000,
    });
    expect(keys.slice(1000).every((p) => s.idempotency.get(p) !== undefined)).toBe(true);
  });
});

describe('the shard over the key store', () => {
  function shardOver(s: ShardStore, replies: Map<number, [string, string]>, clock = () => T0) {
    let appends = 0;
    const shard = new Shard({
      journal: {
        append: (events, index, audits, keyed) => {
          appends++;
          // The shard counts the keys its events carry; the worker marks such records kept.
          expect(keyed).toBe(keysOfEvents(events).length);
          const result = s.append(
            events,
            index.map((e) => ({
              environment: e.environment,
              id: e.id,
              json: Buffer.from(JSON.stringify(e.view)),
            })),
            audits,
          );
          s.idempotency.log(result.seq, keysOfEvents(events));
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

  it('tells the store a batch’s key addresses before deciding it', async () => {
    const s = openStore();
    const replies = new Map<number, [string, string]>();
    const { shard } = shardOver(s, replies);
    const told: Array<Array<string | null>> = [];
    const readAhead = vi
      .spyOn(s.idempotency, 'readAhead')
      .mockImplementation((addresses) => told.push(addresses.map((a) => a?.scopeDigest ?? null)));
    try {
      const unkeyed: Command = {
        op: 'consume',
        environment: 'test',
        customerId: 'c',
        key: 'storage',
        amountMicros: 1_000_000n,
      };
      const read: Command = { op: 'has', environment: 'test', customerId: 'c', key: 'storage' };
      shard.handleBatch([
        { id: 1, command: consume('a') },
        { id: 2, command: unkeyed },
        { id: 3, command: read },
        { id: 4, command: consume('b') },
      ]);
      shard.handleBatch([{ id: 5, command: unkeyed }]);
      const digest = (key: string): string => scopeDigest(`consume\u0000storage\u0000${key}`);
      expect(told).toEqual([[digest('a'), null, null, digest('b')]]);
      while (replies.size < 5) await tick();
      expect(JSON.parse(replies.get(4)?.[1] as string)).toMatchObject({ consumed: 3 });
    } finally {
      readAhead.mockRestore();
    }
  });

  it('finds a key in flight in memory, and once sealed in its run', async () => {
    const s = openStore();
    const replies = new Map<number, [string, string]>();
    const { shard, appends } = shardOver(s, replies);
    // A retry decided while the first record is still on its way: found in memory.
    shard.handleBatch([{ id: 1, command: consume('k0') }]);
    shard.handleBatch([{ id: 2, command: consume('k0') }]);
    expect(appends()).toBe(1);
    for (let i = 1; i < 6; i++) shard.handleBatch([{ id: 10 + i, command: consume(`k${i}`) }]);
    // Sealing waits for the keys decided so far to be durable, then writes them as a run.
    const run = await s.idempotency.seal({
      pause: PACING.pause,
      keysDurable: () => new Promise((resolve) => shard.whenDurable(resolve)),
    });
    expect(run?.count).toBe(6);
    expect(replies.size).toBe(7);
    expect(JSON.parse(replies.get(2)?.[1] as string)).toMatchObject({ consumed: 1 });
    expect(shard.idempotencyKeysInMemory).toBe(0);
    // k0 left memory: the retry reads it from its run.
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

  it('rebuilds, beside its rounds, the era a crash left unstored; a stop ends that', async () => {
    const dir = fixture.tempDir();
    let s = openStore(dir);
    const all = await sealRuns(s, 2 * GROUP_RUNS, 20);
    await fixture.closeStore(s); // the open era is not stored, as at a crash
    const upkeepOver = (target: ShardStore) => {
      const { shard } = shardOver(target, new Map());
      const failures: unknown[] = [];
      const fatal = (error: unknown): void => {
        failures.push(error);
      };
      const upkeep = new KeyUpkeep(target.idempotency, shard, () => T0, fatal, {
        idleMs: 5,
        rebuilt: (groups, ms) => told.push([groups, ms >= 0]),
      });
      return { upkeep, failures };
    };
    /** What each upkeep told when its rebuild ended: [groups, a duration]. */
    const told: Array<[number, boolean]> = [];
    // Stopped at once: the rebuild ends at its next pause and stores nothing.
    s = openStore(dir);
    let { upkeep, failures } = upkeepOver(s);
    upkeep.start();
    await upkeep.stop();
    expect([upkeep.rebuiltGroups, failures, storedEras(dir)]).toEqual([null, [], []]);
    expect(told).toEqual([]);
    expect(s.idempotency.groupsOutsideEras).toBe(2);
    /** Opens the store again and lets its upkeep's rebuild run to its end. */
    const restartRebuilt = async (): Promise<void> => {
      await fixture.closeStore(s);
      s = openStore(dir);
      ({ upkeep, failures } = upkeepOver(s));
      upkeep.start();
      while (upkeep.rebuiltGroups === null) await tick();
      await upkeep.stop();
    };
    await restartRebuilt();
    expect([upkeep.rebuiltGroups, failures, storedEras(dir)]).toEqual([2, [], [1]]);
    expect(told).toEqual([[2, true]]);
    expect([s.idempotency.eraCount, s.idempotency.groupsOutsideEras]).toEqual([1, 0]);
    expect(all.every((p) => s.idempotency.get(p)?.fingerprint === '1')).toBe(true);
    // A start with nothing left to rebuild tells nothing.
    await restartRebuilt();
    expect([upkeep.rebuiltGroups, failures, told.length]).toEqual([0, [], 1]);
  });

  it('seals while the shard serves, drops expired runs; a dropped key is new again', async () => {
    const s = openStore();
    const replies = new Map<number, [string, string]>();
    let now = T0;
    const { shard, appends } = shardOver(s, replies, () => now);
    for (let i = 0; i < 3; i++) shard.handleBatch([{ id: i, command: consume(`k${i}`) }]);
    while (replies.size < 3) await tick();
    const failures: unknown[] = [];
    const upkeep = new KeyUpkeep(
      s.idempotency,
      shard,
      () => now,
      (e) => failures.push(e),
      { idleMs: 5 },
    );
    upkeep.start();
    await tick();
    expect(s.idempotency.runs).toHaveLength(0); // too few keys, too soon: nothing sealed
    now = T0 + 30_000;
    while (s.idempotency.runs.length === 0) await tick();
    expect(s.idempotency.inMemory).toBe(0);
    now = T0 + DAY_MS + 1;
    while (upkeep.dropped === 0) await tick();
    expect(s.idempotency.runs).toHaveLength(0);
    await upkeep.stop();
    expect([upkeep.sealed, upkeep.dropped, failures]).toEqual([1, 1, []]);
    const before = appends();
    shard.handleBatch([{ id: 10, command: consume('k0') }]);
    while (!replies.has(10)) await tick();
    expect(appends()).toBe(before + 1);
    expect(JSON.parse(replies.get(10)?.[1] as string)).toMatchObject({ consumed: 4 });
    expect(s.idempotency.size).toBe(1);
  });
});
