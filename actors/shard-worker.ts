/**
 * Entry point of a shard worker thread: the IO shell around `Shard`.
 *
 * On start it recovers (latest snapshot, then the journal after it, dropping a torn
 * tail record), reports `ready`, and then serves batches from the front end. Replies
 * are coalesced into one message per event-loop turn. Any journal failure or broken
 * invariant crashes the worker (and with it the process): recovery from disk is the
 * only repair.
 */
import { isMainThread, parentPort, workerData } from 'node:worker_threads';
import path from 'node:path';
import { assert } from './assert.js';
import type { CustomerSnapshot, Event } from './customer.js';
import { SNAPSHOT_INTERVAL_MS } from './limits.js';
import { decodeBatch, type FromWorker, type ReplyTriples, type ToWorker } from './protocol.js';
import { Shard, type CustomerIndexEntry } from './shard.js';
import { ShardStore } from '../storage/journal.js';

export interface ShardWorkerData {
  readonly dataDir: string;
  readonly workerIndex: number;
  /** Journal batches between automatic snapshots (SNAPSHOT_EVERY_BATCHES unless overridden). */
  readonly snapshotEveryBatches: number;
}

assert(!isMainThread && parentPort !== null, 'shard-worker runs in a worker thread');
const port = parentPort;
const { dataDir, workerIndex, snapshotEveryBatches } = workerData as ShardWorkerData;

let outbox: ReplyTriples = [];

function post(message: FromWorker): void {
  port.postMessage(message);
}

/** Sends every buffered reply in one message (the shard calls it once per batch or group). */
function flushReplies(): void {
  if (outbox.length === 0) return;
  const replies = outbox;
  outbox = [];
  post({ t: 'replies', replies });
}

function reply(id: number, status: number, body: string): void {
  outbox.push(id, status, body);
}

function crash(error: unknown): never {
  // Never continue after a failed write: the process dies and recovery rebuilds from disk.
  process.stderr.write(`shard ${workerIndex}: fatal: ${String(error instanceof Error ? error.stack : error)}\n`);
  process.exit(70);
}

const store = ShardStore.open(path.join(dataDir, `shard-${workerIndex}`));
const shard = new Shard({
  journal: {
    append: (events: readonly Event[], index: readonly CustomerIndexEntry[]) =>
      store.append(
        events,
        index.map((entry) => ({ environment: entry.environment, id: entry.id, json: Buffer.from(JSON.stringify(entry.view)) })),
      ),
  },
  clock: Date.now,
  reply,
  // Right after a group is released the next one has just been handed to the journal, so
  // nothing is pending: under sustained load this is when a due snapshot can be taken.
  flush: () => {
    flushReplies();
    maybeSnapshot();
  },
  fatal: crash,
});

function recover(): void {
  // Chunk by chunk: the decoded items of one chunk become state and are garbage before
  // the next is read (a failure part-way kills the worker, so partial state never serves).
  const snapshot = store.readSnapshot((items) => shard.loadSnapshot(items as CustomerSnapshot[]));
  const result = store.replay(snapshot?.seq ?? 0, (_seq, events) => shard.replay(events as Event[]));
  post({
    t: 'ready',
    stats: {
      customers: shard.customerCount,
      lastSeq: store.lastSeq,
      snapshotSeq: snapshot?.seq ?? 0,
      replayedBatches: result.batches,
      droppedTornTail: result.droppedTail,
    },
  });
}

let lastSnapshotAtMs = Date.now();
let snapshotting = false;

/** Snapshots when enough has been journaled since the last one, bounding replay time. */
function maybeSnapshot(): void {
  // Events decided but not yet appended are in memory only: a snapshot now would hold
  // them and the journal would later replay them again. Wait for the group to go out.
  if (snapshotting || shard.hasPendingEvents) return;
  const due = shard.batchesSinceSnapshot >= snapshotEveryBatches
    || (shard.batchesSinceSnapshot > 0 && Date.now() - lastSnapshotAtMs >= SNAPSHOT_INTERVAL_MS);
  if (!due) return;
  snapshotting = true;
  const seq = store.lastSeq;
  const items = shard.snapshotItems();
  shard.batchesSinceSnapshot = 0;
  lastSnapshotAtMs = Date.now();
  store.writeSnapshot(seq, items).then(() => {
    snapshotting = false;
  }, crash);
}

function onMessage(message: ToWorker): void {
  switch (message.t) {
    case 'batch':
      shard.handleBatch(decodeBatch(message.wire));
      return;
    case 'config':
      shard.setConfig(message.environment, message.version, message.config);
      return;
    case 'stop':
      void store.close().then(() => post({ t: 'stopped' }), crash);
      return;
  }
}

try {
  recover();
} catch (error) {
  crash(error);
}
port.on('message', onMessage);
setInterval(() => maybeSnapshot(), SNAPSHOT_INTERVAL_MS).unref();
