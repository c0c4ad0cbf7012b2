/**
 * A simulated LMDB environment for the fault simulator: the subset of lmdb-js the shard
 * store (storage/journal.ts) uses, over an in-memory disk whose commits and syncs the
 * simulator drives one at a time, in any order, and may fail.
 *
 * The model of the disk, as lmdb-js runs a shard environment (SHARD_ENV_OPTIONS):
 * - Asynchronous writes (`put`, `remove`, `childTransaction`) issued before the
 *   simulator's next `commit` form one transaction (eventTurnBatching). A commit makes
 *   them visible to reads and resolves their promises; their `flushed` promises (and
 *   `root.flushed`) resolve only when a sync of that transaction completes.
 * - Syncs complete in whatever order the simulator picks. A completed sync of
 *   transaction T makes T and every transaction committed before it durable (fdatasync
 *   flushes the whole file): durability is a prefix of the commit order.
 * - A failed commit rejects the transaction's writes and changes nothing; a failed sync
 *   rejects the `flushed` promises of that transaction.
 * - A process crash (kill -9) loses writes not yet committed and every promise of the
 *   dead process; committed transactions stay (in the page cache), synced or not. After a
 *   failed sync the simulator always cuts power instead (the kernel may have dropped the
 *   pages), which keeps nothing from the failed transaction on.
 * - A machine crash keeps every durable transaction, plus possibly some of the
 *   committed-but-unsynced ones after them (the kernel may have written them back), in
 *   order; the last surviving unsynced transaction's journal record may be torn.
 */
import { SHARD_DB_NAMES, type ShardDbName } from '../../storage/journal.js';
import type { DurableEnv } from '../../storage/lmdb-env.js';

type Key = number | string | ReadonlyArray<string | number>;
interface Entry {
  readonly key: Key;
  readonly value: Buffer;
}
type Table = Map<string, Entry>;
type DiskState = Map<string, Table>;

const DB_NAMES: readonly ShardDbName[] = SHARD_DB_NAMES;

function emptyState(): DiskState {
  return new Map(DB_NAMES.map((name) => [name, new Map()]));
}

function cloneState(state: DiskState): DiskState {
  return new Map([...state].map(([name, table]) => [name, new Map(table)]));
}

const keyString = (key: Key): string => JSON.stringify(key);

/** Orders keys as lmdb-js's ordered-binary does for the keys the store uses. */
function compareKeys(a: Key, b: Key): number {
  if (typeof a === 'number' && typeof b === 'number') return a - b;
  if (Array.isArray(a) && Array.isArray(b)) {
    for (let i = 0; i < Math.min(a.length, b.length); i++) {
      const order = compareKeys(a[i] as Key, b[i] as Key);
      if (order !== 0) return order;
    }
    return a.length - b.length; // a prefix sorts first
  }
  const x = keyString(a);
  const y = keyString(b);
  return x < y ? -1 : x > y ? 1 : 0;
}

interface Deferred<T> {
  readonly promise: Promise<T>;
  resolve(value: T): void;
  reject(error: unknown): void;
}

/** A deferred whose rejection nobody has to handle (lmdb-js's promises behave alike). */
function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (error: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  promise.catch(() => undefined);
  return { promise, resolve, reject };
}

/** One asynchronous write, as the simulator tracks it. */
export interface WriteOp {
  readonly kind: 'put' | 'remove' | 'child' | 'clear';
  readonly db: string;
  readonly key: Key;
  readonly value?: Buffer;
  readonly fn?: () => unknown;
  readonly epoch: number;
  readonly done: Deferred<unknown>;
  readonly flushed: Deferred<void>;
  /** A synchronous write (putSync, removeSync): it returns at commit; nobody awaits its sync. */
  readonly synchronous?: boolean;
  txn?: Txn;
}

export interface Txn {
  readonly id: number;
  readonly ops: WriteOp[];
  readonly after: DiskState;
  synced: boolean;
  failed: boolean;
}

