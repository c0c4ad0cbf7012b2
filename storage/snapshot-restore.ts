/**
 * Offline restore: turns a snapshot file into a fresh data dir that a server started on
 * it answers exactly as the original did at the cut — same keys (revoked ones stay
 * revoked), every configuration version, the audit chains (verbatim, so they verify),
 * every customer's state in its shard's snapshot with the customer index beside it, and
 * the idempotency keys live at the cut (sealed into runs in their shard's key store).
 *
 * It refuses rather than guesses: a data dir that a running server (or another restore)
 * owns, a data dir that is not empty, and a file that fails any check (the whole file is
 * verified before the first byte is written). If writing fails half way, what it wrote
 * is removed, so the directory is as empty as it was.
 *
 * A file is restored only if it is authentic — its MAC verifies with the snapshot secret
 * of the data dir it was taken from, which the operator passes in — or if the operator
 * says explicitly that it may be unauthenticated. Either way every key record, every
 * configuration and every customer is checked against the rules live input obeys before
 * it is written, so an edited file cannot plant a malformed key or customer. The
 * restored data dir keeps the secret it was authenticated with (a new one otherwise).
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import {
  customerView,
  type CustomerProfile,
  type CustomerRecord,
} from '../shared/customer-record.js';
import type { Environment } from '../shared/environment.js';
import {
  IDEMPOTENCY_RETENTION_MS,
  IDEMPOTENCY_RUN_KEYS,
  LOGICAL_SHARDS,
} from '../shared/limits.js';
import { logicalShardOf, workerOf } from '../shared/shard-hash.js';
import { AuditLog } from './audit-log.js';
import { ControlStore, type ConfigEntry, type KeyRecord } from './control-store.js';
import { claimDataDir, dataDirOwner } from './data-dir-lock.js';
import type { KeyPut } from './held-keys.js';
import {
  encodeSnapshotChunk,
  ShardStore,
  SNAPSHOT_CHUNK_ITEMS,
  type IndexEntry,
} from './journal.js';
import {
  snapshotFrames,
  SNAPSHOT_SECRET_BYTES,
  SnapshotFileError,
  verifySnapshotFile,
  type SnapshotHeader,
  type SnapshotRead,
  type SnapshotTrailer,
} from './snapshot-file.js';

export class RestoreRefusedError extends Error {}

export interface RestoreOptions {
  /** Worker count of the restored data dir (default: the snapshot's). */
  readonly workers?: number;
  readonly onProgress?: (
    phase: 'verify' | 'restore',
    bytesRead: number,
    bytesTotal: number,
  ) => void;
  /** Who restored, for the operator audit stream (e.g. the OS user). */
  readonly actor?: string;
  /**
   * The snapshot secret of the data dir the file was taken from: the file's MAC must verify with
   * it.
   */
  readonly secret?: Uint8Array;
  /** Restore without a secret, trusting the file's content unauthenticated (still validated). */
  readonly unauthenticated?: boolean;
  /** Checks a configuration as a push would; answers why it is refused, or null. */
  readonly checkConfig?: (config: unknown) => string | null;
  /** Checks a customer's id and profile as an upsert would; answers why it is refused, or null. */
  readonly checkCustomer?: (customer: CustomerRecord) => string | null;
}

export interface RestoreResult {
  readonly header: SnapshotHeader;
  readonly trailer: SnapshotTrailer;
  readonly workers: number;
  readonly keys: number;
  readonly customers: number;
  /** Idempotency keys restored from `idempotency` frames (format 3; unexpired ones). */
  readonly idempotencyKeys: number;
}

/** Throws RestoreRefusedError when `dataDir` may not be restored into. */
export function checkRestoreTarget(dataDir: string): void {
  const owner = dataDirOwner(dataDir);
  if (owner !== null) {
    throw new RestoreRefusedError(
      `data dir ${dataDir} is held by a running Tally ${owner.role} (pid ${owner.pid}); ` +
        `stop it first, and restore into an empty directory`,
    );
  }
  const entries = fs.existsSync(dataDir) ? fs.readdirSync(dataDir) : [];
  if (entries.length > 0) {
    throw new RestoreRefusedError(
      `data dir ${dataDir} is not empty (${entries.length} entries); restore needs an ` +
        `empty or new directory`,
    );
  }
}

/**
 * Restores `file` into `dataDir`. Rejects with RestoreRefusedError for a refused target,
 * SnapshotFileError for a bad file (nothing written in either case), or the write error.
 */
