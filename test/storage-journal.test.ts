/**
 * ShardStore against a real LMDB environment in a temp directory: append/replay across
 * reopen, group commit, torn tails, corrupt records, snapshots and metadata.
 * Damage is done by opening the environment exactly the way the store does.
 */
import { describe, it, expect } from 'vitest';
import { encodeRecord } from '../storage/codec.js';
import {
  chunkKey,
  encodeSnapshotChunk,
  JOURNAL_PRUNE_IN_SNAPSHOT_MAX,
  JOURNAL_PRUNE_SLICE,
  ShardStore,
  SNAPSHOT_CHUNK_ITEMS,
  SNAPSHOT_FORMAT_VERSION,
} from '../storage/journal.js';
import { openDurableEnv, SHARD_ENV_OPTIONS, SHARD_PAGE_BYTES } from '../storage/lmdb-env.js';
import { readOutbox, type OutboxEvent } from '../storage/outbox.js';
import { storeFixture } from './support/store-fixture.js';

const { tempDir, openStore, closeStore } = storeFixture('tally-journal-', (dir) =>
  ShardStore.open(dir),
);

/** The first element of a snapshot chunk's key (`chunkKey`). */
const CHUNK_PREFIX = chunkKey(0, 0)[0];

function replayAll(store: ShardStore, afterSeq = 0) {
  const batches: [number, unknown[]][] = [];
  const result = store.replay(afterSeq, (seq, events) => batches.push([seq, [...events]]));
  return { ...result, batches };
}

/** Writes raw bytes into one of the store's databases, as a disk or a bug might. */
async function damage(
  dir: string,
  db: 'journal' | 'snapshot',
  key: number | (string | number)[],
  bytes: Buffer | null,
): Promise<void> {
  const env = openDurableEnv(dir, [db]);
  if (bytes === null) env.dbs[db].removeSync(key);
  else env.dbs[db].putSync(key, bytes);
  await env.root.close();
}

function flipLastByte(frame: Buffer): Buffer {
  const copy = Buffer.from(frame);
  copy[copy.length - 1] = (copy[copy.length - 1] ?? 0) ^ 0xff;
  return copy;
}

const batch = (n: number) => [{ type: 'usage', n, amountMinor: BigInt(n) * 100n }];

const webhookEvent = (n: number): OutboxEvent => ({
  id: `evt_${n}`,
  type: 'usage.exhausted',
  environment: 'test',
  customerId: 'c',
  createdAtMs: n,
  data: { n },
});

/** The store's customer index rows: [id, the row's JSON]. */
async function indexRows(dir: string): Promise<Array<[string, unknown]>> {
  const env = openDurableEnv(dir, ['customers'], SHARD_ENV_OPTIONS);
  try {
    return Array.from(env.dbs.customers.getRange({}), ({ key, value }) => [
      (key as string[])[1] as string,
      JSON.parse((value as Buffer).toString('utf8')),
    ]);
  } finally {
    await env.root.close();
  }
}

/** The store's outbox rows as the delivery thread reads them: [outbox seq, event id]. */
async function outboxRows(dir: string): Promise<Array<[number, string]>> {
  const env = openDurableEnv(dir, ['outbox'], SHARD_ENV_OPTIONS);
  try {
    return readOutbox(env.dbs.outbox, 0, 100).map((row) => [row.seq, row.event.id]);
  } finally {
    await env.root.close();
  }
}

