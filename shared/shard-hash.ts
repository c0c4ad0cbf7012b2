/**
 * Which shard owns a customer. In the leaf because the front end routes requests with it,
 * and storage uses it to place restored customers in the shard that will serve them.
 */
import type { Environment } from './environment.js';

/**
 * Stable FNV-1a hash of (environment, customerId) onto a logical shard. Stable across
 * processes and versions: it decides where a customer's journal lives.
 */
export function logicalShardOf(
  environment: Environment,
  customerId: string,
  logicalShards: number,
): number {
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