export class SimDisk {
  /** What every transaction before `txns` left: on disk for certain. */
  private base: DiskState = emptyState();
  /** Committed transactions after `base`, in commit order. */
  txns: Txn[] = [];
  /** Writes issued since the last commit: the next transaction. */
  open: WriteOp[] = [];
  /** Transactions with an id up to this one are on disk. */
  durableId = 0;
  private nextTxnId = 1;
  /** Incarnation of the process using the disk: a crash strands the old one's promises. */
  epoch = 0;
  private view: DiskState = this.base;
  /** The state a child transaction is writing (putSync/removeSync go there), else null. */
  private child: DiskState | null = null;
  private flushWaiters: Array<{
    readonly upTo: number;
    readonly epoch: number;
    readonly d: Deferred<void>;
  }> = [];

  get lastCommittedId(): number {
    return this.txns.at(-1)?.id ?? this.durableId;
  }

  /** Committed transactions whose sync has not completed (or failed). */
  unsynced(): Txn[] {
    return this.txns.filter((t) => !t.synced && !t.failed);
  }

  /**
   * Whether a later transaction's completed sync covered `txn` (its pages are on disk) before
   * its own sync completed: that sync can no longer fail.
   */
  covered(txn: Txn): boolean {
    return txn.id <= this.durableId;
  }

  /** Whether a write is on disk: committed in a transaction covered by a completed sync. */
  isDurable(op: WriteOp | 'base'): boolean {
    if (op === 'base') return true;
    return op.txn !== undefined && op.txn.id <= this.durableId && !op.txn.failed;
  }

  /** The pending put of journal record `seq` (just issued by an append). */
  lastJournalPut(seq: number): WriteOp {
    for (let i = this.open.length - 1; i >= 0; i--) {
      const op = this.open[i] as WriteOp;
      if (op.kind === 'put' && op.db === 'journal' && op.key === seq) return op;
    }
    throw new Error(`no pending journal put of seq ${seq}`);
  }

  /** Commits the open writes as one transaction, or fails it (nothing of it is stored). */
  commit(fail = false): Txn | null {
    if (this.open.length === 0) return null;
    const ops = this.open;
    this.open = [];
    if (fail) {
      const error = new Error('Commit failed (simulated: MDB_PANIC)');
      for (const op of ops) op.done.reject(error);
      return null;
    }
    const state = cloneState(this.view);
    const results: Array<{ ok: boolean; value: unknown }> = [];
    for (const op of ops) {
      if (op.kind === 'child') {
        const before = cloneState(state);
        this.child = state;
        this.view = state;
        try {
          results.push({ ok: true, value: op.fn?.() });
        } catch (error) {
          // All or nothing: the child's writes are undone.
          for (const [name, table] of before) state.set(name, table);
          results.push({ ok: false, value: error });
        } finally {
          this.child = null;
        }
        continue;
      }
      const table = state.get(op.db) as Table;
      if (op.kind === 'clear') {
        table.clear();
        results.push({ ok: true, value: undefined });
        continue;
      }
      const existed = table.delete(keyString(op.key));
      if (op.kind === 'put')
        table.set(keyString(op.key), { key: op.key, value: op.value as Buffer });
      results.push({ ok: true, value: op.kind === 'put' ? true : existed });
    }
    const txn: Txn = { id: this.nextTxnId++, ops, after: state, synced: false, failed: false };
    for (const op of ops) op.txn = txn;
    this.txns.push(txn);
    this.view = state;
    ops.forEach((op, i) => {
      const result = results[i] as { ok: boolean; value: unknown };
      if (op.epoch !== this.epoch) return;
      if (result.ok) op.done.resolve(result.value);
      else op.done.reject(result.value);
    });
    return txn;
  }

