/**
 * The shard's idempotency keys as the shell sees them: a bounded window of recent keys in
 * memory in front of the shard's key table on disk.
 *
 * Why both: the table (storage/idempotency-table.ts) holds every key of the retention
 * and is read synchronously on a miss, but a read sees only committed transactions, and
 * a key decided a moment ago rides a journal append that may not have committed yet. The
 * window therefore holds every key whose append is not yet committed (it never evicts
 * one), plus the most recent others up to a fixed budget, so a retry of a recent request
 * (the common case) never reaches disk. Entries are compact: a 22-character digest of
 * the scope (never the key text), the fingerprint and the time.
 *
 * The pure core never sees any of this: the shard looks a command's scope up here and
 * hands `decide` the entry it found (`IdempotencySeen`).
 */
import { createHash } from 'node:crypto';
import { assert } from '../shared/assert.js';
import type { Environment } from '../shared/environment.js';
import type { IdempotencySeen } from './customer.js';

/** Where a key is kept: its customer and the digest of its scope (op, meter, key). */
export interface KeyAddress {
  readonly environment: Environment;
  readonly customerId: string;
  readonly scopeDigest: string;
}

/** An idempotency key a write used, stored with the journal record that applies it. */
export interface IdempotencyPut extends KeyAddress, IdempotencySeen {}

/** One key of a customer as a snapshot item carries it: [scope digest, fingerprint, atMs]. */
export type CustomerKey = [string, string, number];

/** Where keys that left the window are found: the table on disk (or nothing, in tests). */
export interface StoredKeys {
  /** The committed entry at `address`, or undefined. Synchronous. */
  get(address: KeyAddress): IdempotencySeen | undefined;
  /** Every committed key of one customer. */
  customerKeys(environment: Environment, customerId: string): CustomerKey[];
}

/** For a shard without a table (unit tests): the window alone. */
export const NO_STORED_KEYS: StoredKeys = { get: () => undefined, customerKeys: () => [] };

/**
 * The digest that names an idempotency scope within its customer: 128 bits of SHA-256
 * over the scope, in base64url (22 characters) whatever the key's length. Two scopes of
 * one customer collide as likely as a guess of a random 128-bit number.
 */
export function scopeDigest(scope: string): string {
  return createHash('sha256').update(scope).digest().subarray(0, 16).toString('base64url');
}

/** The window's key of an address. */
function windowKey(address: KeyAddress): string {
  const environment = address.environment === 'live' ? 'l' : 't';
  return `${environment}${address.customerId}\u0000${address.scopeDigest}`;
}

/** A key in the window: `put` null marks one the sweep removed, not yet committed. */
interface WindowEntry {
  readonly put: IdempotencyPut | null;
  /** The shard's append that carries it (Infinity for a sweep's mark). */
  readonly append: number;
  /** Its window key (the eviction queue holds entries). */
  readonly key: string;
}

export class IdempotencyKeys {
  private readonly window = new Map<string, WindowEntry>();
  /**
   * The window's entries oldest first, from `head` on; an entry the window no longer
   * holds (replaced by a newer use, or removed) is skipped. A queue of its own rather
   * than the Map's order, because evicting from the front of a Map leaves deleted slots
   * that every later walk from the front steps over again until the Map is rebuilt.
   */
  private order: WindowEntry[] = [];
  private head = 0;
  /** Appends up to this one are committed: their keys are readable from `stored`. */
  private committedAppend = 0;

  constructor(
    private readonly stored: StoredKeys,
    /** Keys kept in memory once committed (IDEMPOTENCY_WINDOW_ENTRIES). */
    private readonly windowMax: number,
  ) {
    assert(windowMax >= 0, 'the idempotency window budget is not negative');
  }

  /** Keys in memory now. */
  get size(): number {
    return this.window.size;
  }

  /** The entry at `address`: from the window, else from disk; null if neither has one. */
  lookup(address: KeyAddress): IdempotencySeen | null {
    const held = this.window.get(windowKey(address));
    if (held !== undefined) return held.put;
    return this.stored.get(address) ?? null;
  }

  /** A key decided now, carried by the shard's append number `append`. */
  remember(put: IdempotencyPut, append: number): void {
    this.place(windowKey(put), put, append);
    this.evict();
  }

  /** Appends up to `append` are committed: their keys may leave the window. */
  committed(append: number): void {
    if (append > this.committedAppend) this.committedAppend = append;
    this.evict();
  }

  /**
   * Whether the window holds a newer use of `address` than the one at `atMs` (the sweep
   * must then leave the stored key alone: the newer one replaces it).
   */
  newerThan(address: KeyAddress, atMs: number): boolean {
    const held = this.window.get(windowKey(address))?.put;
    return held !== undefined && held !== null && held.atMs > atMs;
  }

  /**
   * The sweep removed `address` from disk, not committed yet: until then a lookup must
   * not find the expired entry still readable there (and count it as present).
   */
  swept(address: KeyAddress): void {
    this.place(windowKey(address), null, Number.POSITIVE_INFINITY);
  }

  /** The removal of a swept key committed: its mark goes, unless a new use replaced it. */
  sweepCommitted(address: KeyAddress): void {
    const key = windowKey(address);
    if (this.window.get(key)?.put === null) this.window.delete(key);
  }

  /**
   * Every key the window holds now, by `environment \0 customerId` (an online snapshot's
   * cut: with the table read later, the keys as of the cut). One pass over the window,
   * which is bounded.
   */
  heldKeys(): Map<string, IdempotencyPut[]> {
    const byCustomer = new Map<string, IdempotencyPut[]>();
    for (const { put } of this.window.values()) {
      if (put === null) continue;
      const key = `${put.environment}\u0000${put.customerId}`;
      let list = byCustomer.get(key);
      if (list === undefined) byCustomer.set(key, (list = []));
      list.push(put);
    }
    return byCustomer;
  }

  /** Every key of one customer as of now: the table's, with the window's over them. */
  customerKeys(
    environment: Environment,
    customerId: string,
    held: readonly IdempotencyPut[],
  ): CustomerKey[] {
    const keys = new Map<string, CustomerKey>();
    for (const key of this.stored.customerKeys(environment, customerId)) keys.set(key[0], key);
    for (const put of held) keys.set(put.scopeDigest, [put.scopeDigest, put.fingerprint, put.atMs]);
    return [...keys.values()];
  }

  /** Stores `key`'s entry at the back of the eviction order. */
  private place(key: string, put: IdempotencyPut | null, append: number): void {
    const entry: WindowEntry = { put, append, key };
    this.order.push(entry);
    this.window.set(key, entry);
  }

  /** Drops the oldest committed entries beyond the budget; stops at one not committed yet. */
  private evict(): void {
    for (; this.head < this.order.length; this.head++) {
      const entry = this.order[this.head] as WindowEntry;
      if (this.window.get(entry.key) !== entry) continue;
      if (this.window.size <= this.windowMax || entry.append > this.committedAppend) break;
      this.window.delete(entry.key);
    }
    this.compact();
  }

  /**
   * Drops the entries already passed once they are most of the queue, and the skipped
   * ones too when they outgrow the window (stale entries behind a long-lived one).
   */
  private compact(): void {
    const queued = this.order.length - this.head;
    if (this.head >= 4096 && this.head * 2 >= this.order.length) {
      this.order = this.order.slice(this.head);
      this.head = 0;
    }
    if (queued <= 2 * this.window.size + 4096) return;
    this.order = this.order
      .slice(this.head)
      .filter((entry) => this.window.get(entry.key) === entry);
    this.head = 0;
  }
}
