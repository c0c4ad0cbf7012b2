/**
 * Entry point of a shard worker thread: the IO shell around `Shard`.
 *
 * On start it recovers (latest snapshot, then the journal after it, dropping a torn
 * tail record), makes what it recovered durable (the recovery barrier,
 * ShardStore.syncRecovered), reports `ready`, and then serves batches from the front end. Replies
 * are coalesced into one message per event-loop turn. Any journal failure or broken
 * invariant crashes the worker (and with it the process): recovery from disk is the
 * only repair.
 */
import type { WorkerQuotas } from '../shared/quotas.js';
import { nameThisThread } from './thread-name.js';
import {
  isMainThread,
  parentPort,
  receiveMessageOnPort,
  workerData,
  type MessagePort,
} from 'node:worker_threads';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { assert } from '../shared/assert.js';
import { getHeapStatistics } from 'node:v8';
import { PublishedViews } from './has-view.js';
import { GcPauses } from './gc-pauses.js';
import { Histogram, JOURNAL_BATCH_EVENTS_BOUNDS, JOURNAL_FLUSH_BOUNDS_MS } from './histogram.js';
import type { CustomerState, Event } from './customer.js';
import { isCustomerSnapshot, isEvent } from './core/shapes.js';
import {
  FRONT_ENDS_MAX,
  IDEMPOTENCY_RETENTION_MS,
  SNAPSHOT_EVERY_EVENTS,
  SNAPSHOT_INTERVAL_MS,
  SNAPSHOT_SLICE_MS,
} from '../shared/limits.js';
import {
  decodeBatch,
  isPendingAudit,
  type AuditEffect,
  type FromWorker,
  type PendingAudit,
  type ReplyBatch,
  type ReplyOutcome,
  type ShardLiveStats,
  type ToWorker,
} from './protocol.js';
import {
  IDEMPOTENCY_LAYOUT_META,
  IDEMPOTENCY_LAYOUT_VERSION,
  IDEMPOTENCY_RUNS_LAYOUT,
  KeyMigration,
  KeyUpkeep,
} from './idempotency-upkeep.js';
import { keysOfEvents } from './idempotency-keys.js';
import { Shard, type CustomerIndexEntry } from './shard.js';
import { PartFile, ShardCopy } from './shard-export.js';
import {
  encodeSnapshotChunk,
  indexRowOf,
  JOURNAL_PRUNE_SLICE,
  SNAPSHOT_PRUNE_CHUNKS,
  ShardStore,
} from '../storage/journal.js';
import { OutboxMarker, OutboxMarks, type OutboxEvent } from '../storage/outbox.js';
import { lessWaits, threadWaitMs, threadWaitMsSince } from '../storage/thread-time.js';
import type { Notice } from './webhook-events.js';

export interface ShardWorkerData {
  readonly dataDir: string;
  readonly workerIndex: number;
  /** Journal batches between automatic snapshots (SNAPSHOT_EVERY_BATCHES unless overridden). */
  readonly snapshotEveryBatches: number;
  /** Work per slice of a snapshot copy (SNAPSHOT_SLICE_WORK unless overridden). */
  readonly snapshotSliceWork: number;
  /** Idempotency keys held in memory before a run is sealed (IDEMPOTENCY_RUN_KEYS by default). */
  readonly idempotencyRunKeys: number;
  /**
   * Groups of runs a new era of idempotency filters holds at most, or null: each new era
   * sized by the keys' rate (the default).
   */
  readonly idempotencyEraGroups: number | null;
  /** This worker's shares of the operator's quotas. */
  readonly quotas: WorkerQuotas;
  /** The stamp counters of the `has` view (shared with the front ends: has-view.ts). */
  readonly viewStamps: Int32Array;
  /** Every shard's durable outbox mark (storage/outbox.ts), shared with the delivery thread. */
  readonly outboxMarks: SharedArrayBuffer;
  /**
   * Channels of the front-end threads after the first (TALLY_FRONTENDS), the second front end's
   * first: they send batches only, and get their replies here.
   */
  readonly frontEnds: readonly MessagePort[];
}

