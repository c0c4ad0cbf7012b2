/**
 * A shard's idempotency keys: the recent ones in memory, every other one of the retention
 * on disk in sealed, sorted runs, behind filters in memory.
 *
 * Why runs: keyed writes (a request id on every consume) arrive in random key order. A
 * B-tree that takes them in that order rewrites about one 4 KB page per key at every
 * commit once it has more leaves than a commit has keys, and the disk, not the CPU, then
 * bounds keyed writes. Here every write on the hot path is an append:
 *
 * - The journal record itself: a keyed write's event carries its key (the scope's digest
 *   and the fingerprint), so a key is on disk exactly when its write is, and goes with a
 *   record recovery drops (a torn tail). The key is also in memory (`remember`), where
 *   lookups find it until it is sealed; the caller says which records carry keys
 *   (`carried`), and the journal keeps them until a seal has committed their keys
 *   (`keptFrom`). The catalog names the newest record whose keys are all sealed
 *   (`sealedThrough`); recovery holds the keys of the records after it in memory again
 *   (`reheld`). Writing keys in a table of their own cost each commit about six 16 KiB
 *   pages more, whatever the keys' bytes.
 * - `idempotency-log-0` / `-1`: [log seq] → frame([record seq, environment, customerId,
 *   scope digest, fingerprint, atMs, …]): keys recovery migrates from older layouts
 *   (`backfill`, naming no record), and the keys of journal records as releases before
 *   this one logged them (named by the record's seq, so the keys of a record recovery
 *   drops are dropped with it: `forgetLoggedAfter`). They are loaded into memory at start
 *   and sealed with the next run.
 * - `idempotency-runs`: [run seq, environment, customerId, scope digest] of a block's
 *   first key → frame([customerId, count, then count × (scope digest, fingerprint,
 *   atMs), customerId, count, …]): a block of up to BLOCK_KEYS keys in key order, in
 *   sections, one per customer. Sealing takes the keys in memory, sorts them and writes
 *   them as the next run, in key order (dense, sequential pages), a slice at a time: one
 *   write per block rather than per key, whatever the customers (a write per customer
 *   cost ~1.3 µs of the shard's thread and ~0.8 of LMDB's a key where most customers had
 *   one key in a run). Customers whose ids are plain (`plainId`: their keys sort in LMDB
 *   as their texts do) share blocks, and a lookup reads the last block whose key is at
 *   most its own (one backward read). Any other id (a control character, or a code unit
 *   from 0xD800 on, which lmdb-js escapes, or writes unescaped from 64 units on, where a
 *   NUL sorts as a separator) can sort among another's keys, so its keys get blocks of
 *   their own under `<environment>+own`, and a lookup reads the customer's last block
 *   whose first digest is at most its own (a backward range read that stops at the
 *   customer's first block; the id is in the value because such a key does not always
 *   decode to it). Runs sealed before sections hold blocks of one customer's keys
 *   ([…, first scope digest] → frame([customerId, scope digest, fingerprint, atMs, …]),
 *   read as the other ids' blocks are), and runs sealed before blocks one key per entry
 *   ([…, scope digest] → frame([fingerprint, atMs])); their catalog record says which
 *   layout a run has, and all are read until they expire.
 * - `idempotency-run-catalog`: [run seq] → frame(run): its key count per environment, its
 *   time range and its own filter; ['group', first run seq] → frame([first run seq,
 *   capacity, filter]). Runs come in groups of up to GROUP_RUNS consecutive runs behind
 *   one filter (key-filter.ts): sealing adds each key to the open group's filter and to the
 *   run's, stored with the run's record in one transaction. Lookups find a run once that
 *   transaction is on disk; then the keys it holds leave memory and their log table is
 *   cleared. (Runs sealed before runs had filters of their own have none and are read
 *   wherever their group's filter says maybe.)
 * - `idempotency-run-eras`: the filters of eras of up to 16 groups (idempotency-eras.ts),
 *   in an LMDB environment of its own (`EraHome`): an era's image is tens of megabytes,
 *   and a sync of the shard's environment that had to write it back would hold every
 *   journal record committed meanwhile, for up to seconds. The shard's own table of that
 *   name holds the eras a release before this one stored there; they are read from there,
 *   and removed from there, until their groups expire.
 *
 * Sealing takes the keys in memory (new keys go to a new batch, and to the other log
 * table), waits until every key decided before is durable, writes the run, then stores the
 * newest record whose keys it took and clears the sealed log table. A crash at any point
 * keeps every key: a key is in a committed run, or in a record after the stored one or a
 * log table (both loaded back into memory at start), or both (a duplicate answers the
 * same).
 * Every upkeep write waits until it is on disk, so a failed sync stops the worker.
 *
 * A lookup reads memory, then the groups newest first: where a group's filter says it may
 * hold the key, it probes the filters of the group's runs (newest first) and reads only
 * the runs whose filter says maybe. One filter per group keeps the probes of a lookup that
 * misses to one per group; a group's filter answering maybe for ~0.6% of absent keys would,
 * alone, cost every miss 16 × 0.6% ≈ 0.1 B-tree reads (~10 µs each) per group, so the runs'
 * own filters (~3% each) take that to ~0.004. Groups come in eras behind one more filter
 * (idempotency-eras.ts): where an era's filter says no, the lookup skips all its groups,
 * and a group closed inside an era probes its runs' filters only. The era open at a crash
 * was never stored: the next start rebuilds one over its groups (`rebuildEras`). A group
 * is dropped whole once its newest key is past the retention, oldest first. Keys expire in
 * lookups by their time, not by removal.
 *
 * `idempotency` and `idempotency-expiry` are the layout before runs (one B-tree in key
 * order); `migrateTable` moves its keys into runs at start.
 */
import { assert } from '../shared/assert.js';
import { IDEMPOTENCY_RUN_KEYS } from '../shared/limits.js';
import {
  decodeRecord,
  encodeRecord,
  encodeRecordSliced,
  frameArray,
  packNumber,
  packText,
} from './codec.js';
import {
  carveRunCopy,
  carveRunFilter,
  ERA_GROUPS,
  ERA_GROUPS_MAX,
  eraGroupsFor,
  hasRoom,
  loadEras,
  makeResident,
  MAP_FROM_BYTES,
  openEra,
  REBUILT_ERA_MAX_KEYS,
  rebuiltEra,
  reopenedEra,
  removeEra,
  storeEra,
  type Era,
} from './idempotency-eras.js';
import {
  HeldKeys,
  sameAddress,
  type HashedAddress,
  type KeyAddress,
  type KeyPut,
  type StoredKey,
} from './held-keys.js';
import { KEY_HASHES, KeyFilter, keyHashes, RUN_FILTER_BITS_PER_KEY } from './key-filter.js';
import type { RootDatabase } from 'lmdb';
import { flushedWrite, type BinaryDb } from './lmdb-env.js';

export type { HashedAddress, KeyAddress, KeyPut, StoredKey };

/**
 * Where a store keeps its eras' images: the table `idempotency-run-eras` of an environment
 * of their own, whose syncs the journal's never wait for (journal.ts, ShardStore.open).
 */
export interface EraHome {
  readonly root: RootDatabase;
  readonly table: BinaryDb;
}

/** The table of eras' images (idempotency-eras.ts), in an `EraHome`. */
export const ERA_TABLE = 'idempotency-run-eras';

/** The names of the databases, for the environment that opens them. */
export const IDEMPOTENCY_DB_NAMES = [
  'idempotency',
  'idempotency-expiry',
  'idempotency-log-0',
  'idempotency-log-1',
  'idempotency-runs',
  'idempotency-run-catalog',
  ERA_TABLE,
] as const;
export type IdempotencyDbName = (typeof IDEMPOTENCY_DB_NAMES)[number];

/** Keys one slice of dropping, clearing (an interrupted run) or migrating writes or removes. */
export const KEY_SLICE = 2000;
/**
 * Keys one turn of sealing writes into the run's blocks (~0.35 µs a key of the shard's
 * thread, so ~0.4 ms a full slice). A batch that arrives during a slice waits for it, and
 * every reply of the batch with it, so a slice is short: in one process a seal's turns of
 * every kind took 0.04 ms at the median and 0.5 ms at p99 (these slices the longest). A
 * slice's blocks ride the transaction of its turn's journal records, and each such
 * transaction writes the run's last pages again: keyed runs flat out went faster at 1,024
 * keys a turn than at 256 (median 1.10× over eleven alternated rounds, the journal's flush
 * ~0.1 ms shorter) and no faster at 2,048 or 4,096.
 */
export const SEAL_SLICE = 1024;
/**
 * Keys whose filter bits one turn of sealing sets, in the filters' order (~0.15–0.2 µs a
 * key, most of it the era's filter: a miss in memory): a turn as long as a block slice's.
 */
const FILTER_SLICE = 2048;
/**
 * Bits of the first hash that bucket keys into the filters' order: 4,096 buckets, whose
 * counts (16 KB) stay in the nearest cache while a seal shares the thread with requests;
 * within a bucket keys land in 1/4,096 of each filter (16 KiB of an era's of 64 MiB).
 */
export const HASH_BUCKET_BITS = 12;
/** The most keys one stored block of a run holds. */
export const BLOCK_KEYS = 32;

/**
 * Whether `id` is stored as its own characters in a block's key and sorts by them: every
 * code unit from 28 to 0xD7FF (lmdb-js orders keys by their bytes, and writes a string
 * whose units all lie there as its UTF-8 bytes, which sort as the strings do, a shorter
 * id before any id it starts). An id with a control character or a unit from 0xD800 on is
 * written escaped, or not (64 units or more), and can sort among another id's keys; its
 * keys are stored in blocks of their own (`OWN_BLOCKS`), never beside another customer's.
 */
export function plainId(id: string): boolean {
  if (id.length === 0) return false;
  for (let i = 0; i < id.length; i++) {
    const unit = id.charCodeAt(i);
    if (unit < 28 || unit >= 0xd800) return false;
  }
  return true;
}

/**
 * Where the blocks of customers whose ids are not plain (`plainId`) are stored, apart from
 * the blocks of plain ones, by environment: a run's key [seq, space, customerId, digest].
 * Both sort after every key of the environment itself.
 */
const OWN_BLOCKS = { live: 'live+own', test: 'test+own' } as const;

/** The environment of a block stored in `space` (an environment, or its `OWN_BLOCKS`). */
function environmentOfSpace(space: string): 'test' | 'live' {
  if (space === 'live' || space === OWN_BLOCKS.live) return 'live';
  if (space === 'test' || space === OWN_BLOCKS.test) return 'test';
  throw new Error(`an idempotency key block is stored under ${JSON.stringify(space)}`);
}

/**
 * Where a customer's own blocks lie in a run in blocks: under its environment in a run
 * sealed before sections, under `OWN_BLOCKS` for an id that is not plain; null for a plain
 * id in a run in sections (its keys share blocks with other plain ids').
 */
function blockSpace(run: RunInfo, environment: 'test' | 'live', customerId: string) {
  if (!run.sections) return environment;
  return plainId(customerId) ? null : OWN_BLOCKS[environment];
}
/**
 * Keys and blocks one turn of rebuilding an era reads at most (`KeyStore.rebuildEras`).
 * Reading and decoding a block costs more than hashing and adding its keys: measured over
 * 1.5 million keys, ~0.8 µs a key where a run holds many keys of each customer (1,024 keys
 * a turn, median 0.7 ms, p99 1.2), ~3.8 µs where each customer has one (128 blocks a
 * turn, median 0.5 ms, p99 1.0).
 */
const REBUILD_SLICE_KEYS = 1024;
const REBUILD_SLICE_BLOCKS = 128;
/**
 * And the longest it reads for, by the clock (checked after each block): bounded by keys
 * alone, slices over a live shard's runs took 0.67 ms at the median but 3.5 ms at p99, each
 * a wait for the consumes behind it; with this bound too, 0.61 and 2.6 ms. One block, or a
 * collection inside a slice, can still run past it (the longest slice 15.5 and 41.5 ms).
 */
const REBUILD_SLICE_MS = 1;
/**
 * The keys a batch in memory has room for when runs are sealed at `runKeys`: a quarter
 * more, for the keys that come while the previous run is still being written.
 */
function batchSlots(runKeys: number): number {
  return Math.ceil(1.25 * runKeys);
}
/** Keys or customers sorted in one turn when a run is sealed (~0.15 ms of the shard's thread). */
const SORT_CHUNK = 512;
/** Keys (or buckets) a turn of sealing counts or places (~0.05 ms; ~1 ms not yet optimized). */
const COUNT_SLICE = 8192;
/** Runs one group's filter covers. */
export const GROUP_RUNS = 16;
/** The fewest keys a group's filter is sized for (a few KB). */
const MIN_GROUP_KEYS = 4096;
/** The most keys one run written by `migrateTable` holds. */
const MIGRATION_RUN_KEYS = 1 << 20;
/** The time before a batch's newest key whose runs count toward the keys' rate. */
const RATE_WINDOW_MS = 60 * 60 * 1000;
const DAY_MS = 24 * 60 * 60 * 1000;

