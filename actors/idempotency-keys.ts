/**
 * The shard's idempotency keys as the shell sees them: what the shard asks of the store
 * that keeps them (recent keys in memory, the rest of the retention in sealed runs on
 * disk: storage/idempotency-runs.ts), and the digest that names a key.
 *
 * The pure core never sees any of this: the shard looks a command's scope up here and
 * hands `decide` the entry it found (`IdempotencySeen`).
 */
import crypto from 'node:crypto';
import { assert } from '../shared/assert.js';
import type { Environment } from '../shared/environment.js';
import {
  idempotencyFingerprint,
  type Event,
  type IdempotencyRecord,
  type IdempotencySeen,
  type WriteCommand,
} from './customer.js';

/** Where a key is kept: its customer and the digest of its scope (op, meter, key). */
export interface KeyAddress {
  readonly environment: Environment;
  readonly customerId: string;
  readonly scopeDigest: string;
}

/** An idempotency key a write used, stored with the journal record that applies it. */
export interface IdempotencyPut extends KeyAddress, IdempotencySeen {}

/** One key of a customer as a snapshot carries it: [scope digest, fingerprint, atMs]. */
export type CustomerKey = [string, string, number];

/** The store of a shard's keys. */
export interface StoredKeys {
  /**
   * The address of a key as this store looks it up: a keyed write makes its key's address
   * here once and hands it to `readAhead` and `get`, so whatever the store computes of an
   * address (its hashes) is computed once, not at each step.
   */
  address(environment: Environment, customerId: string, scopeDigest: string): KeyAddress;
  /** The entry at `address` (in memory or on disk), or undefined. Synchronous. */
  get(address: KeyAddress): IdempotencySeen | undefined;
  /**
   * Optional: told a batch's addresses (null for a command without a key) just before the
   * batch is decided, to read ahead what their lookups will touch. Changes nothing.
   */
  readAhead?(addresses: readonly (KeyAddress | null)[]): void;
  /** A key decided now: `get` finds it from now on, before its record is on disk. */
  remember(put: IdempotencyPut): void;
  /** Keys held in memory now. */
  readonly inMemory: number;
  /** An online snapshot's cut of every key stored now, to read a slice at a time. */
  cut(): KeysAtCut;
}

/** One customer's keys as an online snapshot carries them: its environment, id and keys. */
export type CustomerKeys = [environment: Environment, customerId: string, keys: CustomerKey[]];

/**
 * The keys stored at a cut (an online snapshot's), read a slice at a time: `read` answers
 * about `budget` more keys, a customer's consecutive ones in one item, until `done`. A key
 * may come twice; the later is its newer use. A cut given up before its end is closed
 * (`close`); one read to the end closes itself.
 */
export interface KeysAtCut {
  read(budget: number): CustomerKeys[];
  readonly done: boolean;
  close(): void;
}

/** Keys in memory only: a shard without disk (unit tests). */
export class MemoryKeys implements StoredKeys {
  private readonly keys = new Map<string, IdempotencyPut>();

  address(environment: Environment, customerId: string, scopeDigest: string): KeyAddress {
    return { environment, customerId, scopeDigest };
  }

  get(address: KeyAddress): IdempotencySeen | undefined {
    return this.keys.get(memoryKey(address));
  }

  remember(put: IdempotencyPut): void {
    this.keys.set(memoryKey(put), put);
  }

  get inMemory(): number {
    return this.keys.size;
  }

  cut(): KeysAtCut {
    const items: CustomerKeys[] = [...this.keys.values()].map((put) => [
      put.environment,
      put.customerId,
      [[put.scopeDigest, put.fingerprint, put.atMs]],
    ]);
    let next = 0;
    return {
      get done() {
        return next === items.length;
      },
      read(budget) {
        const slice = items.slice(next, next + Math.max(1, budget));
        next += slice.length;
        return slice;
      },
      close() {},
    };
  }
}

/**
 * The key a keyed write's event holds (`decide`'s `carry`): the scope's digest and the
 * fingerprint, stored in the journal record that applies the write, so the key is on disk
 * exactly when its write is. The core builds the event with it in place, one object shape
 * for every consume: a copy of the event with the key added would cost the shard thread
 * ~2 µs a keyed consume (a property migration per copy, and megamorphic reads of events).
 */
export function carriedKey(address: KeyAddress, command: WriteCommand): IdempotencyRecord {
  assert(command.op === 'consume' || command.op === 'refund', `${command.op} has no key`);
  return { fingerprint: idempotencyFingerprint(command), digest: address.scopeDigest };
}

/**
 * The keys a journal record's events hold (`carriedKey`): recovery holds them in memory
 * again. Events without one, or of older data dirs (no digest), carry none. Throws on a
 * key of the wrong shape, as on any corrupt record.
 */
export function keysOfEvents(events: readonly Event[]): IdempotencyPut[] {
  const puts: IdempotencyPut[] = [];
  for (const event of events) {
    if (event.type !== 'consumed' && event.type !== 'refunded') continue;
    const key: unknown = event.idempotency;
    if (key === undefined || key === null) continue;
    const { fingerprint, digest } = key as Record<string, unknown>;
    if (digest === undefined) continue;
    if (typeof digest !== 'string' || digest.length === 0 || typeof fingerprint !== 'string')
      throw new Error(
        `a journal record's ${event.type} event carries a malformed idempotency key; ` +
          'refusing to start',
      );
    puts.push({
      environment: event.environment,
      customerId: event.customerId,
      scopeDigest: digest,
      fingerprint,
      atMs: event.atMs,
    });
  }
  return puts;
}

function memoryKey(address: KeyAddress): string {
  return `${address.environment}\u0000${address.customerId}\u0000${address.scopeDigest}`;
}

/**
 * The digest that names an idempotency scope within its customer: 128 bits of SHA-256
 * over the scope, in base64url (22 characters) whatever the key's length. Two scopes of
 * one customer collide as likely as a guess of a random 128-bit number.
 *
 * Node renders a digest as base64url in one call several times faster than it returns it
 * as a Buffer, so the digest is the first 22 characters of the whole hash's base64url with
 * the last character's low four bits cleared: exactly the base64url of its first 16 bytes.
 *
 * The digest is `slice + character` (~0.1 µs less than building it from character codes).
 * V8 keeps that sum as a pair of strings over the whole hash until its characters are
 * first read, then as one flat string; a digest lives as long as its write's batch (the
 * keys held in memory copy its characters into typed arrays: storage/held-keys.ts).
 */
export function scopeDigest(scope: string): string {
  const whole = sha256Base64url(scope);
  return (
    whole.slice(0, DIGEST_CHARS - 1) + (CLEARED_LAST[whole.charCodeAt(DIGEST_CHARS - 1)] ?? '')
  );
}

/** 128 bits in base64url. */
const DIGEST_CHARS = 22;

const BASE64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';

/** By a base64url character's code: the character with its low four bits cleared. */
const CLEARED_LAST: string[] = [];
for (let value = 0; value < 64; value++)
  CLEARED_LAST[BASE64URL.charCodeAt(value)] = BASE64URL.charAt(value & 0b110000);

/** SHA-256 in base64url, in one call where Node has it (20.12 on), else through a Hash. */
const sha256Base64url: (data: string) => string =
  typeof crypto.hash === 'function'
    ? (data) => crypto.hash('sha256', data, 'base64url')
    : (data) => crypto.createHash('sha256').update(data).digest('base64url');
