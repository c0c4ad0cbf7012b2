/**
 * How a customer's state is held in memory: the shared empty values that keep millions
 * of idle customers small, interned entitlement keys, and a new customer. Used by apply
 * (which fills the state) and the snapshot form (which rebuilds it).
 */
import { assert } from '../../shared/assert.js';
import type {
  CustomerProfile,
  CustomerState,
  Environment,
  Lot,
  LotDraw,
  MetadataValue,
} from './types.js';

/*
 * Memory: a shard keeps every customer it owns in memory, millions of them, so the state
 * shares what is empty instead of allocating it per customer. An empty Map costs about
 * 180 bytes and an empty array 32, which for a customer with three meters would be more
 * than the billing state itself (measured by `npm run bench:recovery`). Maps nobody has used
 * are null; empty arrays and metadata are the frozen shared values below, replaced by an
 * own copy on the first write (a write to a shared one would throw, never leak into
 * other customers).
 */
export const NO_LOT_DRAWS = Object.freeze([]) as unknown as LotDraw[];
export const NO_LOTS = Object.freeze([]) as unknown as Lot[];
export const NO_METADATA = Object.freeze({}) as Record<string, MetadataValue>;

/** Bound on `internedKeys`: far more entitlement keys than any configuration has. */
const INTERNED_KEYS_MAX = 4096;
const internedKeys = new Map<string, string>();

/**
 * One copy of an entitlement key string for all meters that use it: events decoded from
 * the journal each carry their own copy, and a meter keeps the one it was created with.
 * A bounded memo with no effect on results (like the period and timestamp caches).
 */
export function internKey(key: string): string {
  const interned = internedKeys.get(key);
  if (interned !== undefined) return interned;
  if (internedKeys.size >= INTERNED_KEYS_MAX) internedKeys.clear();
  internedKeys.set(key, key);
  return key;
}

/** The string literal rather than the caller's copy (one per decoded event). */
export function canonicalEnvironment(environment: Environment): Environment {
  assert(
    environment === 'test' || environment === 'live',
    `unknown environment ${String(environment)}`,
  );
  return environment === 'live' ? 'live' : 'test';
}

export function newCustomer(
  environment: Environment,
  id: string,
  createdAtMs: number,
): CustomerState {
  const profile: CustomerProfile = {
    name: null,
    email: null,
    metadata: NO_METADATA,
    updatedAtMs: createdAtMs,
  };
  return {
    environment: canonicalEnvironment(environment),
    id,
    createdAtMs,
    profile,
    contract: null,
    meters: new Map(),
    limits: null,
    commerce: null,
    copyMark0: 0,
    copyMark1: 0,
  };
}