assert(!isMainThread && parentPort !== null, 'shard-worker runs in a worker thread');
const port = parentPort;
const {
  dataDir,
  workerIndex,
  snapshotEveryBatches,
  snapshotSliceWork,
  idempotencyRunKeys,
  idempotencyEraGroups,
  quotas,
  viewStamps,
  outboxMarks,
  frontEnds,
} = workerData as ShardWorkerData;
nameThisThread(`tally-shard-${workerIndex}`);

/** Each front end's channel: the first front end's is the parent port. */
const channels: ReadonlyArray<{ postMessage(message: FromWorker): void }> = [port, ...frontEnds];
/** Replies buffered per front end (a request id's remainder by FRONT_ENDS_MAX names it). */
const outboxes: ReplyBatch[] = channels.map(() => []);

function post(message: FromWorker): void {
  port.postMessage(message);
}

/**
 * What the first front end's `has` view needs to know; sent with its replies, in order.
 * (Only the first front end keeps the view; the others ask the shard.)
 */
const views = new PublishedViews(undefined, viewStamps);

/**
 * Sends every buffered reply in one message per front end (the shard calls it once per
 * batch or group), the first one's with the view changes decided since the last one.
 */
function flushReplies(): void {
  const view = views.take();
  for (let index = 0; index < channels.length; index++) {
    const replies = outboxes[index] as ReplyBatch;
    if (replies.length === 0 && (index > 0 || view.length === 0)) continue;
    outboxes[index] = [];
    (channels[index] as (typeof channels)[number]).postMessage({
      t: 'replies',
      replies,
      view: index === 0 ? view : [],
    });
  }
}

function reply(id: number, outcome: ReplyOutcome, body: string, effect: AuditEffect): void {
  const outbox = outboxes[id % FRONT_ENDS_MAX];
  assert(outbox !== undefined, `request ${id} names no front end of this worker`);
  outbox.push(id, outcome, body, effect);
}

function crash(error: unknown): never {
  // Never continue after a failed write: the process dies and recovery rebuilds from disk.
  process.stderr.write(
    `shard ${workerIndex}: fatal: ${String(error instanceof Error ? error.stack : error)}\n`,
  );
  process.exit(70);
}

const store = ShardStore.open(path.join(dataDir, `shard-${workerIndex}`), {
  isEvent,
  isSnapshotItem: isCustomerSnapshot,
  isAudit: isPendingAudit,
  keysOf: keysOfEvents,
});
store.idempotency.eraGroups = idempotencyEraGroups;
/**
 * TEST ONLY, never set in production: TALLY_TEST_MAP_ERAS_FROM=<bytes> stores closed
 * idempotency eras from that size on in the memory map (storage/idempotency-eras.ts), so a
 * kill -9 test whose eras are tiny exercises the mapped path a busy shard takes.
 */
const MAP_ERAS_FROM_FOR_TESTS = process.env['TALLY_TEST_MAP_ERAS_FROM'];
if (MAP_ERAS_FROM_FOR_TESTS !== undefined) {
  const bytes = Number(MAP_ERAS_FROM_FOR_TESTS);
  assert(Number.isSafeInteger(bytes) && bytes >= 0, 'TALLY_TEST_MAP_ERAS_FROM is a byte count');
  store.idempotency.mapErasFrom = bytes;
  process.stderr.write(
    `shard ${workerIndex}: TALLY_TEST_MAP_ERAS_FROM=${bytes}: eras that small go to the ` +
      `memory map (test only)\n`,
  );
}
/** Metrics of this worker's journal, shipped with every stats reply. */
const journalFlushMs = new Histogram(JOURNAL_FLUSH_BOUNDS_MS);
const journalBatchEvents = new Histogram(JOURNAL_BATCH_EVENTS_BOUNDS);
/** This worker's garbage-collection pauses (its heap is its own). */
const gcPauses = new GcPauses();
/** Automatic snapshots stored since start, and the latest one's timing (metrics). */
let snapshotsTaken = 0;
let lastSnapshotMs: number | null = null;
let lastSnapshotPauseMsMax: number | null = null;
let lastSnapshotWorkMsMax: number | null = null;
let lastSnapshotStoreMs: number | null = null;
let lastSnapshotStoreWorkMs: number | null = null;

