/**
 * In-memory collections of Stripe objects, with Stripe-style ids.
 *
 * Each resource lives in a `Collection` keyed by id in creation order. Collections are
 * bounded: past the limit, creating another object is refused with a Stripe-shaped 400
 * (a sandbox that grows without limit would be a memory leak in a long-running process).
 * The event log is the exception: like Stripe's 30-day retention it drops its oldest
 * entries instead. Stored objects hold related objects by id; `expand.ts` swaps ids for
 * objects on the way out.
 */
import { randomBytes } from 'node:crypto';
import { StripeApiError, resourceMissing } from './errors.js';

const ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';

/** A random base62 string. */
export function randomToken(length: number): string {
  const bytes = randomBytes(length);
  let out = '';
  for (const byte of bytes) out += ALPHABET[byte % ALPHABET.length];
  return out;
}

/** A fresh id with Stripe's prefix for the object (`cus_`, `sub_`, `cs_test_`, …). */
export function newId(prefix: string): string {
  return `${prefix}_${randomToken(prefix === 'cs_test' ? 58 : 24)}`;
}

export interface Identified {
  readonly id: string;
}

export class Collection<T extends Identified> {
  readonly #items = new Map<string, T>();

  constructor(
    /** Singular noun for messages: `No such customer: 'cus_…'`. */
    readonly noun: string,
    readonly limit: number,
    /** Drop the oldest object instead of refusing a new one past the limit. */
    readonly evictOldest = false,
  ) {}

  get size(): number {
    return this.#items.size;
  }

  insert(item: T): T {
    if (this.#items.size >= this.limit) {
      if (!this.evictOldest) {
        throw new StripeApiError(400, {
          type: 'invalid_request_error',
          code: 'sandbox_limit_reached',
          message: `The Stripe sandbox holds at most ${this.limit} ${this.noun} objects.`,
        });
      }
      const oldest = this.#items.keys().next();
      if (oldest.done !== true) this.#items.delete(oldest.value);
    }
    this.#items.set(item.id, item);
    return item;
  }

  /** Replaces a stored object (same id). */
  update(item: T): T {
    if (!this.#items.has(item.id)) throw resourceMissing(this.noun, item.id);
    this.#items.set(item.id, item);
    return item;
  }

  find(id: string): T | undefined {
    return this.#items.get(id);
  }

  /** The object, or 404 `resource_missing` naming `param`. */
  get(id: string, param = 'id'): T {
    const item = this.#items.get(id);
    if (item === undefined) throw resourceMissing(this.noun, id, param);
    return item;
  }

  delete(id: string): boolean {
    return this.#items.delete(id);
  }

  /** Newest first, the order of Stripe's list endpoints. */
  newestFirst(): T[] {
    return [...this.#items.values()].reverse();
  }

  all(): IterableIterator<T> {
    return this.#items.values();
  }
}

/**
 * A deep copy as it goes over the wire. (Not `structuredClone`: SDK values such as
 * `Stripe.Decimal` serialize through `toJSON`, which a structured clone would skip.)
 */
export function wireCopy<T>(value: T): T {
  return JSON.parse(JSON.stringify(value)) as T;
}
