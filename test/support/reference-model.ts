/**
 * A reference model of Tally's metering semantics, written to be obviously correct rather
 * than fast: plain bigint arithmetic on micro-units, one mutable record per customer, no
 * events, no journal, no shared code with the core (actors/customer.ts) beyond the
 * command type and the error catalog's message texts (the API contract). Tests run it
 * side by side with the real core or shard and compare every reply and every balance.
 *
 * `exec` answers one command as the HTTP API would: a status and the parsed JSON body.
 */
import type { BillingConfig } from '../../actors/billing-config.js';
import type { Command, ContextRequest, ProfilePatch } from '../../actors/customer.js';
import { errorBody, type ErrorCode, type ErrorParams } from '../../src/errors.js';

export interface Reply {
  readonly status: number;
  readonly body: unknown;
}

type MetaValue = string | number | boolean | null;

interface Lot {
  readonly id: string;
  remaining: bigint;
}

interface Meter {
  period: number;
  usedIncluded: bigint;
  overage: bigint;
  /** Lot draws of the period, oldest first: a refund gives back the newest first. */
  draws: Array<{ lot: string; amount: bigint }>;
  overageEnabled: boolean;
  lots: Lot[];
}

interface Customer {
  readonly id: string;
  readonly createdAt: number;
  name: string | null;
  email: string | null;
  metadata: Record<string, MetaValue>;
  updatedAt: number;
  contract: {
    priceAmount: number;
    priceInterval: string;
    entitlements: Record<string, { included: number }>;
    updatedAt: number;
  } | null;
  meters: Map<string, Meter>;
  limits: Map<string, { purchased: number; auto: boolean }>;
  /** scope → amount (as text) and when it was first accepted. */
  idempotency: Map<string, { amount: string; at: number }>;
}

const DAY = 86_400_000;
const RETENTION = DAY;
const LOTS_MAX = 10_000;
const METADATA_KEYS_MAX = 50;

/** Micro-units of a decimal number with at most 6 decimals, or null. */
export function microsOf(value: number): bigint | null {
  const text = value.toFixed(6);
  if (Number(text) !== value) return null;
  const [whole, fraction] = text.split('.') as [string, string];
  return BigInt(whole) * 1_000_000n + BigInt(fraction);
}

/** A JSON amount: micro-units as the number they spell. */
function amount(micros: bigint): number {
  const whole = micros / 1_000_000n;
  const fraction = (micros % 1_000_000n).toString().padStart(6, '0');
  return Number(`${whole}.${fraction}`);
}

const iso = (ms: number): string => new Date(ms).toISOString();

/** Start and end of the calendar period holding `ms` (UTC). */
function period(reset: string, ms: number): { start: number; end: number | null } {
  const d = new Date(ms);
  const y = d.getUTCFullYear();
  const m = d.getUTCMonth();
  const day = d.getUTCDate();
  if (reset === 'never') return { start: 0, end: null };
  if (reset === 'day') return { start: Date.UTC(y, m, day), end: Date.UTC(y, m, day + 1) };
  if (reset === 'week') {
    const back = (d.getUTCDay() + 6) % 7;
    return { start: Date.UTC(y, m, day - back), end: Date.UTC(y, m, day - back + 7) };
  }
  if (reset === 'month') return { start: Date.UTC(y, m, 1), end: Date.UTC(y, m + 1, 1) };
  return { start: Date.UTC(y, 0, 1), end: Date.UTC(y + 1, 0, 1) };
}

function fail(code: ErrorCode, params: ErrorParams = {}, extra?: object): Reply {
  const status: Record<string, number> = {
    entitlement_not_found: 404,
    contract_not_found: 404,
    refund_exceeds_usage: 409,
    insufficient_balance: 429,
  };
  return { status: status[code] ?? 400, body: JSON.parse(errorBody(code, params, extra)) };
}

/** One environment's customers under the configuration the caller passes to each command. */
export class ReferenceModel {
  private customers = new Map<string, Customer>();

