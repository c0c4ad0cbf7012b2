/**
 * The upkeep of a shard's idempotency key table, done by the worker shell around the
 * shard: moving keys out of an older data dir's layout at start (the automatic
 * migration), and sweeping expired keys off the disk in small slices while it serves.
 *
 * Why a migration: data dirs written before keys had their own table hold them in the
 * customers of a format-1 snapshot and in the journal's consume and refund events. A
 * worker that finds no `idempotency-layout` meta record moves every unexpired key it meets
 * while recovering into the table; its recovery barrier makes them durable with the
 * meta record, so the next start skips the work. Snapshots written afterwards hold no keys.
 */
import { IDEMPOTENCY_RETENTION_MS, IDEMPOTENCY_SWEEP_SLICE_ENTRIES } from '../shared/limits.js';
import type { CustomerSnapshot, Environment, Event } from './customer.js';
import { scopeDigest, type IdempotencyPut, type KeyAddress } from './idempotency-keys.js';
import type { Shard } from './shard.js';

/** The meta record that says a shard's keys live in the table (the layout's version). */
export const IDEMPOTENCY_LAYOUT_META = 'idempotency-layout';
export const IDEMPOTENCY_LAYOUT_VERSION = 1;

/** The part of the key table the upkeep uses (storage/idempotency-table.ts). */
export interface KeyTable {
  backfill(entry: IdempotencyPut): boolean;
  sweep(
    beforeMs: number,
    max: number,
    newerInMemory: (address: KeyAddress, atMs: number) => boolean,
  ): {
    readonly scanned: number;
    readonly removed: readonly KeyAddress[];
    readonly committed: Promise<void>;
  };
}

/**
 * Moves the keys of an older layout into the table while recovery reads it: call
 * `snapshotItems` for each snapshot chunk and `events` for each replayed record.
 * Keys already expired at `nowMs` are left behind.
 */
export class KeyMigration {
  /** Keys stored into the table. */
  moved = 0;

  constructor(
    private readonly table: KeyTable,
    private readonly nowMs: number,
  ) {}

  /**
   * A snapshot chunk's keys: a format-1 item's `idempotency` (scope text), or the `keys`
   * (scope digests) of an item restored from an online snapshot.
   */
  snapshotItems(items: readonly CustomerSnapshot[]): void {
    for (const { environment, id, idempotency, keys } of items) {
      for (const [scope, fingerprint, atMs] of idempotency ?? [])
        this.move(environment, id, scopeDigest(scope), fingerprint, atMs);
      for (const [digest, fingerprint, atMs] of keys ?? [])
        this.move(environment, id, digest, fingerprint, atMs);
    }
  }

  events(events: readonly Event[]): void {
    for (const event of events) {
      if (event.type !== 'consumed' && event.type !== 'refunded') continue;
      if (event.idempotency === null) continue;
      const { scope, fingerprint } = event.idempotency;
      this.move(event.environment, event.customerId, scopeDigest(scope), fingerprint, event.atMs);
    }
  }

  private move(
    environment: Environment,
    customerId: string,
    digest: string,
    fingerprint: string,
    atMs: number,
  ): void {
    if (atMs <= this.nowMs - IDEMPOTENCY_RETENTION_MS) return;
    const put: IdempotencyPut = { environment, customerId, scopeDigest: digest, fingerprint, atMs };
    if (this.table.backfill(put)) this.moved += 1;
  }
}

/**
 * Sweeps expired keys off the table, one slice of at most IDEMPOTENCY_SWEEP_SLICE_ENTRIES
 * at a time, each after the previous one's removals committed: back to back while slices
 * come back full, else once every `idleMs`. `stop` ends it (a clean stop).
 */
export class KeySweeper {
  private timer: ReturnType<typeof setTimeout> | null = null;
  private stopped = false;
  /** Keys removed since start. */
  removed = 0;

  constructor(
    private readonly table: KeyTable,
    private readonly shard: Shard,
    private readonly clock: () => number,
    private readonly idleMs = 1000,
  ) {}

  start(): void {
    this.schedule(0);
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== null) clearTimeout(this.timer);
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => this.slice(), delayMs);
    this.timer.unref();
  }

  /** One slice. A failed read of the table throws out of the timer: the worker dies. */
  private slice(): void {
    this.timer = null;
    if (this.stopped) return;
    const beforeMs = this.clock() - IDEMPOTENCY_RETENTION_MS + 1;
    const slice = this.table.sweep(beforeMs, IDEMPOTENCY_SWEEP_SLICE_ENTRIES, (address, atMs) =>
      this.shard.newerKeyThan(address, atMs),
    );
    this.shard.keysSwept(slice.removed);
    this.removed += slice.removed.length;
    void slice.committed.then(() => {
      this.shard.keysSweepCommitted(slice.removed);
      this.schedule(slice.scanned === IDEMPOTENCY_SWEEP_SLICE_ENTRIES ? 0 : this.idleMs);
    });
  }
}
