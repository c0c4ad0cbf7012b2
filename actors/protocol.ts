/**
 * Messages between the HTTP front end and the shard workers.
 *
 * The front end sends one `batch` per worker per event-loop turn, never one message per
 * request (a wake-up costs ~30 µs; batching amortises it to a few µs). Replies come back
 * batched the same way, as typed replies (ShardReply) whose answer is already JSON text,
 * so the front end only picks a status and writes bytes. Commands are validated at the
 * edge before they are put in a batch; the core asserts the same invariants again. The
 * op table (ops.ts) says how each op's command fills its wire slots.
 */
import type { Environment } from '../shared/environment.js';
import type { BillingConfig } from './billing-config.js';
import type { GcPauseStats } from './gc-pauses.js';
import type { ViewChanges } from './has-view.js';
import type { HistogramData } from './histogram.js';
import type { Command } from './customer.js';
import { OPS, OPS_BY_CODE, type WireValue } from './ops.js';

export type { Command, Environment };

/**
 * Marks an audited write: who made it (the key's id) and a reference unique per request.
 * The shard derives the entry itself (ops.ts, the op table) and, if the write changes anything,
 * stores it in the change's own transaction (journal.ts, `audits`); the audit chain records
 * the reference too, so recovery appends exactly the stored entries the chain lacks.
 */
export interface AuditTag {
  readonly ref: string;
  readonly actor: string;
  /**
   * Set when the environment has used up its daily quota of audit entries (the number):
   * the shard then refuses the write if it would change anything, and so be audited.
   */
  readonly auditQuotaReached?: number;
}

/** An audited write's entry as the shard stores it: with the time the change was decided. */
export interface PendingAudit {
  readonly ref: string;
  readonly environment: Environment;
  readonly action: string;
  readonly resourceType: string;
  /** Always the customer's id (every shard write is one customer's), so it also finds the shard. */
  readonly resourceId: string;
  readonly actor: string;
  readonly data: Readonly<Record<string, unknown>>;
  readonly atMs: number;
}

/** Whether `value`, read back from disk, has a PendingAudit's fields. */
export function isPendingAudit(value: unknown): value is PendingAudit {
  if (typeof value !== 'object' || value === null) return false;
  const audit = value as Readonly<Record<keyof PendingAudit, unknown>>;
  return (
    typeof audit.ref === 'string' &&
    (audit.environment === 'test' || audit.environment === 'live') &&
    typeof audit.action === 'string' &&
    typeof audit.resourceType === 'string' &&
    typeof audit.resourceId === 'string' &&
    typeof audit.actor === 'string' &&
    typeof audit.data === 'object' &&
    audit.data !== null &&
    typeof audit.atMs === 'number'
  );
}

/** A command with the front end's request id, which the reply carries back. */
export interface Envelope {
  readonly id: number;
  readonly command: Command;
  /** Present on audited writes: their entry is stored with the change if it changes anything. */
  readonly audit?: AuditTag;
}

/**
 * Commands on the wire: a flat array of primitives, COMMAND_SLOTS per command, because structured
 * cloning a flat array costs a fraction of cloning one object per command (measured: postMessage
 * was the front end's largest cost with objects). Slots: [id, op, environment, customerId, key, a,
 * b, audit] where op is the op's code, a/b are filled and read by its record in the op table
 * (wireA, wireB, fromWire), and audit is the command's AuditTag as `actor ref` (two short strings:
 * cheap to clone) or null.
 */
export type WireBatch = Array<number | string | WireValue>;

export const COMMAND_SLOTS = 8;

/** Appends one command to a wire batch (one push of eight values: no temporary arrays). */
export function pushCommand(
  wire: WireBatch,
  id: number,
  command: Command,
  tag: AuditTag | null = null,
): void {
  const audit =
    tag === null
      ? null
      : `${tag.auditQuotaReached === undefined ? '' : `!${tag.auditQuotaReached} `}` +
        `${tag.actor} ${tag.ref}`;
  const env = command.environment === 'live' ? 1 : 0;
  const op = OPS[command.op];
  wire.push(
    id,
    op.code,
    env,
    command.customerId,
    command.key,
    op.wireA(command),
    op.wireB(command),
    audit,
  );
}