describe('ShardStore journal', () => {
  it('replays exactly the appended batches, in order, after reopen; seq continues', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    expect(store.lastSeq).toBe(0);
    const appended = [1, 2, 3].map((n) => store.append(batch(n)));
    expect(appended.map((a) => a.seq)).toEqual([1, 2, 3]);
    await Promise.all(appended.map((a) => a.durable));
    await store.append(batch(4)).durable;
    await closeStore(store);

    const reopened = openStore(dir);
    expect(reopened.lastSeq).toBe(4);
    const replay = replayAll(reopened);
    expect(replay).toEqual({
      batches: [1, 2, 3, 4].map((n) => [n, batch(n)]),
      droppedTail: false,
      droppedAfterGap: 0,
      forgottenKeys: 0,
      reheldKeys: 0,
      forgottenAudits: 0,
      forgottenEvents: 0,
    });
    const fifth = reopened.append(batch(5));
    expect(fifth.seq).toBe(5);
    await fifth.durable;
    expect(replayAll(reopened, 3).batches.map(([seq]) => seq)).toEqual([4, 5]);
  });

  it('commits 200 appends issued in one turn together (group commit)', async () => {
    const store = openStore(tempDir());
    const txnIdBefore = store.stats().lastTxnId;
    const startedMs = performance.now();
    const appended = Array.from({ length: 200 }, (_, i) => store.append(batch(i)));
    await Promise.all(appended.map((a) => a.durable));
    const elapsedMs = performance.now() - startedMs;
    const transactions = store.stats().lastTxnId - txnIdBefore;
    console.log(
      `200 appends in one turn: ${transactions} transaction(s), ${elapsedMs.toFixed(2)} ms`,
    );
    expect(transactions).toBeGreaterThanOrEqual(1);
    expect(transactions).toBeLessThanOrEqual(2);
    expect(appended.map((a) => a.seq)).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
    expect(replayAll(store).batches).toEqual(appended.map((a, i) => [a.seq, batch(i)]));
  });

  it('drops a torn tail, reports it, and reuses the seq for the next append', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    for (const n of [1, 2, 3]) await store.append(batch(n)).durable;
    await closeStore(store);
    await damage(dir, 'journal', 4, Buffer.from('torn write garbage'));

    const reopened = openStore(dir);
    expect(() => reopened.append(batch(99))).toThrow(/torn journal tail at seq 4/);
    const replay = replayAll(reopened);
    expect(replay.droppedTail).toBe(true);
    expect(replay.batches).toEqual([1, 2, 3].map((n) => [n, batch(n)]));
    expect(reopened.lastSeq).toBe(3);
    const next = reopened.append(batch(4));
    expect(next.seq).toBe(4);
    await next.durable;
    await closeStore(reopened);

    const again = openStore(dir);
    expect(replayAll(again)).toEqual({
      batches: [1, 2, 3, 4].map((n) => [n, batch(n)]),
      droppedTail: false,
      droppedAfterGap: 0,
      forgottenKeys: 0,
      reheldKeys: 0,
      forgottenAudits: 0,
      forgottenEvents: 0,
    });
  });

  it('drops the keys, audit entries and webhook events of a torn tail or past a gap', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    const key = (n: number) =>
      ({
        environment: 'test',
        customerId: 'c',
        scopeDigest: `digest-${n}`,
        fingerprint: String(n),
        atMs: 1_000 + n,
      }) as const;
    const audit = (n: number) => ({ ref: `r${n}`, action: 'usage.consume', n });
    // Records 1-5, each with its key logged in its transaction, as the worker does, an
    // audit entry and webhook events (two for record 4).
    for (const n of [1, 2, 3, 4, 5]) {
      store.idempotency.remember(key(n));
      const events = n === 4 ? [webhookEvent(n), webhookEvent(40)] : [webhookEvent(n)];
      const { seq, durable } = store.append(batch(n), [], [audit(n)], [], events);
      store.idempotency.log(seq, [key(n)]);
      await durable;
    }
    await closeStore(store);
    expect(await outboxRows(dir)).toEqual([
      [1, 'evt_1'],
      [2, 'evt_2'],
      [3, 'evt_3'],
      [4, 'evt_4'],
      [5, 'evt_40'],
      [6, 'evt_5'],
    ]);
    // Record 5 torn (its key's log entry kept, as a power cut can leave them).
    await damage(dir, 'journal', 5, Buffer.from('torn write garbage'));

    const reopened = openStore(dir);
    expect(reopened.idempotency.get(key(5))).toBeDefined(); // loaded before replay
    expect(replayAll(reopened)).toMatchObject({
      droppedTail: true,
      forgottenKeys: 1,
      forgottenAudits: 1,
      forgottenEvents: 1,
    });
    // The audit entries of the records kept, as they were given (nothing of the store's own).
    const pending = (s: ShardStore) => s.pendingAudits() as Array<ReturnType<typeof audit>>;
    expect(pending(reopened).sort((a, b) => a.n - b.n)).toEqual([1, 2, 3, 4].map(audit));
    for (const n of [1, 2, 3, 4])
      expect(reopened.idempotency.get(key(n))?.fingerprint).toBe(`${n}`);
    expect(reopened.idempotency.get(key(5))).toBeUndefined();
    // The seq is used again by another record, with another key: only that key is its.
    reopened.idempotency.remember(key(6));
    const next = reopened.append(batch(6), [], [], [], [webhookEvent(6)]);
    expect(next.seq).toBe(5);
    reopened.idempotency.log(next.seq, [key(6)]);
    await next.durable;
    await closeStore(reopened);
    // Record 5's event went with it; record 6's is numbered after the newest row left.
    expect((await outboxRows(dir)).slice(-2)).toEqual([
      [5, 'evt_40'],
      [6, 'evt_6'],
    ]);
    // Record 3 missing (its append failed): 4 and 5 go as never acknowledged, and the keys
    // of all three with them.
    await damage(dir, 'journal', 3, null);

    const again = openStore(dir);
    expect(replayAll(again)).toMatchObject({
      droppedAfterGap: 2,
      forgottenKeys: 3,
      forgottenAudits: 2,
      forgottenEvents: 4,
    });
    expect(
      pending(again)
        .map((a) => a.ref)
        .sort(),
    ).toEqual(['r1', 'r2']);
    expect([1, 2, 3, 4, 5, 6].map((n) => again.idempotency.get(key(n)) !== undefined)).toEqual([
      true,
      true,
      false,
      false,
      false,
      false,
    ]);
    await closeStore(again);
    expect(await outboxRows(dir)).toEqual([
      [1, 'evt_1'],
      [2, 'evt_2'],
    ]);
    const last = openStore(dir);
    expect(replayAll(last)).toMatchObject({ forgottenKeys: 0, forgottenEvents: 0 });
    expect(last.idempotency.get(key(4))).toBeUndefined();
    await closeStore(last);
  });

  it('repairs the customer index after dropped records, also after a start cut short', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    const customer = (id: string, name: string) => ({
      environment: 'test',
      id,
      view: { id, name },
    });
    const row = (id: string, name: string) => ({
      environment: 'test',
      id,
      json: Buffer.from(JSON.stringify(customer(id, name).view)),
    });
    // Record 1 creates a and b; record 2 renames a; record 3 creates c and renames b.
    const rows = [
      [row('a', 'A'), row('b', 'B')],
      [row('a', 'A2')],
      [row('c', 'C'), row('b', 'B3')],
    ];
    for (const [i, index] of rows.entries()) await store.append(batch(i + 1), index).durable;
    expect(store.indexRepairPending).toBe(false);
    await closeStore(store);
    // Record 3 torn: c never existed and b was never renamed, yet their rows are there.
    await damage(dir, 'journal', 3, Buffer.from('torn write garbage'));

    const cut = openStore(dir);
    expect(replayAll(cut)).toMatchObject({ droppedTail: true });
    expect(cut.indexRepairPending).toBe(true);
    await closeStore(cut); // a start cut short: the repair never ran

    const reopened = openStore(dir);
    expect(replayAll(reopened)).toMatchObject({ droppedTail: false, droppedAfterGap: 0 });
    expect(reopened.indexRepairPending).toBe(true);
    // The customers as recovery rebuilt them from records 1 and 2.
    const recovered = [customer('a', 'A2'), customer('b', 'B')];
    expect(await reopened.repairIndex(recovered)).toEqual({ rewritten: 1, removed: 1 });
    expect(reopened.indexRepairPending).toBe(false);
    await closeStore(reopened);
    expect(await indexRows(dir)).toEqual([
      ['a', { id: 'a', name: 'A2' }],
      ['b', { id: 'b', name: 'B' }],
    ]);
    const again = openStore(dir);
    replayAll(again);
    expect(again.indexRepairPending).toBe(false);
    // A gap asks for a repair too: record 2 missing drops it and record 3.
    await again.append(batch(3), [row('d', 'D')]).durable;
    await closeStore(again);
    await damage(dir, 'journal', 2, null);
    const gap = openStore(dir);
    expect(replayAll(gap)).toMatchObject({ droppedAfterGap: 1 });
    expect(gap.indexRepairPending).toBe(true);
    expect(await gap.repairIndex([customer('a', 'A'), customer('b', 'B')])).toEqual({
      rewritten: 1,
      removed: 1,
    });
    await closeStore(gap);
    expect((await indexRows(dir)).map(([id]) => id)).toEqual(['a', 'b']);
  });

  it('forgets them too when a recovery removed their record before them', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    const key = {
      environment: 'test',
      customerId: 'c',
      scopeDigest: 'digest-3',
      fingerprint: '3',
      atMs: 1_003,
    } as const;
    for (const n of [1, 2, 3]) {
      if (n === 3) store.idempotency.remember(key);
      const { seq, durable } = store.append(batch(n), [], [{ ref: `r${n}` }]);
      if (n === 3) store.idempotency.log(seq, [key]);
      await durable;
    }
    await closeStore(store);
    // Record 3 gone, its key and audit entry left: a recovery that removed a torn record
    // and stopped before the rest. Nothing is dropped now, and they still go.
    await damage(dir, 'journal', 3, null);

    const reopened = openStore(dir);
    expect(replayAll(reopened)).toMatchObject({
      droppedTail: false,
      droppedAfterGap: 0,
      forgottenKeys: 1,
      forgottenAudits: 1,
    });
    expect(reopened.idempotency.get(key)).toBeUndefined();
    expect(reopened.pendingAudits()).toEqual([{ ref: 'r1' }, { ref: 'r2' }]);
    await closeStore(reopened);
  });

  it('refuses to replay past a corrupt middle record', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    for (const n of [1, 2, 3]) await store.append(batch(n)).durable;
    await closeStore(store);
    await damage(dir, 'journal', 2, flipLastByte(encodeRecord(batch(2))));

    const reopened = openStore(dir);
    const seen: number[] = [];
    expect(() => reopened.replay(0, (seq) => seen.push(seq))).toThrow(
      /journal is corrupt at seq 2/,
    );
    expect(seen).toEqual([1]);
  });

  it(
    'drops the records after a missing one: appends in flight when an earlier append ' +
      'failed, never acknowledged',
    async () => {
      const dir = tempDir();
      const store = openStore(dir);
      for (const n of [1, 2, 3, 4]) await store.append(batch(n)).durable;
      await closeStore(store);
      await damage(dir, 'journal', 2, null);

      const reopened = openStore(dir);
      const seen: number[] = [];
      const result = reopened.replay(0, (seq) => seen.push(seq));
      expect(seen).toEqual([1]);
      expect(result).toMatchObject({ batches: 1, droppedTail: false, droppedAfterGap: 2 });
      expect(reopened.lastSeq).toBe(1);
      // The next append takes the first free seq, and a later start replays it in order.
      await reopened.append(batch(5)).durable;
      expect(reopened.lastSeq).toBe(2);
      await closeStore(reopened);
      const again: number[] = [];
      openStore(dir).replay(0, (seq) => again.push(seq));
      expect(again).toEqual([1, 2]);
    },
  );

  it('stores and reads metadata durably across reopen', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    expect(store.getMeta('shardId')).toBeUndefined();
    await store.putMeta('shardId', { id: 7, createdAtMs: 1_700_000_000_000, counter: 5n });
    await closeStore(store);
    expect(openStore(dir).getMeta('shardId')).toEqual({
      id: 7,
      createdAtMs: 1_700_000_000_000,
      counter: 5n,
    });
  });
});

