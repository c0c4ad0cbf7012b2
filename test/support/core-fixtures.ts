/**
 * Shared fixtures for core tests: a billing configuration exercising every entitlement
 * type, and a tiny in-memory driver that runs commands through `execute` the way a
 * shard does (events applied in place, journal and idempotency keys kept in memory).
 */
import {
  compileConfig,
  type BillingConfig,
  type CompiledConfig,
} from '../../actors/billing-config.js';
import {
  apply,
  execute,
  idempotencyFingerprint,
  idempotencyScope,
  query,
  type Command,
  type CustomerState,
  type Event,
  type IdempotencySeen,
  type Outcome,
} from '../../actors/customer.js';
import { isRead } from '../../actors/shard.js';
import { decodeRecord, encodeRecord } from '../../storage/codec.js';

export const CONFIG: BillingConfig = {
  entitlements: {
    sso: { type: 'feature', name: 'Single sign-on' },
    audit: { type: 'feature' },
    seats: { type: 'limit', name: 'Seats' },
    projects: { type: 'limit' },
    api_calls: { type: 'meter', reset: 'month' },
    tokens: { type: 'meter', reset: 'day' },
    storage: { type: 'meter', reset: 'never' },
    exports: { type: 'meter', reset: 'month' },
  },
  products: {
    free: {
      name: 'Free',
      default: true,
      entitlements: {
        sso: true,
        audit: false,
        seats: { included: 5, expansion: { unitAmount: 500 } },
        projects: { included: 0 },
        api_calls: { included: 100, overage: { unitAmount: 1 } },
        tokens: { included: 1000 },
        storage: { included: 10 },
      },
    },
    pro: {
      name: 'Pro',
      price: { amount: 2000, currency: 'usd', interval: 'month' },
      entitlements: { audit: true },
    },
    pack: {
      name: 'Credit pack',
      price: { amount: 500, currency: 'usd' },
      grants: { api_calls: 50 },
    },
  },
};

export const COMPILED: CompiledConfig = compileConfig(CONFIG, 1);

/** 2026-03-15T12:00:00.000Z, a Sunday in the middle of a month. */
export const T0 = Date.UTC(2026, 2, 15, 12, 0, 0);

export class Driver {
  readonly customers = new Map<string, CustomerState>();
  readonly journal: Event[] = [];
  /** The shell's idempotency keys, as a shard keeps them: outside the customers' state. */
  readonly keys = new Map<string, IdempotencySeen>();

  constructor(public config: CompiledConfig = COMPILED) {}

  run(command: Command, nowMs: number): Outcome {
    const key = `${command.environment}\u0000${command.customerId}`;
    if (isRead(command)) {
      return query(this.customers.get(key), this.config, command, nowMs);
    }
    const scope = idempotencyScope(command);
    const scoped = scope === null ? null : `${key}\u0000${scope}`;
    const seen = scoped === null ? null : (this.keys.get(scoped) ?? null);
    const result = execute(this.customers.get(key), this.config, command, nowMs, undefined, seen);
    if (result.customer !== undefined) this.customers.set(key, result.customer);
    // As the shard does: a keyed write that wrote events stores its key.
    const written = result.events[0];
    if (
      scoped !== null &&
      written !== undefined &&
      (command.op === 'consume' || command.op === 'refund')
    )
      this.keys.set(scoped, { fingerprint: idempotencyFingerprint(command), atMs: written.atMs });
    this.journal.push(...result.events);
    return result.outcome;
  }

  /**
   * A fresh state rebuilt from the journal with `apply` only, the events read back
   * through the storage codec as recovery reads them (so an encoding loss shows).
   */
  replayed(): Map<string, CustomerState> {
    const rebuilt = new Map<string, CustomerState>();
    for (const event of throughCodec(this.journal)) {
      const key = `${event.environment}\u0000${event.customerId}`;
      rebuilt.set(key, apply(rebuilt.get(key), event));
    }
    return rebuilt;
  }
}

/** `value` written and read back by the storage codec, as a journal record or snapshot chunk is. */
export function throughCodec<T>(value: T): T {
  const decoded = decodeRecord(encodeRecord(value));
  if (!decoded.ok) throw new Error(`codec round trip failed: ${decoded.reason}`);
  return decoded.value as T;
}
