/**
 * A shard worker's durable storage: its write-ahead journal, its latest snapshot and a
 * little metadata, all in one LMDB environment that only that worker writes (its
 * idempotency eras' images, tens of megabytes each, in a second one: ERA_ENV_DIR).
 *
 * Why it exists: a shard replies to a batch of commands only after the batch's events are
 * on disk, and recovers by loading the latest snapshot and replaying the journal after it.
 * So this class promises exactly four things:
 * - `append` assigns sequence numbers synchronously and in order, and its `durable`
 *   promise resolves only once the record is fsynced (lmdb-env.ts says which option
 *   guarantees that and why). Appends issued in one event-loop turn share one LMDB
 *   transaction, hence one fsync.
 * - `replay` hands back every record after a snapshot, in order, or refuses: a bad LAST
 *   record (a torn tail: never acknowledged, or rotted) is dropped, a bad or missing record
 *   anywhere else throws, because skipping it would silently lose acknowledged events.
 * - `writeSnapshot` replaces the previous snapshot and prunes the journal it covers in ONE
 *   transaction, so there is never a moment with neither the old snapshot nor the records.
 *   Records that carry idempotency keys not yet sealed into runs are kept past it
 *   (`KeyStore.keptFrom`): recovery reads their keys again.
 * - `syncRecovered` resolves only once everything the store holds is on disk, including
 *   transactions a killed process committed but never synced: the recovery barrier.
 *
 * Layout: `journal` maps seq (ordered-binary number) → frame(events array); `snapshot`
 * maps 0 → frame(header) and 1..chunkCount → frame(items chunk); `meta` maps name → frame
 * (`recovered`: see syncRecovered); `outbox` holds the webhook events of journaled changes
 * until the delivery thread has taken them (storage/outbox.ts).
 *
 * Records are typed by the store's user, who knows what they are (the shard worker: its
 * events, snapshot items and audit entries); storage knows only how to keep them. A store
 * opened with RecordShapes checks every event, snapshot item and audit entry it reads back
 * against them and refuses one of the wrong shape as corrupt.
 */
import { join } from 'node:path';
import { assert } from '../shared/assert.js';
import {
  decodeRecord,
  encodeRecord,
  encodeWithJournalRecord,
  journalRecordOf,
  withoutJournalRecord,
} from './codec.js';
import { lastOutboxSeq, outboxRowsAfter, putOutboxEvent, type OutboxEvent } from './outbox.js';
import {
  ERA_TABLE,
  IDEMPOTENCY_DB_NAMES,
  KeyStore,
  type IdempotencyDbName,
  type KeyPut,
} from './idempotency-runs.js';
import {
  envInfo,
  flushedWrite,
  openDurableEnv,
  readRecord,
  SHARD_ENV_OPTIONS,
  type BinaryDb,
  type BinaryKey,
  type DurableEnv,
  type EnvInfo,
} from './lmdb-env.js';
import { lessWaits, threadWaitMs, threadWaitMsSince } from './thread-time.js';

/**
 * Largest journal record. A batch holds at most BATCH_COMMANDS_MAX (1,024) commands whose
 * events are small, i.e. well under a megabyte; a record this large means batching is
 * broken, and writing it would hold every other append behind one huge fsync.
 */
export const JOURNAL_RECORD_BYTES_MAX = 64 * 1024 * 1024;

/**
 * Items per snapshot chunk. Large enough that per-chunk costs (a key, a checksum, a put)
 * are noise even for millions of items; small enough that no single encode or decode
 * builds one huge contiguous buffer.
 */
export const SNAPSHOT_CHUNK_ITEMS = 1000;

/**
 * Bump when the snapshot layout changes. Version 2: items carry no idempotency keys (they
 * live in their own table), and chunks are keyed by the snapshot's generation
 * (['chunk', generation, n]) so they can be written before the transaction that makes
 * them the snapshot. Version 1 (chunks at keys 1..n, items that may carry keys) is still
 * read: the shard worker moves its keys into the table (see `readSnapshot`'s
 * `formatVersion`). Any other version is refused.
 */
export const SNAPSHOT_FORMAT_VERSION = 2;

/** Snapshot format versions this build reads. */
const SNAPSHOT_FORMATS_READ: readonly number[] = [1, 2];

const SNAPSHOT_HEADER_KEY = 0;

/**
 * Covered journal records a snapshot's own transaction removes; the rest go afterwards in
 * slices of JOURNAL_PRUNE_SLICE (`pruneCovered`). The transaction runs on the caller's
 * thread with LMDB's write lock held, so pruning a whole interval's records in it (up to
 * 50,000) would stall the shard. Under a keyed soak 200 removals took 1.6–2.0 ms of a
 * 2.5–3.5 ms transaction; a few dozen leave the snapshot's hold to its own work.
 */
export const JOURNAL_PRUNE_IN_SNAPSHOT_MAX = 20;

/**
 * Covered journal records one `pruneCovered` slice removes. Its removals are issued as
 * asynchronous writes (LMDB's write thread does them, not the shard's), so a slice can
 * be larger than what the snapshot's own transaction takes.
 */
export const JOURNAL_PRUNE_SLICE = 1000;

/**
 * Chunks of replaced snapshots one `pruneStaleChunks` slice removes (a chunk holds up to
 * SNAPSHOT_CHUNK_ITEMS customers, ~150 KB).
 */
export const SNAPSHOT_PRUNE_CHUNKS = 64;

/** Meta record written by `syncRecovered`, the write whose sync is the recovery barrier. */
const RECOVERED_META = 'recovered';

/**
 * Meta record present while the customer index may hold rows of dropped records: written
 * before recovery drops any, removed with the repair (`repairIndex`), so a recovery cut
 * short in between leaves it for the next start.
 */
const INDEX_REPAIR_META = 'index-repair';

/** The first element of a format-2 chunk key. */
const CHUNK = 'chunk';
type ChunkKey = [typeof CHUNK, number, number];