export async function restoreSnapshot(
  file: string,
  dataDir: string,
  options: RestoreOptions = {},
): Promise<RestoreResult> {
  checkRestoreTarget(dataDir);
  const secret = options.secret ?? null;
  if (secret !== null && secret.length !== SNAPSHOT_SECRET_BYTES)
    throw new RestoreRefusedError(
      `a snapshot secret is ${SNAPSHOT_SECRET_BYTES} bytes (${SNAPSHOT_SECRET_BYTES * 2} ` +
        `hex digits)`,
    );
  if (secret === null && options.unauthenticated !== true) {
    throw new RestoreRefusedError(
      'restore needs the snapshot secret of the data dir the file was taken from, to ' +
        'check the file is the one the service wrote ' +
        '(`tally snapshot secret` prints it); to restore a file that cannot be ' +
        'authenticated, say so explicitly',
    );
  }
  const verified = verifySnapshotFile(
    file,
    (read, total) => options.onProgress?.('verify', read, total),
    secret,
  );
  const workers = options.workers ?? verified.header.workers;
  if (!Number.isInteger(workers) || workers < 1 || workers > 64)
    throw new RestoreRefusedError(`workers must be 1 to 64, got ${workers}`);
  const existed = fs.existsSync(dataDir);
  const release = claimDataDir(dataDir, 'restore');
  try {
    const result = await writeDataDir(file, dataDir, workers, {
      ...options,
      secret: secret ?? randomBytes(SNAPSHOT_SECRET_BYTES),
    });
    release();
    return result;
  } catch (error) {
    release();
    // Leave the directory as empty as it was found.
    for (const name of fs.readdirSync(dataDir))
      fs.rmSync(path.join(dataDir, name), { recursive: true, force: true });
    if (!existed) fs.rmSync(dataDir, { recursive: true, force: true });
    throw error;
  }
}

/**
 * What restore reads of a snapshot's customer item: where it belongs and its customer
 * record (for the index row). The item itself is stored as it is, for the shard to load.
 */
interface StoredCustomer extends CustomerRecord {
  readonly environment: Environment;
}

/** `item` as a StoredCustomer, or SnapshotFileError when it lacks those fields. */
function storedCustomer(item: unknown): StoredCustomer {
  const fields = (typeof item === 'object' && item !== null ? item : {}) as Partial<
    Record<keyof StoredCustomer, unknown>
  >;
  const profile = (
    typeof fields.profile === 'object' && fields.profile !== null ? fields.profile : {}
  ) as Partial<Record<keyof CustomerProfile, unknown>>;
  const ok =
    (fields.environment === 'test' || fields.environment === 'live') &&
    typeof fields.id === 'string' &&
    typeof fields.createdAtMs === 'number' &&
    typeof profile.updatedAtMs === 'number' &&
    typeof profile.metadata === 'object' &&
    profile.metadata !== null;
  if (!ok)
    throw new SnapshotFileError(
      'a customer item of the snapshot lacks its environment, id or profile',
    );
  return item as StoredCustomer;
}

/**
 * One restored shard's contents, built while the file streams by: its snapshot as
 * encoded chunks and its customer index rows, so a restore of millions of customers
 * holds bytes, never every customer decoded at once. Its idempotency keys (files of
 * format 3; older ones carry them in the customers' items) go to its key store as they
 * come and are sealed into runs as a shard seals them, a run's worth at a time: a restore
 * holds at most one run of keys a shard in memory however many there are, and the
 * restored shard's first start finds them in runs, with none to load.
 */
class ShardContents {
  readonly chunks: Buffer[] = [];
  readonly index: IndexEntry[] = [];
  private pending: StoredCustomer[] = [];
  items = 0;
  /** Its environment, opened at its first idempotency key (else when it is written). */
  private store: ShardStore | null = null;

  constructor(private readonly dir: string) {}

  add(item: StoredCustomer): void {
    this.pending.push(item);
    this.items++;
    this.index.push({
      environment: item.environment,
      id: item.id,
      json: Buffer.from(JSON.stringify(customerView(item))),
    });
    if (this.pending.length === SNAPSHOT_CHUNK_ITEMS) this.seal();
  }

  seal(): void {
    if (this.pending.length === 0) return;
    this.chunks.push(encodeSnapshotChunk(this.pending));
    this.pending = [];
  }

  /** Holds `put` in its key store; true once a run's worth waits to be sealed (`sealKeys`). */
  holdKey(put: KeyPut): boolean {
    this.store ??= ShardStore.open(this.dir);
    this.store.idempotency.remember(put);
    return this.store.idempotency.unsealed >= IDEMPOTENCY_RUN_KEYS;
  }

