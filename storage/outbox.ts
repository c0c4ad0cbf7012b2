/**
 * The outbox: events waiting to be handed to the webhook delivery thread, in the order they
 * were decided. Every store that makes a change durable keeps one: each shard (its customers'
 * changes, written in the same LMDB transaction as the journal record that holds the change)
 * and the control store (configuration pushes, written with the new version). So an event
 * exists exactly when its change is durable: never one without the other.
 *
 * Layout: `outbox` maps an increasing number (the store's outbox seq) → frame(OutboxEvent,
 * plus in a shard's rows the seq of the journal record written with it, which readers never
 * see). The delivery thread reads rows after the last one it took, copies them into its own
 * store and then removes them but the newest (`pruneOutbox`): the only write another thread
 * makes to a shard's environment, one small transaction now and then, never on a request's
 * path.
 *
 * A shard's transaction is visible to readers once committed, a moment before it is on
 * disk (its journal waits for the sync, not for the commit). So the delivery thread reads a
 * shard's rows only up to the shard's durable mark (`OutboxMarks`): the newest row of its
 * transactions whose sync completed, every earlier one's included. An event never leaves
 * before its change is on disk, even if the power fails just after the commit. Rows of a
 * record that recovery drops (never acknowledged, so never under the mark) go with it
 * (`outboxRowsAfter`), so their events are never sent either. The control store syncs
 * before a commit is visible, so its rows need no mark.
 */
import type { Environment } from '../shared/environment.js';
import {
  decodeRecord,
  encodeRecord,
  encodeWithJournalRecord,
  journalRecordOf,
  withoutJournalRecord,
} from './codec.js';
import type { BinaryDb } from './lmdb-env.js';

/** An event as stored: the delivered JSON body is built from it by the delivery thread. */
export interface OutboxEvent {
  /** `evt_…`: the event's id, also its `webhook-id`. */
  readonly id: string;
  readonly type: string;
  readonly environment: Environment;
  /** The customer it concerns (deliveries to one endpoint keep its order), or null. */
  readonly customerId: string | null;
  readonly createdAtMs: number;
  readonly data: Readonly<Record<string, unknown>>;
}

export function isOutboxEvent(value: unknown): value is OutboxEvent {
  if (typeof value !== 'object' || value === null) return false;
  const e = value as Record<string, unknown>;
  return (
    typeof e.id === 'string' &&
    typeof e.type === 'string' &&
    (e.environment === 'test' || e.environment === 'live') &&
    (e.customerId === null || typeof e.customerId === 'string') &&
    typeof e.createdAtMs === 'number' &&
    typeof e.data === 'object' &&
    e.data !== null
  );
}

/** The highest outbox seq stored (0 when empty): where a writer continues after a restart. */
export function lastOutboxSeq(db: BinaryDb): number {
  for (const key of db.getKeys({ reverse: true, limit: 1 })) return key as number;
  return 0;
}

/**
 * Queues the put of one event under `seq` in the caller's current write turn (so it commits
 * with whatever else the caller writes in that turn). The promise is the caller's to await
 * or to leave to the transaction's own durability promise.
 */
export function putOutboxEvent(
  db: BinaryDb,
  seq: number,
  event: OutboxEvent,
  journalRecord: number | null = null,
): Promise<boolean> {
  return db.put(
    seq,
    journalRecord === null ? encodeRecord(event) : encodeWithJournalRecord(event, journalRecord),
  );
}

/**
 * Up to `limit` events after `afterSeq` and up to `upToSeq`, oldest first. Throws on a
 * corrupt row.
 */
export function readOutbox(
  db: BinaryDb,
  afterSeq: number,
  limit: number,
  upToSeq = Number.POSITIVE_INFINITY,
): Array<{ seq: number; event: OutboxEvent }> {
  const rows: Array<{ seq: number; event: OutboxEvent }> = [];
  if (upToSeq <= afterSeq) return rows;
  const range =
    upToSeq === Number.POSITIVE_INFINITY
      ? { start: afterSeq + 1, limit }
      : { start: afterSeq + 1, end: upToSeq + 1, limit };
  for (const { key, value } of db.getRange(range)) {
    const decoded = decodeRecord(value);
    if (!decoded.ok || !isOutboxEvent(decoded.value))
      throw new Error(`outbox row ${String(key)} is corrupt`);
    rows.push({ seq: key as number, event: withoutJournalRecord(decoded.value) });
  }
  return rows;
}

/**
 * The seqs of the newest rows written with journal records after `lastRecord`, newest
 * first (recovery removes them with their records). Rows that name no record (the control
 * store's, or written by a release before rows named theirs) end the search.
 */
export function outboxRowsAfter(db: BinaryDb, lastRecord: number): number[] {
  const rows: number[] = [];
  for (const { key, value } of db.getRange({ reverse: true })) {
    const record = journalRecordOf(value);
    if (record === undefined || record <= lastRecord) break;
    rows.push(key as number);
  }
  return rows;
}

/**
 * Each shard's durable outbox mark, shared by the shards (which raise it) and the delivery
 * thread (which reads up to it): one slot per shard over shared memory, 0 until the shard
 * has recovered.
 */
export class OutboxMarks {
  readonly #slots: BigInt64Array;

  constructor(shared: SharedArrayBuffer) {
    this.#slots = new BigInt64Array(shared);
  }

  /** The shared memory of `shards` marks, to hand to every thread that uses them. */
  static memory(shards: number): SharedArrayBuffer {
    return new SharedArrayBuffer(8 * Math.max(1, shards));
  }

  /** Raises shard `index`'s mark to `seq` (a lower seq leaves it as it is). */
  raise(index: number, seq: number): void {
    if (seq > this.get(index)) Atomics.store(this.#slots, index, BigInt(seq));
  }

  /** Shard `index`'s mark: its rows up to it are on disk. */
  get(index: number): number {
    return Number(Atomics.load(this.#slots, index));
  }
}

/**
 * A shard's side of its mark: raised past an append's rows once that append and every
 * append issued before it are on disk. Order matters: after a failed append, recovery
 * drops the records written after it, rows and all, so a later append's durability alone
 * does not make its rows safe to send.
 */
export class OutboxMarker {
  /** Settles once every append issued so far is on disk; rejects once one failed. */
  #appends: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly marks: OutboxMarks,
    private readonly index: number,
  ) {}

  /** Recovery is durable: every row in the outbox now is on disk. */
  recovered(newestRow: number): void {
    this.marks.raise(this.index, newestRow);
  }

  /** An append was issued, whose transaction holds the rows up to `newestRow`. */
  issued(durable: Promise<void>, newestRow: number): void {
    this.#appends = Promise.all([this.#appends, durable]).then(() =>
      this.marks.raise(this.index, newestRow),
    );
    // A failed append is the shard's to handle (it stops): the mark stays where it is.
    this.#appends.catch(() => undefined);
  }
}

/**
 * Removes the rows before `takenSeq`, the newest row taken, in one transaction; resolves
 * when committed. That row stays: the store numbers its next event after its newest row, so
 * an emptied outbox would start again at 1, below the taker's cursor, and its events would
 * never be taken. The taker reads only after its cursor, so it never sees that row again.
 */
export function pruneOutbox(db: BinaryDb, takenSeq: number): Promise<unknown> {
  return db.transaction(() => {
    const keys = Array.from(db.getKeys({ end: takenSeq }));
    for (const key of keys) db.removeSync(key);
  });
}