/** Where chunk `index` (from 1) of a format-2 snapshot of `generation` is stored. */
export function chunkKey(generation: number, index: number): ChunkKey {
  return [CHUNK, generation, index];
}

/** Every chunk key of every generation (numbers sort before arrays, arrays before strings). */
const ALL_CHUNKS = { start: [CHUNK], end: [CHUNK, Number.MAX_SAFE_INTEGER] };

/**
 * A snapshot being written: its chunks go to disk as they come (each rides whatever
 * transaction is open, off the caller's thread), and `commit` makes them the snapshot.
 */
export interface SnapshotWriter {
  /** Stores the next chunk (`encodeSnapshotChunk`). */
  add(chunk: Buffer): void;
  /**
   * Makes the chunks, `itemCount` items in all, the shard's snapshot in one small
   * transaction; see `writeSnapshot` for what it guarantees. Resolves when durable,
   * rejects as `writeSnapshot` does.
   */
  commit(itemCount: number): Promise<void>;
}

interface SnapshotHeader {
  readonly formatVersion: number;
  readonly seq: number;
  readonly chunkCount: number;
  readonly itemCount: number;
  readonly createdAtMs: number;
  /** Format 2: the generation whose chunks hold the items. */
  readonly generation?: number;
}

/**
 * One row of the shard's customer index (`customers`: [environment, id] → the customer's
 * JSON as the API shows it), read by the front end for listings and lookups.
 */
export interface IndexEntry {
  readonly environment: string;
  readonly id: string;
  readonly json: Buffer;
}

/**
 * A customer index row's bytes for `view` (what the API shows): the one encoding both an
 * append's rows and `repairIndex`'s comparison use, so a repair never sees a row written
 * by an append as different.
 */
export function indexRowOf(view: unknown): Buffer {
  return Buffer.from(JSON.stringify(view));
}

/**
 * The record types a store holds, and how to recognise one read back from disk. Each
 * check looks at the record's shape only; whoever consumes the record asserts the rest.
 */
export interface RecordShapes<Ev, Item, Audit> {
  readonly isEvent: (value: unknown) => value is Ev;
  readonly isSnapshotItem: (value: unknown) => value is Item;
  readonly isAudit: (value: unknown) => value is Audit;
  /**
   * The idempotency keys a record's events carry (none where absent): recovery holds those
   * of records after the keys' last seal in memory again (`replay`). Throws on a key of the
   * wrong shape.
   */
  readonly keysOf?: (events: readonly Ev[]) => readonly KeyPut[];
}

/** For a store whose records are not typed (tools and tests): every record is accepted. */
export const UNTYPED: RecordShapes<unknown, unknown, unknown> = {
  isEvent: (_value): _value is unknown => true,
  isSnapshotItem: (_value): _value is unknown => true,
  isAudit: (_value): _value is unknown => true,
};

export interface ReplayResult {
  readonly batches: number;
  readonly droppedTail: boolean;
  /** Records after a missing one, dropped as never acknowledged (see `replay`). */
  readonly droppedAfterGap: number;
  /** Idempotency keys logged with the dropped records, forgotten with them. */
  readonly forgottenKeys: number;
  /** Idempotency keys of records after the keys' last seal, held in memory again. */
  readonly reheldKeys: number;
  /** Audit entries stored with the dropped records, removed with them. */
  readonly forgottenAudits: number;
  /** Webhook events stored with the dropped records, removed with them. */
  readonly forgottenEvents: number;
}

/** The customer id an index row's JSON names (null if it names none). */
function indexRowId(row: Buffer): string | null {
  try {
    const view = JSON.parse(row.toString('utf8')) as { id?: unknown } | null;
    return typeof view?.id === 'string' ? view.id : null;
  } catch {
    return null;
  }
}

export interface ShardStoreStats extends EnvInfo {
  readonly lastSeq: number;
  readonly snapshotSeq: number;
  readonly journalRecords: number;
}

export type ShardDbName =
  | 'journal'
  | 'snapshot'
  | 'meta'
  | 'customers'
  | 'audits'
  | 'outbox'
  | IdempotencyDbName;

/** Every named database of a shard environment. */
export const SHARD_DB_NAMES: readonly ShardDbName[] = [
  'journal',
  'snapshot',
  'meta',
  'customers',
  'audits',
  'outbox',
  ...IDEMPOTENCY_DB_NAMES,
];
type DbName = ShardDbName;

/**
 * The directory, inside a shard's, of the environment that holds its idempotency eras'
 * images (idempotency-runs.ts, EraHome): a file of its own, so that the journal's syncs
 * never write one back.
 */
export const ERA_ENV_DIR = 'eras';

export class ShardStore<Ev = unknown, Item = unknown, Audit = unknown> {
  readonly #env: DurableEnv<DbName>;
  /** Where the idempotency eras' images live (null: in `#env`, a test's simulated one). */
  readonly #eraEnv: DurableEnv<typeof ERA_TABLE> | null;
  readonly #shapes: RecordShapes<Ev, Item, Audit>;
  #lastSeq: number;
  #snapshotSeq: number;
  /** Seq of a last record that failed verification at open; replay() drops it. */
  #tornTailSeq: number | null;
  /** A write failed: lmdb-js will never settle that batch's flush (see close()). */
  #writeFailed = false;
  /**
   * The shard's idempotency keys (idempotency-runs.ts). A keyed write's record carries its
   * key; `replay` holds the keys of records after the last seal in memory again.
   */
  readonly idempotency: KeyStore;
  /**
   * How long the latest snapshot's transaction ran on this thread, in ms (lmdb-js runs a
   * child transaction's callback on the caller's thread while the write lock is held).
   */
  lastSnapshotWriteMs = 0;
  /** The same less the thread's waits for a core (null: unknown on this system). */
  lastSnapshotWriteWorkMs: number | null = null;
  /** The generation the next snapshot's chunks are written under: above any on disk. */
  #nextGeneration: number;
  /** The last outbox seq used, read from disk on the first event stored. */
  #outboxSeq: number | null = null;

