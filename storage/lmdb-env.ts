/**
 * How Tally opens an LMDB environment. It lives in one place because Tally's durability
 * rule — a write's promise resolves only once the write is on disk, so a reply can never
 * leave before its data is durable — depends entirely on these options and on which
 * promise a caller waits for. There are two option sets: DURABLE_ENV_OPTIONS (the
 * control store: keys, configuration, audit), described here, where the write's own
 * promise means on disk; and SHARD_ENV_OPTIONS (the shard journals, below), where only
 * its `flushed` promise does, so shard stores wait through `flushedWrite`.
 *
 * What guarantees what for DURABLE_ENV_OPTIONS (read in lmdb-js 3.5.6's source, and
 * checked with strace by test/storage-durability.test.ts):
 * - `overlappingSync: false`: the write thread begins each batch transaction WITHOUT
 *   MDB_NOSYNC (src/writer.cpp, WriteWorker::Write), so `mdb_txn_commit` fdatasyncs the
 *   data pages and then writes the meta page through the O_DSYNC descriptor before it
 *   returns (mdb.c: mdb_txn_commit → mdb_env_sync0 → mdb_env_write_meta). Only after it
 *   returns does the thread set TXN_COMMITTED, the flag that resolves the JS promise of
 *   every put/remove/transaction in that batch (write.js, resolveWrites/resolveCommit).
 *   So an awaited write is on disk. With the default `overlappingSync: true` lmdb-js's README
 *   says a write's promise resolves at commit and only `db.flushed` means durable; we
 *   do not depend on that mode, whatever its current implementation does.
 * - `noSync: false` / `noMetaSync: false`: with MDB_NOSYNC set, mdb_env_sync0 skips the
 *   fdatasync entirely; with MDB_NOMETASYNC the meta page is not written synchronously.
 * - Synchronous writes (putSync/removeSync outside a batch) begin their transaction with
 *   flags 2 rather than 0x10002 (NO_SYNC_FLUSH) when overlappingSync is off (write.js), so
 *   they too are synced before returning. If an asynchronous batch is open at that moment
 *   lmdb-js folds the write into it; it is then durable when that batch commits.
 * - `eventTurnBatching: true` groups every asynchronous write issued in one event-loop
 *   turn into one transaction, hence one fsync for all of them (group commit).
 * - A write that fails (disk full, I/O error) rejects every promise of its batch with
 *   "Commit failed"; lmdb-js logs the cause and ALSO rejects a shared `error.commitError`
 *   promise that, left alone, is an unhandled rejection. `durableWrite` below turns that
 *   into one rejection per write carrying the real cause.
 *
 * Surprise worth knowing: in lmdb-js 3.5.6 the default overlappingSync mode also syncs
 * inside mdb_txn_commit (its `done:` block, after releasing the write lock) before the
 * promise resolves, and with it on our strace test passes too. lmdb-js's README documents the
 * opposite, so we keep overlappingSync off and rely only on documented behaviour.
 */
import { open, type Database, type RootDatabase, type RootDatabaseOptions } from 'lmdb';
import { decodeRecord } from './codec.js';

/**
 * Options for every Tally environment. Exported so tests can open an environment exactly
 * the way the stores do (to damage it on purpose, or to check what a child process sees).
 */
export const DURABLE_ENV_OPTIONS = {
  // A write's promise resolves only after fdatasync + synced meta write (see header).
  overlappingSync: false,
  noSync: false,
  noMetaSync: false,
  // Writes go through write(2), not a writable map: a stray pointer cannot scribble on the
  // data, and child transactions (used for all-or-nothing snapshots) stay available.
  useWritemap: false,
  // All async writes of one event-loop turn share one transaction and one fsync.
  eventTurnBatching: true,
  // Commit at the next turn: shards batch commands themselves, so waiting longer would only
  // add latency to every reply.
  commitDelay: 0,
  // Initial address space only: lmdb-js doubles the map when a transaction runs out of
  // pages (mdb.c mdb_page_alloc, "lmdb-js addition"), so this is a starting point, not a
  // cap. The file grows with the data (no writable map, so it is never preallocated).
  mapSize: 256 * 1024 * 1024,
  // A shard environment uses thirteen named databases (journal.ts, SHARD_DB_NAMES); a
  // little headroom, no more, because LMDB scans this table linearly.
  maxDbs: 16,
} as const satisfies RootDatabaseOptions;

/** Page size of a shard environment created by this release (see SHARD_ENV_OPTIONS). */
export const SHARD_PAGE_BYTES = 16_384;

/**
 * Options for a shard worker's environment (its journal, snapshot and customer index),
 * which takes every durable write of the hot path. It differs in two respects, both
 * because measurement asked for them: its page size (below), and `overlappingSync: true`,
 * which syncs each transaction after LMDB's write lock is released, so the next
 * transaction is written while the previous one syncs; a shard keeps several appends in
 * flight to use that (actors/shard.ts; ~+15% durable consume at 50 connections). In this
 * mode a write's promise resolves when its transaction is committed, not when it is on
 * disk, so `separateFlushed` gives each write a `flushed` promise that resolves once the
 * OS reports the sync done: the only promise this module lets a shard act on
 * (`flushedWrite`). The front end opens the same environments (customer index reads)
 * with the same options: lmdb-js shares one native environment per path within a
 * process. A crash of the process (not the machine) leaves committed-but-unsynced
 * transactions in the page cache, where lmdb-js finds them again (same boot id); none of
 * them was acknowledged.
 */
