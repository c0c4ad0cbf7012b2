/**
 * The webhook delivery thread's own store: an LMDB environment at `<dataDir>/webhooks` that
 * holds what is still to be delivered, what was attempted, and how far each outbox has been
 * taken. Only the delivery thread writes it; the front end reads the attempt log directly
 * (`GET /v1/webhooks/{id}/deliveries`).
 *
 * Layout:
 * - `cursors`: outbox name (`control`, `shard-<n>`) → frame(seq): the last outbox row copied
 *   here. The copy and the cursor commit in one transaction, so a crash repeats or skips
 *   nothing: the outbox rows are pruned only after it is durable.
 * - `queue`: [endpoint id, seq] → frame(QueuedDelivery): one row per event and endpoint that
 *   wants it, in the order the events were taken (`seq` increases across all endpoints).
 *   A row goes when its delivery succeeds (or the endpoint is deleted or disabled).
 * - `attempts`: [endpoint id, seq] → frame(DeliveryAttempt): the attempt log, newest last,
 *   trimmed to ATTEMPTS_KEPT_PER_ENDPOINT.
 * - `meta`: counters (`nextSeq`).
 */
import path from 'node:path';
import { decodeRecord, encodeRecord } from './codec.js';
import { isOutboxEvent, type OutboxEvent } from './outbox.js';
import { durableWrite, openDurableEnv, readRecord, type DurableEnv } from './lmdb-env.js';

/**
 * Attempts kept per endpoint for the listing; older ones are dropped as new ones come (up to
 * TRIM_EVERY_ATTEMPTS more between two trims).
 */
export const ATTEMPTS_KEPT_PER_ENDPOINT = 1000;

export interface QueuedDelivery {
  readonly event: OutboxEvent;
  /** Attempts made so far. */
  readonly attempts: number;
  /** When the next attempt is due (ms since the epoch). */
  readonly nextAttemptAtMs: number;
  /** Every attempt failed: held until an operator enables the endpoint again. */
  readonly exhausted: boolean;
}

export interface DeliveryAttempt {
  readonly eventId: string;
  readonly type: string;
  /** 1 for the first attempt of this event to this endpoint. */
  readonly attempt: number;
  readonly atMs: number;
  readonly durationMs: number;
  /** The receiver's HTTP status, or null when none came (timeout, refused, network). */
  readonly responseStatus: number | null;
  readonly ok: boolean;
  readonly error: string | null;
}

type DbName = 'cursors' | 'queue' | 'attempts' | 'meta';

function isQueuedDelivery(value: unknown): value is QueuedDelivery {
  if (typeof value !== 'object' || value === null) return false;
  const q = value as Record<string, unknown>;
  return (
    isOutboxEvent(q.event) &&
    typeof q.attempts === 'number' &&
    typeof q.nextAttemptAtMs === 'number' &&
    typeof q.exhausted === 'boolean'
  );
}

function isDeliveryAttempt(value: unknown): value is DeliveryAttempt {
  if (typeof value !== 'object' || value === null) return false;
  const a = value as Record<string, unknown>;
  return (
    typeof a.eventId === 'string' &&
    typeof a.type === 'string' &&
    typeof a.attempt === 'number' &&
    typeof a.atMs === 'number' &&
    typeof a.durationMs === 'number' &&
    (a.responseStatus === null || typeof a.responseStatus === 'number') &&
    typeof a.ok === 'boolean' &&
    (a.error === null || typeof a.error === 'string')
  );
}

function decoded<T>(bytes: Buffer, is: (value: unknown) => value is T, what: string): T {
  const result = decodeRecord(bytes);
  if (!result.ok || !is(result.value)) throw new Error(`webhook store: ${what} is corrupt`);
  return result.value;
}

/** Attempts recorded per endpoint between two trims of its log (a trim scans the log's end). */
const TRIM_EVERY_ATTEMPTS = 100;

