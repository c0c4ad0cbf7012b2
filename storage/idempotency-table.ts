/**
 * A shard's idempotency keys on disk: two named databases of its LMDB environment.
 *
 * Why it exists: keyed writes (a request id on every consume) would otherwise keep every
 * key of the last 24 h on the heap, and at tens of thousands of keyed writes a second
 * that is billions of entries. Here they cost disk, and a lookup is a memory-mapped
 * B-tree read (microseconds) on the worker's thread.
 *
 * Layout:
 * - `idempotency`: [environment, customerId, scope digest] → frame([fingerprint, atMs]).
 *   The scope digest names op, meter and key in a fixed 22 characters whatever the key's
 *   length, so every LMDB key stays within its limit; a customer's keys are one key
 *   range (an online snapshot copies them with the customer), and so are an
 *   environment's (the quota counts them).
 * - `idempotency-expiry`: [atMs, environment, customerId, scope digest] → nothing: the
 *   same entries in time order, so the sweep finds the expired ones without reading the
 *   rest.
 *
 * Writes are issued by the caller in the same event-loop turn as the journal record that
 * applies the command (lmdb-js puts every asynchronous write of one turn into one
 * transaction), so a key is on disk exactly when its write is: a crash keeps both or
 * neither. The table itself never waits for anything; the record's durability is the
 * journal's to report.
 */
import { assert } from '../shared/assert.js';
import { decodeRecord, encodeRecord } from './codec.js';
import type { BinaryDb } from './lmdb-env.js';

/** The names of the two databases, for the environment that opens them. */
export const IDEMPOTENCY_DB_NAMES = ['idempotency', 'idempotency-expiry'] as const;
export type IdempotencyDbName = (typeof IDEMPOTENCY_DB_NAMES)[number];

/** A stored key: the fingerprint (the amount) of the write that used it first, and when. */
export interface StoredKey {
  readonly fingerprint: string;
  readonly atMs: number;
}

/** Where a key is stored: its customer and the digest of its scope. */
export interface KeyAddress {
  readonly environment: 'test' | 'live';
  readonly customerId: string;
  readonly scopeDigest: string;
}

/** A key to store. */
export interface KeyPut extends KeyAddress, StoredKey {}

/** One key of a customer: [scope digest, fingerprint, atMs]. */
export type CustomerKey = [string, string, number];

/** What one sweep slice did. */
export interface SweepSlice {
  /** Expiry entries read (at most the slice's budget). */
  readonly scanned: number;
  /** Keys removed. */
  readonly removed: readonly KeyAddress[];
  /** Settles once the removals are committed (never rejects: a failed removal is retried). */
  readonly committed: Promise<void>;
}

const NOTHING = Buffer.from([0]);

type TableKey = [string, string, string];

function tableKey(address: KeyAddress): TableKey {
  return [address.environment, address.customerId, address.scopeDigest];
}

export class IdempotencyTable {
  readonly #keys: BinaryDb;
  readonly #expiry: BinaryDb;

  constructor(dbs: Readonly<Record<IdempotencyDbName, BinaryDb>>) {
    this.#keys = dbs.idempotency;
    this.#expiry = dbs['idempotency-expiry'];
  }

  /**
   * The committed entry at `address`, or undefined. Synchronous: an LMDB read of the
   * memory map. Throws if the stored bytes fail verification (stored state that fails its
   * checksum must stop the worker).
   */
  get(address: KeyAddress): StoredKey | undefined {
    return this.#decode(this.#keys.get(tableKey(address)), address.scopeDigest);
  }

