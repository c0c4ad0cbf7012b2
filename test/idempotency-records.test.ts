/**
 * Idempotency keys carried in their journal records: a keyed write's event holds its key,
 * recovery holds the keys of the records after the last seal in memory again, and the
 * journal keeps those records, snapshot or not, until a seal has committed their keys.
 * Against a real LMDB environment, with the worker's own event shapes.
 */
import { describe, expect, it } from 'vitest';
import { execute, idempotencyScope, type Event, type WriteCommand } from '../actors/customer.js';
import { isEvent } from '../actors/core/shapes.js';
import {
  carriedKey,
  keysOfEvents,
  MemoryKeys,
  scopeDigest,
  type IdempotencyPut,
} from '../actors/idempotency-keys.js';
import { ShardStore, type RecordShapes } from '../storage/journal.js';
import { openDurableEnv } from '../storage/lmdb-env.js';
import { COMPILED, T0 } from './support/core-fixtures.js';
import { storeFixture } from './support/store-fixture.js';

/** The worker's event shapes and keys, over an untyped store. */
const SHAPES: RecordShapes<unknown, unknown, unknown> = {
  isEvent: (value): value is unknown => isEvent(value),
  isSnapshotItem: (_value): _value is unknown => true,
  isAudit: (_value): _value is unknown => true,
  keysOf: (events) => keysOfEvents(events as Event[]),
};
const fixture = storeFixture('tally-idem-records-', (dir) => ShardStore.open(dir, SHAPES));

const PACING = {
  pause: (): Promise<void> => new Promise((resolve) => setImmediate(resolve)),
  keysDurable: (): Promise<void> => Promise.resolve(),
};

function put(n: number, customerId = `cust-${n % 3}`): IdempotencyPut {
  return {
    environment: 'test',
    customerId,
    scopeDigest: scopeDigest(`consume\u0000tokens\u0000req-${n}`),
    fingerprint: String(n),
    atMs: T0 + n,
  };
}

/** A consume's event, holding `key` as a keyed write's does (`carriedKey`). */
function consumed(key: IdempotencyPut): Event {
  return {
    type: 'consumed',
    environment: key.environment,
    customerId: key.customerId,
    key: 'tokens',
    atMs: key.atMs,
    periodStartMs: T0,
    includedMicros: 1_000_000n,
    lotDraws: [],
    overageMicros: 0n,
    idempotency: { fingerprint: key.fingerprint, digest: key.scopeDigest },
  };
}

/** One record of keyed consumes, as the shard and its worker write it; returns its seq. */
async function append(store: ShardStore, keys: readonly IdempotencyPut[]): Promise<number> {
  for (const key of keys) store.idempotency.remember(key);
  const events = keys.map(consumed);
  const { seq, durable } = store.append(events);
  store.idempotency.carried(seq);
  await durable;
  return seq;
}

function replay(store: ShardStore, afterSeq = 0) {
  const seqs: number[] = [];
  const result = store.replay(afterSeq, (seq) => seqs.push(seq));
  return { ...result, seqs };
}

const found = (store: ShardStore, keys: readonly IdempotencyPut[]): boolean[] =>
  keys.map((key) => store.idempotency.get(key)?.fingerprint === key.fingerprint);