describe('ShardStore pages', () => {
  /** The journal's page size and overflow pages, read with the store closed. */
  async function journalPages(dir: string): Promise<{ pageSize: number; overflow: number }> {
    const env = openDurableEnv(dir, ['journal'], SHARD_ENV_OPTIONS);
    const pageSize = (env.root.getStats() as { pageSize: number }).pageSize;
    const overflow = (env.dbs.journal.getStats() as { overflowPages: number }).overflowPages;
    await env.root.close();
    return { pageSize, overflow };
  }

  // A batch record of ~12 KB, as a busy shard writes.
  const big = [{ type: 'usage', note: 'x'.repeat(12_000) }];

  it('creates 16 KiB pages, so a batch record of 12 KB takes a single page', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    await store.append(big).durable;
    await closeStore(store);
    expect(await journalPages(dir)).toEqual({ pageSize: SHARD_PAGE_BYTES, overflow: 1 });
  });

  it('keeps the 4 KiB pages of an environment created with them, and its records', async () => {
    const dir = tempDir();
    const old = openDurableEnv(dir, ['journal'], { ...SHARD_ENV_OPTIONS, pageSize: 4096 });
    await old.dbs.journal.put(1, encodeRecord(big));
    await old.root.close();
    const store = openStore(dir);
    await store.append(big).durable;
    expect(replayAll(store).batches).toEqual([
      [1, big],
      [2, big],
    ]);
    await closeStore(store);
    expect(await journalPages(dir)).toEqual({ pageSize: 4096, overflow: 6 });
  });
});