  private constructor(
    env: DurableEnv<DbName>,
    shapes: RecordShapes<Ev, Item, Audit>,
    eraEnv: DurableEnv<typeof ERA_TABLE> | null = null,
  ) {
    this.#env = env;
    this.#eraEnv = eraEnv;
    const eraHome =
      eraEnv === null ? undefined : { root: eraEnv.root, table: eraEnv.dbs[ERA_TABLE] };
    this.idempotency = new KeyStore(env.dbs, env.root, eraHome);
    this.#shapes = shapes;
    this.#snapshotSeq = readSnapshotHeader(env.dbs.snapshot)?.seq ?? 0;
    const tail = lastJournalRecord(env.dbs.journal);
    this.#lastSeq = Math.max(this.#snapshotSeq, tail?.seq ?? 0);
    this.#tornTailSeq = tail !== undefined && !decodeRecord(tail.bytes).ok ? tail.seq : null;
    let generation = 0;
    for (const key of env.dbs.snapshot.getKeys(ALL_CHUNKS))
      generation = Math.max(generation, (key as unknown as ChunkKey)[1]);
    this.#nextGeneration = generation + 1;
  }

  /**
   * Opens (creating if needed) the shard environment in directory `path`, holding records
   * of the given shapes (or untyped ones). Throws if LMDB cannot open it or if the snapshot
   * header is corrupt (refuse to start).
   */
  static open(path: string): ShardStore;
  static open<Ev, Item, Audit>(
    path: string,
    shapes: RecordShapes<Ev, Item, Audit>,
  ): ShardStore<Ev, Item, Audit>;
  static open(path: string, shapes: RecordShapes<unknown, unknown, unknown> = UNTYPED): ShardStore {
    const env = openDurableEnv<DbName>(path, SHARD_DB_NAMES, SHARD_ENV_OPTIONS);
    let eraEnv: DurableEnv<typeof ERA_TABLE> | null = null;
    try {
      eraEnv = openDurableEnv(join(path, ERA_ENV_DIR), [ERA_TABLE], SHARD_ENV_OPTIONS);
      return new ShardStore(env, shapes, eraEnv);
    } catch (error) {
      // Release the environments; the error still stops the caller.
      void env.root.close();
      void eraEnv?.root.close();
      throw error;
    }
  }

  /**
   * Test seam: the store over an environment the caller opened, which may be a simulated
   * one (test/support/sim-lmdb.ts) whose commits and syncs a test controls. The server
   * only ever uses `open`.
   */
  static overEnv(
    env: DurableEnv<ShardDbName>,
    shapes: RecordShapes<unknown, unknown, unknown> = UNTYPED,
  ): ShardStore {
    return new ShardStore(env, shapes);
  }