describe('idempotency keys carried in journal records', () => {
  it('holds the keys of the records after the last seal again, and only those', async () => {
    const dir = fixture.tempDir();
    const keys = Array.from({ length: 7 }, (_, n) => put(n));
    const store = fixture.openStore(dir);
    await append(store, keys.slice(0, 2));
    await append(store, keys.slice(2, 4));
    await store.idempotency.seal(PACING);
    expect(store.idempotency.sealedThrough).toBe(2);
    expect(store.idempotency.inMemory).toBe(0);
    await append(store, keys.slice(4, 6));
    await append(store, keys.slice(6));
    await fixture.closeStore(store);

    const reopened = fixture.openStore(dir);
    expect(reopened.idempotency.sealedThrough).toBe(2);
    const result = replay(reopened);
    expect(result.seqs).toEqual([1, 2, 3, 4]);
    expect(result.reheldKeys).toBe(3);
    expect(reopened.idempotency.inMemory).toBe(3);
    expect(found(reopened, keys)).toEqual(keys.map(() => true));
    // What is held again is the record's key: its fingerprint and time.
    expect(reopened.idempotency.get(keys[6] as IdempotencyPut)).toMatchObject({
      fingerprint: '6',
      atMs: T0 + 6,
    });
    // Sealing them again stores the newest record they came from.
    await reopened.idempotency.seal(PACING);
    expect(reopened.idempotency.sealedThrough).toBe(4);
    await fixture.closeStore(reopened);
    const sealed = fixture.openStore(dir);
    expect(replay(sealed).reheldKeys).toBe(0);
    expect(found(sealed, keys)).toEqual(keys.map(() => true));
  });

  it('keeps records whose keys are not sealed past a snapshot, then prunes them', async () => {
    const dir = fixture.tempDir();
    const keys = Array.from({ length: 4 }, (_, n) => put(n));
    const store = fixture.openStore(dir);
    for (const key of keys) await append(store, [key]);
    await store.writeSnapshot(4, []);
    // The snapshot covers all four, but their keys are in memory only: none goes.
    expect(store.idempotency.keptFrom).toBe(1);
    expect(store.pruneCovered(100).removed).toBe(0);
    await fixture.closeStore(store);

    // Recovery reads the keys of the covered records, and replays none of them.
    const reopened = fixture.openStore(dir);
    const result = replay(reopened, 4);
    expect(result.seqs).toEqual([]);
    expect(result.reheldKeys).toBe(4);
    expect(found(reopened, keys)).toEqual([true, true, true, true]);
    expect(reopened.idempotency.keptFrom).toBe(1);
    // Sealed, they may go: the journal keeps nothing the snapshot covers.
    await reopened.idempotency.seal(PACING);
    expect(reopened.idempotency.keptFrom).toBe(Number.POSITIVE_INFINITY);
    const pruned = reopened.pruneCovered(100);
    expect(pruned.removed).toBe(4);
    await pruned.committed;
    await fixture.closeStore(reopened);
    const after = fixture.openStore(dir);
    expect(replay(after, 4).reheldKeys).toBe(0);
    expect(found(after, keys)).toEqual([true, true, true, true]);
  });

  it('keeps the records from a seal in progress, and those keyed since', async () => {
    const dir = fixture.tempDir();
    const store = fixture.openStore(dir);
    await append(store, [put(0)]);
    store.append([]);
    await append(store, [put(1)]);
    let release = (): void => undefined;
    const durable = new Promise<void>((resolve) => {
      release = resolve;
    });
    const sealing = store.idempotency.seal({ ...PACING, keysDurable: () => durable });
    // Switched: records 1 and 3 are the seal's, record 4 the next one's.
    await append(store, [put(2)]);
    expect(store.idempotency.keptFrom).toBe(1);
    release();
    await sealing;
    expect(store.idempotency.sealedThrough).toBe(3);
    expect(store.idempotency.keptFrom).toBe(4);
    await store.idempotency.seal(PACING);
    expect(store.idempotency.keptFrom).toBe(Number.POSITIVE_INFINITY);
  });

  it('forgets the key of a torn last record: a retry of it applies', async () => {
    const dir = fixture.tempDir();
    const keys = [put(0), put(1)];
    const store = fixture.openStore(dir);
    await append(store, [keys[0] as IdempotencyPut]);
    await append(store, [keys[1] as IdempotencyPut]);
    await fixture.closeStore(store);
    const env = openDurableEnv(dir, ['journal']);
    env.dbs.journal.putSync(2, Buffer.from('torn write garbage'));
    await env.root.close();

    const reopened = fixture.openStore(dir);
    const result = replay(reopened);
    expect(result.droppedTail).toBe(true);
    expect(result.reheldKeys).toBe(1);
    expect(found(reopened, keys)).toEqual([true, false]);
  });

  it('refuses a record whose event carries a key of the wrong shape', async () => {
    const dir = fixture.tempDir();
    const store = fixture.openStore(dir);
    const event = { ...consumed(put(0)), idempotency: { fingerprint: 1, digest: 'x' } };
    await store.append([event as unknown as Event]).durable;
    await fixture.closeStore(store);
    const reopened = fixture.openStore(dir);
    expect(() => replay(reopened)).toThrow(/consumed event carries a malformed idempotency key/);
  });
});

describe("a keyed write's events", () => {
  it('hold its key on the event that applies it, and give it back', () => {
    const command: WriteCommand = {
      op: 'consume',
      environment: 'test',
      customerId: 'ada',
      key: 'tokens',
      amountMicros: 5_000_000n,
      idempotencyKey: 'req-1',
    };
    const scope = idempotencyScope(command);
    expect(scope).not.toBeNull();
    const address = new MemoryKeys().address('test', 'ada', scopeDigest(scope ?? ''));
    const carry = carriedKey(address, command);
    expect(carry).toEqual({ fingerprint: '5000000', digest: address.scopeDigest });
    const { events } = execute(undefined, COMPILED, command, T0, undefined, null, carry);
    expect(events).toHaveLength(1);
    expect(events[0]).toMatchObject({ type: 'consumed', idempotency: carry });
    expect(keysOfEvents(events)).toEqual([{ ...address, fingerprint: '5000000', atMs: T0 }]);
    const { idempotencyKey: _, ...unkeyedCommand } = command;
    const unkeyed = execute(undefined, COMPILED, unkeyedCommand, T0);
    expect(unkeyed.events).toHaveLength(1);
    expect(keysOfEvents(unkeyed.events)).toEqual([]);
    const limit: WriteCommand = {
      op: 'limitSettings',
      environment: 'test',
      customerId: 'ada',
      key: 'seats',
      purchased: 2,
    };
    expect(() => carriedKey(address, limit)).toThrow(/limitSettings has no key/);
  });

  it('of older data dirs carry none: a fingerprint alone, or the scope text', () => {
    const key = put(1);
    const events = [
      { ...consumed(key), idempotency: { fingerprint: '1' } },
      { ...consumed(key), idempotency: { fingerprint: '1', scope: 'consume\u0000tokens\u0000k' } },
      { ...consumed(key), idempotency: null },
    ] as Event[];
    expect(keysOfEvents(events)).toEqual([]);
  });
});