/**
 * Audit entries the chain now holds, whose stored copies this shard may drop. They go
 * with the next journal append rather than in a write of their own: a forget needs no
 * fsync (a copy that survives a crash is only forgotten again at the next start, because
 * the chain already has its reference), and an extra sync would hold up every consume
 * queued behind it. A clean stop writes what is left.
 */
let auditsToForget: string[] = [];

/**
 * TEST ONLY, never set in production: TALLY_TEST_BREAK_DURABILITY breaks the durability
 * rule on purpose, as the negative control of a syscall-level test that must catch it;
 * the worker says so loudly at start.
 * - `previous-sync` releases each append's replies when the PREVIOUS append is durable
 *   instead of its own, so an acknowledged write can be lost
 *   (test/durability-strace-concurrent.test.ts);
 * - `no-recovery-sync` reports ready without the recovery barrier, so a reply computed
 *   from records a killed process never synced can leave before they are on disk
 *   (test/durability-strace-recovery.test.ts).
 */
const BREAK_DURABILITY = process.env['TALLY_TEST_BREAK_DURABILITY'];
const BREAK_DURABILITY_FOR_TESTS = BREAK_DURABILITY === 'previous-sync';
const SKIP_RECOVERY_SYNC_FOR_TESTS = BREAK_DURABILITY === 'no-recovery-sync';
if (BREAK_DURABILITY_FOR_TESTS) {
  process.stderr.write(
    `shard ${workerIndex}: TALLY_TEST_BREAK_DURABILITY=previous-sync: replies do NOT wait ` +
      `for their own journal sync (test-only negative control)\n`,
  );
}
if (SKIP_RECOVERY_SYNC_FOR_TESTS) {
  process.stderr.write(
    `shard ${workerIndex}: TALLY_TEST_BREAK_DURABILITY=no-recovery-sync: ready WITHOUT ` +
      `syncing what recovery read (test-only negative control)\n`,
  );
}
let previousDurableForTests: Promise<void> = Promise.resolve();

/** A webhook event as stored, named here: ids are random, so the pure core never makes one. */
function outboxEventOf(notice: Notice): OutboxEvent {
  return {
    id: `evt_${randomBytes(16).toString('base64url')}`,
    type: notice.type,
    environment: notice.environment,
    customerId: notice.customerId,
    createdAtMs: notice.atMs,
    data: notice.data,
  };
}

/** This shard's durable outbox mark, read by the delivery thread (storage/outbox.ts). */
const outboxMarker = new OutboxMarker(new OutboxMarks(outboxMarks), workerIndex);

function appendTimed(
  events: readonly Event[],
  index: readonly CustomerIndexEntry[],
  audits: readonly PendingAudit[],
  keyed: number,
  notices: readonly Notice[],
): { readonly seq: number; readonly durable: Promise<void> } {
  const issuedMs = performance.now();
  const forget = auditsToForget;
  auditsToForget = [];
  const appended = store.append(
    events,
    index.map((entry) => ({
      environment: entry.environment,
      id: entry.id,
      json: indexRowOf(entry.view),
    })),
    audits,
    forget,
    notices.map(outboxEventOf),
  );
  // The record carries its keys (its events do): the journal keeps it until they are sealed.
  if (keyed > 0) store.idempotency.carried(appended.seq);
  outboxMarker.issued(appended.durable, store.outboxSeq);
  journalBatchEvents.observe(events.length);
  // A failed write is the shard's to handle (it crashes); this handler only measures.
  appended.durable.then(
    () => journalFlushMs.observe(performance.now() - issuedMs),
    () => undefined,
  );
  if (BREAK_DURABILITY_FOR_TESTS) {
    const previous = previousDurableForTests;
    previousDurableForTests = appended.durable;
    return { seq: appended.seq, durable: previous };
  }
  return appended;
}

