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
import type { Command, Environment } from './customer.js';

export type { Command, Environment };

/** A command with the front end's request id, which the reply carries back. */
export interface Envelope {
  readonly id: number;
  readonly command: Command;
}

export type ToWorker =
  | { readonly t: 'config'; readonly environment: Environment; readonly version: number; readonly config: BillingConfig }
  | { readonly t: 'batch'; readonly envelopes: readonly Envelope[] }
  | { readonly t: 'snapshot'; readonly requestId: number }
  | { readonly t: 'stop' };

/** Replies flattened as [id, status, body, id, status, body, ...] to keep cloning cheap. */
export type ReplyTriples = Array<number | string>;

export interface WorkerStats {
  readonly customers: number;
  readonly lastSeq: number;
  readonly snapshotSeq: number;
  readonly replayedBatches: number;
  readonly droppedTornTail: boolean;
}

export type FromWorker =
  | { readonly t: 'ready'; readonly stats: WorkerStats }
  | { readonly t: 'replies'; readonly replies: ReplyTriples }
  | { readonly t: 'snapshotted'; readonly requestId: number; readonly seq: number }
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