  /**
   * Every committed key of one customer, as of now. Throws as `get` does.
   */
  customerKeys(environment: 'test' | 'live', customerId: string): CustomerKey[] {
    const keys: CustomerKey[] = [];
    const range = this.#keys.getRange({
      start: [environment, customerId],
      end: [environment, customerId, '\uffff'],
    });
    for (const { key, value } of range) {
      const [env, id, scopeDigest] = key as TableKey;
      // The range is by bytes; ids with control characters could border it.
      if (env !== environment || id !== customerId) continue;
      const stored = this.#decode(value, scopeDigest) as StoredKey;
      keys.push([scopeDigest, stored.fingerprint, stored.atMs]);
    }
    return keys;
  }

  #decode(bytes: Buffer | undefined, what: string): StoredKey | undefined {
    if (bytes === undefined) return undefined;
    const decoded = decodeRecord(bytes);
    const value = decoded.ok ? decoded.value : null;
    if (
      !Array.isArray(value) ||
      typeof value[0] !== 'string' ||
      typeof value[1] !== 'number' ||
      value.length !== 2
    )
      throw new Error(`idempotency key ${what} is corrupt; refusing to go on`);
    return { fingerprint: value[0], atMs: value[1] };
  }

  /**
   * Issues the puts of `entries` (an entry replaces whatever its digest held). They join
   * the transaction of the other writes issued in this event-loop turn; their failure
   * fails that whole transaction, which the journal record's durable promise reports.
   */
  put(entries: readonly KeyPut[]): void {
    for (const entry of entries) {
      assert(entry.scopeDigest.length > 0, 'an idempotency scope digest is not empty');
      const key = tableKey(entry);
      this.#keys.put(key, encodeRecord([entry.fingerprint, entry.atMs])).catch(() => undefined);
      this.#expiry.put([entry.atMs, ...key], NOTHING).catch(() => undefined);
    }
  }

  /**
   * Recovery's migration of a key found in an older layout (a snapshot or journal record
   * written when keys lived in the customer's state): stored unless the table already
   * holds the same or a newer use of the digest. Issued like `put`.
   */
  backfill(entry: KeyPut): boolean {
    const stored = this.get(entry);
    if (stored !== undefined && stored.atMs >= entry.atMs) return false;
    this.put([entry]);
    return true;
  }

  /**
   * Removes up to `max` keys used before `beforeMs` (oldest first). An expiry entry whose
   * key was used again since (the table holds a newer time) only loses its expiry entry;
   * so does one `newerInMemory` says a write not yet committed uses again.
   * Removals are issued like puts; a crash before they commit only leaves them for the
   * next sweep (an expired key is as good as none to a lookup). The next slice must wait
   * for this one's `committed`: until then reads still see what it removed.
   */
  sweep(
    beforeMs: number,
    max: number,
    newerInMemory: (address: KeyAddress, atMs: number) => boolean,
  ): SweepSlice {
    const found: Array<[number, string, string, string]> = [];
    for (const key of this.#expiry.getKeys({ end: [beforeMs], limit: max }))
      found.push(key as unknown as [number, string, string, string]);
    const removed: KeyAddress[] = [];
    const writes: Array<Promise<unknown>> = [];
    for (const entry of found) {
      const [atMs, environment, customerId, scopeDigest] = entry;
      assert(
        environment === 'test' || environment === 'live',
        'an expiry entry names its environment',
      );
      const address: KeyAddress = { environment, customerId, scopeDigest };
      writes.push(this.#expiry.remove(entry));
      if (this.get(address)?.atMs !== atMs || newerInMemory(address, atMs)) continue;
      writes.push(this.#keys.remove(tableKey(address)));
      removed.push(address);
    }
    const committed = Promise.all(writes).then(
      () => undefined,
      () => undefined,
    );
    return { scanned: found.length, removed, committed };
  }

  /** Keys on disk, expired ones not yet swept included (LMDB keeps the count: O(1)). */
  get size(): number {
    return (this.#keys.getStats() as { entryCount: number }).entryCount;
  }

  /**
   * Keys on disk of one environment: a walk over its key range, so only for a start,
   * never per request. (`live` sorts before `test`.)
   */
  countOf(environment: 'test' | 'live'): number {
    const range = environment === 'live' ? { end: ['test'] } : { start: ['test'] };
    let count = 0;
    for (const _ of this.#keys.getKeys(range)) count++;
    return count;
  }
}