  /** Seals the keys it holds into runs. */
  async sealKeys(): Promise<void> {
    if (this.store !== null) await this.store.idempotency.seal(RESTORE_PACING);
  }

  /**
   * Writes its environment: the customers as the shard's snapshot, their index rows, the
   * keys still held sealed, and the open era of their filters stored (idempotency-eras.ts),
   * so that the first start reads them through it.
   */
  async write(): Promise<void> {
    this.seal();
    const store = this.store ?? ShardStore.open(this.dir);
    this.store = store;
    await store.writeSnapshotChunks(0, this.chunks, this.items);
    for (let start = 0; start < this.index.length; start += INDEX_ROWS_PER_BATCH) {
      await store.putIndex(this.index.slice(start, start + INDEX_ROWS_PER_BATCH));
    }
    await this.sealKeys();
    await store.idempotency.storeOpenEra(RESTORE_PACING.pause);
    await this.close();
  }

  async close(): Promise<void> {
    const store = this.store;
    this.store = null;
    await store?.close();
  }
}

/** A restore seals keys with nothing else to serve: no journal to wait for. */
const RESTORE_PACING = {
  pause: (): Promise<void> => new Promise((resolve) => setImmediate(resolve)),
  keysDurable: (): Promise<void> => Promise.resolve(),
};

/** Index rows written per LMDB batch: bounded promises in flight. */
const INDEX_ROWS_PER_BATCH = 10_000;

async function writeDataDir(
  file: string,
  dataDir: string,
  workers: number,
  options: RestoreOptions & { secret: Uint8Array },
): Promise<RestoreResult> {
  const control = ControlStore.open(dataDir);
  const audit = new AuditLog(control.auditDb);
  const shards = Array.from(
    { length: workers },
    (_, index) => new ShardContents(path.join(dataDir, `shard-${index}`)),
  );
  const shardOf = (environment: Environment, id: string): ShardContents =>
    shards[workerOf(logicalShardOf(environment, id, LOGICAL_SHARDS), workers)] as ShardContents;
  const writes: Array<Promise<void>> = [];
  // Awaited after the frames; one that fails meanwhile (while a seal is awaited) is
  // reported there, not as an unhandled rejection.
  const issue = (write: Promise<void>): void => {
    write.catch(() => undefined);
    writes.push(write);
  };
  let keys = 0;
  let idempotencyKeys = 0;
  const expiredBeforeMs = Date.now() - IDEMPOTENCY_RETENTION_MS;
  const frames = snapshotFrames(file, (read, total) =>
    options.onProgress?.('restore', read, total),
  );
  let next = frames.next();
  try {
    for (; next.done !== true; next = frames.next()) {
      const frame = next.value;
      switch (frame.k) {
        case 'keys':
          for (const record of frame.items) issue(control.putKey(checkedKey(record)));
          keys += frame.items.length;
          break;
        case 'configs':
          for (const entry of frame.entries)
            issue(
              control.putConfig(
                checkedEnvironment(frame.environment),
                checkedConfig(entry, options),
              ),
            );
          break;
        case 'audit':
          for (const [seq, bytes] of frame.entries) issue(audit.putRaw(frame.stream, seq, bytes));
          break;
        case 'idempotency': {
          const due = new Set<ShardContents>();
          for (const item of frame.items) {
            const [environment, customerId, stored] = checkedKeys(item);
            const shard = shardOf(environment, customerId);
            for (const [scopeDigest, fingerprint, atMs] of stored) {
              // As a start migrates keys: one past the retention is not brought over.
              if (atMs <= expiredBeforeMs) continue;
              if (shard.holdKey({ environment, customerId, scopeDigest, fingerprint, atMs }))
                due.add(shard);
              idempotencyKeys++;
            }
          }
          for (const shard of due) await shard.sealKeys();
          break;
        }
        case 'customers':
          for (const item of frame.items.map(storedCustomer)) {
            checkCustomer(item, options);
            shardOf(item.environment, item.id).add(item);
          }
          break;
      }
    }
  } catch (error) {
    // Closes the file: the generator's own `finally` runs (what it returns is moot here).
    frames.return(undefined as unknown as SnapshotRead);
    await Promise.all(shards.map((shard) => shard.close()));
    throw error;
  }
  const { header, trailer } = next.value;
  writes.push(control.putMeta('workers', workers));
  writes.push(control.putSnapshotSecret(options.secret));
  writes.push(
    control.putMeta('restoredFrom', {
      id: header.id,
      createdAtMs: header.createdAtMs,
      sha256: trailer.sha256,
    }),
  );
  await Promise.all(writes);
  try {
    for (const shard of shards) await shard.write();
  } finally {
    await Promise.all(shards.map((shard) => shard.close()));
  }
  await audit.append(
    'operator',
    {
      action: 'snapshot.restore',
      resourceType: 'snapshot',
      resourceId: header.id,
      actor: options.actor ?? 'cli',
      data: {
        createdAt: new Date(header.createdAtMs).toISOString(),
        sha256: trailer.sha256,
        customers: trailer.customers,
        workers,
      },
    },
    Date.now(),
  );
  await control.close();
  return { header, trailer, workers, keys, customers: trailer.customers, idempotencyKeys };
}