const shard = new Shard({
  journal: { append: appendTimed },
  clock: Date.now,
  reply,
  // Right after a group is released the next one has just been handed to the journal, so
  // nothing is pending: under sustained load this is when a due snapshot can be taken.
  flush: () => {
    flushReplies();
    maybeSnapshot();
  },
  fatal: crash,
  quotas,
  storedKeys: store.idempotency,
  views,
});

/** Set by a clean stop: no more upkeep writes (sealing, dropping, pruning) after it. */
let stopping = false;

/** Seals idempotency keys into runs on disk and drops expired runs while the shard serves. */
const keyUpkeep = new KeyUpkeep(store.idempotency, shard, Date.now, crash, {
  runKeys: idempotencyRunKeys,
  rebuilt: (groups, ms) => post({ t: 'erasRebuilt', groups, ms: Math.round(ms) }),
});

/** When this shard's latest snapshot was stored (null: it never took one). */
let lastSnapshotAtMs: number | null = null;

async function recover(): Promise<void> {
  // Chunk by chunk: the decoded items of one chunk become state and are garbage before
  // the next is read (a failure part-way kills the worker, so partial state never serves).
  // A data dir of the layout before the key table: its keys move into the table as they
  // are read (idempotency-upkeep.ts), made durable by the barrier below with the meta.
  const layout = store.getMeta(IDEMPOTENCY_LAYOUT_META) as { version?: unknown } | undefined;
  // A layout newer than this release reads (keys elsewhere, or in another form) is refused,
  // as a newer snapshot format is: going on would miss keys and mark the dir as older.
  if (
    layout !== undefined &&
    !(typeof layout.version === 'number' && layout.version <= IDEMPOTENCY_LAYOUT_VERSION)
  )
    throw new Error(
      `the idempotency keys of ${dataDir} are of layout ${String(layout.version)}; this ` +
        `release reads layouts up to ${IDEMPOTENCY_LAYOUT_VERSION}: run a newer release`,
    );
  const migration = layout === undefined ? new KeyMigration(store.idempotency, Date.now()) : null;
  const snapshot = store.readSnapshot((items) => {
    migration?.snapshotItems(items);
    shard.loadSnapshot(items);
  });
  if (snapshot !== null) lastSnapshotAtMs = snapshot.createdAtMs;
  const result = store.replay(snapshot?.seq ?? 0, (_seq, events) => {
    migration?.events(events);
    shard.replay(events);
  });
  // Recovery dropped records (now or in a start cut short): their customer index rows may
  // still list or describe what never applied, so the index is made to match the customers.
  const indexRepaired = store.indexRepairPending ? store.repairIndex(shard.indexEntries()) : null;
  // Awaited after the barrier; a failure seen before then is reported there, not unhandled.
  indexRepaired?.catch(() => undefined);
  // Layout 1 kept keys in one table in key order: it moves into runs before serving.
  const tableMoved =
    ((layout?.version as number | undefined) ?? 0) >= IDEMPOTENCY_RUNS_LAYOUT
      ? 0
      : await store.idempotency.migrateTable(Date.now() - IDEMPOTENCY_RETENTION_MS, {
          pause: () => new Promise((resolve) => setImmediate(resolve)),
        });
  const layoutStored =
    layout?.version === IDEMPOTENCY_LAYOUT_VERSION
      ? Promise.resolve()
      : store.putMeta(IDEMPOTENCY_LAYOUT_META, { version: IDEMPOTENCY_LAYOUT_VERSION });
  // The recovery barrier: after kill -9 what was just read may be in the page cache only
  // (LMDB reopens at the newest commit, synced or not). A reply computed from it without
  // a new record of its own (an idempotent retry, a rejection) would acknowledge state a
  // power cut could still take, so nothing is served before it is all on disk.
  const syncStartedMs = performance.now();
  if (!SKIP_RECOVERY_SYNC_FOR_TESTS) await store.syncRecovered();
  await layoutStored;
  const indexRepair = indexRepaired === null ? null : await indexRepaired;
  // Everything in the outbox now is on disk: the delivery thread may read all of it.
  outboxMarker.recovered(store.outboxSeq);
  const recoverySyncMs = performance.now() - syncStartedMs;
  if (shard.countsKeys)
    shard.countStoredKeys({
      test: store.idempotency.countOf('test'),
      live: store.idempotency.countOf('live'),
    });
  post({
    t: 'ready',
    pendingAudits: store.pendingAudits(),
    stats: {
      customers: shard.customerCount,
      lastSeq: store.lastSeq,
      snapshotSeq: snapshot?.seq ?? 0,
      replayedBatches: result.batches,
      droppedTornTail: result.droppedTail,
      droppedAfterGap: result.droppedAfterGap,
      ...(indexRepair === null ? {} : { indexRowsRepaired: indexRepair }),
      recoverySyncMs: Math.round(recoverySyncMs * 10) / 10,
      idempotencyKeysReheld: result.reheldKeys,
      ...(migration === null && tableMoved === 0
        ? {}
        : { idempotencyKeysMigrated: (migration?.moved ?? 0) + tableMoved }),
    },
  });
}