describe('ShardStore snapshots', () => {
  const items = (count: number, tag: string) =>
    Array.from({ length: count }, (_, i) => ({
      customerId: `${tag}-${i}`,
      balanceMinor: BigInt(i),
    }));

  /**
   * A store in a new directory with one record and a snapshot of three chunks (two full,
   * one of a single item), at seq 1; also the bytes of its second chunk, to damage.
   */
  async function storeWithThreeChunkSnapshot(tag: string) {
    const dir = tempDir();
    const store = openStore(dir);
    await store.append(batch(1)).durable;
    const snapshotItems = items(2 * SNAPSHOT_CHUNK_ITEMS + 1, tag);
    await store.writeSnapshot(1, snapshotItems);
    const chunk2 = encodeRecord(
      snapshotItems.slice(SNAPSHOT_CHUNK_ITEMS, 2 * SNAPSHOT_CHUNK_ITEMS),
    );
    return { dir, store, snapshotItems, chunk2 };
  }

  it('loads a snapshot after reopen, prunes covered records and replays later ones', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    expect(store.loadSnapshot()).toBeNull();
    for (const n of [1, 2, 3, 4, 5]) await store.append(batch(n)).durable;
    const snapshotItems = items(2 * SNAPSHOT_CHUNK_ITEMS + 5, 'a');
    await store.writeSnapshot(3, snapshotItems);
    await store.append(batch(6)).durable;
    await closeStore(store);

    const reopened = openStore(dir);
    expect(reopened.loadSnapshot()).toEqual({
      seq: 3,
      createdAtMs: expect.any(Number),
      items: snapshotItems,
    });
    expect(reopened.stats()).toMatchObject({ snapshotSeq: 3, lastSeq: 6, journalRecords: 3 });
    expect(replayAll(reopened, 3).batches).toEqual([4, 5, 6].map((n) => [n, batch(n)]));
    expect(() => reopened.replay(0, () => {})).toThrow(/snapshot covers up to 3/);
  });

  it('prunes what a snapshot covers beyond its own transaction a slice at a time', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    const total = JOURNAL_PRUNE_IN_SNAPSHOT_MAX + JOURNAL_PRUNE_SLICE * 2 + 500;
    let last: Promise<void> = Promise.resolve();
    for (let n = 1; n <= total; n++) last = store.append(batch(n)).durable;
    await last;
    await store.append(batch(total + 1)).durable;
    await store.writeSnapshot(total, items(2, 'pruned'));
    expect(store.stats().journalRecords).toBe(total + 1 - JOURNAL_PRUNE_IN_SNAPSHOT_MAX);
    const removed: number[] = [];
    for (;;) {
      const slice = store.pruneCovered(JOURNAL_PRUNE_SLICE);
      removed.push(slice.removed);
      await slice.committed;
      if (slice.removed < JOURNAL_PRUNE_SLICE) break;
    }
    expect(removed).toEqual([JOURNAL_PRUNE_SLICE, JOURNAL_PRUNE_SLICE, 500]);
    // Only the record after the snapshot is left, and it is what a restart replays.
    expect(store.stats().journalRecords).toBe(1);
    expect(replayAll(store, total).batches).toEqual([[total + 1, batch(total + 1)]]);
  });

  it('replaces the previous snapshot, leaving no stale chunks', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    for (const n of [1, 2, 3, 4, 5]) await store.append(batch(n)).durable;
    await store.writeSnapshot(2, items(3 * SNAPSHOT_CHUNK_ITEMS, 'first'));
    const second = items(SNAPSHOT_CHUNK_ITEMS + 1, 'second');
    await store.writeSnapshot(5, second);
    expect(store.loadSnapshot()).toEqual({
      seq: 5,
      createdAtMs: expect.any(Number),
      items: second,
    });
    expect(store.stats().journalRecords).toBe(0);
    await closeStore(store);

    const env = openDurableEnv(dir, ['snapshot']);
    // The header, and the second snapshot's two chunks (its generation is 2).
    expect(Array.from(env.dbs.snapshot.getKeys({}))).toEqual([0, chunkKey(2, 1), chunkKey(2, 2)]);
    await env.root.close();
    const reopened = openStore(dir);
    expect(reopened.lastSeq).toBe(5);
    expect(reopened.append(batch(6)).seq).toBe(6);
  });

  it("leaves a replaced snapshot's chunks to pruneStaleChunks, not a younger one's", async () => {
    const dir = tempDir();
    const store = openStore(dir);
    for (const n of [1, 2, 3]) await store.append(batch(n)).durable;
    await store.writeSnapshot(1, items(3 * SNAPSHOT_CHUNK_ITEMS, 'first'));
    // As a shard stores its own snapshot: chunks as it copies, then the commit.
    const second = items(SNAPSHOT_CHUNK_ITEMS + 1, 'second');
    const writer = store.beginSnapshot(2);
    writer.add(encodeSnapshotChunk(second.slice(0, SNAPSHOT_CHUNK_ITEMS)));
    writer.add(encodeSnapshotChunk(second.slice(SNAPSHOT_CHUNK_ITEMS)));
    // A younger snapshot still being written when the second is committed.
    const younger = store.beginSnapshot(3);
    younger.add(encodeSnapshotChunk(items(1, 'younger')));
    await writer.commit(second.length);
    // The first snapshot's three chunks are still there, unread.
    expect(store.loadSnapshot()).toMatchObject({ seq: 2, items: second });
    const removed: number[] = [];
    for (;;) {
      const pruned = store.pruneStaleChunks(2);
      removed.push(pruned.removed);
      await pruned.committed;
      if (pruned.removed < 2) break;
    }
    expect(removed).toEqual([2, 1]);
    expect(store.loadSnapshot()).toMatchObject({ seq: 2, items: second });
    await closeStore(store);
    const env = openDurableEnv(dir, ['snapshot']);
    expect(Array.from(env.dbs.snapshot.getKeys({}))).toEqual([
      0,
      chunkKey(2, 1),
      chunkKey(2, 2),
      chunkKey(3, 1),
    ]);
    await env.root.close();
  });

  it('refuses to commit a snapshot one of whose chunks is missing', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    for (const n of [1, 2]) await store.append(batch(n)).durable;
    await store.writeSnapshot(1, items(2, 'first'));
    const writer = store.beginSnapshot(2);
    for (let chunk = 0; chunk < 3; chunk++) writer.add(encodeSnapshotChunk(items(2, `c${chunk}`)));
    await store.append(batch(3)).durable;
    // As a failed write would leave it: the second chunk is not there.
    const env = openDurableEnv(dir, ['snapshot']);
    const missing = Array.from(env.dbs.snapshot.getKeys({ start: [CHUNK_PREFIX, 2] }))[1];
    expect(missing).toEqual(chunkKey(2, 2));
    env.dbs.snapshot.removeSync(missing as never);
    await expect(writer.commit(6)).rejects.toThrow(/1 of its 3 chunks were never stored/);
    expect(store.loadSnapshot()).toMatchObject({ seq: 1, items: items(2, 'first') });
    await env.root.close();
  });

  it('orders a snapshot after appends issued before it in the same turn', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    const before = [1, 2, 3].map((n) => store.append(batch(n)));
    const snapshot = store.writeSnapshot(3, items(10, 'x'));
    const after = store.append(batch(4));
    await Promise.all([...before.map((a) => a.durable), snapshot, after.durable]);
    await closeStore(store);

    const reopened = openStore(dir);
    expect(reopened.loadSnapshot()?.seq).toBe(3);
    expect(replayAll(reopened, 3).batches).toEqual([[4, batch(4)]]);
  });

  it('writes an empty snapshot and snapshots captured at call time', async () => {
    const store = openStore(tempDir());
    await store.append(batch(1)).durable;
    await store.writeSnapshot(1, []);
    expect(store.loadSnapshot()).toEqual({ seq: 1, createdAtMs: expect.any(Number), items: [] });
    const live = [{ balanceMinor: 1n }];
    const written = store.writeSnapshot(1, live);
    live[0] = { balanceMinor: 999n }; // mutation after the call must not leak in
    await written;
    expect(store.loadSnapshot()).toEqual({
      seq: 1,
      createdAtMs: expect.any(Number),
      items: [{ balanceMinor: 1n }],
    });
  });

  it('refuses snapshots beyond the journal or older than the current one', async () => {
    const store = openStore(tempDir());
    await store.append(batch(1)).durable;
    await store.append(batch(2)).durable;
    expect(() => store.writeSnapshot(3, [])).toThrow(/beyond the journal/);
    await store.writeSnapshot(2, []);
    expect(() => store.writeSnapshot(1, [])).toThrow(/go back before 2/);
  });

  it(
    'refuses, inside the transaction, ' + 'a concurrent snapshot older than the one before it',
    async () => {
      const store = openStore(tempDir());
      for (const n of [1, 2, 3]) await store.append(batch(n)).durable;
      const newer = store.writeSnapshot(3, items(5, 'newer'));
      const older = store.writeSnapshot(2, items(5, 'older'));
      await newer;
      await expect(older).rejects.toThrow(
        /snapshot at seq 2 was not committed: .*would replace a newer snapshot at 3/,
      );
      expect(store.loadSnapshot()).toEqual({
        seq: 3,
        createdAtMs: expect.any(Number),
        items: items(5, 'newer'),
      });
      expect(store.stats().snapshotSeq).toBe(3);
    },
  );

  it(
    'reads a snapshot chunk by chunk, and stops at a corrupt chunk after handing over the ' +
      'ones before it',
    async () => {
      const { dir, store, snapshotItems, chunk2 } = await storeWithThreeChunkSnapshot('r');
      const chunks: unknown[][] = [];
      expect(store.readSnapshot((chunk) => chunks.push([...chunk]))).toEqual({
        seq: 1,
        createdAtMs: expect.any(Number),
        itemCount: snapshotItems.length,
        formatVersion: SNAPSHOT_FORMAT_VERSION,
      });
      expect(chunks.map((c) => c.length)).toEqual([SNAPSHOT_CHUNK_ITEMS, SNAPSHOT_CHUNK_ITEMS, 1]);
      expect(chunks.flat()).toEqual(snapshotItems);
      await closeStore(store);

      await damage(dir, 'snapshot', chunkKey(1, 2), flipLastByte(chunk2));
      const reopened = openStore(dir);
      const seen: number[] = [];
      expect(() => reopened.readSnapshot((chunk) => seen.push(chunk.length))).toThrow(
        /chunk 2 failed verification \(checksum\)/,
      );
      expect(seen).toEqual([SNAPSHOT_CHUNK_ITEMS]);
    },
  );

  it('throws on a corrupt chunk, a missing chunk or a corrupt header', async () => {
    const { dir, store, chunk2 } = await storeWithThreeChunkSnapshot('c');
    await closeStore(store);

    await damage(dir, 'snapshot', chunkKey(1, 2), flipLastByte(chunk2));
    let reopened = openStore(dir);
    expect(() => reopened.loadSnapshot()).toThrow(/chunk 2 failed verification \(checksum\)/);
    await closeStore(reopened);

    await damage(dir, 'snapshot', chunkKey(1, 2), null);
    reopened = openStore(dir);
    expect(() => reopened.loadSnapshot()).toThrow(/snapshot is corrupt/);
    await closeStore(reopened);

    await damage(dir, 'snapshot', 0, Buffer.from('not a header'));
    expect(() => ShardStore.open(dir)).toThrow(/snapshot header is corrupt/);
  });
});