/** One key of a customer: [scope digest, fingerprint, atMs]. */
export type CustomerKey = [string, string, number];

/** What the shell awaits between slices, and what tells it a sealed batch is durable. */
export interface Pacing {
  /** Resolves on a later turn of the event loop (the shard serves in between). */
  readonly pause: () => Promise<void>;
  /** Resolves once every key remembered so far rides a durable journal record. */
  readonly keysDurable: () => Promise<void>;
}

/** A sealed run as the catalog and the lookups know it. */
export interface RunInfo {
  readonly seq: number;
  readonly count: number;
  readonly test: number;
  readonly live: number;
  readonly minAtMs: number;
  readonly maxAtMs: number;
  /** Its keys are stored in blocks (else one per entry, as sealed before blocks). */
  readonly blocks: boolean;
  /**
   * Its blocks hold customers' sections, plain ids' keys in shared blocks (else each
   * block is one customer's keys, as sealed before sections).
   */
  readonly sections: boolean;
}

interface Run extends RunInfo {
  /**
   * Its own filter (null for a run sealed before runs had one: read whenever probed); in
   * its era's memory or image where it has one (idempotency-eras.ts).
   */
  filter: KeyFilter | null;
}

/**
 * Up to GROUP_RUNS consecutive runs behind one filter: a lookup probes one filter per
 * group, then reads the group's runs only where it says maybe. The newest group is open:
 * sealing adds runs (and their keys to its filter) until it is full.
 */
interface Group {
  readonly first: number;
  readonly runs: Run[];
  /**
   * Its filter; null in memory once it is closed inside an era (whose filter holds its
   * keys), never on disk.
   */
  filter: KeyFilter | null;
  /** The keys its filter was sized for. */
  readonly capacity: number;
  count: number;
  maxAtMs: number;
  /**
   * The era it is in (idempotency-eras.ts), and how many of the era's groups precede it: set
   * when it opens, or when an era is rebuilt over it (`KeyStore.rebuildEras`).
   */
  era: Era | null;
  eraIndex: number;
}

type GroupKey = ['group', number];

/** The catalog's record of the newest journal record whose keys are all in runs. */
const SEALED_KEY = 'sealed';

function decodeSealed(bytes: Uint8Array): number {
  const decoded = decodeRecord(bytes);
  const value = decoded.ok ? decoded.value : null;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0)
    throw new Error('the record of the sealed idempotency keys is corrupt; refusing to go on');
  return value;
}

/**
 * The capacity of a new group for a run of `keys` keys: GROUP_RUNS runs like it, a run
 * counted at most `runKeys` (a batch far larger, as after a restore, fills a group of its
 * own), and at least MIN_GROUP_KEYS keys.
 */
function groupCapacity(keys: number, runKeys: number): number {
  const perRun = Math.max(Math.min(keys, runKeys), MIN_GROUP_KEYS / GROUP_RUNS);
  return Math.max(keys, GROUP_RUNS * perRun);
}

type RunKey = [number, string, string, string];

function decodeStored(bytes: Uint8Array, what: string): StoredKey {
  const decoded = decodeRecord(bytes);
  const value = decoded.ok ? decoded.value : null;
  if (
    !Array.isArray(value) ||
    value.length !== 2 ||
    typeof value[0] !== 'string' ||
    typeof value[1] !== 'number'
  )
    throw new Error(`idempotency key ${what} is corrupt; refusing to go on`);
  return { fingerprint: value[0], atMs: value[1] };
}

/**
 * A stored block: its customer's id, then [scope digest, fingerprint, atMs] for each key, in
 * digest order.
 */
function decodeBlock(bytes: Uint8Array, what: string): Array<string | number> {
  const decoded = decodeRecord(bytes);
  const value = decoded.ok ? decoded.value : null;
  if (
    !Array.isArray(value) ||
    value.length < 4 ||
    value.length % 3 !== 1 ||
    typeof value[0] !== 'string'
  )
    throw new Error(`idempotency key block ${what} is corrupt; refusing to go on`);
  for (let i = 1; i < value.length; i += 3)
    if (
      typeof value[i] !== 'string' ||
      typeof value[i + 1] !== 'string' ||
      typeof value[i + 2] !== 'number'
    )
      throw new Error(`idempotency key block ${what} is corrupt; refusing to go on`);
  return value as Array<string | number>;
}

/**
 * A block of sections: [customerId, count, then count × (digest, fingerprint, atMs), …].
 * A block of a run sealed before sections (`sections` false: [customerId, digest,
 * fingerprint, atMs, …], one customer's keys) is read as one section. Throws on any other
 * shape, as on a corrupt block.
 */
function decodeSections(
  bytes: Uint8Array,
  what: string,
  sections: boolean,
): Array<string | number> {
  if (!sections) {
    const [customerId, ...keys] = decodeBlock(bytes, what);
    return [customerId as string, keys.length / 3, ...keys];
  }
  const decoded = decodeRecord(bytes);
  const value = decoded.ok ? decoded.value : null;
  const corrupt = () => new Error(`idempotency key block ${what} is corrupt; refusing to go on`);
  if (!Array.isArray(value) || value.length === 0) throw corrupt();
  for (let i = 0; i < value.length; ) {
    const count: unknown = value[i + 1];
    if (
      typeof value[i] !== 'string' ||
      typeof count !== 'number' ||
      !Number.isInteger(count) ||
      count < 1 ||
      i + 2 + 3 * count > value.length
    )
      throw corrupt();
    for (let k = i + 2; k < i + 2 + 3 * count; k += 3)
      if (
        typeof value[k] !== 'string' ||
        typeof value[k + 1] !== 'string' ||
        typeof value[k + 2] !== 'number'
      )
        throw corrupt();
    i += 2 + 3 * count;
  }
  return value as Array<string | number>;
}

/**
 * Calls `visit` with each section of `block` (`decodeSections`): its customer and where
 * its keys lie, three values each from `from` to `end`.
 */
function eachSection(
  block: ReadonlyArray<string | number>,
  visit: (customerId: string, from: number, end: number) => void,
): void {
  for (let i = 0; i < block.length; ) {
    const end = i + 2 + 3 * (block[i + 1] as number);
    visit(block[i] as string, i + 2, end);
    i = end;
  }
}

/**
 * The key of `customerId` with digest `scopeDigest` in a block of sections, or undefined.
 */
function findInSections(
  block: ReadonlyArray<string | number>,
  customerId: string,
  scopeDigest: string,
): StoredKey | undefined {
  let found: StoredKey | undefined;
  eachSection(block, (id, from, end) => {
    if (id !== customerId) return;
    for (let k = from; k < end; k += 3)
      if (block[k] === scopeDigest)
        found = { fingerprint: block[k + 1] as string, atMs: block[k + 2] as number };
  });
  return found;
}

/**
 * A log entry: the keys of one journal record (stored five fields each, one after the
 * other), and that record's seq (null for entries that name none).
 */
interface Logged {
  readonly record: number | null;
  readonly puts: KeyPut[];
}

function decodeLogged(bytes: Uint8Array, seq: number): Logged {
  const decoded = decodeRecord(bytes);
  const value = decoded.ok ? decoded.value : null;
  const corrupt = (): Error =>
    new Error(`idempotency log entry ${seq} is corrupt; refusing to go on`);
  if (!Array.isArray(value) || value.length === 0) throw corrupt();
  // Entries of layout 4 on lead with their journal record's seq; earlier ones, and keys
  // recovery migrated, name none.
  const record = typeof value[0] === 'number' ? value[0] : null;
  const from = record === null ? 0 : 1;
  if (
    (record !== null && !(Number.isSafeInteger(record) && record > 0)) ||
    value.length === from ||
    (value.length - from) % 5 !== 0
  )
    throw corrupt();
  const puts: KeyPut[] = [];
  for (let i = from; i < value.length; i += 5) {
    const [environment, customerId, scopeDigest, fingerprint, atMs] = value.slice(i, i + 5);
    if (
      (environment !== 'test' && environment !== 'live') ||
      typeof customerId !== 'string' ||
      typeof scopeDigest !== 'string' ||
      typeof fingerprint !== 'string' ||
      typeof atMs !== 'number'
    )
      throw corrupt();
    puts.push({ environment, customerId, scopeDigest, fingerprint, atMs });
  }
  return { record, puts };
}

function decodeRun(bytes: Uint8Array, seq: number): Run {
  const decoded = decodeRecord(bytes);
  const value = (decoded.ok ? decoded.value : null) as Record<string, unknown> | null;
  const numbers = ['count', 'test', 'live', 'minAtMs', 'maxAtMs'] as const;
  if (
    value === null ||
    typeof value !== 'object' ||
    numbers.some((field) => typeof value[field] !== 'number') ||
    (value.blocks !== undefined && value.blocks !== true) ||
    (value.sections !== undefined && (value.sections !== true || value.blocks !== true)) ||
    (value.filter !== undefined && !(value.filter instanceof Uint8Array))
  )
    throw new Error(`idempotency run ${seq} is corrupt; refusing to go on`);
  return {
    seq,
    count: value.count as number,
    test: value.test as number,
    live: value.live as number,
    minAtMs: value.minAtMs as number,
    maxAtMs: value.maxAtMs as number,
    blocks: value.blocks === true,
    sections: value.sections === true,
    filter: value.filter instanceof Uint8Array ? KeyFilter.fromBytes(value.filter) : null,
  };
}

/** A group's catalog record: [first run seq, capacity, filter]. */
function decodeGroup(bytes: Uint8Array, first: number): [number, KeyFilter] {
  const decoded = decodeRecord(bytes);
  const value = decoded.ok ? decoded.value : null;
  if (
    !Array.isArray(value) ||
    value[0] !== first ||
    typeof value[1] !== 'number' ||
    !(value[2] instanceof Uint8Array)
  )
    throw new Error(`idempotency run group ${first} is corrupt; refusing to go on`);
  return [value[1], KeyFilter.fromBytes(value[2])];
}

/**
 * A run's catalog record: its counts and time range, `blocks: true` and `sections: true`
 * (its layout) and its filter's bytes.
 */
function runRecord(run: Run): Buffer {
  const { seq: _seq, blocks, sections, filter, ...counts } = run;
  assert(blocks && sections && filter !== null, 'runs are sealed in sections, with a filter');
  return encodeRecord({ ...counts, blocks, sections, filter: filter.bytes });
}

/** A group's catalog record, its filter (MBs) copied a slice per turn. */
function groupRecord(group: Group, pause: () => Promise<void>): Promise<Buffer> {
  assert(group.filter !== null, 'an open group keeps its filter');
  return encodeRecordSliced([group.first, group.capacity], group.filter.bytes, pause);
}

/** The hashes of a turn's keys of an era being rebuilt, in pairs (a block may end past it). */
const rebuildHashes = new Int32Array(2 * (REBUILD_SLICE_KEYS + BLOCK_KEYS));
/** The most keys of one batch `KeyStore.readAhead` reads ahead for (~2 cache lines a key). */
const READ_AHEAD_KEYS = 256;
const readAheadHashes = new Int32Array(2 * READ_AHEAD_KEYS);
/** The addresses whose hashes `readAheadHashes` holds (one thread, one call at a time). */
const readAheadAddresses: Array<HashedAddress | null> = new Array(READ_AHEAD_KEYS).fill(null);
/**
 * Keys whose blocks in every era's filter are read ahead, then probed, at a time. Each
 * probe is a miss in the cache and in the TLB (an era's filter is up to 64 MiB, one page a
 * probe); read for a whole batch first, 256 keys × 90 eras touch 23,000 pages, and the
 * probes after find them gone and miss again. 8 keys at a time keep them (filters alone,
 * 90 eras of 64 MiB: 23 µs a key against 31).
 */
const ERA_PROBE_KEYS = 8;
/**
 * Keys whose blocks in each filter a seal reads ahead, then sets, at a time (in the filters'
 * order): ~75 ns a key in an era's filter of 64 MiB, ~125 without reading ahead.
 */
const FILTER_READ_AHEAD_KEYS = 64;

/** Sets KEY_HASHES to the hashes of `address`: those it carries (`HashedAddress`), or computed. */
function hashAddress(address: KeyAddress): void {
  const { first, second } = address as Partial<HashedAddress>;
  if (first !== undefined && second !== undefined) {
    KEY_HASHES[0] = first;
    KEY_HASHES[1] = second;
  } else keyHashes(address.environment, address.customerId, address.scopeDigest);
}

