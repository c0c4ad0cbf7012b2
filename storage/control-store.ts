/**
 * The front end's own durable state: API keys, the pushed billing configurations (every
 * version, per environment) and a little metadata, in one LMDB environment at
 * `<dataDir>/control` that only the front-end process writes.
 *
 * It exists apart from the shard journals because this state is not per customer and
 * changes rarely, but it obeys the same rule: a write's promise resolves only once the
 * write is on disk (lmdb-env.ts explains the options that guarantee it), so the front end
 * can acknowledge a new key or config only after it would survive a crash.
 *
 * Layout: `keys` maps key id → frame(KeyRecord); `configs` maps [environment, version] →
 * frame(ConfigEntry), so one environment's versions are contiguous and ordered; `meta`
 * maps name → frame(value); `webhooks` holds webhook endpoints and `outbox` the events of
 * configuration pushes (their modules describe them). Reads verify each record's checksum
 * and shape and throw on a corrupt one: the front end must not serve from state it cannot
 * trust.
 */
import { join } from 'node:path';
import { assert } from '../shared/assert.js';
import { decodeRecord, encodeRecord } from './codec.js';
import {
  durableVoid,
  durableWrite,
  openDurableEnv,
  readRecord,
  type BinaryDb,
  type DurableEnv,
} from './lmdb-env.js';

export type Environment = 'test' | 'live';

export interface KeyRecord {
  id: string;
  prefix: string;
  hashHex: string;
  environment: Environment | null;
  keyClass: 'server' | 'client' | 'admin';
  createdAtMs: number;
  revokedAtMs: number | null;
}

export interface ConfigEntry {
  version: number;
  pushedAtMs: number;
  config: unknown;
}

type DbName = 'keys' | 'configs' | 'meta' | 'audit' | 'auditRefs' | 'webhooks' | 'outbox';

const SNAPSHOT_SECRET_META = 'snapshotSecret';

export class ControlStore {
  readonly #env: DurableEnv<DbName>;

  private constructor(env: DurableEnv<DbName>) {
    this.#env = env;
  }

  /** The audit log's database (storage/audit-log.ts owns its format). */
  get auditDb(): BinaryDb {
    return this.#env.dbs.audit;
  }

  /** Audit entry references (ref → [stream, seq]) of entries a shard also stored: see AuditLog. */
  get auditRefsDb(): BinaryDb {
    return this.#env.dbs.auditRefs;
  }

  /** Webhook endpoints (storage/webhook-registry.ts owns their format). */
  get webhooksDb(): BinaryDb {
    return this.#env.dbs.webhooks;
  }

  /**
   * Events of the front end's own changes (a configuration push), written in the change's
   * transaction; storage/outbox.ts owns their format.
   */
  get outboxDb(): BinaryDb {
    return this.#env.dbs.outbox;
  }

  /** Opens (creating if needed) `<dataDir>/control`. Throws if LMDB cannot open it. */
  static open(dataDir: string): ControlStore {
    return new ControlStore(
      openDurableEnv<DbName>(join(dataDir, 'control'), [
        'keys',
        'configs',
        'meta',
        'audit',
        'auditRefs',
        'webhooks',
        'outbox',
      ]),
    );
  }

  /**
   * Inserts or replaces (e.g. to record a revocation) the key with `record.id`. Resolves
   * once durable; rejects if the write fails. Throws on a malformed record (programmer error).
   */
  putKey(record: KeyRecord): Promise<void> {
    assert(isKeyRecord(record), 'putKey: malformed KeyRecord');
    return durableVoid(
      this.#env.dbs.keys.put(record.id, encodeRecord(record)),
      `key ${record.id} write`,
    );
  }

  /** Every key, ordered by id. Throws if any stored key record is corrupt. */
  listKeys(): KeyRecord[] {
    const keys: KeyRecord[] = [];
    for (const { key, value } of this.#env.dbs.keys.getRange({})) {
      const decoded = decodeRecord(value);
      if (!decoded.ok || !isKeyRecord(decoded.value) || decoded.value.id !== key) {
        throw new Error(`control store: key record ${String(key)} is corrupt`);
      }
      keys.push(decoded.value);
    }
    return keys;
  }

  /**
   * Stores a new config version for `environment`. Versions are kept forever and never
   * overwritten: storing a version that already exists rejects (the caller allocated the
   * version wrongly). Resolves once durable; rejects if the write fails.
   */
  async putConfig(environment: Environment, entry: ConfigEntry): Promise<void> {
    assertEnvironment(environment);
    assert(isConfigEntry(entry), 'putConfig: malformed ConfigEntry');
    const { configs } = this.#env.dbs;
    const key = [environment, entry.version];
    const frame = encodeRecord(entry);
    const written = await durableWrite(
      configs.ifNoExists(key, () => configs.put(key, frame)),
      `config ${environment} v${entry.version} write`,
    );
    if (!written) {
      throw new Error(
        `control store: config version ${entry.version} for ${environment} already exists`,
      );
    }
  }