/** Start of the current snapshot interval (SNAPSHOT_INTERVAL_MS counts from here). */
let intervalStartMs = Date.now();
let snapshotting = false;

/**
 * Snapshots when enough has been journaled since the last one, bounding replay time. The
 * copy is taken as of now (the journal's last seq) and made in slices between batches, so
 * a shard of a million customers keeps answering while it snapshots (collecting and
 * encoding them in one go held the thread for 5–14 s); the chunks are stored when it is done.
 */
function maybeSnapshot(): void {
  // Events decided but not yet appended are in memory only: a snapshot now would hold
  // them and the journal would later replay them again. Wait for the group to go out.
  if (snapshotting || shard.hasPendingEvents) return;
  const due =
    shard.batchesSinceSnapshot >= snapshotEveryBatches ||
    shard.eventsSinceSnapshot >= SNAPSHOT_EVERY_EVENTS ||
    (shard.batchesSinceSnapshot > 0 && Date.now() - intervalStartMs >= SNAPSHOT_INTERVAL_MS);
  if (!due) return;
  snapshotting = true;
  const startedMs = performance.now();
  const seq = store.lastSeq;
  // Each chunk goes to disk as it is encoded; the commit only names them.
  const writer = store.beginSnapshot(seq);
  const copy = new ShardCopy(shard.customerMaps(), (items) =>
    writer.add(encodeSnapshotChunk(items)),
  );
  shard.batchesSinceSnapshot = 0;
  shard.eventsSinceSnapshot = 0;
  intervalStartMs = Date.now();
  runCopy(
    copy,
    (sliceMsMax, sliceWorkMsMax) => {
      writer.commit(copy.done).then(() => {
        snapshotting = false;
        lastSnapshotAtMs = Date.now();
        snapshotsTaken += 1;
        lastSnapshotMs = performance.now() - startedMs;
        lastSnapshotStoreMs = store.lastSnapshotWriteMs;
        lastSnapshotPauseMsMax = Math.max(sliceMsMax, lastSnapshotStoreMs);
        lastSnapshotStoreWorkMs = store.lastSnapshotWriteWorkMs;
        lastSnapshotWorkMsMax =
          sliceWorkMsMax === null || lastSnapshotStoreWorkMs === null
            ? null
            : Math.max(sliceWorkMsMax, lastSnapshotStoreWorkMs);
        pruneJournal();
      }, crash);
    },
    crash,
  );
}

/**
 * Removes the journal records the stored snapshot covers (its own transaction removed only
 * the first few: JOURNAL_PRUNE_IN_SNAPSHOT_MAX) and the chunks of the snapshot it
 * replaced, a slice at a time between batches.
 */