  clone(): ReferenceModel {
    const copy = new ReferenceModel();
    copy.customers = structuredClone(this.customers);
    return copy;
  }

  exec(config: BillingConfig | null, command: Command, now: number): Reply {
    const cfg = config ?? { entitlements: {}, products: {} };
    const id = `${command.environment}/${command.customerId}`;
    const customer = this.customers.get(id);
    const create = (): Customer => {
      const fresh: Customer = {
        id: command.customerId,
        createdAt: now,
        name: null,
        email: null,
        metadata: {},
        updatedAt: now,
        contract: null,
        meters: new Map(),
        limits: new Map(),
        idempotency: new Map(),
      };
      this.customers.set(id, fresh);
      return fresh;
    };
    const plan = Object.values(cfg.products).find((p) => p.default === true) ?? null;
    const grant = (key: string) => plan?.entitlements?.[key];
    const type = (key: string) => cfg.entitlements[key]?.type;
    const reset = (key: string) => cfg.entitlements[key]?.reset ?? 'month';
    const overageAllowed = (key: string): boolean => {
      const g = grant(key);
      return typeof g === 'object' && g.overage !== undefined;
    };
    const expansionAllowed = (key: string): boolean => {
      const g = grant(key);
      return typeof g === 'object' && g.expansion !== undefined;
    };
    const included = (c: Customer | undefined, key: string): bigint => {
      const override = c?.contract?.entitlements[key];
      if (override !== undefined) return microsOf(override.included) as bigint;
      const g = grant(key);
      return microsOf(typeof g === 'object' ? (g.included ?? 0) : 0) as bigint;
    };
    const meterOf = (c: Customer | undefined, key: string): Meter =>
      c?.meters.get(key) ?? {
        period: 0,
        usedIncluded: 0n,
        overage: 0n,
        draws: [],
        overageEnabled: false,
        lots: [],
      };
    const currentPeriod = (m: Meter, key: string): number =>
      Math.max(period(reset(key), now).start, m.period);
    /** This period's usage: included, lots, overage (an earlier period's counts as nothing). */
    const usage = (m: Meter, key: string) => {
      if (m.period < currentPeriod(m, key)) return { included: 0n, lots: 0n, overage: 0n };
      return {
        included: m.usedIncluded,
        lots: m.draws.reduce((s, d) => s + d.amount, 0n),
        overage: m.overage,
      };
    };
    const lotsLeft = (m: Meter): bigint => m.lots.reduce((s, l) => s + l.remaining, 0n);
    const balanceMicros = (c: Customer | undefined, key: string): bigint => {
      const m = meterOf(c, key);
      const left = included(c, key) - usage(m, key).included;
      return (left > 0n ? left : 0n) + lotsLeft(m);
    };
    const balanceView = (c: Customer | undefined, key: string) => {
      const m = meterOf(c, key);
      const u = usage(m, key);
      const p = period(reset(key), Math.max(now, currentPeriod(m, key)));
      return {
        balance: amount(balanceMicros(c, key)),
        included: amount(included(c, key)),
        consumed: amount(u.included + u.lots + u.overage),
        overage: amount(u.overage),
        overageAllowed: overageAllowed(key),
        overageEnabled: m.overageEnabled,
        resets: p.end === null ? null : iso(p.end),
      };
    };
    const limitView = (c: Customer | undefined, key: string) => {
      const g = grant(key);
      const inc =
        c?.contract?.entitlements[key]?.included ?? (typeof g === 'object' ? (g.included ?? 0) : 0);
      const s = c?.limits.get(key);
      return {
        limit: inc + (s?.purchased ?? 0),
        included: inc,
        purchased: s?.purchased ?? 0,
        expansionAllowed: expansionAllowed(key),
        autoExpansionEnabled: s?.auto ?? false,
      };
    };
    const has = (c: Customer | undefined, key: string): boolean => {
      if (type(key) === 'feature') {
        const override = c?.contract?.entitlements[key];
        if (override !== undefined) return override.included > 0;
        const g = grant(key);
        return g === true || (typeof g === 'object' && (g.included ?? 1) > 0);
      }
      if (type(key) === 'limit') return limitView(c, key).limit > 0;
      return balanceMicros(c, key) > 0n || (meterOf(c, key).overageEnabled && overageAllowed(key));
    };
    const customerView = (c: Customer) => ({
      id: c.id,
      name: c.name,
      email: c.email,
      metadata: { ...c.metadata },
      createdAt: iso(c.createdAt),
      updatedAt: iso(c.updatedAt),
    });
    const ok = (body: unknown, status = 200): Reply => ({ status, body });
    /** The existing meter, or a new one (creating the customer) for a write. */
    const ownMeter = (key: string): { c: Customer; m: Meter } => {
      const c = customer ?? create();
      let m = c.meters.get(key);
      if (m === undefined) {
        m = meterOf(undefined, key);
        c.meters.set(key, m);
      }
      return { c, m };
    };
    const changes = (c: Customer, patch: ProfilePatch): boolean =>
      (patch.name !== undefined && patch.name !== c.name) ||
      (patch.email !== undefined && patch.email !== c.email) ||
      Object.entries(patch.metadata ?? {}).some(([k, v]) =>
        v === null ? k in c.metadata : c.metadata[k] !== v,
      );
    /**
     * Applies a profile patch (creating the customer); a rejection when metadata would overflow.
     */
    const upsert = (patch: ProfilePatch): { c: Customer; created: boolean } | Reply => {
      const merged = { ...(customer?.metadata ?? {}), ...patch.metadata };
      const keys = Object.values(merged).filter((v) => v !== null).length;
      if (keys > METADATA_KEYS_MAX)
        return fail('invalid_request', {
          detail: `metadata may hold at most ${METADATA_KEYS_MAX} keys (would hold ${keys})`,
        });
      const c = customer ?? create();
      if (patch.name !== undefined) c.name = patch.name;
      if (patch.email !== undefined) c.email = patch.email;
      for (const [k, v] of Object.entries(patch.metadata ?? {})) {
        if (v === null) delete c.metadata[k];
        else c.metadata[k] = v;
      }
      c.updatedAt = now;
      return { c, created: customer === undefined };
    };
    const contextView = (c: Customer, request: ContextRequest) => ({
      customer: customerView(c),
      features: Object.fromEntries(request.features.map((k) => [k, has(c, k)])),
      usage: Object.fromEntries(request.usage.map((k) => [k, balanceView(c, k)])),
      limits: Object.fromEntries(request.limits.map((k) => [k, limitView(c, k)])),
    });

    // Customer-level commands name no entitlement.
    switch (command.op) {
      case 'getContract': {
        const k = customer?.contract;
        if (k == null) return fail('contract_not_found', { customerId: command.customerId });
        return ok({
          customerId: command.customerId,
          priceAmount: k.priceAmount,
          priceInterval: k.priceInterval,
          entitlements: k.entitlements,
          updatedAt: iso(k.updatedAt),
        });
      }
      case 'putContract': {
        for (const [k, v] of Object.entries(command.contract.entitlements)) {
          if (type(k) === undefined)
            return fail('invalid_request', {
              detail: `entitlements.${k} is not an entitlement of the billing configuration`,
            });
          if (type(k) === 'limit' && !Number.isInteger(v.included))
            return fail('invalid_request', {
              detail: `entitlements.${k}.included must be a whole number for a limit`,
            });
          if (type(k) === 'meter' && microsOf(v.included) === null)
            return fail('invalid_request', {
              detail: `entitlements.${k}.included must have at most 6 decimal places`,
            });
        }
        const c = customer ?? create();
        const entitlements = structuredClone(command.contract.entitlements) as Record<
          string,
          { included: number }
        >;
        c.contract = {
          priceAmount: command.contract.priceAmount,
          priceInterval: command.contract.priceInterval,
          entitlements,
          updatedAt: now,
        };
        return ok({
          customerId: command.customerId,
          priceAmount: c.contract.priceAmount,
          priceInterval: c.contract.priceInterval,
          entitlements,
          updatedAt: iso(now),
        });
      }
      case 'deleteContract':
        if (customer?.contract == null)
          return fail('contract_not_found', { customerId: command.customerId });
        customer.contract = null;
        return { status: 204, body: '' };
      case 'upsertCustomer': {
        if (customer !== undefined && !changes(customer, command.patch))
          return ok(customerView(customer));
        const done = upsert(command.patch);
        if ('status' in done) return done;
        return ok(customerView(done.c), done.created ? 201 : 200);
      }
      case 'context': {
        const lists: Array<[readonly string[], string | null]> = [
          [command.request.features, null],
          [command.request.usage, 'meter'],
          [command.request.limits, 'limit'],
        ];
        for (const [keys, expected] of lists) {
          for (const k of keys) {
            if (type(k) === undefined) return fail('entitlement_not_found', { key: k });
            if (expected !== null && type(k) !== expected)
              return fail('wrong_entitlement_type', {
                key: k,
                actual: type(k) as string,
                expected,
              });
          }
        }
        if (customer !== undefined && !changes(customer, command.patch))
          return ok(contextView(customer, command.request));
        const done = upsert(command.patch);
        if ('status' in done) return done;
        return ok(contextView(done.c, command.request));
      }
      default:
        break;
    }

    const key = command.key;
    const actual = type(key);
    if (actual === undefined) return fail('entitlement_not_found', { key });
    const expected =
      { has: null, limit: 'limit', limitSettings: 'limit' }[command.op as string] ??
      (command.op === 'has' ? null : 'meter');
    if (expected !== null && actual !== expected)
      return fail('wrong_entitlement_type', { key, actual, expected });

    switch (command.op) {
      case 'has':
        return ok(has(customer, key));
      case 'limit':
        return ok(limitView(customer, key));
      case 'balance':
        return ok(balanceView(customer, key));
      case 'limitSettings': {
        if (!expansionAllowed(key)) {
          if ((command.purchased ?? 0) > 0)
            return fail('expansion_not_allowed', { key, field: 'purchased' });
          if (command.autoExpansionEnabled === true)
            return fail('expansion_not_allowed', { key, field: 'autoExpansionEnabled' });
        }
        const before = limitView(customer, key);
        const purchased = command.purchased ?? before.purchased;
        const auto = command.autoExpansionEnabled ?? before.autoExpansionEnabled;
        // Settings that repeat what is stored (or the defaults) change nothing, create nothing.
        if (purchased === before.purchased && auto === before.autoExpansionEnabled)
          return ok(before);
        const c = customer ?? create();
        c.limits.set(key, { purchased, auto });
        return ok(limitView(c, key));
      }
      case 'usageSettings': {
        if (command.overageEnabled && !overageAllowed(key))
          return fail('overage_not_allowed', { key });
        if (command.overageEnabled === (customer?.meters.get(key)?.overageEnabled ?? false))
          return ok(balanceView(customer, key));
        const { c, m } = ownMeter(key);
        m.overageEnabled = command.overageEnabled;
        return ok(balanceView(c, key));
      }
      case 'grantLot': {
        const existing = customer?.meters.get(key);
        if (existing?.lots.some((l) => l.id === command.lotId))
          return ok(balanceView(customer, key));
        if (existing !== undefined && existing.lots.length >= LOTS_MAX)
          return fail('too_many_lots', { key });
        const { c, m } = ownMeter(key);
        m.lots.push({ id: command.lotId, remaining: command.amountMicros });
        return ok(balanceView(c, key));
      }
      case 'getCommerce':
      case 'setProcessorCustomer':
      case 'syncSubscription':
      case 'recordPurchase':
      case 'quoteRefund':
      case 'recordRefund':
      case 'overageDue':
      case 'recordOverageBill':
        throw new Error(
          `${command.op} is not modelled: commerce is tested end to end (test/commerce.test.ts)`,
        );
      case 'consume':
      case 'refund': {
        const want = command.amountMicros;
        const scope = `${command.op}/${key}/${command.idempotencyKey ?? ''}`;
        const seen =
          command.idempotencyKey === undefined ? undefined : customer?.idempotency.get(scope);
        if (seen !== undefined && seen.at > now - RETENTION) {
          if (seen.amount !== String(want)) return fail('idempotency_key_reused');
          return ok(balanceView(customer, key));
        }
        const m0 = meterOf(customer, key);
        const u = usage(m0, key);
        if (command.op === 'consume') {
          const left = included(customer, key) - u.included;
          const fromIncluded = left <= 0n ? 0n : want < left ? want : left;
          const afterLots =
            want -
            fromIncluded -
            (lotsLeft(m0) < want - fromIncluded ? lotsLeft(m0) : want - fromIncluded);
          if (afterLots > 0n && !(m0.overageEnabled && overageAllowed(key)))
            return fail('insufficient_balance', { key }, balanceView(customer, key));
          const { c, m } = ownMeter(key);
          const p = currentPeriod(m, key);
          if (m.period < p)
            Object.assign(m, { period: p, usedIncluded: 0n, overage: 0n, draws: [] });
          m.usedIncluded += fromIncluded;
          let need = want - fromIncluded;
          for (const lot of m.lots) {
            const take = need < lot.remaining ? need : lot.remaining;
            if (take === 0n) continue;
            lot.remaining -= take;
            need -= take;
            const last = m.draws.at(-1);
            if (last?.lot === lot.id) last.amount += take;
            else m.draws.push({ lot: lot.id, amount: take });
          }
          m.overage += need;
          if (command.idempotencyKey !== undefined)
            c.idempotency.set(scope, { amount: String(want), at: now });
          return ok(balanceView(c, key));
        }
        if (want > u.included + u.lots + u.overage)
          return fail('refund_exceeds_usage', { key }, balanceView(customer, key));
        const c = customer as Customer;
        const m = c.meters.get(key) as Meter;
        let left = want;
        const fromOverage = left < m.overage ? left : m.overage;
        m.overage -= fromOverage;
        left -= fromOverage;
        while (left > 0n && m.draws.length > 0) {
          const last = m.draws.at(-1) as { lot: string; amount: bigint };
          const take = left < last.amount ? left : last.amount;
          last.amount -= take;
          if (last.amount === 0n) m.draws.pop();
          (m.lots.find((l) => l.id === last.lot) as Lot).remaining += take;
          left -= take;
        }
        m.usedIncluded -= left;
        if (command.idempotencyKey !== undefined)
          c.idempotency.set(scope, { amount: String(want), at: now });
        return ok(balanceView(c, key));
      }
    }
  }

  /** Environment/id of every customer the model holds. */
  customerIds(): string[] {
    return [...this.customers.keys()].sort();
  }
}

/**
 * Every read that observes a customer: `has` on every key and the key's own read
 * (balance, limit), plus the contract, for each customer id and environment given.
 */
export function observingReads(
  config: BillingConfig,
  environments: readonly ('test' | 'live')[],
  customerIds: readonly string[],
  extraKeys: readonly string[] = [],
): Command[] {
  const reads: Command[] = [];
  const keys = [...Object.keys(config.entitlements), ...extraKeys];
  for (const environment of environments) {
    for (const customerId of customerIds) {
      reads.push({ op: 'getContract', environment, customerId, key: '' });
      for (const key of keys) {
        reads.push({ op: 'has', environment, customerId, key });
        const t = config.entitlements[key]?.type;
        if (t === 'meter') reads.push({ op: 'balance', environment, customerId, key });
        if (t === 'limit') reads.push({ op: 'limit', environment, customerId, key });
      }
    }
  }
  return reads;
}

/** A reply as the shard renders it (status, body text), parsed for comparison with the model. */
export function parseReply(status: number, body: string): Reply {
  return { status, body: body === '' ? '' : JSON.parse(body) };
}
