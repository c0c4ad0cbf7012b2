/**
 * The outbox's reading rules against a real LMDB environment: the delivery thread reads a
 * shard's rows only up to the shard's durable mark, never sees the journal record a row
 * names, and recovery finds the rows of the records it drops by that name.
 */
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { openDurableEnv, SHARD_ENV_OPTIONS, type DurableEnv } from '../storage/lmdb-env.js';
import {
  OutboxMarks,
  outboxRowsAfter,
  putOutboxEvent,
  readOutbox,
  type OutboxEvent,
} from '../storage/outbox.js';
import { storeFixture } from './support/store-fixture.js';

const { tempDir, openStore } = storeFixture('tally-outbox-', (dir) => {
  const env = openDurableEnv<'outbox'>(dir, ['outbox'], SHARD_ENV_OPTIONS);
  return Object.assign(env, { close: () => env.root.close() });
});

const event = (n: number): OutboxEvent => ({
  id: `evt_${n}`,
  type: 'usage.exhausted',
  environment: 'test',
  customerId: `c${n}`,
  createdAtMs: 1_000 + n,
  data: { n },
});

/** Rows 1..records.length, row n written with journal record records[n - 1] (null: none). */
async function outboxOf(records: ReadonlyArray<number | null>): Promise<DurableEnv<'outbox'>> {
  const env = openStore(tempDir());
  await Promise.all(
    records.map((record, i) => putOutboxEvent(env.dbs.outbox, i + 1, event(i + 1), record)),
  );
  return env;
}

const seqsOf = (rows: ReadonlyArray<{ seq: number }>) => rows.map((row) => row.seq);

describe('outbox', () => {
  it('reads only up to the durable mark, and never shows the record a row names', async () => {
    const { dbs } = await outboxOf([1, 1, 2, 3, 3]);
    expect(seqsOf(readOutbox(dbs.outbox, 0, 10))).toEqual([1, 2, 3, 4, 5]);
    expect(seqsOf(readOutbox(dbs.outbox, 0, 10, 3))).toEqual([1, 2, 3]);
    expect(seqsOf(readOutbox(dbs.outbox, 1, 10, 4))).toEqual([2, 3, 4]);
    expect(seqsOf(readOutbox(dbs.outbox, 1, 2, 5))).toEqual([2, 3]);
    expect(readOutbox(dbs.outbox, 3, 10, 3)).toEqual([]);
    expect(readOutbox(dbs.outbox, 0, 10, 0)).toEqual([]);
    // The event as it was given, without the journal record its row names.
    expect(readOutbox(dbs.outbox, 3, 1)).toEqual([{ seq: 4, event: event(4) }]);
  });

  it('finds the newest rows of records after a seq, up to a row that names none', async () => {
    const { dbs } = await outboxOf([null, null, 7, 8, 8, 9]);
    expect(outboxRowsAfter(dbs.outbox, 9)).toEqual([]);
    expect(outboxRowsAfter(dbs.outbox, 8)).toEqual([6]);
    expect(outboxRowsAfter(dbs.outbox, 7)).toEqual([6, 5, 4]);
    // Rows 1 and 2 name no record (written before rows named theirs): they are kept.
    expect(outboxRowsAfter(dbs.outbox, 0)).toEqual([6, 5, 4, 3]);
    const empty = openStore(tempDir());
    expect(outboxRowsAfter(empty.dbs.outbox, 0)).toEqual([]);
  });

  it('a mark only rises, per shard, and another thread reads it', async () => {
    const memory = OutboxMarks.memory(2);
    const shard = new OutboxMarks(memory);
    const reader = new OutboxMarks(memory);
    expect([reader.get(0), reader.get(1)]).toEqual([0, 0]);
    shard.raise(1, 5);
    shard.raise(1, 3);
    expect([reader.get(0), reader.get(1)]).toEqual([0, 5]);
    shard.raise(0, 2 ** 40);
    const seen = await new Promise<number>((resolve, reject) => {
      const worker = new Worker(
        `const { workerData, parentPort } = require('node:worker_threads');
         parentPort.postMessage(Number(Atomics.load(new BigInt64Array(workerData), 0)));`,
        { eval: true, workerData: memory },
      );
      worker.once('message', (value: number) => {
        resolve(value);
        void worker.terminate();
      });
      worker.once('error', reject);
    });
    expect(seen).toBe(2 ** 40);
  });
});