export const SHARD_ENV_OPTIONS = {
  ...DURABLE_ENV_OPTIONS,
  overlappingSync: true,
  separateFlushed: true,
  // Pages of 16 KiB rather than 4 KiB, for environments created from now on (LMDB keeps
  // the page size a file was created with). A journal record holds a whole batch (often
  // 5-15 KiB): with 4 KiB pages it needs several contiguous overflow pages, and once the
  // journal's pruning has filled the free list, finding such runs among single free
  // pages costs LMDB's allocator so much CPU that a shard's write rate fell by half or
  // more after each snapshot. A record of up to 16 KiB takes one page, any free page.
  pageSize: SHARD_PAGE_BYTES,
} as const satisfies RootDatabaseOptions;

/** Every named database holds our own framed records (codec.ts), keyed by ordered-binary keys. */
export const BINARY_DB_OPTIONS = {
  encoding: 'binary',
  keyEncoding: 'ordered-binary',
} as const;

/** A key of a Tally table: a number, a string or an array of them (ordered-binary). */
export type BinaryKey = number | string | (string | number)[];

export type BinaryDb = Database<Buffer, BinaryKey>;

export interface DurableEnv<Name extends string> {
  readonly root: RootDatabase;
  readonly dbs: Readonly<Record<Name, BinaryDb>>;
}

/**
 * Opens (creating if needed) the environment at directory `path` with the named
 * databases. Throws if LMDB cannot open it (permissions, a different process holding it
 * with incompatible flags, a corrupt file).
 */
export function openDurableEnv<Name extends string>(
  path: string,
  names: readonly Name[],
  options: RootDatabaseOptions = DURABLE_ENV_OPTIONS,
): DurableEnv<Name> {
  const root = open({ path, ...options });
  const dbs = {} as Record<Name, BinaryDb>;
  for (const name of names) {
    dbs[name] = root.openDB({ name, ...BINARY_DB_OPTIONS }) as BinaryDb;
  }
  return { root, dbs };
}

/**
 * `db` (or an environment's root), its thread's read snapshot renewed: reads from it see every
 * commit made so far, by any thread. lmdb-js keeps a thread's snapshot until a timer resets it,
 * so a thread that reads a table another thread writes would otherwise miss a commit made
 * since its last read in the same turn, or, on a thread whose timers do not run (a piscina
 * worker waiting for its next task), every commit since its first read.
 */
export function freshSnapshot<Db extends { resetReadTxn(): void }>(db: Db): Db {
  db.resetReadTxn();
  return db;
}

/**
 * Reads and decodes one framed record. Returns undefined when the key is absent; throws
 * when the stored bytes fail their checksum or do not decode (`what` names the record in
 * the message), because stored state that fails verification must stop the process.
 */
export function readRecord(db: BinaryDb, key: number | string, what: string): unknown {
  const bytes = db.get(key);
  if (bytes === undefined) return undefined;
  const decoded = decodeRecord(bytes);
  if (!decoded.ok) throw new Error(`${what} is corrupt (${decoded.reason})`);
  return decoded.value;
}

/**
 * Adapts an lmdb-js write promise to Tally's contract: resolves with the write's own result once it
 * is durable; rejects with an Error naming `what` and carrying the failure's cause (as LMDB reports
 * it, e.g. "Input/output error") if its transaction failed. The caller must treat that rejection as
 * fatal.
 */
export function durableWrite<T>(write: Promise<T>, what: string): Promise<T> {
  return write.then(
    (result) => result,
    (error: unknown) => {
      const commitError = (error as { commitError?: Promise<unknown> } | null)?.commitError;
      const fail = (cause: unknown): never => {
        throw new Error(`${what} was not committed: ${describe(cause)}`, { cause });
      };
      // lmdb-js rejects commitError synchronously right after rejecting the writes
      // (write.js, startWriting's callback), so it has settled by the time we get here.
      return commitError === undefined ? fail(error) : commitError.then(() => fail(error), fail);
    },
  );
}

/**
 * `durableWrite` for an environment opened with SHARD_ENV_OPTIONS: resolves with the
 * write's result once it is flushed to disk, using the write's own `flushed` promise
 * (separateFlushed), or, for a transaction (which has none), the environment's
 * `flushed`, which covers every write committed before it is read. Rejects as
 * `durableWrite` does.
 */
export function flushedWrite<T>(root: RootDatabase, write: Promise<T>, what: string): Promise<T> {
  const own = (write as Promise<T> & { flushed?: PromiseLike<unknown> }).flushed;
  return durableWrite(write, what).then(async (result) => {
    await (own ?? root.flushed);
    return result;
  });
}

/** For call sites whose contract is Promise<void>: durable, nothing to report. */
export async function durableVoid(write: Promise<unknown>, what: string): Promise<void> {
  await durableWrite(write, what);
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** Env-wide numbers lmdb-js reports (`getStats()` is typed `{}` upstream). */
export interface EnvInfo {
  readonly lastTxnId: number;
  readonly mapSizeBytes: number;
  readonly usedBytes: number;
}

export function envInfo(db: BinaryDb): EnvInfo {
  const stats = db.getStats() as {
    lastTxnId: number;
    mapSize: number;
    lastPageNumber: number;
    pageSize: number;
  };
  return {
    lastTxnId: stats.lastTxnId,
    mapSizeBytes: stats.mapSize,
    usedBytes: (stats.lastPageNumber + 1) * stats.pageSize,
  };
}
