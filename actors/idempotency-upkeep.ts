/**
 * The upkeep of a shard's idempotency keys, done by the worker shell around the shard:
 * moving keys out of an older data dir's layout at start (the automatic migration),
 * sealing the keys in memory into runs on disk, and dropping runs whose keys all expired,
 * in small slices while it serves.
 *
 * Why a migration: data dirs written before keys had their own table hold them in the
 * customers of a format-1 snapshot and in the journal's consume and refund events. A
 * worker that finds no `idempotency-layout` meta record moves every unexpired key it meets
 * while recovering into the key store; its recovery barrier makes them durable with the
 * meta record, so the next start skips the work. Snapshots written afterwards hold no
 * keys. Data dirs of layout version 1 (one key table in key order) have that table moved
 * into runs at start (`KeyStore.migrateTable`); version 2's runs are read as they are.
 */
import {
  IDEMPOTENCY_RETENTION_MS,
  IDEMPOTENCY_RUN_KEYS,
  IDEMPOTENCY_SEAL_INTERVAL_MS,
} from '../shared/limits.js';
import type { Environment } from '../shared/environment.js';
import type { CustomerSnapshot, Event } from './customer.js';
import { scopeDigest, type IdempotencyPut } from './idempotency-keys.js';
import type { Shard } from './shard.js';

/** The meta record that says how a shard's keys are laid out (the layout's version). */
export const IDEMPOTENCY_LAYOUT_META = 'idempotency-layout';
/**
 * Version 1: one key table in key order. Version 2: sealed runs (and their logs), a key per
 * entry. Version 3: runs sealed from now on store blocks of a customer's keys; the runs of
 * version 2 are read as they are until they expire (each run's record names its layout).
 * Within version 3, a run's record also carries the run's own filter from this release on;
 * runs without one are read wherever their group's filter says maybe, and a release that
 * predates the field reads the record as before, ignoring it (no new version is needed).
 * Eras stored as images (storage/idempotency-eras.ts) need none either: such a release
 * takes an image's entries for an unfinished era's and removes them, and its groups' own
 * filters answer. Version 4: a log entry leads with the seq of the journal record whose
 * keys it holds, so recovery forgets the keys of a record it drops (a torn tail); entries
 * of version 3 are read as before. Version 5: a key rides in its journal record (the
 * consume's or refund's event carries the scope's digest and the fingerprint) instead of a
 * log entry; the catalog names the newest record whose keys are all sealed, and recovery
 * holds the keys of the records after it in memory again. The log tables keep only keys
 * migrated at start, and the entries an older release left until they are sealed.
 * Version 6: runs sealed from now on store blocks of sections, one per customer, several
 * customers' keys to a block (a run's record says `sections`); a release before would read
 * such a block as one customer's and miss keys, so it must refuse the dir. Runs of
 * version 5 are read as they are until they expire.
 */
export const IDEMPOTENCY_LAYOUT_VERSION = 6;
/** The first version whose keys are in runs (older ones have the one table to move). */
export const IDEMPOTENCY_RUNS_LAYOUT = 2;

/** The part of the key store the migration uses (storage/idempotency-runs.ts). */
export interface KeyBackfill {
  backfill(entry: IdempotencyPut): boolean;
}