/** Reads the command at `offset` of a wire batch (the inverse of pushCommand). */
export function readCommand(wire: WireBatch, offset: number): Envelope {
  const envelope = readBareCommand(wire, offset);
  const text = wire[offset + 7] as string | null;
  if (text === null) return envelope;
  // `!N actor ref` when the audit quota of N entries a day is reached, else `actor ref`.
  const quota = text.startsWith('!') ? text.slice(1, text.indexOf(' ')) : null;
  const audit = quota === null ? text : text.slice(quota.length + 2);
  const space = audit.indexOf(' ');
  const tag = { actor: audit.slice(0, space), ref: audit.slice(space + 1) };
  return {
    ...envelope,
    audit: quota === null ? tag : { ...tag, auditQuotaReached: Number(quota) },
  };
}

function readBareCommand(wire: WireBatch, offset: number): Envelope {
  const op = OPS_BY_CODE[wire[offset + 1] as number];
  if (op === undefined) throw new Error(`unknown op code ${String(wire[offset + 1])}`);
  const address = {
    environment: wire[offset + 2] === 1 ? ('live' as const) : ('test' as const),
    customerId: wire[offset + 3] as string,
    key: wire[offset + 4] as string,
  };
  return {
    id: wire[offset] as number,
    command: op.fromWire(address, wire[offset + 5] as WireValue, wire[offset + 6] as WireValue),
  };
}

export function decodeBatch(wire: WireBatch): Envelope[] {
  const envelopes: Envelope[] = [];
  for (let offset = 0; offset < wire.length; offset += COMMAND_SLOTS)
    envelopes.push(readCommand(wire, offset));
  return envelopes;
}

export type ToWorker =
  | {
      readonly t: 'config';
      readonly environment: Environment;
      readonly version: number;
      readonly config: BillingConfig;
    }
  | { readonly t: 'batch'; readonly wire: WireBatch }
  | { readonly t: 'stats'; readonly requestId: number }
  /** Take this shard's cut of an online snapshot now and write it to `partPath`. */
  | { readonly t: 'cut'; readonly snapshotId: string; readonly partPath: string }
  /** These audit entries are durable in the chain: the shard may forget its copies. */
  | { readonly t: 'auditsRecorded'; readonly refs: readonly string[] }
  | { readonly t: 'stop' };

/** How a shard's answer to one command came out; the front end maps it to an HTTP status. */
export type ReplyOutcome = 'ok' | 'created' | 'deleted' | 'rejected';

/**
 * What the command did, for the audit log: a write changed something ('wrote') or
 * nothing ('unchanged': a replay, or an upsert repeating what is stored); reads and
 * rejections change nothing and write nothing ('none').
 */
export type AuditEffect = 'wrote' | 'unchanged' | 'none';

/**
 * A shard's answer to one command. `body` is JSON text: the answer's value ('' for
 * 'deleted'), or for 'rejected' the core's Rejection, which the front end renders as an
 * error from its catalog.
 */
export type ShardReply = [outcome: ReplyOutcome, body: string, effect: AuditEffect];

/** Replies flattened as [id, outcome, body, effect, id, ...] to keep cloning cheap. */
export type ReplyBatch = Array<number | string>;

/** Slots per reply in a ReplyBatch. */
export const REPLY_SLOTS = 4;

export interface WorkerStats {
  readonly customers: number;
  readonly lastSeq: number;
  readonly snapshotSeq: number;
  readonly replayedBatches: number;
  readonly droppedTornTail: boolean;
  /** Journal records after a missing one (a failed append), dropped as never acknowledged. */
  readonly droppedAfterGap: number;
  /**
   * Present when this start checked the customer index against the recovered customers
   * (records were dropped): the rows it rewrote and removed.
   */
  readonly indexRowsRepaired?: { readonly rewritten: number; readonly removed: number };
  /** How long the recovery barrier (ShardStore.syncRecovered) took, in milliseconds. */
  readonly recoverySyncMs: number;
  /**
   * Idempotency keys held in memory again from the journal records after their last seal
   * (they are in no run yet: the next seal writes them).
   */
  readonly idempotencyKeysReheld: number;
  /**
   * Present when this start migrated the data dir's idempotency keys into their table
   * (the first start on a data dir of the older layout, or a new one): how many it moved.
   */
  readonly idempotencyKeysMigrated?: number;
}