  /** Completes (or fails) the sync of one committed transaction. */
  sync(txn: Txn, fail = false): void {
    if (txn.synced || txn.failed) return;
    if (fail && this.covered(txn))
      throw new Error(`txn ${txn.id} is on disk already: its sync cannot fail`);
    if (fail) {
      txn.failed = true;
      const error = new Error('fdatasync: Input/output error (simulated)');
      for (const op of txn.ops) if (op.epoch === this.epoch) op.flushed.reject(error);
      for (const w of this.flushWaiters)
        if (w.upTo >= txn.id && w.epoch === this.epoch) w.d.reject(error);
      return;
    }
    txn.synced = true;
    // A sync after a failed one does not make the failed transaction durable: the process
    // must have died on the failure (and the simulator crashes it before going on).
    const firstFailed = this.txns.find((t) => t.failed)?.id ?? Number.POSITIVE_INFINITY;
    if (txn.id < firstFailed) this.durableId = Math.max(this.durableId, txn.id);
    for (const op of txn.ops) if (op.epoch === this.epoch) op.flushed.resolve();
    this.flushWaiters = this.flushWaiters.filter((w) => {
      if (w.epoch !== this.epoch) return false;
      if (w.upTo > this.durableId) return true;
      w.d.resolve();
      return false;
    });
  }

  /**
   * kill -9: uncommitted writes and every promise of the process are gone; the page cache stays.
   */
  processCrash(): void {
    this.epoch++;
    this.open = [];
    this.flushWaiters = [];
  }

  /**
   * Power cut: keeps every durable transaction and, by `rand`, a run of the unsynced ones
   * after it; may tear the last kept unsynced transaction's journal record. Returns what
   * happened, for the failure report.
   */
  machineCrash(rand: () => number): string {
    this.epoch++;
    this.open = [];
    this.flushWaiters = [];
    const firstFailed = this.txns.find((t) => t.failed)?.id ?? Number.POSITIVE_INFINITY;
    const candidates = this.txns.filter((t) => t.id > this.durableId && t.id < firstFailed);
    const extra = rand() < 0.5 ? 0 : Math.floor(rand() * (candidates.length + 1));
    const keepId = extra === 0 ? this.durableId : (candidates[extra - 1] as Txn).id;
    const kept = [...this.txns].reverse().find((t) => t.id <= keepId);
    let state = kept === undefined ? this.base : kept.after;
    let torn = '';
    if (kept !== undefined && kept.id > this.durableId && rand() < 0.5) {
      const put = kept.ops.find((op) => op.kind === 'put' && op.db === 'journal');
      const journal = state.get('journal') as Table;
      const last = [...journal.values()].sort((a, b) => compareKeys(b.key, a.key))[0];
      if (put !== undefined && last !== undefined && last.key === put.key) {
        state = cloneState(state);
        const bytes = Buffer.from(last.value);
        // Torn: cut in half, or its last byte flipped.
        const cut = rand() < 0.5;
        if (!cut) bytes[bytes.length - 1] = (bytes[bytes.length - 1] as number) ^ 0xff;
        const tornBytes = cut ? bytes.subarray(0, Math.floor(bytes.length / 2)) : bytes;
        (state.get('journal') as Table).set(keyString(last.key), {
          key: last.key,
          value: Buffer.from(tornBytes),
        });
        torn = `, tore record ${String(last.key)}`;
      }
    }
    // What the cut kept is on disk, a failed transaction included when a later sync had
    // completed before its own failed (that fdatasync wrote its pages back).
    for (const t of this.txns) {
      if (t.id > keepId) continue;
      t.synced = true;
      t.failed = false;
    }
    this.base = state;
    this.view = state;
    this.txns = [];
    this.durableId = keepId;
    return (
      `machine crash: kept transactions up to ${keepId} (durable up ` +
      `to ${this.durableId})${torn}`
    );
  }