/** The part of the key store the upkeep uses (storage/idempotency-runs.ts). */
export interface KeyRuns {
  readonly unsealed: number;
  seal(
    pacing: { pause: () => Promise<void>; keysDurable: () => Promise<void> },
    runKeys: number,
  ): Promise<unknown>;
  dropExpired(
    beforeMs: number,
    pacing: { pause: () => Promise<void> },
  ): Promise<ReadonlyArray<Readonly<Record<Environment, number>>>>;
  /** Rebuilds the eras a crash left unstored; resolves to the groups they hold. */
  rebuildEras(expiredBeforeMs: number, pacing: { pause: () => Promise<void> }): Promise<number>;
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
    private readonly table: KeyBackfill,
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
      // Events of the older layout carry their key's scope (every keyed one of them).
      if (event.idempotency?.scope === undefined) continue;
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

/** Thrown out of a pause once the upkeep is stopped: the work in progress ends there. */
class Stopped extends Error {}

/**
 * Seals the keys in memory into a run once IDEMPOTENCY_RUN_KEYS are waiting or
 * IDEMPOTENCY_SEAL_INTERVAL_MS after the last seal, and drops groups of runs whose keys all
 * expired; checks once a second, at once again while a full run is waiting. From the
 * start, beside those rounds, it rebuilds the eras of filters a crash left unstored
 * (storage/idempotency-runs.ts, `rebuildEras`). Every step yields to the event loop
 * between slices. `stop` ends it at the next slice (a clean stop; what it was writing is
 * finished by the next start). A failed write is handed to `fatal`.
 */
export class KeyUpkeep {
  private timer: ReturnType<typeof setTimeout> | null = null;
  private stopped = false;
  private running: Promise<void> = Promise.resolve();
  private rebuilding: Promise<void> = Promise.resolve();
  private lastSealMs: number;
  /** Runs sealed and dropped since start. */
  sealed = 0;
  dropped = 0;
  /** Groups of runs the eras rebuilt since start hold (null: the rebuild has not ended). */
  rebuiltGroups: number | null = null;

  constructor(
    private readonly runs: KeyRuns,
    private readonly shard: Shard,
    private readonly clock: () => number,
    private readonly fatal: (error: unknown) => void,
    /**
     * Keys that make a run (IDEMPOTENCY_RUN_KEYS), the check interval (1 s), and what to
     * tell when a rebuild ends that rebuilt groups (none after a clean stop): how many, and
     * how long it took from the start.
     */
    private readonly settings: {
      readonly runKeys?: number;
      readonly idleMs?: number;
      readonly rebuilt?: (groups: number, ms: number) => void;
    } = {},
  ) {
    this.lastSealMs = clock();
  }

  start(): void {
    // Before the first seal: the newest group a rebuilt era holds must take no more runs.
    const startedMs = performance.now();
    this.rebuilding = this.runs
      .rebuildEras(this.clock() - IDEMPOTENCY_RETENTION_MS, this.pacing)
      .then(
        (groups) => {
          this.rebuiltGroups = groups;
          if (groups > 0) this.settings.rebuilt?.(groups, performance.now() - startedMs);
        },
        (error: unknown) => {
          if (!(error instanceof Stopped)) this.fatal(error);
        },
      );
    this.schedule(0);
  }

  /** Stops; resolves once no slice is running (a rebuild part-way stores nothing more). */
  stop(): Promise<void> {
    this.stopped = true;
    if (this.timer !== null) clearTimeout(this.timer);
    return Promise.all([this.running, this.rebuilding]).then(() => undefined);
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.running = this.step().then(
        (again) => this.schedule(again ? 0 : (this.settings.idleMs ?? 1000)),
        (error: unknown) => {
          if (!(error instanceof Stopped)) this.fatal(error);
        },
      );
    }, delayMs);
    this.timer.unref();
  }

  /** Between slices: a later turn, unless stopped. Sealing waits for keys to be durable. */
  private readonly pacing = {
    pause: (): Promise<void> =>
      new Promise((resolve, reject) =>
        setImmediate(() => (this.stopped ? reject(new Stopped()) : resolve())),
      ),
    keysDurable: (): Promise<void> => new Promise((resolve) => this.shard.whenDurable(resolve)),
  };

  /** One round; true when a full run is already waiting again. */
  private async step(): Promise<boolean> {
    const now = this.clock();
    const dropped = await this.runs.dropExpired(now - IDEMPOTENCY_RETENTION_MS, this.pacing);
    for (const run of dropped) this.shard.keysDropped(run);
    this.dropped += dropped.length;
    const waiting = this.runs.unsealed;
    const runKeys = this.settings.runKeys ?? IDEMPOTENCY_RUN_KEYS;
    if (
      waiting >= runKeys ||
      (waiting > 0 && now - this.lastSealMs >= IDEMPOTENCY_SEAL_INTERVAL_MS)
    ) {
      this.lastSealMs = now;
      await this.runs.seal(this.pacing, runKeys);
      this.sealed += 1;
    }
    return this.runs.unsealed >= runKeys;
  }
}
