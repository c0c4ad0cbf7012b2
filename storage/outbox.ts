/**
 * The outbox: events waiting to be handed to the webhook delivery thread, in the order they
 * were decided. Every store that makes a change durable keeps one: each shard (its customers'
 * changes, written in the same LMDB transaction as the journal record that holds the change)
 * and the control store (configuration pushes, written with the new version). So an event
 * exists exactly when its change is durable: never one without the other.
 *
 * Layout: `outbox` maps an increasing number (the store's outbox seq) → frame(OutboxEvent).
 * The delivery thread reads rows after the last one it took, copies them into its own store
 * and then removes them but the newest (`pruneOutbox`): the only write another thread makes
 * to a shard's environment, one small transaction now and then, never on a request's path.
 */
import type { Environment } from '../shared/environment.js';
import { decodeRecord, encodeRecord } from './codec.js';
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
export function putOutboxEvent(db: BinaryDb, seq: number, event: OutboxEvent): Promise<boolean> {
  return db.put(seq, encodeRecord(event));
}

/** Up to `limit` events after `afterSeq`, oldest first. Throws on a corrupt row. */
export function readOutbox(
  db: BinaryDb,
  afterSeq: number,
  limit: number,
): Array<{ seq: number; event: OutboxEvent }> {
  const rows: Array<{ seq: number; event: OutboxEvent }> = [];
  for (const { key, value } of db.getRange({ start: afterSeq + 1, limit })) {
    const decoded = decodeRecord(value);
    if (!decoded.ok || !isOutboxEvent(decoded.value))
      throw new Error(`outbox row ${String(key)} is corrupt`);
    rows.push({ seq: key as number, event: decoded.value });
  }
  return rows;
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