  /**
   * Every version of `environment` up to `upToVersion`, oldest first. Throws on a corrupt record.
   */
  listConfigs(environment: Environment, upToVersion: number): ConfigEntry[] {
    assertEnvironment(environment);
    const entries: ConfigEntry[] = [];
    for (const { key, value } of this.#env.dbs.configs.getRange({
      start: [environment, 0],
      end: [environment, upToVersion + 1],
    })) {
      const decoded = decodeRecord(value);
      if (
        !decoded.ok ||
        !isConfigEntry(decoded.value) ||
        !sameKey(key, [environment, decoded.value.version])
      ) {
        throw new Error(`control store: config record ${JSON.stringify(key)} is corrupt`);
      }
      entries.push(decoded.value);
    }
    return entries;
  }

  /** The highest version stored for `environment`, or null. Throws if that record is corrupt. */
  latestConfig(environment: Environment): ConfigEntry | null {
    assertEnvironment(environment);
    const newestFirst = {
      start: [environment, Number.MAX_SAFE_INTEGER],
      end: [environment],
      reverse: true,
      limit: 1,
    };
    for (const { key, value } of this.#env.dbs.configs.getRange(newestFirst)) {
      const decoded = decodeRecord(value);
      if (
        !decoded.ok ||
        !isConfigEntry(decoded.value) ||
        !sameKey(key, [environment, decoded.value.version])
      ) {
        throw new Error(`control store: config record ${JSON.stringify(key)} is corrupt`);
      }
      return decoded.value;
    }
    return null;
  }

  /**
   * The highest version stored for `environment`, 0 when none, read from the key alone:
   * a cache keyed by version (the OpenAPI document) checks it on every request without
   * decoding the whole configuration. Throws if that key is malformed.
   */
  latestConfigVersion(environment: Environment): number {
    assertEnvironment(environment);
    const newestFirst = {
      start: [environment, Number.MAX_SAFE_INTEGER],
      end: [environment],
      reverse: true,
      limit: 1,
    };
    for (const key of this.#env.dbs.configs.getKeys(newestFirst)) {
      const version: unknown = Array.isArray(key) ? key[1] : undefined;
      if (typeof version !== 'number' || !sameKey(key, [environment, version])) {
        throw new Error(`control store: config key ${JSON.stringify(key)} is corrupt`);
      }
      return version;
    }
    return 0;
  }

  /** Returns the stored value, or undefined. Throws if the stored record is corrupt. */
  getMeta(name: string): unknown {
    return readRecord(this.#env.dbs.meta, name, `control meta "${name}"`);
  }

  /** Stores a value; resolves once durable, rejects if the write fails. */
  putMeta(name: string, value: unknown): Promise<void> {
    return durableVoid(
      this.#env.dbs.meta.put(name, encodeRecord(value)),
      `control meta "${name}" write`,
    );
  }

  /**
   * The key of every snapshot file's MAC, or null before one was made. It stays in this
   * store (and in the operator's safekeeping, exported with `tally snapshot secret`) and
   * never enters a snapshot file. Throws if the stored value is malformed.
   */
  snapshotSecret(): Buffer | null {
    const stored = this.getMeta(SNAPSHOT_SECRET_META);
    if (stored === undefined) return null;
    assert(
      typeof stored === 'string' && /^[0-9a-f]{64}$/.test(stored),
      'control store: the snapshot secret is malformed',
    );
    return Buffer.from(stored, 'hex');
  }

  /** Stores the snapshot secret (32 bytes); resolves once durable. */
  putSnapshotSecret(secret: Uint8Array): Promise<void> {
    assert(secret.length === 32, 'a snapshot secret has 32 bytes');
    return this.putMeta(SNAPSHOT_SECRET_META, Buffer.from(secret).toString('hex'));
  }

  /** Waits for queued writes to finish, then closes the environment. */
  close(): Promise<void> {
    return this.#env.root.close();
  }
}

function assertEnvironment(environment: unknown): asserts environment is Environment {
  assert(
    environment === 'test' || environment === 'live',
    `unknown environment ${String(environment)}`,
  );
}

function isKeyRecord(value: unknown): value is KeyRecord {
  if (typeof value !== 'object' || value === null) return false;
  const r = value as Record<string, unknown>;
  return (
    typeof r.id === 'string' &&
    r.id.length > 0 &&
    typeof r.prefix === 'string' &&
    typeof r.hashHex === 'string' &&
    (r.environment === 'test' || r.environment === 'live' || r.environment === null) &&
    (r.keyClass === 'server' || r.keyClass === 'client' || r.keyClass === 'admin') &&
    typeof r.createdAtMs === 'number' &&
    (r.revokedAtMs === null || typeof r.revokedAtMs === 'number')
  );
}

function isConfigEntry(value: unknown): value is ConfigEntry {
  if (typeof value !== 'object' || value === null) return false;
  const e = value as Record<string, unknown>;
  return (
    typeof e.version === 'number' &&
    Number.isSafeInteger(e.version) &&
    e.version >= 0 &&
    typeof e.pushedAtMs === 'number' &&
    'config' in e
  );
}

function sameKey(key: unknown, expected: readonly (string | number)[]): boolean {
  return (
    Array.isArray(key) &&
    key.length === expected.length &&
    key.every((part, i) => part === expected[i])
  );
}