/** The body of the last log entry built (`logEntry`; one thread, one call at a time). */
let logBody = Buffer.allocUnsafe(4096);

/**
 * A log entry: the list [record, environment, customerId, digest, fingerprint, atMs, …]
 * (no record when null) framed byte for byte as `encodeRecord` frames it, but written value
 * by value: the packr's walk over a list of five values a key took twice as long.
 */
function logEntry(record: number | null, puts: readonly KeyPut[]): Buffer {
  let room = 9;
  for (const put of puts) {
    assert(put.scopeDigest.length > 0, 'an idempotency scope digest is not empty');
    room += 29 + 3 * (put.customerId.length + put.scopeDigest.length + put.fingerprint.length);
  }
  if (logBody.length < room) logBody = Buffer.allocUnsafe(Math.max(room, 2 * logBody.length));
  const body = logBody;
  let end = record === null ? 0 : packNumber(record, body, 0);
  for (const put of puts) {
    end = packText(put.environment, body, end);
    end = packText(put.customerId, body, end);
    end = packText(put.scopeDigest, body, end);
    end = packText(put.fingerprint, body, end);
    end = packNumber(put.atMs, body, end);
  }
  return frameArray((record === null ? 0 : 1) + 5 * puts.length, body, end);
}

/** Bytes a block's body is built in at first (a block of 32 keys of ASCII text takes ~1.4 KB). */
const BLOCK_BODY_BYTES = 4096;

/**
 * A run being written: its keys go in in order, up to BLOCK_KEYS at a time into a block;
 * its filter, its group's and its counts grow with them. A block holds sections, one per
 * customer, and is framed as `encodeRecord` frames [customerId, count, digest,
 * fingerprint, atMs, …, customerId, count, …], byte for byte, but built here from the keys'
 * parts (sealing's keys from the batch's arrays: no objects or strings a key). Keys of
 * customers whose ids are plain (`plainId`) share blocks, stored under the block's first
 * environment, customer and digest; a customer whose id is not plain gets blocks of its
 * own, in the environment's space for them (`OWN_BLOCKS`).
 */
class RunWriter {
  count = 0;
  test = 0;
  live = 0;
  minAtMs = Number.POSITIVE_INFINITY;
  maxAtMs = Number.NEGATIVE_INFINITY;
  /** The last block written, and the durable promise of each turn's last block before it. */
  #last: Promise<unknown> | null = null;
  readonly #turns: Promise<unknown>[] = [];
  /**
   * The block being filled: its environment, its first customer and digest, whether it is
   * one customer's own (an id not plain), its keys, its elements so far (two a section,
   * three a key) and its body.
   */
  #environment: 'test' | 'live' = 'test';
  #firstCustomer = '';
  #firstDigest = '';
  #own = false;
  #keys = 0;
  #elements = 0;
  #body = Buffer.allocUnsafe(BLOCK_BODY_BYTES);
  #bodyEnd = 0;
  /** Its last section: the customer, whether the id is plain, where its count is, its keys. */
  #customerId = '';
  #plain = false;
  #countAt = 0;
  #sectionKeys = 0;
  readonly #filter: KeyFilter;

  /** The filters of the group the run joins, and of its era. */
  readonly #upper: readonly KeyFilter[];

  constructor(
    private readonly root: RootDatabase,
    private readonly runs: BinaryDb,
    readonly seq: number,
    group: Group,
    /** The keys the run will hold at most (its own filter is sized for them). */
    keys: number,
  ) {
    const carved = group.era === null ? null : carveRunFilter(group.era, seq, keys);
    this.#filter = carved ?? KeyFilter.sized(keys, RUN_FILTER_BITS_PER_KEY);
    assert(group.filter !== null, 'a run joins an open group');
    this.#upper = group.era === null ? [group.filter] : [group.filter, group.era.filter];
  }

  /** Puts `key`, the next in order. */
  put(key: KeyPut): void {
    const { environment, customerId, scopeDigest, fingerprint, atMs } = key;
    keyHashes(environment, customerId, scopeDigest);
    this.#room(32 + 3 * (customerId.length + scopeDigest.length + fingerprint.length));
    this.#startKey(environment, customerId, scopeDigest);
    this.#bodyEnd = packText(scopeDigest, this.#body, this.#bodyEnd);
    this.#bodyEnd = packText(fingerprint, this.#body, this.#bodyEnd);
    this.#endKey(environment, atMs);
    this.#addKey();
  }

  /**
   * Sets the filter bits of the keys whose hashes `hashes` holds in pairs, from pair `from`
   * to `to` (`hashesInFilterOrder`): in the run's filter, its group's and its era's.
   */
  addHashes(hashes: Int32Array, from: number, to: number): void {
    for (let at = from; at < to; at += FILTER_READ_AHEAD_KEYS) {
      const end = Math.min(to, at + FILTER_READ_AHEAD_KEYS);
      this.#filter.readAhead(hashes, end - at, at);
      for (const filter of this.#upper) filter.readAhead(hashes, end - at, at);
      for (let i = at; i < end; i++) {
        KEY_HASHES[0] = hashes[2 * i] as number;
        KEY_HASHES[1] = hashes[2 * i + 1] as number;
        this.#addKey();
      }
    }
  }

  /**
   * Puts the keys of `batch` in `slots` from `from` to `to` (at most SEAL_SLICE), the next
   * in order, into the run's blocks; their filter bits are set apart (`addHashes`).
   */
  putSlots(batch: HeldKeys, slots: Int32Array, from: number, to: number): void {
    assert(to - from <= SEAL_SLICE, 'a slice of sealing puts at most SEAL_SLICE keys');
    batch.readRowsAhead(slots, from, to);
    for (let i = from; i < to; i++) {
      const slot = slots[i] as number;
      const environment = batch.isLive(slot) ? 'live' : 'test';
      const customerId = batch.customerIdOf(slot);
      this.#room(16 + 3 * customerId.length + 64 + 9);
      const started = this.#startKey(environment, customerId, null);
      if (started) this.#firstDigest = batch.digestOf(slot);
      const end = batch.packTexts(slot, this.#body, this.#bodyEnd);
      if (end >= 0) this.#bodyEnd = end;
      else {
        const digest = batch.digestOf(slot);
        const fingerprint = batch.fingerprintOf(slot);
        this.#room(10 + 3 * (digest.length + fingerprint.length));
        this.#bodyEnd = packText(digest, this.#body, this.#bodyEnd);
        this.#bodyEnd = packText(fingerprint, this.#body, this.#bodyEnd);
      }
      this.#endKey(environment, batch.atMsOf(slot));
    }
  }

  /** Room for `bytes` more in the block's body. */
  #room(bytes: number): void {
    if (this.#bodyEnd + bytes <= this.#body.length) return;
    const body = Buffer.allocUnsafe(Math.max(2 * this.#body.length, this.#bodyEnd + bytes));
    this.#body.copy(body, 0, 0, this.#bodyEnd);
    this.#body = body;
  }

  /**
   * Starts a block for the key unless it is one more of the block being filled (room left,
   * the same environment, and the same customer, or a plain id in a block of plain ones; a
   * customer's section starts there if it is another): whether it started one. A new
   * block's first digest is `digest`, or set by the caller when null.
   */
  #startKey(environment: 'test' | 'live', customerId: string, digest: string | null): boolean {
    const same = customerId === this.#customerId;
    const plain = same ? this.#plain : plainId(customerId);
    if (this.#keys > 0 && this.#keys < BLOCK_KEYS && environment === this.#environment) {
      if (same) return false;
      if (plain && !this.#own) {
        this.#endSection();
        this.#startSection(customerId, plain);
        return false;
      }
    }
    this.#flush();
    this.#environment = environment;
    this.#firstCustomer = customerId;
    this.#own = !plain;
    if (digest !== null) this.#firstDigest = digest;
    this.#startSection(customerId, plain);
    return true;
  }

  /** Starts a customer's section: its id, and its count (one byte, set by `#endSection`). */
  #startSection(customerId: string, plain: boolean): void {
    this.#customerId = customerId;
    this.#plain = plain;
    this.#bodyEnd = packText(customerId, this.#body, this.#bodyEnd);
    this.#countAt = this.#bodyEnd;
    this.#bodyEnd += 1;
    this.#sectionKeys = 0;
    this.#elements += 2;
  }

  /** Sets the section's count: a positive fixint, as BLOCK_KEYS is under 128. */
  #endSection(): void {
    this.#body[this.#countAt] = this.#sectionKeys;
  }

  /** Ends a key whose texts are in the body: its time, the counts. */
  #endKey(environment: 'test' | 'live', atMs: number): void {
    this.#bodyEnd = packNumber(atMs, this.#body, this.#bodyEnd);
    this.#sectionKeys += 1;
    this.#elements += 3;
    this.#keys += 1;
    this.count += 1;
    this[environment] += 1;
    if (atMs < this.minAtMs) this.minAtMs = atMs;
    if (atMs > this.maxAtMs) this.maxAtMs = atMs;
  }

  /** Sets the bits of the key KEY_HASHES holds: in the run's filter, its group's and era's. */
  #addKey(): void {
    this.#filter.add();
    for (const filter of this.#upper) filter.add();
  }