export class DeliveryStore {
  #nextSeq: number;
  /** Attempts recorded per endpoint since its log was last trimmed. */
  readonly #sinceTrim = new Map<string, number>();

  private constructor(private readonly env: DurableEnv<DbName>) {
    const stored = readRecord(env.dbs.meta, 'nextSeq', 'webhook store nextSeq');
    this.#nextSeq = typeof stored === 'number' ? stored : 1;
  }

  /** Opens (creating if needed) `<dataDir>/webhooks`. Throws if LMDB cannot open it. */
  static open(dataDir: string): DeliveryStore {
    return new DeliveryStore(
      openDurableEnv<DbName>(path.join(dataDir, 'webhooks'), [
        'cursors',
        'queue',
        'attempts',
        'meta',
      ]),
    );
  }

  /** The last outbox seq of `source` copied here (0: none). */
  cursor(source: string): number {
    const value = readRecord(this.env.dbs.cursors, source, `webhook cursor ${source}`);
    return typeof value === 'number' ? value : 0;
  }

  /**
   * Queues `deliveries` (each event for each endpoint that wants it, in order) and moves the
   * source's cursor to `cursor`, in one transaction; resolves once durable.
   */
  enqueue(
    source: string,
    cursor: number,
    deliveries: ReadonlyArray<{ endpointId: string; event: OutboxEvent; dueAtMs: number }>,
  ): Promise<Array<{ endpointId: string; seq: number }>> {
    const { queue, cursors, meta } = this.env.dbs;
    const keys: Array<{ endpointId: string; seq: number }> = [];
    for (const { endpointId, event, dueAtMs } of deliveries) {
      const seq = this.#nextSeq++;
      const row: QueuedDelivery = {
        event,
        attempts: 0,
        nextAttemptAtMs: dueAtMs,
        exhausted: false,
      };
      queue.put([endpointId, seq], encodeRecord(row)).catch(() => undefined);
      keys.push({ endpointId, seq });
    }
    meta.put('nextSeq', encodeRecord(this.#nextSeq)).catch(() => undefined);
    return durableWrite(
      cursors.put(source, encodeRecord(cursor)),
      `webhook cursor ${source} write`,
    ).then(() => keys);
  }

  /** Up to `limit` queued deliveries of an endpoint after `afterSeq`, oldest first. */
  queued(
    endpointId: string,
    afterSeq: number,
    limit: number,
  ): Array<{ seq: number; delivery: QueuedDelivery }> {
    const rows: Array<{ seq: number; delivery: QueuedDelivery }> = [];
    const range = {
      start: [endpointId, afterSeq + 1],
      end: [endpointId, Number.MAX_SAFE_INTEGER],
      limit,
    };
    for (const { key, value } of this.env.dbs.queue.getRange(range)) {
      const seq = (key as [string, number])[1];
      rows.push({ seq, delivery: decoded(value, isQueuedDelivery, `queued delivery ${seq}`) });
    }
    return rows;
  }

  /** The endpoint ids that have anything queued. */
  queuedEndpoints(): string[] {
    const ids: string[] = [];
    let last: string | null = null;
    for (const key of this.env.dbs.queue.getKeys({})) {
      const id = (key as [string, number])[0];
      if (id !== last) ids.push(id);
      last = id;
    }
    return ids;
  }

  /**
   * Records an attempt, and either removes the queued row (`next` null: delivered) or replaces
   * it; one transaction, resolves once durable.
   */
  recordAttempt(
    endpointId: string,
    seq: number,
    attempt: DeliveryAttempt,
    next: QueuedDelivery | null,
  ): Promise<void> {
    const { queue, attempts, meta } = this.env.dbs;
    const attemptSeq = this.#nextSeq++;
    meta.put('nextSeq', encodeRecord(this.#nextSeq)).catch(() => undefined);
    attempts.put([endpointId, attemptSeq], encodeRecord(attempt)).catch(() => undefined);
    const since = (this.#sinceTrim.get(endpointId) ?? 0) + 1;
    this.#sinceTrim.set(endpointId, since % TRIM_EVERY_ATTEMPTS);
    if (since >= TRIM_EVERY_ATTEMPTS) this.#trimAttempts(endpointId);
    const write =
      next === null
        ? queue.remove([endpointId, seq])
        : queue.put([endpointId, seq], encodeRecord(next));
    return durableWrite(write, `webhook delivery ${endpointId}/${seq}`).then(() => undefined);
  }

  /** Rewrites queued rows (an operator's re-enable resets held ones); resolves once durable. */
  replaceQueued(
    endpointId: string,
    rows: ReadonlyArray<{ seq: number; delivery: QueuedDelivery }>,
  ): Promise<void> {
    const writes = rows.map(({ seq, delivery }) =>
      this.env.dbs.queue.put([endpointId, seq], encodeRecord(delivery)),
    );
    return durableWrite(Promise.all(writes), `webhook queue ${endpointId} rewrite`).then(
      () => undefined,
    );
  }

  /** Drops everything queued for an endpoint (deleted, or disabled); resolves once durable. */
  dropQueued(endpointId: string): Promise<void> {
    const { queue } = this.env.dbs;
    return durableWrite(
      queue.transaction(() => {
        const keys = Array.from(
          queue.getKeys({ start: [endpointId, 0], end: [endpointId, Number.MAX_SAFE_INTEGER] }),
        );
        for (const key of keys) queue.removeSync(key);
      }),
      `webhook queue ${endpointId} drop`,
    ).then(() => undefined);
  }

  #trimAttempts(endpointId: string): void {
    const { attempts } = this.env.dbs;
    const range = {
      start: [endpointId, Number.MAX_SAFE_INTEGER],
      end: [endpointId, 0],
      reverse: true,
      offset: ATTEMPTS_KEPT_PER_ENDPOINT,
      limit: TRIM_EVERY_ATTEMPTS * 2,
    };
    for (const key of Array.from(attempts.getKeys(range)))
      attempts.remove(key).catch(() => undefined);
  }

  close(): Promise<void> {
    return this.env.root.close();
  }
}

/**
 * The attempt log as the front end reads it (its own read-only handle on the same
 * environment): newest first, `before` continuing a previous page.
 */
export class DeliveryLog {
  private constructor(private readonly env: DurableEnv<DbName>) {}

  static open(dataDir: string): DeliveryLog {
    return new DeliveryLog(
      openDurableEnv<DbName>(path.join(dataDir, 'webhooks'), [
        'cursors',
        'queue',
        'attempts',
        'meta',
      ]),
    );
  }

  page(
    endpointId: string,
    limit: number,
    before: number | null,
  ): { data: Array<DeliveryAttempt & { seq: number }>; nextBefore: number | null } {
    const data: Array<DeliveryAttempt & { seq: number }> = [];
    const range = {
      start: [endpointId, before === null ? Number.MAX_SAFE_INTEGER : before - 1],
      end: [endpointId, 0],
      reverse: true,
      limit: limit + 1,
    };
    for (const { key, value } of this.env.dbs.attempts.getRange(range)) {
      const seq = (key as [string, number])[1];
      data.push({ seq, ...decoded(value, isDeliveryAttempt, `delivery attempt ${seq}`) });
    }
    const more = data.length > limit;
    if (more) data.pop();
    return { data, nextBefore: more ? (data.at(-1)?.seq ?? null) : null };
  }

  /** Deliveries still queued for an endpoint (waiting, retrying or held). */
  pendingCount(endpointId: string): number {
    return this.env.dbs.queue.getKeysCount({
      start: [endpointId, 0],
      end: [endpointId, Number.MAX_SAFE_INTEGER],
    });
  }

  close(): Promise<void> {
    return this.env.root.close();
  }
}