function pruneJournal(): void {
  if (stopping) return;
  const records = store.pruneCovered(JOURNAL_PRUNE_SLICE);
  const chunks = store.pruneStaleChunks(SNAPSHOT_PRUNE_CHUNKS);
  if (records.removed === JOURNAL_PRUNE_SLICE || chunks.removed === SNAPSHOT_PRUNE_CHUNKS)
    void Promise.all([records.committed, chunks.committed]).then(() => setImmediate(pruneJournal));
}

/** Copies in progress (a periodic snapshot and an online one may overlap). */
const running = new Set<{ readonly copy: ShardCopy; failure: unknown }>();

/** Tells every copy in progress about each write (see ShardCopy). */
const observeWrites = {
  before(customer: CustomerState): void {
    for (const run of running) {
      if (run.failure !== null) continue;
      try {
        run.copy.capture(customer);
      } catch (error) {
        // Never let a snapshot's IO fail the batch being decided: fail that snapshot.
        run.failure = error;
      }
    }
  },
  created(customer: CustomerState): void {
    for (const run of running) run.copy.created(customer);
  },
};

/**
 * Runs `copy` to the end in slices of `snapshotSliceWork` units or SNAPSHOT_SLICE_MS of
 * copying, whichever ends first, one per event-loop turn, calling `onSlice` after each
 * unfinished one; then `done` with the longest slice (ms) by the clock, and less the
 * thread's waits for a core (null where unknown), or `failed` with the error its sink
 * threw (in a slice, or while capturing a pre-image during a batch).
 */
function runCopy(
  copy: ShardCopy,
  done: (sliceMsMax: number, sliceWorkMsMax: number | null) => void,
  failed: (error: unknown) => void,
  onSlice: () => void = () => undefined,
): void {
  const run = { copy, failure: null as unknown };
  running.add(run);
  shard.writeObserver = observeWrites;
  const finish = (): void => {
    running.delete(run);
    if (running.size === 0) shard.writeObserver = null;
  };
  let sliceMsMax = 0;
  let sliceWorkMsMax: number | null = 0;
  const step = (): void => {
    let finished = false;
    try {
      if (run.failure !== null) throw run.failure;
      const startedMs = performance.now();
      const startedWaitMs = sliceWorkMsMax === null ? null : threadWaitMs();
      finished = copy.step(snapshotSliceWork, startedMs + SNAPSHOT_SLICE_MS);
      const sliceMs = performance.now() - startedMs;
      sliceMsMax = Math.max(sliceMsMax, sliceMs);
      const workMs = lessWaits(sliceMs, threadWaitMsSince(startedWaitMs));
      sliceWorkMsMax =
        workMs === null || sliceWorkMsMax === null ? null : Math.max(sliceWorkMsMax, workMs);
    } catch (error) {
      finish();
      failed(error);
      return;
    }
    if (!finished) {
      onSlice();
      setImmediate(step);
      return;
    }
    finish();
    done(sliceMsMax, sliceWorkMsMax);
  };
  setImmediate(step);
}

function liveStats(): ShardLiveStats {
  const stored = store.stats();
  return {
    customers: shard.customerCount,
    idempotencyEntries: store.idempotency.size,
    idempotencyKeysInMemory: shard.idempotencyKeysInMemory,
    idempotencyRuns: store.idempotency.runs.length,
    idempotencyEras: store.idempotency.eraCount,
    idempotencyOpenEraGroups: store.idempotency.openEraGroups ?? 0,
    idempotencyGroupsOutsideEras: store.idempotency.groupsOutsideEras,
    idempotencyFilterBytes: store.idempotency.filterBytes,
    idempotencyFilterMappedBytes: store.idempotency.mappedFilterBytes,
    lastSeq: stored.lastSeq,
    snapshotSeq: stored.snapshotSeq,
    journalRecords: stored.journalRecords,
    usedBytes: stored.usedBytes,
    lastSnapshotAtMs,
    heapUsedBytes: getHeapStatistics().used_heap_size,
    gc: gcPauses.stats(),
    snapshotsTaken,
    lastSnapshotMs,
    lastSnapshotPauseMsMax,
    lastSnapshotWorkMsMax,
    lastSnapshotStoreMs,
    lastSnapshotStoreWorkMs,
    journalFlushMs: journalFlushMs.data(),
    journalBatchEvents: journalBatchEvents.data(),
  };
}