  /** Writes the block being filled (the next key starts another). */
  #flush(): void {
    if (this.#keys === 0) return;
    this.#endSection();
    const frame = frameArray(this.#elements, this.#body, this.#bodyEnd);
    const space = this.#own ? OWN_BLOCKS[this.#environment] : this.#environment;
    this.#last = this.runs.put([this.seq, space, this.#firstCustomer, this.#firstDigest], frame);
    this.#keys = 0;
    this.#elements = 0;
    this.#bodyEnd = 0;
  }

  /**
   * Ends a turn's slice: the blocks written in it ride the transaction of whatever else the
   * shard writes in that turn (its journal records), so a slice costs no sync of its own.
   * The block being filled waits for the next slice.
   */
  endSlice(): void {
    const last = this.#last;
    if (last === null) return;
    this.#last = null;
    const durable = flushedWrite(this.root, last, 'a slice of an idempotency run');
    // Awaited in `committed`; a failure seen before then is reported there, not unhandled.
    durable.catch(() => undefined);
    this.#turns.push(durable);
  }

  /** Writes the last block and waits until every block is on disk (a failure is fatal). */
  async committed(): Promise<void> {
    this.#flush();
    this.endSlice();
    const turns = this.#turns.splice(0);
    await Promise.all(turns);
  }

  run(): Run {
    assert(this.#keys === 0, 'a run is whole once its last block is committed');
    const { seq, count, test, live, minAtMs, maxAtMs } = this;
    return {
      seq,
      count,
      test,
      live,
      minAtMs,
      maxAtMs,
      blocks: true,
      sections: true,
      filter: this.#filter,
    };
  }
}

export class KeyStore {
  readonly #logs: readonly [BinaryDb, BinaryDb];
  readonly #runs: BinaryDb;
  readonly #catalog: BinaryDb;
  readonly #table: BinaryDb;
  readonly #tableExpiry: BinaryDb;
  /** The batch new keys go to (the others not yet in a committed run: `#full`, `#sealing`). */
  #active = new HeldKeys();
  /**
   * Batches that filled before a seal took them (a seal was still writing, or the upkeep had
   * not looked yet), oldest first: the next seal writes each as a run of its own. A full
   * batch is set aside rather than grown, because growing copies its arrays and rebuilds its
   * table in one go (~5 ms at 163,840 keys, ~18 ms at the next size) while the shard waits.
   */
  #full: HeldKeys[] = [];
  /** The keys a batch is sealed at once it is full (the last seal's `runKeys`). */
  #runKeys = IDEMPOTENCY_RUN_KEYS;
  /** Lookups answered from a sealed run (not from memory) since the store opened. */
  foundInRuns = 0;
  /** The newest journal record a log entry loaded at start names (0 for none). */
  #loggedThrough = 0;
  /** The batches the seal running now writes, oldest first (empty: no seal is running). */
  #sealing: HeldKeys[] = [];
  /** The last sealed batch, emptied: the next seal's new batch reuses its arrays. */
  #spare: HeldKeys | null = null;
  /** Cuts of online snapshots not closed yet (`cut`): sealed batches are not reused. */
  #cutsOpen = 0;
  /** Which log table new keys go to (0 or 1). */
  #logTable = 0;
  /**
   * The newest journal record whose keys are all in committed runs, as the last seal stored
   * it (0: none stored): recovery holds again the keys of the records after it.
   */
  #sealedThrough = 0;
  /**
   * The oldest journal record carrying keys not yet in a committed run: of the records
   * since the last seal's switch (`#keyedFrom`), and of the seal running now
   * (`#sealingFrom`); 0 for none. The journal keeps every record from there on.
   */
  #keyedFrom = 0;
  #sealingFrom = 0;
  /** The newest journal record known to carry keys (0 for none). */
  #lastKeyed = 0;
  /** Marks of `#probeEras` hold while this is unchanged. */
  #probeStamp = 0;
  /** The address `get` last looked up, and its hashes (`remember` of its key reuses them). */
  #looked: KeyAddress | null = null;
  #lookedFirst = 0;
  #lookedSecond = 0;
  #nextLogSeq: number;
  /** Committed runs, oldest first. */
  readonly #runList: Run[] = [];
  /** Every run is in one group; groups oldest first. */
  readonly #groups: Group[] = [];
  #nextRunSeq: number;
  readonly #eraHome: EraHome;
  /** The shard environment's own era table (eras stored there before), if not `#eraHome`'s. */
  readonly #oldEraTable: BinaryDb | null;
  /** Eras with groups in memory, oldest first; the open one (new groups join it) last. */
  readonly #eras: Era[] = [];
  #openEra: Era | null = null;
  /** Closed eras whose filters are not yet stored (the end of a seal stores them). */
  readonly #erasToStore: Era[] = [];
  /** The memory of the last era stored onto the memory map, zeroed: the next era's. */
  #spareEra: Uint8Array | null = null;
  /** The era `rebuildEras` is building (its memory counts in `filterBytes`). */
  #rebuilding: Era | null = null;
  /** The group `rebuildEras` closed before it was full: new runs start a new group. */
  #closedEarly: Group | null = null;
  /**
   * The smallest era image read from the memory map (idempotency-eras.ts); a test lowers
   * it to have small eras read from there.
   */
  mapErasFrom = MAP_FROM_BYTES;
  #eraGroups: number | null = ERA_GROUPS;

  /**
   * The groups a new era holds at most (ERA_GROUPS to ERA_GROUPS_MAX; the open era keeps
   * its own), or null: each new era sized by the keys' rate (`eraGroupsFor`, from the keys
   * of the batch being sealed and of the runs sealed in the hour before it). More: fewer
   * eras for a lookup to probe (one probe each), and a larger open era's buffer in memory
   * (3 bytes per key of its capacity) and image at its close.
   */
  get eraGroups(): number | null {
    return this.#eraGroups;
  }

  set eraGroups(groups: number | null) {
    assert(
      groups === null ||
        (Number.isInteger(groups) && groups >= ERA_GROUPS && groups <= ERA_GROUPS_MAX),
      `an era holds ${ERA_GROUPS} to ${ERA_GROUPS_MAX} groups, not ${groups}`,
    );
    this.#eraGroups = groups;
  }

  /** The groups the open era holds at most (null: no era is open). */
  get openEraGroups(): number | null {
    return this.#openEra?.maxGroups ?? null;
  }

  /**
   * The keys a day brings at the rate of `batch` (sealed now) and of the runs sealed in the
   * hour before its newest key: their keys over the time from the oldest one's first key to
   * that newest key, at least a second (0 where there are none).
   */
  #keysPerDay(batch: HeldKeys | null): number {
    let keys = 0;
    let fromMs = Number.POSITIVE_INFINITY;
    let toMs = Number.NEGATIVE_INFINITY;
    if (batch !== null) {
      keys = batch.size;
      for (let slot = 0; slot < batch.size; slot++) {
        const atMs = batch.atMsOf(slot);
        if (atMs < fromMs) fromMs = atMs;
        if (atMs > toMs) toMs = atMs;
      }
    }
    for (let i = this.#runList.length - 1; i >= 0; i--) {
      const run = this.#runList[i] as Run;
      if (keys > 0 && run.maxAtMs < toMs - RATE_WINDOW_MS) break;
      keys += run.count;
      fromMs = Math.min(fromMs, run.minAtMs);
      toMs = Math.max(toMs, run.maxAtMs);
    }
    return (keys / Math.max(1000, toMs - fromMs)) * DAY_MS;
  }
  /** First run seqs of era entries stored without a head: removed by the next drop. */
  #orphanEras: number[];

  /** Every write of the upkeep waits until it is on disk: a failed sync must stop the worker. */
  readonly #root: RootDatabase;

  /**
   * The store over the shard environment's tables `dbs`, its eras in `eraHome` (by default
   * the shard environment's own table: a test's simulated environment is one).
   */
  constructor(
    dbs: Readonly<Record<IdempotencyDbName, BinaryDb>>,
    root: RootDatabase,
    eraHome: EraHome = { root, table: dbs[ERA_TABLE] },
  ) {
    this.#root = root;
    this.#logs = [dbs['idempotency-log-0'], dbs['idempotency-log-1']];
    this.#runs = dbs['idempotency-runs'];
    this.#catalog = dbs['idempotency-run-catalog'];
    this.#table = dbs.idempotency;
    this.#tableExpiry = dbs['idempotency-expiry'];
    this.#eraHome = eraHome;
    const oldTable = dbs[ERA_TABLE];
    this.#oldEraTable = eraHome.table === oldTable ? null : oldTable;
    const { eras, orphans } = loadEras(eraHome.table);
    // Only an era of the eras' home is opened again: it is stored there again.
    const newestAtHome = eras.at(-1);
    if (this.#oldEraTable !== null) {
      const old = loadEras(this.#oldEraTable);
      eras.push(...old.eras);
      eras.sort((a, b) => a.first - b.first);
      orphans.push(...old.orphans);
    }
    this.#orphanEras = orphans;
    const groups: Array<[number, number, KeyFilter]> = [];
    for (const { key, value } of this.#catalog.getRange({})) {
      if (typeof key === 'number') this.#runList.push(decodeRun(value, key));
      else if (key === SEALED_KEY) this.#sealedThrough = decodeSealed(value);
      else {
        const first = (key as GroupKey)[1];
        groups.push([first, ...decodeGroup(value, first)]);
      }
    }
    groups.sort((a, b) => a[0] - b[0]);
    const runsOf = groups.map(([first], i) => {
      const next = groups[i + 1]?.[0] ?? Number.POSITIVE_INFINITY;
      return this.#runList.filter((run) => run.seq >= first && run.seq < next);
    });
    const eraOf = (first: number): Era | undefined =>
      eras.find((era) => era.first <= first && first <= era.lastRun);
    // An era whose filter misses a run of its groups (one a release before eras added) is
    // left out, like one whose groups all expired: its groups' own filters answer.
    for (const [i, [first]] of groups.entries()) {
      const era = eraOf(first);
      if (era !== undefined && runsOf[i]?.some((run) => run.seq > era.lastRun)) era.groups = -1;
    }
    for (const [i, [first, capacity, filter]] of groups.entries()) {
      const found = eraOf(first);
      const era = found !== undefined && found.groups >= 0 ? found : null;
      const eraIndex = era === null ? 0 : era.groups++;
      const runs = runsOf[i] as Run[];
      // The era's image holds its runs' filters: read there, not from the runs' records.
      if (era !== null)
        for (const run of runs) run.filter = era.runFilters.get(run.seq) ?? run.filter;
      const group: Group = {
        first,
        runs,
        filter: era === null ? filter : null,
        capacity,
        count: 0,
        maxAtMs: 0,
        era,
        eraIndex,
      };
      for (const run of runs) this.#countIn(group, run);
      this.#groups.push(group);
    }
    if (newestAtHome !== undefined) this.#reopen(newestAtHome, eras);
    for (const era of eras) {
      era.runFilters.clear();
      if (era.groups > 0) this.#eras.push(era);
      else this.#orphanEras.push(era.first);
    }
    assert(
      this.#runList.length === 0 || this.#groups[0]?.first === this.#runList[0]?.seq,
      'every idempotency run is in a group',
    );
    // A run interrupted before its catalog record keeps the next number: the next seal
    // removes what it left, then writes the run again (its keys are in the logs still).
    this.#nextRunSeq = (this.#runList.at(-1)?.seq ?? 0) + 1;
    this.#nextLogSeq = 1;
    this.#loadLogs();
  }

  /**
   * Opens `era` (the newest of `eras`, as loaded) again, in `eras` too, where a clean stop
   * stored it with room for another group like its last (`reopenedEra`): it holds the
   * newest groups and run, and its head covers them all. An era with a group or run after
   * it (a seal the stop cut short committed one), without room, or whose image is not laid
   * out as an open era's, stays closed.
   */
  #reopen(era: Era, eras: Era[]): void {
    const last = this.#groups.at(-1);
    if (
      last === undefined ||
      last.era !== era ||
      eras.at(-1) !== era ||
      era.imageBytes === 0 ||
      this.#runList.at(-1)?.seq !== era.lastRun
    )
      return;
    const held = this.#groups.filter((group) => group.era === era);
    const reserved = held.reduce((sum, group) => sum + group.capacity, 0);
    // Opened for as many groups as its capacity holds of its last one's (its capacity is
    // that many groups' keys, unless capped), and no more than any era.
    const maxGroups = Math.min(ERA_GROUPS_MAX, Math.floor(era.capacity / last.capacity));
    if (held.length >= maxGroups || reserved + last.capacity > era.capacity) return;
    const open = reopenedEra(era, held.length, reserved, maxGroups);
    if (open === null) return;
    const carved = new Map(open.carved.map(([filter, seq]) => [seq, filter]));
    for (const group of held) {
      group.era = open;
      for (const run of group.runs) run.filter = carved.get(run.seq) ?? run.filter;
    }
    eras[eras.length - 1] = open;
    this.#openEra = open;
  }

  #countIn(group: Group, run: Run): void {
    group.count += run.count;
    group.maxAtMs = Math.max(group.maxAtMs, run.maxAtMs);
  }