  /** A fresh handle on the disk for a new process: the lmdb-js surface ShardStore uses. */
  env(): DurableEnv<ShardDbName> {
    const disk = this;
    const epoch = this.epoch;
    const table = (name: string): Table => disk.view.get(name) as Table;
    const sorted = (name: string): Entry[] =>
      [...table(name).values()].sort((a, b) => compareKeys(a.key, b.key));
    const range = (
      name: string,
      options: { start?: Key; end?: Key; reverse?: boolean; limit?: number } = {},
    ): Entry[] => {
      // As lmdb-js reads a range: forward from `start` (inclusive) up to `end` (exclusive);
      // in reverse from `start` (inclusive) down to `end` (exclusive).
      const { start, end } = options;
      const reverse = options.reverse === true;
      let entries = sorted(name).filter((e) =>
        reverse
          ? (start === undefined || compareKeys(e.key, start) <= 0) &&
            (end === undefined || compareKeys(e.key, end) > 0)
          : (start === undefined || compareKeys(e.key, start) >= 0) &&
            (end === undefined || compareKeys(e.key, end) < 0),
      );
      if (reverse) entries = entries.reverse();
      return options.limit === undefined ? entries : entries.slice(0, options.limit);
    };
    const issue = (
      op: Omit<WriteOp, 'epoch' | 'done' | 'flushed'>,
    ): Promise<unknown> & { flushed?: Promise<void> } => {
      // a dead process's write: nothing happens
      if (disk.epoch !== epoch) return new Promise(() => undefined);
      const full: WriteOp = { ...op, epoch, done: deferred(), flushed: deferred() };
      disk.open.push(full);
      return op.kind === 'child'
        ? full.done.promise
        : Object.assign(full.done.promise, { flushed: full.flushed.promise });
    };
    /** A synchronous write: inside a child transaction it joins it; else it commits alone now. */
    const writeSync = (name: string, kind: 'put' | 'remove', key: Key, value?: Buffer): boolean => {
      if (disk.child !== null) {
        const t = disk.child.get(name) as Table;
        const existed = t.delete(keyString(key));
        if (kind === 'put') t.set(keyString(key), { key, value: value as Buffer });
        return kind === 'put' || existed;
      }
      if (disk.open.length > 0)
        throw new Error(
          'simulated lmdb: a synchronous write while asynchronous writes are pending is ' +
            'not modelled',
        );
      const existed = table(name).has(keyString(key));
      void issue(
        kind === 'put'
          ? { kind, db: name, key, value: value as Buffer, synchronous: true }
          : { kind, db: name, key, synchronous: true },
      );
      disk.commit();
      return kind === 'put' || existed;
    };
    const db = (name: string) => ({
      get: (key: Key) => table(name).get(keyString(key))?.value,
      doesExist: (key: Key) => table(name).has(keyString(key)),
      getRange: (options?: { start?: Key; end?: Key; reverse?: boolean; limit?: number }) =>
        range(name, options),
      getKeys: (options?: { start?: Key; end?: Key }) => range(name, options).map((e) => e.key),
      put: (key: Key, value: Buffer) => issue({ kind: 'put', db: name, key, value }),
      remove: (key: Key) => issue({ kind: 'remove', db: name, key }),
      clearAsync: () => issue({ kind: 'clear', db: name, key: '' }),
      putSync: (key: Key, value: Buffer) => writeSync(name, 'put', key, value),
      removeSync: (key: Key) => writeSync(name, 'remove', key),
      childTransaction: (fn: () => unknown) => issue({ kind: 'child', db: name, key: '', fn }),
      getStats: () => ({
        entryCount: table(name).size,
        lastTxnId: disk.lastCommittedId,
        mapSize: 0,
        lastPageNumber: 0,
        pageSize: 4096,
      }),
    });
    const root = {
      get flushed(): Promise<void> {
        const d = deferred<void>();
        if (disk.epoch !== epoch) return new Promise(() => undefined);
        if (disk.lastCommittedId <= disk.durableId) d.resolve();
        else disk.flushWaiters.push({ upTo: disk.lastCommittedId, epoch, d });
        return d.promise;
      },
      close: () => Promise.resolve(),
    };
    const dbs = Object.fromEntries(DB_NAMES.map((name) => [name, db(name)]));
    return { root, dbs } as unknown as DurableEnv<ShardDbName>;
  }
}
