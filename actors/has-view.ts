/**
 * The `has` view: answers to `has` that the front end keeps and serves itself, without a
 * round trip to the shard, and the shard's side that keeps them right.
 *
 * The shard publishes every `has` it answers (a fill: the value, and until when it holds
 * by time alone, from the core's `hasHorizon`) and remembers which answers the front end
 * may hold. When a write changes such a customer the shard answers those keys again and
 * publishes the new answers as it decides the write, before the write's reply can leave (so
 * a `has` after a `consume` is still served by the front end); when a configuration
 * reaches the shard it publishes that too, and the front end drops the environment's
 * answers. These
 * view changes travel in the same messages as the replies and in the order the shard
 * decided them, and the front end applies each message's view changes before its replies.
 * So a client that has its write's answer never reads an answer older than the write, and
 * an answer the front end serves is one the shard would give at that moment.
 *
 * A write that reaches the shard through another front end (a second front-end thread) has
 * its reply sent on that front end's channel, which may overtake the view changes on this
 * one. So every change of a customer's answers also bumps a stamp in memory shared with the
 * front ends (one of VIEW_STAMP_BUCKETS counters, by a hash of the customer) before any
 * reply can leave, and each answer carries the stamp it was made under: the front end
 * serves an answer only while the stamp it came with is still the current one.
 *
 * Bounded: a shard remembers at most HAS_VIEW_CUSTOMERS_MAX customers per environment;
 * past that it forgets them all and tells the front end to do the same.
 */
import type { Environment } from '../shared/environment.js';
import { logicalShardOf } from '../shared/shard-hash.js';

/**
 * View changes on the wire, flat: [kind, environment (0 test, 1 live), customerId, key, until,
 * stamp bucket, stamp].
 */
export type ViewChanges = Array<number | string>;

export const VIEW_SLOTS = 7;

/**
 * Stamp counters per shard worker (a power of two; 1 MiB of shared memory). A write bumps
 * its customer's counter, and every answer held under that counter stops being served until
 * it is asked again, so the counters must outnumber the customers answered: with 4,096 of
 * them, 6,400 consumes a second beside `has` over 100,000 customers, each answering its
 * customer's keys again, left 13% of the `has` requests answered from the view; with
 * 262,144, 97%. A `has` alone ran as fast with either.
 */
export const VIEW_STAMP_BUCKETS = 262_144;

/** The stamp counters of one worker: shared with every front end when given shared memory. */
export function viewStamps(shared = true): Int32Array {
  const bytes = VIEW_STAMP_BUCKETS * Int32Array.BYTES_PER_ELEMENT;
  return new Int32Array(shared ? new SharedArrayBuffer(bytes) : new ArrayBuffer(bytes));
}

/** The stamp counter of a customer. */
export function stampBucketOf(environment: Environment, customerId: string): number {
  return logicalShardOf(environment, customerId, VIEW_STAMP_BUCKETS);
}

/** The customer's answer to `key`: `until` > 0 for true, < 0 for false (magnitude: until when). */
export const VIEW_FILL = 0;
/** Forget every answer of the customer. */
export const VIEW_DROP = 1;
/** A configuration of the environment reached the shard: answers from before it are gone. */
export const VIEW_CONFIGURED = 2;
/** The shard forgot which customers of the environment the front end holds: forget them. */
export const VIEW_CLEAR = 3;

/** Customers per environment a shard remembers as held by the front end. */
export const HAS_VIEW_CUSTOMERS_MAX = 250_000;

const envCode = (environment: Environment): number => (environment === 'live' ? 1 : 0);

/** The customer's answer to `has` of `key` now, or null when it has none (an unknown key). */
export type Reanswer = (
  key: string,
) => { readonly value: boolean; readonly untilMs: number } | null;

/** The shard's side: which answers the front end may hold, and the changes to send. */
export class PublishedViews {
  /** Per environment: customer → the keys the front end may hold answers of. */
  private readonly held: Readonly<Record<Environment, Map<string, Set<string>>>> = {
    test: new Map(),
    live: new Map(),
  };
  private changes: ViewChanges = [];

  constructor(
    private readonly customersMax = HAS_VIEW_CUSTOMERS_MAX,
    private readonly stamps: Int32Array = viewStamps(false),
  ) {}

  /** The shard answered `has`: the front end will hold the answer until `untilMs`. */
  answered(
    environment: Environment,
    customerId: string,
    key: string,
    value: boolean,
    untilMs: number,
  ): void {
    const held = this.held[environment];
    let keys = held.get(customerId);
    if (keys === undefined) {
      if (held.size >= this.customersMax) {
        held.clear();
        this.changes.push(VIEW_CLEAR, envCode(environment), '', '', 0, 0, 0);
      }
      keys = new Set();
      held.set(customerId, keys);
    }
    keys.add(key);
    const bucket = stampBucketOf(environment, customerId);
    const stamp = Atomics.load(this.stamps, bucket);
    this.fill(environment, customerId, key, value, untilMs, bucket, stamp);
  }

  private fill(
    environment: Environment,
    customerId: string,
    key: string,
    value: boolean,
    untilMs: number,
    bucket: number,
    stamp: number,
  ): void {
    const until = value ? untilMs : -untilMs;
    this.changes.push(VIEW_FILL, envCode(environment), customerId, key, until, bucket, stamp);
  }

  /**
   * A write changed the customer (or created it), whose state `reanswer` now reads: every
   * answer the front end may hold of it is sent again. Nothing to do for a customer it holds
   * none of, which is almost every write of a busy shard that nobody asked `has` about, nor
   * when the write can change only the answer to `onlyKey` (a consume or refund of one
   * meter of an existing customer) and the front end holds none to it: its answers to other
   * keys stay served.
   */
  changed(
    environment: Environment,
    customerId: string,
    reanswer: Reanswer,
    onlyKey: string | null = null,
  ): void {
    const keys = this.held[environment].get(customerId);
    if (keys === undefined) return;
    if (onlyKey !== null && !keys.has(onlyKey)) return;
    // Before anything of this write can leave: answers of the old stamp are no longer served.
    const bucket = stampBucketOf(environment, customerId);
    const stamp = Atomics.add(this.stamps, bucket, 1) + 1;
    for (const key of keys) {
      const answer = reanswer(key);
      if (answer === null) {
        this.held[environment].delete(customerId);
        this.changes.push(VIEW_DROP, envCode(environment), customerId, '', 0, 0, 0);
        return;
      }
      this.fill(environment, customerId, key, answer.value, answer.untilMs, bucket, stamp);
    }
  }

  /** A configuration of the environment arrived (applied or, if not newer, ignored). */
  configured(environment: Environment): void {
    this.held[environment].clear();
    this.changes.push(VIEW_CONFIGURED, envCode(environment), '', '', 0, 0, 0);
  }

  /** The changes since the last call, to send with the replies of the same moment. */
  take(): ViewChanges {
    const changes = this.changes;
    if (changes.length > 0) this.changes = [];
    return changes;
  }

  /** Customers the front end may hold answers of, in both environments. */
  get size(): number {
    return this.held.test.size + this.held.live.size;
  }
}