  /** Every logged key not yet sealed is in memory again, newest use last. */
  #loadLogs(): void {
    const logged: Array<[number, KeyPut[]]> = [];
    for (const log of this.#logs)
      for (const { key, value } of log.getRange({})) {
        const seq = key as number;
        const { record, puts } = decodeLogged(value, seq);
        logged.push([seq, puts]);
        if (seq >= this.#nextLogSeq) this.#nextLogSeq = seq + 1;
        if (record !== null && record > this.#loggedThrough) this.#loggedThrough = record;
      }
    logged.sort((a, b) => a[0] - b[0]);
    // Each customer's id once: the keys in memory keep a reference to it until sealed.
    const ids = new Map<string, string>();
    for (const [, puts] of logged)
      for (const put of puts) {
        let customerId = ids.get(put.customerId);
        if (customerId === undefined) ids.set(put.customerId, (customerId = put.customerId));
        this.remember({ ...put, customerId });
      }
  }

  /**
   * Forgets the keys logged with journal records after `lastSeq`: records recovery dropped
   * (a torn tail, or records after a missing one), whose writes never applied although
   * their log entries, written in the same transaction, were kept. A retry of such a write
   * must apply it, not answer it as a replay. Their entries are removed (committed at
   * once; the recovery barrier syncs them) and the keys in memory loaded again without
   * them. Call once replay has settled the journal's end, before anything is served.
   * Returns the keys forgotten.
   */
  forgetLoggedAfter(lastSeq: number): number {
    if (this.#loggedThrough <= lastSeq) return 0;
    let forgotten = 0;
    for (const log of this.#logs) {
      const dropped: number[] = [];
      for (const { key, value } of log.getRange({})) {
        const { record, puts } = decodeLogged(value, key as number);
        if (record === null || record <= lastSeq) continue;
        dropped.push(key as number);
        forgotten += puts.length;
      }
      for (const key of dropped) log.removeSync(key);
    }
    this.#active = new HeldKeys();
    this.#full = [];
    this.#nextLogSeq = 1;
    this.#loggedThrough = 0;
    this.#loadLogs();
    return forgotten;
  }

  /** The address of a key, with its hashes: what lookups of a keyed write are given. */
  address(environment: 'test' | 'live', customerId: string, scopeDigest: string): HashedAddress {
    keyHashes(environment, customerId, scopeDigest);
    return {
      environment,
      customerId,
      scopeDigest,
      first: KEY_HASHES[0] as number,
      second: KEY_HASHES[1] as number,
      clearOfEras: -1,
    };
  }

  /**
   * Reads ahead what lookups of `addresses` (a batch's keys, just before it is decided;
   * nulls skipped, READ_AHEAD_KEYS at most) will touch first: each key's position in the
   * tables of the keys in memory, and one block of each era's filter and of each filter of
   * a group outside an era, all in one loop, so their cache misses overlap rather than
   * stall each lookup in turn. The eras' filters are also probed here, ERA_PROBE_KEYS keys
   * at a time right after their blocks are read: an address (`HashedAddress`) every era
   * said no to is marked so, and its lookup skips the eras' groups. Stores nothing.
   */
  readAhead(addresses: readonly (KeyAddress | null)[]): void {
    const hashes = readAheadHashes;
    let count = 0;
    for (let i = 0; i < addresses.length && count < READ_AHEAD_KEYS; i++) {
      const address = addresses[i];
      if (address === null || address === undefined) continue;
      hashAddress(address);
      hashes[2 * count] = KEY_HASHES[0] as number;
      hashes[2 * count + 1] = KEY_HASHES[1] as number;
      readAheadAddresses[count] = 'first' in address ? (address as HashedAddress) : null;
      count += 1;
    }
    if (count === 0) return;
    this.#active.readAhead(hashes, count);
    for (const batch of this.#full) batch.readAhead(hashes, count);
    for (const batch of this.#sealing) batch.readAhead(hashes, count);
    for (const group of this.#groups)
      if (group.era === null && group.filter !== null) group.filter.readAhead(hashes, count);
    if (this.#eras.length > 0) this.#probeEras(count);
    readAheadAddresses.fill(null, 0, count);
  }

  /**
   * Probes every era's filter for the `count` keys `readAhead` collected, ERA_PROBE_KEYS at
   * a time, and marks each address every era said no to with a new stamp. Any change to
   * the filters or the eras takes a new stamp (`#filtersChanged`), so a mark holds only
   * while nothing has been added since: in practice, for the batch being decided.
   */
  #probeEras(count: number): void {
    const hashes = readAheadHashes;
    const eras = this.#eras;
    const stamp = ++this.#probeStamp;
    for (let from = 0; from < count; from += ERA_PROBE_KEYS) {
      const keys = Math.min(ERA_PROBE_KEYS, count - from);
      for (const era of eras) era.filter.readAhead(hashes, keys, from);
      for (let i = from; i < from + keys; i++) {
        const address = readAheadAddresses[i];
        if (address === null || address === undefined) continue;
        KEY_HASHES[0] = hashes[2 * i] as number;
        KEY_HASHES[1] = hashes[2 * i + 1] as number;
        let clear = true;
        for (let e = 0; e < eras.length && clear; e++)
          clear = !(eras[e] as Era).filter.mayContain();
        if (clear) address.clearOfEras = stamp;
      }
    }
  }

  /** The filters or the eras changed: marks of `#probeEras` made before no longer hold. */
  #filtersChanged(): void {
    this.#probeStamp += 1;
  }

  /**
   * The entry at `address`, or undefined: from memory, else from the newest run whose
   * filter may hold it (a memory-mapped B-tree read). Throws if stored bytes fail
   * verification (stored state that fails its checksum must stop the worker).
   */
  get(address: KeyAddress): StoredKey | undefined {
    hashAddress(address);
    const first = KEY_HASHES[0] as number;
    this.#looked = address;
    this.#lookedFirst = first;
    this.#lookedSecond = KEY_HASHES[1] as number;
    const held = this.#active.get(address, first) ?? this.#heldBefore(address, first);
    if (held !== undefined) return held;
    if (this.#runList.length === 0) return undefined;
    const clearOfEras = (address as Partial<HashedAddress>).clearOfEras === this.#probeStamp;
    let maybe: Era | null = null;
    for (let g = this.#groups.length - 1; g >= 0; g--) {
      const group = this.#groups[g] as Group;
      const era = group.era;
      if (era !== null && era !== maybe) {
        // The era's groups are consecutive: where its filter says no, skip them all.
        if (clearOfEras || !era.filter.mayContain()) {
          g -= group.eraIndex;
          continue;
        }
        maybe = era;
      }
      if (group.filter !== null && !group.filter.mayContain()) continue;
      for (let i = group.runs.length - 1; i >= 0; i--) {
        const run = group.runs[i] as Run;
        if (run.filter !== null && !run.filter.mayContain()) continue;
        const found = this.#read(run, address);
        if (found !== undefined) {
          this.foundInRuns += 1;
          return found;
        }
      }
    }
    return undefined;
  }

  /** The key at `address` in the batches before the active one, newest first. */
  #heldBefore(address: KeyAddress, first: number): KeyPut | undefined {
    for (let i = this.#full.length - 1; i >= 0; i--) {
      const held = (this.#full[i] as HeldKeys).get(address, first);
      if (held !== undefined) return held;
    }
    for (let i = this.#sealing.length - 1; i >= 0; i--) {
      const held = (this.#sealing[i] as HeldKeys).get(address, first);
      if (held !== undefined) return held;
    }
    return undefined;
  }

  #read(run: Run, address: KeyAddress): StoredKey | undefined {
    const { environment, customerId, scopeDigest } = address;
    if (!run.blocks) {
      const bytes = this.#runs.get([run.seq, environment, customerId, scopeDigest]);
      return bytes === undefined ? undefined : decodeStored(bytes, scopeDigest);
    }
    const space = blockSpace(run, environment, customerId);
    if (space === null) {
      // A plain id in a run in sections: in the last block starting at or before its key
      // (those blocks hold their keys in the order their own keys sort).
      const before = this.#runs.getRange({
        start: [run.seq, environment, customerId, scopeDigest],
        end: [run.seq, environment],
        reverse: true,
        limit: 1,
      });
      for (const { value } of before)
        return findInSections(decodeSections(value, scopeDigest, true), customerId, scopeDigest);
      return undefined;
    }
    // The customer's last own block starting at or before the digest: backwards from the
    // digest, down to its first block. Another customer's block found on the way (an id of
    // 64 characters or more with a NUL in it is stored unescaped and can sort among
    // another's keys) is passed over.
    const blocks = this.#runs.getRange({
      start: [run.seq, space, customerId, scopeDigest],
      end: [run.seq, space, customerId],
      reverse: true,
    });
    for (const { key, value } of blocks) {
      const block = decodeSections(value, scopeDigest, run.sections);
      if ((key as RunKey)[1] !== space || block[0] !== customerId) continue;
      return findInSections(block, customerId, scopeDigest);
    }
    return undefined;
  }

  /**
   * A key decided now: lookups find it from now on (its log entry follows with `log`). A
   * keyed write looks its key up just before: its hashes are the lookup's.
   */
  remember(put: KeyPut): void {
    const looked = this.#looked;
    const lookedUp = looked !== null && sameAddress(looked, put);
    if (!lookedUp) hashAddress(put);
    const active = this.#active;
    if (active.size === active.capacity && active.capacity >= this.#runKeys) {
      this.#full.push(active);
      this.#active = this.#spare ?? new HeldKeys(batchSlots(this.#runKeys));
      this.#spare = null;
    }
    this.#active.set(
      put,
      lookedUp ? this.#lookedFirst : (KEY_HASHES[0] as number),
      lookedUp ? this.#lookedSecond : (KEY_HASHES[1] as number),
    );
  }

  /**
   * Issues the log entry of `puts`: keys recovery migrates (`record` null: no record
   * carries them), or, as releases before this one wrote them, the keys of journal record
   * `record`. It joins the transaction of the other writes issued in this event-loop turn;
   * its failure fails that whole transaction, which the durable promise of a write in it
   * reports.
   */
  log(record: number | null, puts: readonly KeyPut[]): void {
    if (puts.length === 0) return;
    const log = this.#logs[this.#logTable] as BinaryDb;
    log.put(this.#nextLogSeq++, logEntry(record, puts)).catch(() => undefined);
  }

  /**
   * Journal record `record`, appended now, carries keys just remembered (their events hold
   * their digests and fingerprints): the journal keeps it until a seal has committed them.
   */
  carried(record: number): void {
    assert(record > this.#lastKeyed, `journal record ${record} after ${this.#lastKeyed}`);
    if (this.#keyedFrom === 0) this.#keyedFrom = record;
    this.#lastKeyed = record;
  }

  /**
   * Recovery: the keys that journal record `record` carries, one after the sealed ones
   * (`sealedThrough`), held in memory again until the next seal. Records in seq order.
   */
  reheld(record: number, puts: readonly KeyPut[]): void {
    assert(record > this.#sealedThrough, `journal record ${record} is sealed already`);
    if (puts.length === 0) return;
    for (const put of puts) this.remember(put);
    this.carried(record);
  }

  /**
   * The newest journal record whose keys are all in committed runs, as stored by the last
   * seal (0: none was stored). The keys of later records are held again at start.
   */
  get sealedThrough(): number {
    return this.#sealedThrough;
  }

  /**
   * The oldest journal record that carries keys not yet in a committed run, which the
   * journal must keep (Infinity: none).
   */
  get keptFrom(): number {
    const from = [this.#sealingFrom, this.#keyedFrom].filter((seq) => seq > 0);
    return from.length === 0 ? Number.POSITIVE_INFINITY : Math.min(...from);
  }

  /**
   * Recovery's migration of a key found in the layout before the key table (a snapshot or
   * journal record that carried keys in the customer's state): remembered and logged
   * unless the same or a newer use of the digest is known.
   */
  backfill(put: KeyPut): boolean {
    const stored = this.get(put);
    if (stored !== undefined && stored.atMs >= put.atMs) return false;
    this.remember(put);
    this.log(null, [put]);
    return true;
  }

  /** Keys in memory (not yet in a committed run). */
  get inMemory(): number {
    let keys = this.unsealed;
    for (const batch of this.#sealing) keys += batch.size;
    return keys;
  }

  /** Keys in memory that are due to be sealed (the batch being sealed not counted). */
  get unsealed(): number {
    let keys = this.#active.size;
    for (const batch of this.#full) keys += batch.size;
    return keys;
  }

  /** Keys stored: in runs (expired ones not yet dropped included) and in memory. */
  get size(): number {
    let count = this.inMemory;
    for (const run of this.#runList) count += run.count;
    return count;
  }

  /** The committed runs, oldest first. */
  get runs(): readonly RunInfo[] {
    return this.#runList;
  }

  /** Groups of runs. */
  get groupCount(): number {
    return this.#groups.length;
  }

  /** Eras of groups (one filter each), the open one included. */
  get eraCount(): number {
    return this.#eras.length;
  }

  /**
   * Groups outside any era, each probed by its own filter for every key that misses memory:
   * after a crash, the groups of the era that was open, until an era is rebuilt over them.
   */
  get groupsOutsideEras(): number {
    let groups = 0;
    for (const group of this.#groups) if (group.era === null) groups += 1;
    return groups;
  }

  /** Eras' images read from the memory map (file pages, not the worker's memory), in bytes. */
  get mappedFilterBytes(): number {
    let bytes = 0;
    for (const era of this.#eras) bytes += era.mappedBytes;
    return bytes;
  }

  /**
   * The worker's memory the filters of the eras, groups and runs take, in bytes (the open
   * era's buffer whole, a spare one included; not the images on the memory map).
   */
  get filterBytes(): number {
    let bytes = 0;
    for (const era of this.#eras) bytes += era.memory?.byteLength ?? era.filter.ownedBytes;
    for (const group of this.#groups) bytes += group.filter?.ownedBytes ?? 0;
    for (const run of this.#runList) bytes += run.filter?.ownedBytes ?? 0;
    bytes += this.#spareEra?.byteLength ?? 0;
    bytes += this.#rebuilding?.memory?.byteLength ?? 0;
    return bytes;
  }

  /** Keys stored of one environment: the runs' counts and a pass over memory (a start's). */
  countOf(environment: 'test' | 'live'): number {
    let count = 0;
    for (const run of this.#runList) count += run[environment];
    for (const batch of this.#heldOldestFirst())
      for (const put of batch.values()) if (put.environment === environment) count += 1;
    return count;
  }

  /**
   * An online snapshot's cut of the keys: every key in memory now and in the runs committed
   * now, read later a slice at a time (`KeyCut`). Until it is read to the end or closed, a
   * sealed batch is not cleared for reuse (the cut may still read it).
   */
  cut(): KeyCut {
    const held = this.#heldOldestFirst()
      .filter((batch) => batch.size > 0)
      .map((batch): [HeldKeys, number] => [batch, batch.size]);
    this.#cutsOpen++;
    return new KeyCut(this.#runs, [...this.#runList], held, () => this.#cutsOpen--);
  }

  /** Every batch of keys in memory, oldest first: being sealed, full, the active one. */
  #heldOldestFirst(): HeldKeys[] {
    return [...this.#sealing, ...this.#full, this.#active];
  }

  /**
   * Seals the keys in memory into runs, one per batch (the full ones set aside since the
   * last seal, oldest first, then the active one): new keys go to a new batch (and log
   * table) from now on; once every key decided so far is durable (`pacing.keysDurable`),
   * each batch is sorted and written a slice per turn and its catalog record committed;
   * then the newest journal record whose keys it took is stored and the sealed log table
   * cleared. Returns the last run, or null when memory held no key. `runKeys` is the size
   * runs are sealed at (a new group's filter is sized for 16 of them). One seal at a time;
   * a failed write throws (the caller crashes: recovery from disk is the repair).
   */
  async seal(pacing: Pacing, runKeys = IDEMPOTENCY_RUN_KEYS): Promise<RunInfo | null> {
    assert(this.#sealing.length === 0, 'one idempotency run is sealed at a time');
    this.#runKeys = runKeys;
    const batches = this.#full;
    this.#full = [];
    if (this.#active.size > 0) {
      batches.push(this.#active);
      this.#active = this.#spare ?? new HeldKeys(batchSlots(runKeys));
      this.#spare = null;
    }
    if (batches.length === 0) return null;
    const sealedLog = this.#logs[this.#logTable] as BinaryDb;
    this.#sealing = batches;
    this.#logTable = 1 - this.#logTable;
    // Every record up to the newest keyed one so far carries only keys of these batches
    // (or of runs already committed): a key is remembered before its record is appended.
    const through = this.#lastKeyed;
    this.#sealingFrom = this.#keyedFrom;
    this.#keyedFrom = 0;
    await pacing.keysDurable();
    let run: Run | null = null;
    for (const batch of batches) run = await this.#sealBatch(batch, pacing, runKeys);
    this.#sealing = [];
    for (const batch of batches) {
      // A cut may still read it: it is the cut's (then the collector's), not the next one's.
      if (this.#cutsOpen > 0) continue;
      batch.clear();
      // A batch smaller than a seal's (the first one, grown from a few slots) is let go.
      if (this.#spare === null && batch.capacity >= batchSlots(runKeys)) this.#spare = batch;
    }
    // One transaction: the sealed log cleared, and the records whose keys are all in runs.
    const sealed = Math.max(through, this.#sealedThrough);
    if (sealed > this.#sealedThrough)
      this.#catalog.put(SEALED_KEY, encodeRecord(sealed)).catch(() => undefined);
    await flushedWrite(
      this.#root,
      sealedLog.clearAsync(),
      'the clearing of a sealed idempotency log',
    );
    this.#sealedThrough = sealed;
    this.#sealingFrom = 0;
    await this.#storeEras(pacing);
    return run;
  }

  /**
   * A clean stop: closes the open era and stores it (and any a seal the stop interrupted
   * closed), so that after the restart its groups are found through its filter, one probe,
   * rather than each through its own until an era is rebuilt over them (up to
   * ERA_GROUPS_MAX - 1 of them, every key read back: `rebuildEras`).
   * It covers the runs committed so far. The next start opens it again where it has room
   * (`#reopen`): new runs start a new group in it, not a new era. An era opened so and
   * given no run since is on disk as it is, and is not stored again. An
   * interrupted seal's keys may have set bits in its filter (a maybe too many, never a
   * key missed), and a run that seal committed after all is past the era's last run: where
   * it joined one of the era's groups, the restart leaves the era out and probes its groups
   * one by one until it has rebuilt one over them. Call once nothing seals any more (the
   * upkeep has stopped).
   */
  async storeOpenEra(pause: Pacing['pause']): Promise<void> {
    const era = this.#openEra;
    // An era opened again at the start and given no run since is on disk as it is.
    const unchanged = era !== null && era.storedLastRun === this.#nextRunSeq - 1;
    if (era !== null && era.groups > 0 && !unchanged) this.#closeEra(era);
    await this.#storeEras({ pause });
  }

  /**
   * Closes `era` (the open one) after the runs committed so far: it takes no more groups,
   * and the next `#storeEras` stores it.
   */
  #closeEra(era: Era): void {
    era.lastRun = this.#nextRunSeq - 1;
    if (this.#openEra === era) this.#openEra = null;
    this.#erasToStore.push(era);
  }

  /** Writes `batch` as the next run and commits it (its keys stay in memory until the end). */
  async #sealBatch(batch: HeldKeys, pacing: Pacing, runKeys: number): Promise<Run> {
    const order = await runOrder(batch, pacing.pause);
    await this.#clearRun(this.#nextRunSeq, pacing);
    // An era the run's group cannot join is stored first: the next era reuses its memory.
    const full = this.#eraClosedBy(batch.size, runKeys);
    if (full !== null) {
      this.#closeEra(full);
      await this.#storeEras(pacing);
    }
    const group = this.#groupFor(batch.size, runKeys, batch);
    if (group.era?.untouched === true) await makeResident(group.era, pacing.pause);
    const writer = new RunWriter(this.#root, this.#runs, this.#nextRunSeq, group, batch.size);
    const hashes = await hashesInFilterOrder(batch, pacing.pause);
    for (let at = 0; at < batch.size; at += FILTER_SLICE) {
      writer.addHashes(hashes, at, Math.min(batch.size, at + FILTER_SLICE));
      this.#filtersChanged();
      await pacing.pause();
    }
    for (let at = 0; at < order.length; at += SEAL_SLICE) {
      writer.putSlots(batch, order, at, Math.min(order.length, at + SEAL_SLICE));
      writer.endSlice();
      await pacing.pause();
    }
    await writer.committed();
    return this.#commitRun(writer, group, pacing.pause);
  }

  /** Stores the filters of the eras closed since the last call. */
  async #storeEras(pacing: Pick<Pacing, 'pause'>): Promise<void> {
    for (let era = this.#erasToStore[0]; era !== undefined; era = this.#erasToStore[0]) {
      this.#spareEra =
        (await storeEra(this.#eraHome.root, this.#eraHome.table, era, pacing.pause)) ??
        this.#spareEra;
      this.#erasToStore.shift();
    }
  }

  /**
   * Removes what an interrupted seal left under run `seq` (blocks written before a crash,
   * its catalog record never), a slice per turn. Its keys are all in the batch sealed now,
   * but in blocks that start elsewhere: left beside the new ones, a lookup could land in an
   * old block that lacks a key the new blocks hold.
   */
  async #clearRun(seq: number, pacing: Pick<Pacing, 'pause'>): Promise<void> {
    for (;;) {
      const keys = [...this.#runs.getKeys({ start: [seq], end: [seq + 1], limit: KEY_SLICE })];
      if (keys.length === 0) return;
      let last: Promise<unknown> = Promise.resolve();
      for (const key of keys) last = this.#runs.remove(key);
      await flushedWrite(this.#root, last, 'the removal of an interrupted idempotency run');
      await pacing.pause();
    }
  }

  /**
   * The group a run of `keys` keys joins: the open one, unless it is full (GROUP_RUNS runs,
   * or no room for the keys in its filter's capacity), else a new one sized for GROUP_RUNS
   * runs like this one, a run counted at most `runKeys` (a batch far larger, as after a
   * restore, fills a group of its own), and at least MIN_GROUP_KEYS keys. A new group is
   * stored with its first run. It joins the open era if it has room, else that era closes
   * (its filter is stored at the end of the seal) and the group opens a new one.
   */
  #groupFor(keys: number, runKeys: number, batch: HeldKeys | null = null): Group {
    const open = this.#openGroupFor(keys);
    if (open !== null) return open;
    const capacity = groupCapacity(keys, runKeys);
    const first = this.#nextRunSeq;
    let era = this.#openEra;
    if (era === null || !hasRoom(era, capacity)) {
      if (era !== null) this.#closeEra(era);
      era = this.#openEra = openEra(
        first,
        capacity,
        GROUP_RUNS,
        this.#spareEra,
        this.mapErasFrom,
        this.#eraGroups ?? eraGroupsFor(this.#keysPerDay(batch), capacity),
      );
      // The spare goes with the era that takes it, or is let go (the keys' rate changed).
      this.#spareEra = null;
      if (era !== null) this.#eras.push(era);
      this.#filtersChanged();
    }
    const eraIndex = era === null ? 0 : era.groups;
    const filter = KeyFilter.sized(capacity);
    return { first, runs: [], filter, capacity, count: 0, maxAtMs: 0, era, eraIndex };
  }

  /** The open group, if a run of `keys` keys can join it. */
  #openGroupFor(keys: number): Group | null {
    const open = this.#groups.at(-1);
    return open !== undefined &&
      open.filter !== null &&
      open !== this.#closedEarly &&
      open.runs.length < GROUP_RUNS &&
      open.count + keys <= open.capacity
      ? open
      : null;
  }

  /** The open era, if a run of `keys` keys would close it (its new group has no room). */
  #eraClosedBy(keys: number, runKeys: number): Era | null {
    const era = this.#openEra;
    if (era === null || this.#openGroupFor(keys) !== null) return null;
    return hasRoom(era, groupCapacity(keys, runKeys)) ? null : era;
  }

  /**
   * Commits a written run: its record and its group's (the filter with its keys) in one
   * transaction. Lookups find it from then on.
   */
  async #commitRun(writer: RunWriter, group: Group, pause: Pacing['pause']): Promise<Run> {
    const run = writer.run();
    const groupBytes = await groupRecord(group, pause);
    this.#catalog.put(run.seq, runRecord(run)).catch(() => undefined);
    const stored = this.#catalog.put(['group', group.first], groupBytes);
    await flushedWrite(this.#root, stored, 'an idempotency run and its group');
    this.#filtersChanged();
    if (this.#groups.at(-1) !== group) this.#joined(group);
    group.runs.push(run);
    this.#countIn(group, run);
    this.#runList.push(run);
    this.#nextRunSeq = run.seq + 1;
    return run;
  }

  /**
   * A new group's first run is committed: it is the open group from now on. The group it
   * follows is closed; inside an era, the era's filter answers for its keys and its own
   * filter leaves memory (its stored record keeps it for a restart).
   */
  #joined(group: Group): void {
    const closed = this.#groups.at(-1);
    if (closed !== undefined && closed.era !== null) closed.filter = null;
    const era = group.era;
    if (era !== null) {
      era.groups += 1;
      era.reserved += group.capacity;
    }
    this.#groups.push(group);
  }

  /**
   * Removes every entry stored for the eras that start at `firsts`, from the eras' home and
   * from the shard environment's own table (where a release before stored them).
   */
  async #removeEras(firsts: readonly number[], what: string): Promise<void> {
    for (const [root, table] of [
      [this.#eraHome.root, this.#eraHome.table],
      [this.#root, this.#oldEraTable],
    ] as const) {
      if (table === null) continue;
      const removed = firsts.map((first) => removeEra(table, first)).filter((r) => r !== null);
      if (removed.length > 0) await flushedWrite(root, removed.at(-1) as Promise<unknown>, what);
    }
  }

  /**
   * Drops the groups whose newest key was used before `beforeMs`, oldest first (lookups
   * stop reading a group when its catalog records go), then removes their runs' keys a
   * slice per turn, with any a crash left behind. Returns the runs dropped.
   */
  async dropExpired(beforeMs: number, pacing: Pick<Pacing, 'pause'>): Promise<RunInfo[]> {
    await this.#removeOrphanEras();
    const dropped: RunInfo[] = [];
    for (;;) {
      const group = this.#groups[0];
      if (group === undefined || group.maxAtMs >= beforeMs || this.#sealing.length > 0) break;
      // Its records go in one transaction: the group's and its runs'. Then its era's, if it
      // was the era's last group held (groups of an era are consecutive; a release before
      // eras may have dropped some of them): an era a crash leaves without groups is
      // removed at the next start's first drop.
      let last: Promise<unknown> = this.#catalog.remove(['group', group.first]);
      for (const run of group.runs) last = this.#catalog.remove(run.seq);
      await flushedWrite(this.#root, last, 'the removal of an idempotency run group');
      const era = group.era;
      const eraEnds = era !== null && this.#groups[1]?.era !== era;
      // An era opened again at the start has its stored image and head still on disk.
      if (eraEnds && (era.stored || era.storedLastRun !== null))
        await this.#removeEras([era.first], 'the removal of an idempotency era');
      if (eraEnds) this.#dropEra(era);
      this.#groups.shift();
      this.#runList.splice(0, group.runs.length);
      dropped.push(...group.runs);
    }
    const floor = this.#runList[0]?.seq ?? this.#nextRunSeq;
    for (;;) {
      const keys = [...this.#runs.getKeys({ end: [floor], limit: KEY_SLICE })];
      if (keys.length === 0) break;
      let last: Promise<unknown> = Promise.resolve();
      for (const key of keys) last = this.#runs.remove(key);
      await flushedWrite(this.#root, last, 'a slice of a dropped idempotency run');
      await pacing.pause();
    }
    return dropped;
  }

  /**
   * Removes the era entries the start found without a head, or without a group held (taken
   * at once: a rebuilt era may be stored under the same first run seq later).
   */
  async #removeOrphanEras(): Promise<void> {
    const orphans = this.#orphanEras;
    if (orphans.length === 0) return;
    this.#orphanEras = [];
    await this.#removeEras(orphans, 'the removal of an unfinished idempotency era');
  }

  /**
   * Rebuilds eras over the groups this start found outside any: those of the era open at a
   * crash (never stored, so up to ERA_GROUPS_MAX - 1 groups each probed by its own filter
   * for every key that misses memory, until they expire). Each era's filter gets every key
   * of its groups' runs, read back from their blocks a slice per turn and hashed as sealing
   * hashed them; its runs' filters are copied from theirs; then it is stored as any closed
   * era is (`storeEra`), and only then do lookups go through it and the groups' own filters
   * leave memory. Until then they are probed one by one, as before. The newest of them
   * takes no more runs (the era would miss their keys): the next run starts a new group.
   *
   * Left out, and probed one by one until they expire: groups whose newest key was used
   * before `expiredBeforeMs` (the next drop takes them), groups of runs sealed a key per
   * entry (such an entry's key may not decode to its customer exactly, so the hashes could
   * differ from sealing's) and stretches of one group (one probe either way). A group
   * dropped meanwhile leaves its era (its keys' bits make a maybe too many, never a miss).
   * A run whose blocks do not hold its count of keys leaves its groups as they are. Stopped
   * part-way (a pause that throws), nothing unfinished is stored; a crash while an image is
   * written leaves entries without a head, which the next start removes and rebuilds. Call
   * once, before the first seal. Returns the groups the eras rebuilt hold.
   *
   * Memory: an era's buffer, 3 bytes a key of its groups, while it is built (beside the open
   * era's, if a seal opened one meanwhile); once stored, the groups' own filters (1.5 bytes a
   * key, and 1 of their runs') leave memory, and a buffer read from the map is zeroed for
   * the next era unless one is open already.
   */
  async rebuildEras(expiredBeforeMs: number, pacing: Pick<Pacing, 'pause'>): Promise<number> {
    const eras = this.#erasToRebuild(expiredBeforeMs);
    if (eras.length === 0) return 0;
    const newest = eras.at(-1)?.at(-1);
    if (newest !== undefined && newest === this.#groups.at(-1)) this.#closedEarly = newest;
    // Their entries may lie under the first run seq of an era rebuilt now: removed first.
    await this.#removeOrphanEras();
    let held = 0;
    for (const groups of eras) held += await this.#rebuildEra(groups, pacing.pause);
    return held;
  }

  /**
   * The groups to rebuild eras over, by era: consecutive groups outside any, up to
   * ERA_GROUPS_MAX and REBUILT_ERA_MAX_KEYS keys an era, two groups at least.
   */
  #erasToRebuild(expiredBeforeMs: number): Group[][] {
    const eras: Group[][] = [];
    let era: Group[] = [];
    let keys = 0;
    const end = (): void => {
      if (era.length >= 2) eras.push(era);
      era = [];
      keys = 0;
    };
    // A seal under way may be adding a run to the newest group.
    const last = this.#sealing.length > 0 ? this.#groups.length - 1 : this.#groups.length;
    for (const group of this.#groups.slice(0, last)) {
      const fits =
        group.era === null &&
        group.filter !== null &&
        group.maxAtMs >= expiredBeforeMs &&
        group.count <= REBUILT_ERA_MAX_KEYS &&
        group.runs.length > 0 &&
        group.runs.every((run) => run.blocks);
      if (!fits) {
        end();
        continue;
      }
      if (era.length === ERA_GROUPS_MAX || keys + group.count > REBUILT_ERA_MAX_KEYS) end();
      era.push(group);
      keys += group.count;
    }
    end();
    return eras;
  }

  /** Builds and stores an era over `groups` (`rebuildEras`): the groups it holds. */
  async #rebuildEra(groups: readonly Group[], pause: Pacing['pause']): Promise<number> {
    let keys = 0;
    let runBytes = 0;
    for (const group of groups)
      for (const run of group.runs) {
        keys += run.count;
        runBytes +=
          run.filter?.byteLength ?? KeyFilter.bytesFor(run.count, RUN_FILTER_BITS_PER_KEY);
      }
    const first = (groups[0] as Group).first;
    const lastRun = ((groups.at(-1) as Group).runs.at(-1) as Run).seq;
    const spare = this.#spareEra;
    const era = rebuiltEra(first, lastRun, keys, runBytes, spare, this.mapErasFrom);
    if (era.memory === spare) this.#spareEra = null;
    this.#rebuilding = era;
    try {
      if (era.untouched) await makeResident(era, pause);
      const filters: Array<[Run, KeyFilter]> = [];
      const held = (group: Group): boolean => this.#groups.includes(group);
      for (const group of groups)
        for (const run of group.runs) {
          if (!held(group)) break;
          const own = run.filter;
          const filter =
            own === null
              ? carveRunFilter(era, run.seq, run.count)
              : carveRunCopy(era, run.seq, own);
          assert(filter !== null, "a rebuilt era has room for its runs' filters");
          // A run without a filter of its own (sealed before runs had one) gets one now.
          const into = own === null ? [era.filter, filter] : [era.filter];
          const read = await this.#addRunKeys(run, into, pause);
          // Blocks removed meanwhile are those of a group dropped, which leaves the era.
          if (read !== run.count && held(group)) return 0;
          filters.push([run, filter]);
        }
      if (!groups.some(held)) return 0;
      const memory = await storeEra(this.#eraHome.root, this.#eraHome.table, era, pause);
      const kept = groups.filter(held);
      if (kept.length === 0) {
        await this.#removeEras([era.first], 'the removal of an idempotency era rebuilt in vain');
        return 0;
      }
      this.#rebuilt(era, kept, filters);
      if (memory !== null && this.#openEra === null) this.#spareEra ??= memory;
      return kept.length;
    } finally {
      this.#rebuilding = null;
    }
  }

  /**
   * Adds the keys of `run` to `filters`, a slice of its blocks per turn, each key hashed from
   * its block's environment, customer and digest as sealing hashed it. Returns the keys read
   * (more than the run's count: the blocks did not read back in order, and it stops).
   */
  async #addRunKeys(
    run: Run,
    filters: readonly KeyFilter[],
    pause: Pacing['pause'],
  ): Promise<number> {
    const hashes = rebuildHashes;
    let read = 0;
    let from: RunKey | null = null;
    for (;;) {
      let count = 0;
      const untilMs = performance.now() + REBUILD_SLICE_MS;
      const last = readRunSlice(
        this.#runs,
        run,
        from,
        REBUILD_SLICE_BLOCKS,
        (environment, customerId, digest) => {
          keyHashes(environment, customerId, digest);
          hashes[2 * count] = KEY_HASHES[0] as number;
          hashes[2 * count + 1] = KEY_HASHES[1] as number;
          count++;
        },
        () => count >= REBUILD_SLICE_KEYS || performance.now() >= untilMs,
      );
      if (last === null) return read;
      for (const filter of filters) {
        filter.readAhead(hashes, count);
        for (let i = 0; i < count; i++) {
          KEY_HASHES[0] = hashes[2 * i] as number;
          KEY_HASHES[1] = hashes[2 * i + 1] as number;
          filter.add();
        }
      }
      read += count;
      if (read > run.count) return read;
      from = last;
      await pause();
    }
  }

  /**
   * A rebuilt era is stored: it answers for `groups` (what is left of those it was built
   * over) from now on, their runs' filters are its copies, and their own leave memory.
   */
  #rebuilt(era: Era, groups: readonly Group[], filters: ReadonlyArray<[Run, KeyFilter]>): void {
    for (const [index, group] of groups.entries()) {
      group.era = era;
      group.eraIndex = index;
      group.filter = null;
    }
    for (const [run, filter] of filters) run.filter = filter;
    era.groups = groups.length;
    const after = this.#eras.findIndex((other) => other.first > era.first);
    this.#eras.splice(after < 0 ? this.#eras.length : after, 0, era);
    // A key marked clear of every era was not probed in this one.
    this.#filtersChanged();
  }

  #dropEra(era: Era): void {
    this.#eras.splice(this.#eras.indexOf(era), 1);
    this.#filtersChanged();
    const unstored = this.#erasToStore.indexOf(era);
    if (unstored >= 0) this.#erasToStore.splice(unstored, 1);
    if (this.#openEra === era) this.#openEra = null;
  }

  /** Keys in the layout before runs (one B-tree), not yet moved (O(1)). */
  get tableSize(): number {
    return (this.#table.getStats() as { entryCount: number }).entryCount;
  }

  /**
   * Moves the keys of the layout before runs into runs, a slice per turn, leaving behind
   * the ones used before `expiredBeforeMs`, then clears the old tables. The old table is
   * in key order, so its keys go into runs as they are read. A crash part-way leaves the
   * old table in place and the runs written so far: the next start moves it again (the
   * duplicates answer the same). Returns the keys moved.
   */
  async migrateTable(expiredBeforeMs: number, pacing: Pick<Pacing, 'pause'>): Promise<number> {
    let remaining = this.tableSize;
    if (remaining > 0) await this.#clearRun(this.#nextRunSeq, pacing);
    let moved = 0;
    let from: Array<string | number> | undefined;
    let writer: RunWriter | null = null;
    let group: Group | null = null;
    while (remaining > 0) {
      const range = from === undefined ? {} : { start: from };
      const slice = [...this.#table.getRange({ ...range, limit: KEY_SLICE + 1 })].filter(
        ({ key }) => from === undefined || !sameKey(key as unknown[], from),
      );
      if (slice.length === 0) break;
      for (const { key, value } of slice) {
        const [environment, customerId, scopeDigest] = key as [string, string, string];
        assert(environment === 'test' || environment === 'live', 'a stored key names its env');
        const stored = decodeStored(value, scopeDigest);
        remaining -= 1;
        if (stored.atMs < expiredBeforeMs) continue;
        if (writer === null) {
          const keys = Math.min(remaining + 1, MIGRATION_RUN_KEYS);
          group = this.#groupFor(keys, MIGRATION_RUN_KEYS);
          writer = new RunWriter(this.#root, this.#runs, this.#nextRunSeq, group, keys);
        }
        writer.put({ environment, customerId, scopeDigest, ...stored });
        moved += 1;
        if (writer.count === MIGRATION_RUN_KEYS) {
          await writer.committed();
          await this.#commitRun(writer, group as Group, pacing.pause);
          writer = null;
        }
      }
      from = (slice.at(-1) as { key: Array<string | number> }).key;
      if (writer !== null) await writer.committed();
      await pacing.pause();
    }
    if (writer !== null && writer.count > 0)
      await this.#commitRun(writer, group as Group, pacing.pause);
    await this.#storeEras(pacing);
    await flushedWrite(this.#root, this.#table.clearAsync(), 'the clearing of the old key table');
    await flushedWrite(
      this.#root,
      this.#tableExpiry.clearAsync(),
      'the clearing of the old expiry table',
    );
    return moved;
  }
}

function sameKey(a: readonly unknown[], b: readonly unknown[]): boolean {
  return a.length === b.length && a.every((part, i) => part === b[i]);
}

/** One customer's keys as an online snapshot carries them: its environment, id and keys. */
export type CutItem = [environment: 'test' | 'live', customerId: string, keys: CustomerKey[]];

/**
 * An online snapshot's cut of a key store (`KeyStore.cut`): the batches in memory at the
 * cut, up to the keys each held then, and the runs committed at the cut, read later one
 * after the other in key order, a slice at a time (`read`), each once. Nothing is copied at
 * the cut: a batch only grows after it (a key is set in place only once its earlier use
 * expired, a day after it was held, long after it was sealed), later keys go to slots,
 * batches and runs the cut does not read, a committed run never changes, and a sealed batch
 * is not cleared while a cut is open. A run dropped meanwhile (every key in it expired)
 * reads as what is left of it. A key may come twice (from a batch whose run committed just
 * before the cut, or a run a crash sealed twice): the later one is the newer use.
 *
 * Why not each customer's keys with the customer: a customer's range in every run is a
 * read per customer per run (3.7–8.3 µs each, measured over 30 to 300 runs and 10,000 to
 * 100,000 customers), and runs are sealed at least every 30 s while keys come: a day of
 * keys over a million customers would have taken hours. Read run by run, a key costs
 * ~0.5 µs however many customers hold them.
 */
export class KeyCut {
  readonly #table: BinaryDb;
  readonly #runs: readonly Run[];
  readonly #held: ReadonlyArray<readonly [HeldKeys, number]>;
  #release: (() => void) | null;
  #batch = 0;
  #slot = 0;
  #run = 0;
  /** The last entry read of the run being read (null: none yet). */
  #from: RunKey | null = null;

  /** `held`: each batch with its size at the cut; `release` is called once, on `close`. */
  constructor(
    table: BinaryDb,
    runs: readonly Run[],
    held: ReadonlyArray<readonly [HeldKeys, number]>,
    release: () => void,
  ) {
    this.#table = table;
    this.#runs = runs;
    this.#held = held;
    this.#release = release;
  }

  /**
   * Ends the cut (read to the end or not): its store may reuse sealed batches again.
   * Reading the last keys closes it too; closing again does nothing.
   */
  close(): void {
    this.#release?.();
    this.#release = null;
  }

  /** Whether every key of the cut has been read. */
  get done(): boolean {
    return this.#batch === this.#held.length && this.#run === this.#runs.length;
  }

  /**
   * The next keys of the cut, about `budget` of them (a run's block is read whole), a
   * customer's consecutive keys in one item. Throws on a corrupt block, as a lookup does.
   */
  read(budget: number): CutItem[] {
    const items: CutItem[] = [];
    let read = 0;
    while (read < budget && !this.done)
      read +=
        this.#batch < this.#held.length
          ? this.#readHeld(items, budget - read)
          : this.#readRun(items, budget - read);
    if (this.done) this.close();
    return items;
  }

  #readHeld(items: CutItem[], budget: number): number {
    const [batch, size] = this.#held[this.#batch] as readonly [HeldKeys, number];
    const end = Math.min(size, this.#slot + budget);
    const from = this.#slot;
    for (let slot = from; slot < end; slot++)
      addCut(
        items,
        batch.isLive(slot) ? 'live' : 'test',
        batch.customerIdOf(slot),
        batch.digestOf(slot),
        batch.fingerprintOf(slot),
        batch.atMsOf(slot),
      );
    this.#slot = end;
    if (end === size) {
      this.#batch++;
      this.#slot = 0;
    }
    return end - from;
  }

  #readRun(items: CutItem[], budget: number): number {
    let read = 0;
    const last = readRunSlice(
      this.#table,
      this.#runs[this.#run] as Run,
      this.#from,
      budget,
      (environment, customerId, digest, fingerprint, atMs) => {
        addCut(items, environment, customerId, digest, fingerprint, atMs);
        read++;
      },
      () => read >= budget,
    );
    if (last === null) {
      this.#run++;
      this.#from = null;
    } else this.#from = last;
    return Math.max(read, 1);
  }
}

/**
 * Reads a slice of `run`'s entries in key order, from the one after `from` (its first when
 * null): hands `visit` each key an entry holds (a block's every key; an entry of a run sealed
 * a key per entry, its one), and stops after `entries` entries or once `enough` says so after
 * one. Returns the last entry read, or null where none was left (the run's end). Throws on a
 * corrupt entry, as a lookup does.
 */
function readRunSlice(
  table: BinaryDb,
  run: Run,
  from: RunKey | null,
  entries: number,
  visit: (
    environment: 'test' | 'live',
    customerId: string,
    digest: string,
    fingerprint: string,
    atMs: number,
  ) => void,
  enough: () => boolean,
): RunKey | null {
  const what = `of run ${run.seq}`;
  let last: RunKey | null = null;
  for (const { key, value } of table.getRange({
    start: from ?? [run.seq],
    end: [run.seq + 1],
    limit: entries + 1,
  })) {
    if (from !== null && sameKey(key as RunKey, from)) continue;
    last = key as RunKey;
    const [, space, customerId, digest] = last;
    const environment = environmentOfSpace(space);
    if (run.blocks) {
      const block = decodeSections(value, what, run.sections);
      eachSection(block, (id, start, end) => {
        for (let k = start; k < end; k += 3)
          visit(
            environment,
            id,
            block[k] as string,
            block[k + 1] as string,
            block[k + 2] as number,
          );
      });
    } else {
      const stored = decodeStored(value, what);
      visit(environment, customerId, digest, stored.fingerprint, stored.atMs);
    }
    if (enough()) break;
  }
  return last;
}

/** Adds a key to `items`: to the last item where it is the same customer's. */
function addCut(
  items: CutItem[],
  environment: 'test' | 'live',
  customerId: string,
  digest: string,
  fingerprint: string,
  atMs: number,
): void {
  const last = items.at(-1);
  if (last !== undefined && last[1] === customerId && last[0] === environment)
    last[2].push([digest, fingerprint, atMs]);
  else items.push([environment, customerId, [[digest, fingerprint, atMs]]]);
}

/**
 * The batch's slots in the order its run is written in (HeldKeys.compare), built a slice
 * per turn. Comparing customer ids as strings for every pair of keys would take most of a
 * seal's sorting, so the customers are ranked first (one comparison sort over customers,
 * not keys); the keys are then counted into buckets by environment and customer place, in
 * one pass, and each bucket (a customer's keys in one environment) is sorted by digest.
 */
export async function runOrder(batch: HeldKeys, pause: () => Promise<void>): Promise<Int32Array> {
  while (!batch.indexCustomers(COUNT_SLICE)) await pause();
  await rankCustomers(batch, pause);
  const buckets = batch.buckets;
  // starts[b] is where bucket b begins in the order; starts[buckets] is the batch's size.
  const starts = new Int32Array(buckets + 1);
  for (let from = 0; from < batch.size; from += COUNT_SLICE) {
    const end = Math.min(batch.size, from + COUNT_SLICE);
    for (let slot = from; slot < end; slot++) {
      const after = batch.bucketOf(slot) + 1;
      starts[after] = (starts[after] as number) + 1;
    }
    await pause();
  }
  for (let b = 0; b < buckets; ) {
    for (const end = Math.min(buckets, b + COUNT_SLICE); b < end; b++)
      starts[b + 1] = (starts[b + 1] as number) + (starts[b] as number);
    await pause();
  }
  const next = starts.slice(0, buckets);
  const order = new Int32Array(batch.size);
  for (let from = 0; from < batch.size; from += COUNT_SLICE) {
    const end = Math.min(batch.size, from + COUNT_SLICE);
    for (let slot = from; slot < end; slot++) {
      const bucket = batch.bucketOf(slot);
      const at = next[bucket] as number;
      next[bucket] = at + 1;
      order[at] = slot;
    }
    await pause();
  }
  // A turn sorts up to SORT_CHUNK keys and passes up to COUNT_SLICE buckets.
  let sortedInTurn = 0;
  for (let b = 0; b < buckets; b++) {
    const from = starts[b] as number;
    const to = starts[b + 1] as number;
    if (to - from > SORT_CHUNK) await sortLargeBucket(order, from, to, batch.compare, pause);
    else if (to - from > 1) order.subarray(from, to).sort(batch.compare);
    sortedInTurn += to - from;
    if (sortedInTurn >= SORT_CHUNK || b % COUNT_SLICE === COUNT_SLICE - 1) {
      sortedInTurn = 0;
      await pause();
    }
  }
  return order;
}

/**
 * The hashes of `batch`'s keys in pairs, in the order of the filter blocks they set bits
 * in, counted into buckets by their first hash (unsigned) a slice per turn: every filter
 * places a key's block by that hash, in that order. Set in the order of the run's blocks
 * (by customer and digest), a key's bits in its era's filter of tens of megabytes are a
 * cache and TLB miss at a random place (~120 ns, read ahead); in this order a seal walks
 * each filter from start to end, a page at a time (~75 ns).
 */
export async function hashesInFilterOrder(
  batch: HeldKeys,
  pause: () => Promise<void>,
): Promise<Int32Array> {
  const shift = 32 - HASH_BUCKET_BITS;
  // starts[b + 1] counts bucket b's keys; summed, starts[b] is where bucket b begins.
  const starts = new Int32Array((1 << HASH_BUCKET_BITS) + 1);
  for (let from = 0; from < batch.size; from += COUNT_SLICE) {
    const end = Math.min(batch.size, from + COUNT_SLICE);
    for (let slot = from; slot < end; slot++) {
      batch.hashKey(slot);
      const after = ((KEY_HASHES[0] as number) >>> shift) + 1;
      starts[after] = (starts[after] as number) + 1;
    }
    await pause();
  }
  for (let b = 0; b < 1 << HASH_BUCKET_BITS; b++)
    starts[b + 1] = (starts[b + 1] as number) + (starts[b] as number);
  const hashes = new Int32Array(2 * batch.size);
  for (let from = 0; from < batch.size; from += COUNT_SLICE) {
    const end = Math.min(batch.size, from + COUNT_SLICE);
    for (let slot = from; slot < end; slot++) {
      batch.hashKey(slot);
      const first = KEY_HASHES[0] as number;
      const bucket = first >>> shift;
      const at = starts[bucket] as number;
      starts[bucket] = at + 1;
      hashes[2 * at] = first;
      hashes[2 * at + 1] = KEY_HASHES[1] as number;
    }
    await pause();
  }
  return hashes;
}

/** Sorts `order` from `from` to `to` (one customer's many keys): chunks, then merged. */
async function sortLargeBucket(
  order: Int32Array,
  from: number,
  to: number,
  compare: (a: number, b: number) => number,
  pause: () => Promise<void>,
): Promise<void> {
  const chunks: Int32Array[] = [];
  for (let at = from; at < to; at += SORT_CHUNK) {
    chunks.push(order.slice(at, Math.min(to, at + SORT_CHUNK)).sort(compare));
    await pause();
  }
  const merge = new SortedMerge(chunks, compare);
  for (let at = from; at < to; ) {
    for (const end = Math.min(to, at + SORT_CHUNK); at < end; at++) order[at] = merge.next();
    await pause();
  }
}

/**
 * Gives each of the batch's customers its place in id order, a slice per turn: chunks of
 * SORT_CHUNK customers sorted by id, then merged.
 */
async function rankCustomers(batch: HeldKeys, pause: () => Promise<void>): Promise<void> {
  const chunks: Int32Array[] = [];
  for (let from = 0; from < batch.customerCount; from += SORT_CHUNK) {
    chunks.push(batch.sortedCustomers(from, SORT_CHUNK));
    await pause();
  }
  const merge = new SortedMerge(chunks, batch.compareCustomers);
  while (!merge.done) {
    for (let n = 0; n < SORT_CHUNK && !merge.done; n++) batch.rankCustomer(merge.next());
    await pause();
  }
}

/**
 * Merges sorted chunks (of slots, or of customers) into one order: a binary heap of the
 * chunks by their next item, so each costs a few comparisons however many chunks there are.
 */
class SortedMerge {
  private readonly at: number[];
  /** Chunk indices with slots left, as a heap on their next slot (first in order on top). */
  private readonly heap: number[] = [];

  constructor(
    private readonly chunks: readonly Int32Array[],
    private readonly compare: (a: number, b: number) => number,
  ) {
    this.at = chunks.map(() => 0);
    for (let i = 0; i < chunks.length; i++) if ((chunks[i]?.length ?? 0) > 0) this.push(i);
  }

  get done(): boolean {
    return this.heap.length === 0;
  }

  /** The next slot in order. */
  next(): number {
    const best = this.heap[0];
    assert(best !== undefined, 'a merge is read only while it is not done');
    const chunk = this.chunks[best] as Int32Array;
    const position = this.at[best] as number;
    this.at[best] = position + 1;
    if (position + 1 < chunk.length) this.siftDown(0);
    else {
      const last = this.heap.pop() as number;
      if (this.heap.length > 0) {
        this.heap[0] = last;
        this.siftDown(0);
      }
    }
    return chunk[position] as number;
  }

  /** The next slot of chunk `i`. */
  private slot(i: number): number {
    return (this.chunks[i] as Int32Array)[this.at[i] as number] as number;
  }

  private push(i: number): void {
    const heap = this.heap;
    heap.push(i);
    let at = heap.length - 1;
    while (at > 0) {
      const parent = (at - 1) >> 1;
      if (this.compare(this.slot(heap[parent] as number), this.slot(i)) <= 0) break;
      heap[at] = heap[parent] as number;
      at = parent;
    }
    heap[at] = i;
  }

  private siftDown(from: number): void {
    const heap = this.heap;
    const moving = heap[from] as number;
    const slot = this.slot(moving);
    let at = from;
    for (;;) {
      const left = 2 * at + 1;
      if (left >= heap.length) break;
      const right = left + 1;
      let child = left;
      if (
        right < heap.length &&
        this.compare(this.slot(heap[right] as number), this.slot(heap[left] as number)) < 0
      )
        child = right;
      if (this.compare(slot, this.slot(heap[child] as number)) <= 0) break;
      heap[at] = heap[child] as number;
      at = child;
    }
    heap[at] = moving;
  }
}