  /** A write of this store, durable: flushed to disk (lmdb-env.ts, SHARD_ENV_OPTIONS). */
  #flushed(write: Promise<unknown>, what: string): Promise<void> {
    return flushedWrite(this.#env.root, write, what).then(
      () => undefined,
      (error: unknown) => {
        this.#writeFailed = true;
        throw error;
      },
    );
  }

  /** Highest seq appended (or covered by the snapshot); 0 for a new store. */
  get lastSeq(): number {
    return this.#lastSeq;
  }

  /**
   * Appends one batch of events under the next seq, assigned synchronously. `durable`
   * resolves once the record is on disk and rejects if the write fails — the caller must
   * then crash the worker. Throws (programmer error) if a torn tail is still pending
   * (call replay() first), if `events` is not an array or the record is too large.
   */
  append(
    events: readonly Ev[],
    index: readonly IndexEntry[] = [],
    audits: ReadonlyArray<Audit & { readonly ref: string }> = [],
    forget: readonly string[] = [],
    outbox: readonly OutboxEvent[] = [],
  ): { seq: number; durable: Promise<void> } {
    assert(
      this.#tornTailSeq === null,
      `torn journal tail at seq ${this.#tornTailSeq}: replay() before append()`,
    );
    assert(Array.isArray(events), 'journal record must be an array of events');
    const seq = this.#lastSeq + 1;
    assert(Number.isSafeInteger(seq), 'journal seq overflow');
    const frame = encodeRecord(events);
    assert(
      frame.length <= JOURNAL_RECORD_BYTES_MAX,
      `journal record of ${frame.length} bytes exceeds the limit`,
    );
    // Issued in the same turn as the journal record, the index puts land in the same LMDB
    // transaction: the customer index never disagrees with the journal, even after a crash.
    // (A failure fails the whole transaction; the journal record's `durable` reports it.)
    for (const entry of index)
      this.#env.dbs.customers.put([entry.environment, entry.id], entry.json).catch(() => undefined);
    // The audit entries of audited writes, likewise: kept until the front end has them in
    // the audit chain (`forget`, which rides on a later append), and handed to it again
    // after a crash (pendingAudits). Each names its record, so recovery drops it with the
    // record (`replay`).
    for (const audit of audits)
      this.#env.dbs.audits
        .put(audit.ref, encodeWithJournalRecord(audit, seq))
        .catch(() => undefined);
    for (const ref of forget) this.#env.dbs.audits.remove(ref).catch(() => undefined);
    // The webhook events of the record's changes, likewise (storage/outbox.ts): an event
    // exists exactly when its change is durable.
    if (outbox.length > 0) {
      let outboxSeq = (this.#outboxSeq ??= lastOutboxSeq(this.#env.dbs.outbox));
      for (const event of outbox)
        putOutboxEvent(this.#env.dbs.outbox, ++outboxSeq, event, seq).catch(() => undefined);
      this.#outboxSeq = outboxSeq;
    }
    const durable = this.#flushed(
      this.#env.dbs.journal.put(seq, frame),
      `journal append of seq ${seq}`,
    );
    this.#lastSeq = seq;
    return { seq, durable };
  }

  /**
   * Every stored audit entry not yet forgotten, in no particular order. Throws on a corrupt one.
   */
  pendingAudits(): Audit[] {
    const audits: Audit[] = [];
    for (const { key } of this.#env.dbs.audits.getRange({})) {
      const audit = readRecord(this.#env.dbs.audits, key as string, `pending audit ${String(key)}`);
      if (!this.#shapes.isAudit(audit))
        throw new Error(
          `pending audit ${String(key)} is corrupt (not an audit entry); refusing to start`,
        );
      audits.push(withoutJournalRecord(audit));
    }
    return audits;
  }

  /**
   * Removes the stored audit entries of journal records after `lastSeq` (records recovery
   * dropped: their writes never applied, so the chain must not record them). Entries
   * stored before they named their record are kept. Returns how many went.
   */
  #forgetAuditsAfter(lastSeq: number): number {
    const { audits } = this.#env.dbs;
    const dropped: string[] = [];
    for (const { key, value } of audits.getRange({})) {
      const record = journalRecordOf(value);
      if (record !== undefined && record > lastSeq) dropped.push(key as string);
    }
    for (const ref of dropped) audits.removeSync(ref);
    return dropped.length;
  }

  /**
   * Drops the stored copies of audit entries the chain now holds, in a write of its own;
   * resolves once durable. Only for a clean stop: while running, forgets ride on appends.
   */
  forgetAudits(refs: readonly string[]): Promise<void> {
    return Promise.all(
      refs.map((ref) =>
        this.#flushed(this.#env.dbs.audits.remove(ref), `pending audit ${ref} removal`),
      ),
    ).then(() => undefined);
  }

  /**
   * Calls `onBatch` for every record with seq > `afterSeq`, synchronously and in seq
   * order. `afterSeq` must be at least the snapshot's seq (records up to it are pruned).
   * If the last record failed verification at open it is removed (synchronously, with
   * removeSync, committed on return and ordered before every later append, which will
   * reuse its seq; in overlappingSync mode its sync may come later: `syncRecovered`,
   * which the owner awaits before serving, covers it) and `droppedTail` is true. Records
   * after a missing one are removed the same way (`droppedAfterGap`: they were written by
   * appends in flight when an earlier one failed, and never acknowledged).
   * Throws if any other record is corrupt: the journal must never be skipped.
   * Errors thrown by `onBatch` propagate unchanged.
   */
  replay(afterSeq: number, onBatch: (seq: number, events: readonly Ev[]) => void): ReplayResult {
    assert(
      Number.isSafeInteger(afterSeq) && afterSeq >= 0,
      'replay afterSeq must be a non-negative integer',
    );
    assert(
      afterSeq >= this.#snapshotSeq,
      `replay after ${afterSeq} but the snapshot covers up to ${this.#snapshotSeq}`,
    );
    const range =
      this.#tornTailSeq === null
        ? { start: afterSeq + 1 }
        : { start: afterSeq + 1, end: this.#tornTailSeq };
    let expectedSeq = afterSeq + 1;
    const afterGap: number[] = [];
    const keys = new CarriedKeys(this.idempotency.sealedThrough, this.#shapes.keysOf);
    // Records the snapshot covers may still carry keys not yet sealed (the journal keeps
    // them: `KeyStore.keptFrom`); their keys are all that is read of them.
    if (keys.after < afterSeq) {
      const end = Math.min(afterSeq + 1, this.#tornTailSeq ?? Number.POSITIVE_INFINITY);
      const covered = { start: keys.after + 1, end };
      for (const { key, value } of this.#env.dbs.journal.getRange(covered)) {
        const seq = journalSeq(key);
        keys.read(seq, this.#events(seq, decodeJournalRecord(seq, value)));
      }
    }
    for (const { key, value } of this.#env.dbs.journal.getRange(range)) {
      const seq = journalSeq(key);
      // A missing record is an append that failed while later ones, already in flight,
      // committed. The shard stops at a failed append and releases replies in append order,
      // so no record from the gap on was ever acknowledged: they go, like a torn tail.
      if (seq !== expectedSeq || afterGap.length > 0) {
        afterGap.push(seq);
        continue;
      }
      const events = this.#events(seq, decodeJournalRecord(seq, value));
      keys.read(seq, events);
      onBatch(seq, events);
      expectedSeq += 1;
    }
    // A dropped record's customer index rows name no record: the index is checked against
    // the recovered customers instead (`repairIndex`), which this flag asks for until done.
    if (this.#tornTailSeq !== null || afterGap.length > 0)
      this.#env.dbs.meta.putSync(INDEX_REPAIR_META, encodeRecord({ lastSeq: expectedSeq - 1 }));
    const droppedTail = this.#dropTornTail();
    for (const seq of afterGap) this.#env.dbs.journal.removeSync(seq);
    if (afterGap.length > 0) this.#lastSeq = Math.max(this.#snapshotSeq, expectedSeq - 1);
    // The idempotency keys logged and the audit entries stored with the dropped records go
    // with them; also those of records an interrupted recovery removed before them, so
    // both look past the journal's end whether or not this replay dropped anything.
    const forgottenKeys = this.idempotency.forgetLoggedAfter(this.#lastSeq);
    const forgottenAudits = this.#forgetAuditsAfter(this.#lastSeq);
    const forgottenEvents = this.#forgetOutboxAfter(this.#lastSeq);
    // After the logs' keys (older than any record's), newest use last.
    const reheldKeys = keys.holdIn(this.idempotency, this.#lastSeq);
    return {
      batches: expectedSeq - afterSeq - 1,
      droppedTail,
      droppedAfterGap: afterGap.length,
      forgottenKeys,
      reheldKeys,
      forgottenAudits,
      forgottenEvents,
    };
  }

  /**
   * Removes the webhook events written with records after `lastSeq`. They are the newest
   * rows, never under the durable mark, so never taken: the delivery thread's cursor is
   * below them and the next events, numbered after the newest row left, are read.
   */
  #forgetOutboxAfter(lastSeq: number): number {
    const { outbox } = this.#env.dbs;
    const dropped = outboxRowsAfter(outbox, lastSeq);
    for (const row of dropped) outbox.removeSync(row);
    if (dropped.length > 0) this.#outboxSeq = null;
    return dropped.length;
  }

  /** The newest webhook event's outbox seq (0 when none): its row and all before are written. */
  get outboxSeq(): number {
    return (this.#outboxSeq ??= lastOutboxSeq(this.#env.dbs.outbox));
  }

  /**
   * Stores a snapshot covering every journal record with seq <= `seq`. `items` are
   * encoded synchronously, before this returns, so the caller may keep mutating its state
   * right away. The chunks are written first, under a generation of their own; then ONE
   * small transaction (an lmdb-js child transaction: all or nothing) checks they are all
   * there, writes the header naming them and prunes the first
   * JOURNAL_PRUNE_IN_SNAPSHOT_MAX journal records <= `seq` (`pruneCovered` removes the
   * rest). That transaction runs after every append issued before this call (lmdb-js runs
   * queued async transaction callbacks after the queued puts), and it aborts if record
   * `seq` is not in the journal, so a snapshot never covers an append that failed. Once it
   * is durable, the chunks of the snapshot it replaced are removed (`pruneStaleChunks`),
   * and then it resolves; it rejects if the transaction fails or is refused (nothing of
   * it is then stored, and the previous snapshot stays in force). Throws
   * synchronously (programmer error) if `seq` is below the current snapshot or above
   * lastSeq, or if a torn tail is still pending.
   */
  writeSnapshot(seq: number, items: readonly Item[]): Promise<void> {
    return this.writeSnapshotChunks(seq, encodeChunks(items), items.length);
  }

  /**
   * `writeSnapshot` for items already encoded as chunks of at most SNAPSHOT_CHUNK_ITEMS
   * (`encodeSnapshotChunk`), so a caller streaming many items (restore) never holds them
   * all decoded. Same guarantees and failures as `writeSnapshot`.
   */
  writeSnapshotChunks(seq: number, chunks: readonly Buffer[], itemCount: number): Promise<void> {
    // Synchronous up to the commit, so a refused seq throws here (see writeSnapshot).
    const writer = this.beginSnapshot(seq);
    for (const chunk of chunks) writer.add(chunk);
    const prune = async (): Promise<void> => {
      for (;;) {
        const pruned = this.pruneStaleChunks(SNAPSHOT_PRUNE_CHUNKS);
        await pruned.committed;
        if (pruned.removed < SNAPSHOT_PRUNE_CHUNKS) return;
      }
    };
    return writer.commit(itemCount).then(prune);
  }

  /**
   * Starts a snapshot covering every journal record with seq <= `seq`, whose chunks the
   * caller adds as it encodes them (a shard copying itself in slices); `commit` stores it.
   * Throws as `writeSnapshot` does. Its commit leaves the chunks of the snapshot it
   * replaces, and a writer never committed leaves its own, for `pruneStaleChunks`.
   */
  beginSnapshot(seq: number): SnapshotWriter {
    assert(
      this.#tornTailSeq === null,
      `torn journal tail at seq ${this.#tornTailSeq}: replay() before writeSnapshot()`,
    );
    assert(Number.isSafeInteger(seq), 'snapshot seq must be an integer');
    assert(
      seq >= this.#snapshotSeq,
      `snapshot at ${seq} would go back before ${this.#snapshotSeq}`,
    );
    assert(
      seq <= this.#lastSeq,
      `snapshot at ${seq} is beyond the journal (lastSeq ${this.#lastSeq})`,
    );
    const generation = this.#nextGeneration++;
    const { journal, snapshot } = this.#env.dbs;
    let chunkCount = 0;
    let committed = false;
    return {
      add: (chunk) => {
        assert(!committed, 'a snapshot takes no chunk after its commit');
        chunkCount += 1;
        // Its failure fails the transaction it rides, whose own writes report it; the
        // commit's transaction then finds the chunk missing and refuses.
        snapshot.put(chunkKey(generation, chunkCount), chunk).catch(() => undefined);
      },
      commit: (itemCount) => {
        assert(!committed, 'a snapshot is committed once');
        committed = true;
        const header: SnapshotHeader = {
          formatVersion: SNAPSHOT_FORMAT_VERSION,
          seq,
          chunkCount,
          itemCount,
          createdAtMs: Date.now(),
          generation,
        };
        const replaced = snapshot.childTransaction(() => {
          const startedMs = performance.now();
          const startedWaitMs = threadWaitMs();
          try {
            replaceSnapshot(journal, snapshot, header, this.idempotency.keptFrom);
          } finally {
            this.lastSnapshotWriteMs = performance.now() - startedMs;
            this.lastSnapshotWriteWorkMs = lessWaits(
              this.lastSnapshotWriteMs,
              threadWaitMsSince(startedWaitMs),
            );
          }
        });
        return this.#flushed(replaced, `snapshot at seq ${seq}`).then(() => {
          // Only a committed snapshot moves the floor; concurrent requests are ordered (or
          // refused) inside the transaction by replaceSnapshot.
          this.#snapshotSeq = Math.max(this.#snapshotSeq, seq);
        });
      },
    };
  }

  /**
   * Removes up to `max` journal records the stored snapshot covers and its own transaction
   * left (JOURNAL_PRUNE_IN_SNAPSHOT_MAX), oldest first. The removals ride the next
   * transaction; `committed` settles when it commits (never rejects: a failure fails that
   * transaction, whose own writes report it). Call again after `committed` while
   * `removed` is `max`. Records a crash leaves behind are never replayed (replay starts
   * after the snapshot) and go with the next pruning.
   */
  pruneCovered(max: number): { readonly removed: number; readonly committed: Promise<void> } {
    const { journal } = this.#env.dbs;
    const end = Math.min(this.#snapshotSeq + 1, this.idempotency.keptFrom);
    return removeAfter(journal, Array.from(journal.getKeys({ end, limit: max })));
  }

  /**
   * Removes up to `max` chunks no stored snapshot names: those of the snapshots the stored
   * one replaced (older generations, or a format-1 snapshot's numbered chunks) and of
   * writers never committed before it. A younger generation is a snapshot still being
   * written and stays. The removals ride the next transaction (LMDB's write thread does
   * them); `committed` settles when it commits and never rejects, as `pruneCovered`'s.
   * Call again after `committed` while `removed` is `max`.
   */
  pruneStaleChunks(max: number): { readonly removed: number; readonly committed: Promise<void> } {
    const { snapshot } = this.#env.dbs;
    const generation = readSnapshotHeader(snapshot)?.generation;
    // No snapshot, or a format-1 one, whose numbered chunks are the live ones.
    if (generation === undefined) return { removed: 0, committed: Promise.resolve() };
    // Collected before removing: never delete under a live cursor.
    const keys = Array.from(snapshot.getKeys({ start: 1, end: [CHUNK], limit: max }));
    if (keys.length < max)
      for (const key of snapshot.getKeys({
        start: [CHUNK],
        end: [CHUNK, generation],
        limit: max - keys.length,
      }))
        keys.push(key);
    return removeAfter(snapshot, keys);
  }

  /**
   * Loads the latest snapshot, or null if none was ever written; see `readSnapshot`,
   * which this collects into one array.
   */
  loadSnapshot(): { seq: number; createdAtMs: number; items: Item[] } | null {
    const items: Item[] = [];
    const read = this.readSnapshot((chunk) => {
      for (const item of chunk) items.push(item);
    });
    return read === null ? null : { seq: read.seq, createdAtMs: read.createdAtMs, items };
  }

  /**
   * Reads the latest snapshot chunk by chunk, in order, handing each chunk's items to
   * `onChunk` as soon as it is decoded, so a caller that turns items into state never holds
   * the whole decoded snapshot as well. Returns the snapshot's seq, item count and format
   * version, or null if none was ever written. Verifies the header, every chunk's
   * checksum, that chunks are exactly 1..chunkCount and that the item count matches, and
   * throws a clear Error otherwise (refuse to start on a corrupt snapshot). A chunk that
   * fails is found only when reached, after `onChunk` has seen the chunks before it, so on
   * a throw the caller must discard everything it loaded (the shard worker dies). Errors
   * thrown by `onChunk` propagate unchanged.
   */
  readSnapshot(
    onChunk: (items: readonly Item[]) => void,
  ): { seq: number; createdAtMs: number; itemCount: number; formatVersion: number } | null {
    const { snapshot } = this.#env.dbs;
    const header = readSnapshotHeader(snapshot);
    if (header === null) return null;
    let itemCount = 0;
    let expectedKey = 1;
    const generation = header.generation;
    const range =
      generation === undefined
        ? snapshot.getRange({ start: 1, end: [CHUNK] })
        : snapshot.getRange({
            start: chunkKey(generation, 1),
            end: chunkKey(generation, header.chunkCount + 1),
          });
    for (const { key: stored, value } of range) {
      const key = generation === undefined ? stored : (stored as unknown as ChunkKey)[2];
      if (key !== expectedKey || expectedKey > header.chunkCount) {
        throw new Error(
          `snapshot is corrupt: unexpected chunk key ${String(key)} ` +
            `(chunkCount ${header.chunkCount})`,
        );
      }
      const items = decodeChunk(expectedKey, value);
      itemCount += items.length;
      if (itemCount > header.itemCount) {
        throw new Error(
          `snapshot is corrupt: header says ${header.itemCount} items, ` +
            `chunk ${expectedKey} goes beyond`,
        );
      }
      onChunk(this.#items(expectedKey, items));
      expectedKey += 1;
    }
    if (expectedKey - 1 !== header.chunkCount || itemCount !== header.itemCount) {
      throw new Error(
        `snapshot is corrupt: header says ${header.chunkCount} chunks ` +
          `/ ${header.itemCount} items, found ${expectedKey - 1} / ${itemCount}`,
      );
    }
    return {
      seq: header.seq,
      createdAtMs: header.createdAtMs,
      itemCount,
      formatVersion: header.formatVersion,
    };
  }

  /**
   * Whether the customer index must be checked against the recovered customers before
   * serving (`repairIndex`): recovery dropped records, now or in a start cut short.
   */
  get indexRepairPending(): boolean {
    return this.#env.dbs.meta.doesExist(INDEX_REPAIR_META);
  }

  /**
   * Makes the customer index hold exactly `entries` (every customer the shard recovered,
   * each with its view now, stored as JSON like a journal record's rows): rows that differ
   * are rewritten, rows of customers it does not hold are removed, and the repair flag
   * goes, all issued in the caller's turn, so in one transaction. Resolves with the rows
   * rewritten and removed once that is on disk; rejects if it fails (the caller must die,
   * as on any failed write).
   */
  repairIndex(
    entries: Iterable<{
      readonly environment: string;
      readonly id: string;
      readonly view: unknown;
    }>,
  ): Promise<{ rewritten: number; removed: number }> {
    const { customers, meta } = this.#env.dbs;
    const held = new Set<string>();
    let rewritten = 0;
    for (const entry of entries) {
      const key = [entry.environment, entry.id];
      held.add(`${entry.environment}\u0000${entry.id}`);
      const json = indexRowOf(entry.view);
      const stored = customers.get(key) as Buffer | undefined;
      if (stored !== undefined && Buffer.compare(stored, json) === 0) continue;
      customers.put(key, json).catch(() => undefined);
      rewritten += 1;
    }
    let removed = 0;
    for (const { key, value } of customers.getRange({})) {
      const [environment, id] = key as [string, string];
      if (held.has(`${environment}\u0000${id}`)) continue;
      // A key does not always decode to its id (one of 64 characters or more is stored
      // unescaped, and a NUL in it reads back as a separator): the row's own JSON names it.
      const rowId = indexRowId(value);
      if (held.has(`${environment}\u0000${rowId}`)) continue;
      customers.remove(rowId === null ? key : [environment, rowId]).catch(() => undefined);
      removed += 1;
    }
    return this.#flushed(meta.remove(INDEX_REPAIR_META), 'customer index repair').then(() => ({
      rewritten,
      removed,
    }));
  }

  /**
   * Writes customer index rows outside any journal record (restore seeds a fresh store
   * this way). Resolves once all are durable; rejects if any write fails.
   */
  async putIndex(entries: readonly IndexEntry[]): Promise<void> {
    const { customers } = this.#env.dbs;
    await Promise.all(
      entries.map((entry) =>
        this.#flushed(
          customers.put([entry.environment, entry.id], entry.json),
          `index row ${entry.id}`,
        ),
      ),
    );
  }

  /** Returns the stored value, or undefined. Throws if the stored record is corrupt. */
  getMeta(name: string): unknown {
    return readRecord(this.#env.dbs.meta, name, `shard meta "${name}"`);
  }

  /** Stores a value; resolves once durable, rejects if the write fails. */
  putMeta(name: string, value: unknown): Promise<void> {
    return this.#flushed(
      this.#env.dbs.meta.put(name, encodeRecord(value)),
      `shard meta "${name}" write`,
    );
  }

  /**
   * The recovery barrier: makes everything this store has read since it opened durable,
   * before its owner serves anything computed from it. After `kill -9`, LMDB reopens at the
   * newest committed transaction even if its sync never completed (the pages are still in
   * the page cache, and lmdb-js does not sync at open), so replayed records, pending audit
   * entries and the removal of a torn tail may exist only in memory. This writes one small
   * meta record (`recovered`: the last seq and the time) and resolves once that write is
   * flushed: its transaction's `fdatasync` writes back every dirty page of the file,
   * whichever process dirtied it, and the synced meta page that follows names a tree that
   * holds everything recovery read. Rejects if the write or its sync fails (the caller
   * must die: a failed sync may have dropped the pages).
   */
  syncRecovered(): Promise<void> {
    assert(
      this.#tornTailSeq === null,
      `torn journal tail at seq ${this.#tornTailSeq}: replay() before syncRecovered()`,
    );
    return this.putMeta(RECOVERED_META, { lastSeq: this.#lastSeq, atMs: Date.now() });
  }

  /** Cheap counters for logs and metrics (LMDB keeps them; nothing is scanned). */
  stats(): ShardStoreStats {
    const { journal } = this.#env.dbs;
    const { entryCount } = journal.getStats() as { entryCount: number };
    return {
      ...envInfo(journal),
      lastSeq: this.#lastSeq,
      snapshotSeq: this.#snapshotSeq,
      journalRecords: entryCount,
    };
  }

  /**
   * Waits for queued writes to finish, then closes the environments. After a failed write
   * it resolves at once: in overlappingSync mode lmdb-js (3.5) never settles the failed
   * batch's flush promise, which its close() waits for, so it would hang forever. The
   * process is on its way out then anyway (a failed journal write crashes the worker).
   */
  close(): Promise<void> {
    const closing = Promise.all([this.#env.root.close(), this.#eraEnv?.root.close()]);
    return this.#writeFailed ? Promise.resolve() : closing.then(() => undefined);
  }

  /** A journal record's events, checked against the store's shapes. */
  #events(seq: number, events: readonly unknown[]): readonly Ev[] {
    for (const event of events) {
      if (!this.#shapes.isEvent(event))
        throw new Error(
          `journal is corrupt at seq ${seq} (an event of the wrong shape); refusing to start`,
        );
    }
    return events as readonly Ev[];
  }

  /** A snapshot chunk's items, checked against the store's shapes. */
  #items(key: number, items: readonly unknown[]): readonly Item[] {
    for (const item of items) {
      if (!this.#shapes.isSnapshotItem(item))
        throw new Error(`snapshot is corrupt: chunk ${key} holds an item of the wrong shape`);
    }
    return items as readonly Item[];
  }

  #dropTornTail(): boolean {
    if (this.#tornTailSeq === null) return false;
    const seq = this.#tornTailSeq;
    this.#env.dbs.journal.removeSync(seq);
    this.#tornTailSeq = null;
    this.#lastSeq = Math.max(this.#snapshotSeq, seq - 1);
    return true;
  }
}

/**
 * The idempotency keys of the journal records after the keys' last seal, collected while
 * recovery reads them and held in memory again once it has settled the journal's end
 * (`holdIn`). Each customer's id is kept once: the keys in memory keep a reference to it.
 */
class CarriedKeys<Ev> {
  readonly #records: Array<[number, readonly KeyPut[]]> = [];
  readonly #ids = new Map<string, string>();

  constructor(
    /** The newest record whose keys are all in runs: only later records' are read. */
    readonly after: number,
    private readonly keysOf: ((events: readonly Ev[]) => readonly KeyPut[]) | undefined,
  ) {}

  read(seq: number, events: readonly Ev[]): void {
    if (seq <= this.after || this.keysOf === undefined) return;
    const carried = this.keysOf(events);
    if (carried.length === 0) return;
    const puts = carried.map((put) => {
      let customerId = this.#ids.get(put.customerId);
      if (customerId === undefined) this.#ids.set(put.customerId, (customerId = put.customerId));
      return { ...put, customerId };
    });
    this.#records.push([seq, puts]);
  }

  /** Holds the keys of the records `store`'s journal kept, oldest first; returns how many. */
  holdIn(store: KeyStore, lastSeq: number): number {
    let keys = 0;
    for (const [seq, puts] of this.#records) {
      if (seq > lastSeq) break;
      store.reheld(seq, puts);
      keys += puts.length;
    }
    return keys;
  }
}

function journalSeq(key: unknown): number {
  assert(
    typeof key === 'number' && Number.isSafeInteger(key) && key > 0,
    `journal key ${String(key)} is not a seq`,
  );
  return key;
}

function lastJournalRecord(journal: BinaryDb): { seq: number; bytes: Buffer } | undefined {
  for (const { key, value } of journal.getRange({ reverse: true, limit: 1 })) {
    return { seq: journalSeq(key), bytes: value };
  }
  return undefined;
}

function decodeJournalRecord(seq: number, bytes: Buffer): readonly unknown[] {
  const decoded = decodeRecord(bytes);
  if (!decoded.ok) {
    throw new Error(`journal is corrupt at seq ${seq} (${decoded.reason}); refusing to start`);
  }
  if (!Array.isArray(decoded.value)) {
    throw new Error(
      `journal is corrupt at seq ${seq} (record is not an events array); refusing to start`,
    );
  }
  return decoded.value;
}

/** One chunk of a shard snapshot: at most SNAPSHOT_CHUNK_ITEMS items (throws beyond). */
export function encodeSnapshotChunk(items: readonly unknown[]): Buffer {
  assert(
    items.length <= SNAPSHOT_CHUNK_ITEMS,
    `a snapshot chunk holds at most ${SNAPSHOT_CHUNK_ITEMS} items`,
  );
  return encodeRecord(items);
}

function encodeChunks(items: readonly unknown[]): Buffer[] {
  const chunks: Buffer[] = [];
  for (let start = 0; start < items.length; start += SNAPSHOT_CHUNK_ITEMS) {
    chunks.push(encodeSnapshotChunk(items.slice(start, start + SNAPSHOT_CHUNK_ITEMS)));
  }
  return chunks;
}

function decodeChunk(key: number, bytes: Buffer): unknown[] {
  const decoded = decodeRecord(bytes);
  if (!decoded.ok)
    throw new Error(`snapshot is corrupt: chunk ${key} failed verification (${decoded.reason})`);
  if (!Array.isArray(decoded.value))
    throw new Error(`snapshot is corrupt: chunk ${key} is not an array`);
  return decoded.value;
}

/** Returns the verified header, null if there is no snapshot; throws if it is corrupt. */
function readSnapshotHeader(snapshot: BinaryDb): SnapshotHeader | null {
  const value = readRecord(snapshot, SNAPSHOT_HEADER_KEY, 'snapshot header');
  if (value === undefined) return null;
  const header = value as Partial<Record<keyof SnapshotHeader, unknown>> | null;
  const counts = [header?.seq, header?.chunkCount, header?.itemCount];
  const format = header?.formatVersion;
  if (typeof format === 'number' && format > SNAPSHOT_FORMAT_VERSION) {
    // A data dir written by a newer build: never guess at it, and never write over it.
    throw new Error(
      `the shard snapshot is of format ${format}, newer than this build of Tally reads ` +
        `(${SNAPSHOT_FORMATS_READ.join(', ')}): run the release that wrote this data dir, ` +
        `or a newer one`,
    );
  }
  if (
    typeof format !== 'number' ||
    !SNAPSHOT_FORMATS_READ.includes(format) ||
    header === null ||
    !counts.every((n) => typeof n === 'number' && Number.isSafeInteger(n) && n >= 0) ||
    typeof header.createdAtMs !== 'number'
  ) {
    throw new Error(
      `snapshot header is corrupt or of an unknown format: ${JSON.stringify(value, bigintSafe)}`,
    );
  }
  return header as SnapshotHeader;
}

function bigintSafe(_key: string, value: unknown): unknown {
  return typeof value === 'bigint' ? `${value}n` : value;
}

/**
 * Removes `keys` (collected before: never delete under a live cursor) in the next
 * transaction; `committed` settles when it commits and never rejects (a failure fails
 * that transaction, whose own writes report it).
 */
function removeAfter(
  db: BinaryDb,
  keys: readonly BinaryKey[],
): { readonly removed: number; readonly committed: Promise<void> } {
  const removals = keys.map((key) => db.remove(key));
  return {
    removed: keys.length,
    committed: Promise.all(removals).then(
      () => undefined,
      () => undefined,
    ),
  };
}

/**
 * Runs inside the snapshot's write transaction (reads see this transaction's writes).
 * Throwing aborts the child transaction, so nothing of it is committed.
 */
function replaceSnapshot(
  journal: BinaryDb,
  snapshot: BinaryDb,
  header: SnapshotHeader,
  keptFrom: number,
): void {
  const previousSeq = readSnapshotHeader(snapshot)?.seq ?? 0;
  if (header.seq < previousSeq) {
    throw new Error(`snapshot at ${header.seq} would replace a newer snapshot at ${previousSeq}`);
  }
  if (header.seq > previousSeq && !journal.doesExist(header.seq)) {
    throw new Error(
      `snapshot at ${header.seq}: journal record ${header.seq} was never committed (did ` +
        `its append fail?)`,
    );
  }
  const generation = header.generation as number;
  // Every chunk 1..chunkCount is there: counted in one range read (a lookup each took
  // ~4 µs, 31 ms for the 8,000 chunks of a million customers copied in slices).
  let stored = 0;
  for (const _ of snapshot.getKeys({
    start: chunkKey(generation, 1),
    end: chunkKey(generation, header.chunkCount + 1),
  }))
    stored++;
  if (stored !== header.chunkCount)
    throw new Error(
      `snapshot at ${header.seq}: ${header.chunkCount - stored} of its ${header.chunkCount} ` +
        'chunks were never stored',
    );
  snapshot.putSync(SNAPSHOT_HEADER_KEY, encodeRecord(header));
  // The chunks it replaces stay until `pruneStaleChunks` (unread: the header names the new
  // generation); removing a million customers' chunks here held the thread ~45 ms.
  const coveredRecords = Array.from(
    journal.getKeys({
      end: Math.min(header.seq + 1, keptFrom),
      limit: JOURNAL_PRUNE_IN_SNAPSHOT_MAX,
    }),
  );
  for (const key of coveredRecords) journal.removeSync(key);
}