/** A restored record that breaks a rule live input obeys: the file was edited or is damaged. */
function refused(what: string, why: string): never {
  throw new RestoreRefusedError(
    `snapshot file holds an invalid ${what}: ${why}; nothing was restored`,
  );
}

function checkedEnvironment(value: unknown): Environment {
  if (value !== 'test' && value !== 'live') refused('environment', JSON.stringify(value));
  return value;
}

/** The longest scope digest and fingerprint a restored idempotency key may have. */
const DIGEST_MAX = 64;
const FINGERPRINT_MAX = 1024;

/**
 * An `idempotency` frame's item as the service writes one: an environment, a customer id
 * and its keys, each [scope digest, fingerprint, atMs].
 */
function checkedKeys(
  value: unknown,
): [Environment, string, ReadonlyArray<readonly [string, string, number]>] {
  const item = value as unknown[];
  const shaped =
    Array.isArray(item) &&
    item.length === 3 &&
    (item[0] === 'test' || item[0] === 'live') &&
    typeof item[1] === 'string' &&
    item[1].length > 0 &&
    Array.isArray(item[2]) &&
    item[2].every(
      (key: unknown) =>
        Array.isArray(key) &&
        key.length === 3 &&
        typeof key[0] === 'string' &&
        key[0].length > 0 &&
        key[0].length <= DIGEST_MAX &&
        typeof key[1] === 'string' &&
        key[1].length <= FINGERPRINT_MAX &&
        Number.isSafeInteger(key[2]),
    );
  if (!shaped) refused('idempotency key item', JSON.stringify(value).slice(0, 200));
  return item as [Environment, string, ReadonlyArray<readonly [string, string, number]>];
}

const KEY_CLASSES: ReadonlySet<unknown> = new Set(['server', 'client', 'admin']);

/**
 * A key record as the service writes one: an id, a SHA-256 digest, a class that fits its
 * environment.
 */
function checkedKey(value: unknown): KeyRecord {
  const key = value as Partial<KeyRecord> | null;
  const shaped =
    typeof key === 'object' &&
    key !== null &&
    typeof key.id === 'string' &&
    /^key_[A-Za-z0-9_-]{1,64}$/.test(key.id) &&
    typeof key.prefix === 'string' &&
    key.prefix.length <= 64 &&
    typeof key.hashHex === 'string' &&
    /^[0-9a-f]{64}$/.test(key.hashHex) &&
    KEY_CLASSES.has(key.keyClass) &&
    (key.keyClass === 'admin'
      ? key.environment === null
      : key.environment === 'test' || key.environment === 'live') &&
    Number.isSafeInteger(key.createdAtMs) &&
    (key.revokedAtMs === null || Number.isSafeInteger(key.revokedAtMs));
  if (!shaped) refused('API key record', JSON.stringify(value));
  return key as KeyRecord;
}

function checkedConfig(value: unknown, options: RestoreOptions): ConfigEntry {
  const entry = value as Partial<ConfigEntry> | null;
  if (
    typeof entry !== 'object' ||
    entry === null ||
    !Number.isSafeInteger(entry.version) ||
    !Number.isSafeInteger(entry.pushedAtMs)
  ) {
    refused('configuration entry', 'version and pushedAtMs must be whole numbers');
  }
  const why = options.checkConfig?.(entry.config) ?? null;
  if (why !== null) refused(`configuration (version ${entry.version})`, why);
  return entry as ConfigEntry;
}

function checkCustomer(item: StoredCustomer, options: RestoreOptions): void {
  const why = options.checkCustomer?.(item) ?? null;
  if (why !== null) refused(`customer ${JSON.stringify(String(item.id).slice(0, 64))}`, why);
}
