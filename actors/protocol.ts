/**
 * Messages between the HTTP front end and the shard workers.
 *
 * The front end sends one `batch` per worker per event-loop turn, never one message per
 * request (a wake-up costs ~30 µs; batching amortises it to a few µs). Replies come back
 * batched the same way, already rendered to status and JSON body so the front end only
 * writes bytes. Commands are validated at the edge before they are put in a batch; the
 * core asserts the same invariants again.
 */
import type { BillingConfig } from './billing-config.js';
import type { HistogramData } from './histogram.js';
import type { Command, ContextRequest, ContractInput, Environment, ProfilePatch } from './customer.js';

export type { Command, Environment };

/**
 * Marks an audited write: who made it (the key's id) and a reference unique per request.
 * The shard derives the entry itself (audit-of.ts) and, if the write changes anything,
 * stores it in the change's own transaction (journal.ts, `audits`); the audit chain records
 * the reference too, so recovery appends exactly the stored entries the chain lacks.
 */
export interface AuditTag {
  readonly ref: string;
  readonly actor: string;
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

/** A command with the front end's request id, which the reply carries back. */
export interface Envelope {
  readonly id: number;
  readonly command: Command;
  /** Present on audited writes: their entry is stored with the change if it changes anything. */
  readonly audit?: AuditTag;
}

/**
 * Commands on the wire: a flat array of primitives, COMMAND_SLOTS per command, because
 * structured cloning a flat array costs a fraction of cloning one object per command
 * (measured: postMessage was the front end's largest cost with objects). Slots:
 * [id, op, environment, customerId, key, a, b, audit] where a/b depend on the op and
 * audit is the command's AuditTag as `actor ref` (two short strings: cheap to clone) or null.
 */
export type WireBatch = Array<number | string | bigint | boolean | null | ContractInput | ProfilePatch | ContextRequest>;

export const COMMAND_SLOTS = 8;

const OPS = ['has', 'limit', 'balance', 'consume', 'refund', 'limitSettings', 'usageSettings', 'grantLot', 'getContract', 'putContract', 'deleteContract', 'upsertCustomer', 'context'] as const;
const OP_CODES: Record<Command['op'], number> = {
  has: 0,
  limit: 1,
  balance: 2,
  consume: 3,
  refund: 4,
  limitSettings: 5,
  usageSettings: 6,
  grantLot: 7,
  getContract: 8,
  putContract: 9,
  deleteContract: 10,
  upsertCustomer: 11,
  context: 12,
};

/** Appends one command to a wire batch (one push of eight values: no temporary arrays). */
export function pushCommand(wire: WireBatch, id: number, command: Command, tag: AuditTag | null = null): void {
  const audit = tag === null ? null : `${tag.actor} ${tag.ref}`;
  const env = command.environment === 'live' ? 1 : 0;
  const op = OP_CODES[command.op];
  switch (command.op) {
    case 'has':
    case 'limit':
    case 'balance':
      wire.push(id, op, env, command.customerId, command.key, null, null, audit);
      return;
    case 'consume':
    case 'refund':
      wire.push(id, op, env, command.customerId, command.key, command.amountMicros, command.idempotencyKey ?? null, audit);
      return;
    case 'limitSettings':
      wire.push(id, op, env, command.customerId, command.key, command.purchased ?? null, command.autoExpansionEnabled ?? null, audit);
      return;
    case 'usageSettings':
      wire.push(id, op, env, command.customerId, command.key, command.overageEnabled, null, audit);
      return;
    case 'grantLot':
      wire.push(id, op, env, command.customerId, command.key, command.amountMicros, command.lotId, audit);
      return;
    case 'getContract':
    case 'deleteContract':
      wire.push(id, op, env, command.customerId, command.key, null, null, audit);
      return;
    case 'putContract':
      wire.push(id, op, env, command.customerId, command.key, command.contract, null, audit);
      return;
    case 'upsertCustomer':
      wire.push(id, op, env, command.customerId, command.key, command.patch, null, audit);
      return;
    case 'context':
      wire.push(id, op, env, command.customerId, command.key, command.patch, command.request, audit);
      return;
  }
}

/** Reads the command at `offset` of a wire batch (the inverse of pushCommand). */
export function readCommand(wire: WireBatch, offset: number): Envelope {
  const envelope = readBareCommand(wire, offset);
  const audit = wire[offset + 7] as string | null;
  if (audit === null) return envelope;
  const space = audit.indexOf(' ');
  return { ...envelope, audit: { actor: audit.slice(0, space), ref: audit.slice(space + 1) } };
}

function readBareCommand(wire: WireBatch, offset: number): Envelope {
  const id = wire[offset] as number;
  const op = OPS[wire[offset + 1] as number];
  const base = {
    environment: wire[offset + 2] === 1 ? ('live' as const) : ('test' as const),
    customerId: wire[offset + 3] as string,
    key: wire[offset + 4] as string,
  };
  const a = wire[offset + 5];
  const b = wire[offset + 6];
  switch (op) {
    case 'has':
    case 'limit':
    case 'balance':
      return { id, command: { op, ...base } };
    case 'consume':
    case 'refund':
      return { id, command: { op, ...base, amountMicros: a as bigint, ...(b === null ? {} : { idempotencyKey: b as string }) } };
    case 'limitSettings':
      return {
        id,
        command: {
          op,
          ...base,
          ...(a === null ? {} : { purchased: a as number }),
          ...(b === null ? {} : { autoExpansionEnabled: b as boolean }),
        },
      };
    case 'usageSettings':
      return { id, command: { op, ...base, overageEnabled: a as boolean } };
    case 'grantLot':
      return { id, command: { op, ...base, amountMicros: a as bigint, lotId: b as string } };
    case 'getContract':
    case 'deleteContract':
      return { id, command: { op, ...base } };
    case 'putContract':
      return { id, command: { op, ...base, contract: a as ContractInput } };
    case 'upsertCustomer':
      return { id, command: { op, ...base, patch: a as ProfilePatch } };
    case 'context':
      return { id, command: { op, ...base, patch: a as ProfilePatch, request: b as ContextRequest } };
  }
  throw new Error(`unknown op code ${String(wire[offset + 1])}`);
}

export function decodeBatch(wire: WireBatch): Envelope[] {
  const envelopes: Envelope[] = [];
  for (let offset = 0; offset < wire.length; offset += COMMAND_SLOTS) envelopes.push(readCommand(wire, offset));
  return envelopes;
}

export type ToWorker =
  | { readonly t: 'config'; readonly environment: Environment; readonly version: number; readonly config: BillingConfig }
  | { readonly t: 'batch'; readonly wire: WireBatch }
  | { readonly t: 'stats'; readonly requestId: number }
  /** Take this shard's cut of an online snapshot now and write it to `partPath`. */
  | { readonly t: 'cut'; readonly snapshotId: string; readonly partPath: string }
  /** These audit entries are durable in the chain: the shard may forget its copies. */
  | { readonly t: 'auditsRecorded'; readonly refs: readonly string[] }
  | { readonly t: 'stop' };

/**
 * The status a shard gives a `context` reply that created or changed the customer, so the
 * front end can record it in the audit log (as `customer.upsert`) before answering 200.
 * It never reaches a client.
 */
export const CONTEXT_WROTE_STATUS = 201;

/**
 * The status a shard gives an audited write that changed nothing (a customer upsert or a
 * limit or usage settings call repeating what is stored; the body is the current state),
 * so the front end answers 200 without an audit entry. Never reaches a client.
 */
export const UNCHANGED_STATUS = 299;

/** Replies flattened as [id, status, body, id, status, body, ...] to keep cloning cheap. */
export type ReplyTriples = Array<number | string>;

export interface WorkerStats {
  readonly customers: number;
  readonly lastSeq: number;
  readonly snapshotSeq: number;
  readonly replayedBatches: number;
  readonly droppedTornTail: boolean;
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
  readonly idempotencyEntries: number;
  readonly lastSeq: number;
  readonly snapshotSeq: number;
  readonly journalRecords: number;
  /** Bytes of the LMDB environment's data file in use. */
  readonly usedBytes: number;
  /** When the shard last stored a snapshot of itself (null: never, since start). */
  readonly lastSnapshotAtMs: number | null;
  /** Journal appends since start: milliseconds from append issued to durable (metrics). */
  readonly journalFlushMs: HistogramData;
  /** Events per journal record since start, i.e. the size of each group commit (metrics). */
  readonly journalBatchEvents: HistogramData;
}

export type FromWorker =
  /** `pendingAudits`: stored audit entries not yet confirmed in the audit chain (a crash came between). */
  | { readonly t: 'ready'; readonly stats: WorkerStats; readonly pendingAudits: readonly PendingAudit[] }
  | { readonly t: 'stats'; readonly requestId: number; readonly stats: ShardLiveStats }
  | { readonly t: 'cutProgress'; readonly snapshotId: string; readonly done: number; readonly total: number }
  | { readonly t: 'cutDone'; readonly snapshotId: string; readonly result: CutResult }
  | { readonly t: 'cutFailed'; readonly snapshotId: string; readonly error: string }
  | { readonly t: 'replies'; readonly replies: ReplyTriples }
  | { readonly t: 'stopped' };

/**
 * Stable FNV-1a hash of (environment, customerId) onto a logical shard. Stable across
 * processes and versions: it decides where a customer's journal lives.
 */
export function logicalShardOf(environment: Environment, customerId: string, logicalShards: number): number {
  let hash = 0x811c9dc5;
  hash = fnvString(hash, environment);
  hash = Math.imul(hash ^ 0, 0x01000193) >>> 0;
  hash = fnvString(hash, customerId);
  return hash % logicalShards;
}

function fnvString(seed: number, text: string): number {
  let hash = seed;
  for (let i = 0; i < text.length; i++) {
    hash = Math.imul(hash ^ text.charCodeAt(i), 0x01000193) >>> 0;
  }
  return hash;
}

/** Logical shards are dealt round-robin onto workers. */
export function workerOf(logicalShard: number, workers: number): number {
  return logicalShard % workers;
}