/** A shard's finished part of an online snapshot. */
export interface CutResult {
  /** The journal seq holding the last event the cut includes. */
  readonly position: number;
  readonly frames: number;
  readonly customers: number;
  readonly bytes: number;
}

/** What a worker reports on request (status, metrics): cheap counters, nothing scanned. */
export interface ShardLiveStats {
  readonly customers: number;
  /** Idempotency keys stored: in runs on disk (expired ones not yet dropped) and in memory. */
  readonly idempotencyEntries: number;
  /** Idempotency keys held in memory, not yet sealed into a run. */
  readonly idempotencyKeysInMemory: number;
  /** Sealed runs of idempotency keys on disk. */
  readonly idempotencyRuns: number;
  /** Eras of groups of runs (one filter each), the open one included. */
  readonly idempotencyEras: number;
  /** Groups the open era holds at most (0: none is open). */
  readonly idempotencyOpenEraGroups: number;
  /** Groups of runs outside any era, each probed by its own filter. */
  readonly idempotencyGroupsOutsideEras: number;
  /** The worker's memory the filters of the eras, groups and runs take, in bytes. */
  readonly idempotencyFilterBytes: number;
  /** Closed eras' filters read from the memory map (file pages), in bytes. */
  readonly idempotencyFilterMappedBytes: number;
  readonly lastSeq: number;
  readonly snapshotSeq: number;
  readonly journalRecords: number;
  /** Bytes of the LMDB environment's data file in use. */
  readonly usedBytes: number;
  /** When the shard last stored a snapshot of itself (null: never, since start). */
  readonly lastSnapshotAtMs: number | null;
  /** Bytes of this worker's V8 heap in use. */
  readonly heapUsedBytes: number;
  /** This worker's garbage-collection pauses since start. */
  readonly gc: GcPauseStats;
  /** Automatic snapshots this shard stored since start. */
  readonly snapshotsTaken: number;
  /** The latest automatic snapshot: cut to stored, in ms (null: none since start). */
  readonly lastSnapshotMs: number | null;
  /**
   * Its longest stretch of work on the worker's thread, in ms: a slice of the copy, or the
   * transaction that stores it.
   */
  readonly lastSnapshotPauseMsMax: number | null;
  /**
   * The longest such stretch less the thread's waits for a core in it: a stretch timed by
   * the clock also counts the time other threads had the cores (null: none yet, or
   * unknown on this system).
   */
  readonly lastSnapshotWorkMsMax: number | null;
  /**
   * Of those stretches, the transaction that stored the latest snapshot, by the clock and
   * less the thread's waits for a core (null: none yet; the second also when unknown): a
   * hold longer than this was a slice of the copy.
   */
  readonly lastSnapshotStoreMs: number | null;
  readonly lastSnapshotStoreWorkMs: number | null;
  /** Journal appends since start: milliseconds from append issued to durable (metrics). */
  readonly journalFlushMs: HistogramData;
  /** Events per journal record since start, i.e. the size of each group commit (metrics). */
  readonly journalBatchEvents: HistogramData;
}

export type FromWorker =
  /**
   * `pendingAudits`: stored audit entries not yet confirmed in the audit chain (a crash came
   * between).
   */
  | {
      readonly t: 'ready';
      readonly stats: WorkerStats;
      readonly pendingAudits: readonly PendingAudit[];
    }
  | { readonly t: 'stats'; readonly requestId: number; readonly stats: ShardLiveStats }
  | {
      readonly t: 'cutProgress';
      readonly snapshotId: string;
      readonly done: number;
      readonly total: number;
    }
  | { readonly t: 'cutDone'; readonly snapshotId: string; readonly result: CutResult }
  | { readonly t: 'cutFailed'; readonly snapshotId: string; readonly error: string }
  /**
   * The eras of idempotency filters a crash left unstored are rebuilt and stored: `groups`
   * groups of runs, `ms` after the worker began to serve (it served meanwhile).
   */
  | { readonly t: 'erasRebuilt'; readonly groups: number; readonly ms: number }
  /** `view`: changes to the front end's `has` view (has-view.ts), applied before the replies. */
  | { readonly t: 'replies'; readonly replies: ReplyBatch; readonly view: ViewChanges }
  | { readonly t: 'stopped' };