function onMessage(message: ToWorker): void {
  switch (message.t) {
    case 'batch':
      shard.handleBatch(decodeBatch(message.wire));
      return;
    case 'config':
      shard.setConfig(message.environment, message.version, message.config);
      // The front end serves no `has` of the environment from its view until it hears this.
      flushReplies();
      return;
    case 'stats':
      post({ t: 'stats', requestId: message.requestId, stats: liveStats() });
      return;
    case 'cut':
      startExport(message.snapshotId, message.partPath);
      return;
    case 'auditsRecorded':
      for (const ref of message.refs) auditsToForget.push(ref);
      return;
    case 'stop':
      // Batches the other front ends sent before they stopped (they stop first) are served.
      for (const frontEnd of frontEnds)
        for (let queued = receiveMessageOnPort(frontEnd); queued !== undefined; ) {
          onFrontEndMessage(queued.message as ToWorker);
          queued = receiveMessageOnPort(frontEnd);
        }
      stopping = true;
      void keyUpkeep
        .stop()
        // The open era's image, so its groups are not probed one by one after the restart.
        .then(() => store.idempotency.storeOpenEra(() => new Promise(setImmediate)))
        .then(() => store.forgetAudits(auditsToForget))
        .then(() => store.close())
        .then(() => post({ t: 'stopped' }), crash);
      return;
  }
}

/** Progress is reported every this many slices. */
const EXPORT_PROGRESS_EVERY_SLICES = 25;

let exporting = false;

/**
 * Takes this shard's cut of an online snapshot: the customers as they are now, with every
 * event decided so far, and the idempotency keys stored so far. The part is reported done
 * only once those events are durable, so a snapshot never holds a write that a crash could
 * still lose.
 */
function startExport(snapshotId: string, partPath: string): void {
  if (exporting) {
    post({ t: 'cutFailed', snapshotId, error: 'this shard is still writing an earlier snapshot' });
    return;
  }
  let part: PartFile;
  try {
    part = new PartFile(partPath);
  } catch (error) {
    post({ t: 'cutFailed', snapshotId, error: String(error) });
    return;
  }
  exporting = true;
  const position = store.lastSeq + (shard.hasPendingEvents ? 1 : 0);
  const durable = new Promise<void>((resolve) => shard.whenDurable(resolve));
  const keys = shard.keysAtCut();
  const copy = new ShardCopy(
    shard.customerMaps(),
    (items) => part.write(items),
    { cut: keys, sink: (items) => part.writeKeys(items) },
    1,
  );
  let slices = 0;
  runCopy(
    copy,
    () => {
      part.close();
      keys.close();
      exporting = false;
      const result = { frames: part.frames, customers: copy.done, bytes: part.bytes, position };
      void durable.then(() => post({ t: 'cutDone', snapshotId, result }));
    },
    (error) => {
      // A failed export (e.g. a full disk) fails the snapshot, not the shard.
      part.close();
      keys.close();
      exporting = false;
      post({ t: 'cutFailed', snapshotId, error: String(error) });
    },
    () => {
      if (++slices % EXPORT_PROGRESS_EVERY_SLICES === 0)
        post({ t: 'cutProgress', snapshotId, done: copy.done, total: copy.total });
    },
  );
}

/** A front end after the first sends batches only; anything else from it is a broken invariant. */
function onFrontEndMessage(message: ToWorker): void {
  assert(message.t === 'batch', `a second front end sent ${message.t}`);
  shard.handleBatch(decodeBatch(message.wire));
}

recover().then(() => {
  port.on('message', onMessage);
  for (const frontEnd of frontEnds) frontEnd.on('message', onFrontEndMessage);
  keyUpkeep.start();
  setInterval(() => maybeSnapshot(), SNAPSHOT_INTERVAL_MS).unref();
}, crash);
