/**
 * Table-driven tests of the pure customer actor: every metering rule (docs/api.md),
 * with rejections checked in precedence order.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { compileConfig } from '../actors/billing-config.js';
import type { BalanceView, Command, Outcome } from '../actors/customer.js';
import {
  AMOUNT_UNITS_MAX,
  EXACT_UNITS_MAX,
  parseAmount,
  quantityToMicros,
  type AmountParse,
  type Micros,
} from '../actors/fixed.js';
import { periodAt } from '../actors/periods.js';
import { CONFIG, Driver, T0 } from './support/core-fixtures.js';

const env = 'test' as const;
const customerId = 'cus_1';
const u = (units: number): Micros => {
  const parsed = parseAmount(units);
  if (!parsed.ok) throw new Error(`bad amount ${units}`);
  return parsed.micros;
};

function consume(key: string, amount: number, idempotencyKey?: string): Command {
  return {
    op: 'consume',
    environment: env,
    customerId,
    key,
    amountMicros: u(amount),
    ...(idempotencyKey ? { idempotencyKey } : {}),
  };
}
function refund(key: string, amount: number, idempotencyKey?: string): Command {
  return {
    op: 'refund',
    environment: env,
    customerId,
    key,
    amountMicros: u(amount),
    ...(idempotencyKey ? { idempotencyKey } : {}),
  };
}
function balance(key: string): Command {
  return { op: 'balance', environment: env, customerId, key };
}
function grant(key: string, lotId: string, amount: number): Command {
  return { op: 'grantLot', environment: env, customerId, key, lotId, amountMicros: u(amount) };
}
function overage(key: string, overageEnabled: boolean): Command {
  return { op: 'usageSettings', environment: env, customerId, key, overageEnabled };
}
function viewOf(outcome: Outcome): BalanceView {
  if (outcome.kind === 'balance') return outcome.view;
  if (outcome.kind === 'rejected' && 'view' in outcome.rejection) return outcome.rejection.view;
  throw new Error(`no balance view in ${JSON.stringify(outcome)}`);
}
function rejectionOf(outcome: Outcome): string {
  return outcome.kind === 'rejected' ? outcome.rejection.kind : 'accepted';
}

describe('parseAmount', () => {
  it.each([
    [1, 1_000_000n],
    [0.1, 100_000n],
    [0.000001, 1n],
    [1200, 1_200_000_000n],
    [123.456789, 123_456_789n],
    [1e12, 1_000_000_000_000_000_000n],
  ])('accepts %s as %s micros', (value, micros) => {
    expect(parseAmount(value)).toEqual({ ok: true, micros });
  });
  it.each([
    [0, 'not_positive'],
    [-1, 'not_positive'],
    [0.0000001, 'too_many_decimals'],
    [1.1234567, 'too_many_decimals'],
    [Number.POSITIVE_INFINITY, 'not_number'],
    [Number.NaN, 'not_number'],
    ['1', 'not_number'],
    [null, 'not_number'],
    [1e13, 'too_large'],
    // A literal beyond a double is the case under test (it parses to Infinity).
    // biome-ignore lint/correctness/noPrecisionLoss: the case under test
    [1e309, 'not_number'],
  ])('rejects %s (%s)', (value, reason) => {
    expect(parseAmount(value)).toEqual({ ok: false, reason });
  });
  it('finds without String() exactly the micro-units the digits spell, for any amount', () => {
    const reference = (value: number): AmountParse => {
      const micros = quantityToMicros(value);
      return micros === null || micros === 0n
        ? { ok: false, reason: 'too_many_decimals' }
        : { ok: true, micros };
    };
    const sixDecimals = fc.integer({ min: 1, max: Number.MAX_SAFE_INTEGER }).map((k) => k / 1e6);
    const sixDecimalsInRange = fc.integer({ min: 1, max: 2 ** 43 }).map((k) => k / 1e6);
    const sevenDecimals = fc.integer({ min: 1, max: 2 ** 46 }).map((k) => k / 1e7);
    const anyDouble = fc.double({ min: Number.MIN_VALUE, max: AMOUNT_UNITS_MAX, noNaN: true });
    const nearLimit = fc.double({
      min: EXACT_UNITS_MAX / 2,
      max: EXACT_UNITS_MAX * 2,
      noNaN: true,
    });
    const wholeUnits = fc.integer({ min: 1, max: AMOUNT_UNITS_MAX });
    fc.assert(
      fc.property(
        fc.oneof(sixDecimals, sixDecimalsInRange, sevenDecimals, anyDouble, nearLimit, wholeUnits),
        (value) => {
          fc.pre(value > 0 && value <= AMOUNT_UNITS_MAX);
          expect(parseAmount(value)).toEqual(reference(value));
        },
      ),
      { numRuns: 20_000 },
    );
  });
});

describe('periods (UTC calendar)', () => {
  const at = Date.UTC(2026, 2, 18, 15, 30); // Wednesday 18 March 2026
  it.each([
    ['day', Date.UTC(2026, 2, 18), Date.UTC(2026, 2, 19)],
    ['week', Date.UTC(2026, 2, 16), Date.UTC(2026, 2, 23)],
    ['month', Date.UTC(2026, 2, 1), Date.UTC(2026, 3, 1)],
    ['year', Date.UTC(2026, 0, 1), Date.UTC(2027, 0, 1)],
  ] as const)('%s', (reset, startMs, endMs) => {
    expect(periodAt(reset, at)).toEqual({ startMs, endMs });
  });
  it('week starts on Monday even when now is Sunday', () => {
    expect(periodAt('week', Date.UTC(2026, 2, 22, 23, 59))).toEqual({
      startMs: Date.UTC(2026, 2, 16),
      endMs: Date.UTC(2026, 2, 23),
    });
  });
  it('never has no end', () => {
    expect(periodAt('never', at)).toEqual({ startMs: 0, endMs: null });
  });
  it('month handles December → January and leap February', () => {
    expect(periodAt('month', Date.UTC(2026, 11, 31, 23)).endMs).toBe(Date.UTC(2027, 0, 1));
    expect(periodAt('month', Date.UTC(2028, 1, 29)).endMs).toBe(Date.UTC(2028, 2, 1));
  });
});

describe('consume', () => {
  it('draws included first, then lots oldest first, then overage when enabled', () => {
    const d = new Driver();
    d.run(grant('api_calls', 'lot_a', 10), T0);
    d.run(grant('api_calls', 'lot_b', 10), T0 + 1);
    expect(viewOf(d.run(consume('api_calls', 95), T0 + 2))).toMatchObject({
      balance: 25,
      consumed: 95,
      overage: 0,
    });
    expect(viewOf(d.run(consume('api_calls', 12), T0 + 3))).toMatchObject({
      balance: 13,
      consumed: 107,
    });
    const customer = d.customers.get(`test\u0000${customerId}`);
    expect(customer?.meters.get('api_calls')?.lots.map((l) => l.remainingMicros)).toEqual([
      u(3),
      u(10),
    ]);
    expect(rejectionOf(d.run(consume('api_calls', 14), T0 + 4))).toBe('insufficient_balance');
    d.run(overage('api_calls', true), T0 + 5);
    expect(viewOf(d.run(consume('api_calls', 14), T0 + 6))).toMatchObject({
      balance: 0,
      consumed: 121,
      overage: 1,
      overageEnabled: true,
    });
  });

  it('answers 429 with the balance fields and draws nothing when short', () => {
    const d = new Driver();
    d.run(consume('api_calls', 60), T0);
    const outcome = d.run(consume('api_calls', 41), T0 + 1);
    expect(rejectionOf(outcome)).toBe('insufficient_balance');
    expect(viewOf(outcome)).toMatchObject({ balance: 40, consumed: 60, included: 100 });
    expect(viewOf(d.run(balance('api_calls'), T0 + 2))).toMatchObject({
      balance: 40,
      consumed: 60,
    });
  });

  it('keeps exact decimals: 0.1 + 0.2 consumed is 0.3', () => {
    const d = new Driver();
    d.run(consume('api_calls', 0.1), T0);
    expect(viewOf(d.run(consume('api_calls', 0.2), T0))).toMatchObject({
      consumed: 0.3,
      balance: 99.7,
    });
  });

  it('rejects in precedence order: unknown key, then wrong type', () => {
    const d = new Driver();
    expect(rejectionOf(d.run(consume('nope', 1), T0))).toBe('entitlement_not_found');
    expect(rejectionOf(d.run(consume('sso', 1), T0))).toBe('wrong_entitlement_type');
    expect(rejectionOf(d.run(consume('seats', 1), T0))).toBe('wrong_entitlement_type');
    expect(d.journal).toEqual([]);
  });

  it('meter outside the plan has no included allowance but can use lots', () => {
    const d = new Driver();
    expect(rejectionOf(d.run(consume('exports', 1), T0))).toBe('insufficient_balance');
    d.run(grant('exports', 'lot_x', 5), T0);
    expect(viewOf(d.run(consume('exports', 2), T0))).toMatchObject({
      balance: 3,
      included: 0,
      consumed: 2,
    });
  });
});

describe('idempotency', () => {
  it('applies a retried consume once and answers the current balance', () => {
    const d = new Driver();
    d.run(consume('api_calls', 10, 'req-1'), T0);
    d.run(consume('api_calls', 5), T0 + 1);
    const replay = d.run(consume('api_calls', 10, 'req-1'), T0 + 2);
    expect(viewOf(replay)).toMatchObject({ consumed: 15, balance: 85 });
    expect(d.journal).toHaveLength(2);
    // The events hold only the key the shell hands `decide` (`carry`; none here): the
    // shell keeps the keys, with their fingerprints.
    const held = d.journal.map((event) => ('idempotency' in event ? event.idempotency : null));
    expect(held).toEqual([undefined, undefined]);
  });

  it('same key with different parameters is rejected', () => {
    const d = new Driver();
    d.run(consume('api_calls', 10, 'req-1'), T0);
    expect(rejectionOf(d.run(consume('api_calls', 11, 'req-1'), T0 + 1))).toBe(
      'idempotency_key_reused',
    );
  });

  it('a failed attempt records nothing, so its key can be used again', () => {
    const d = new Driver();
    expect(rejectionOf(d.run(consume('api_calls', 500, 'req-9'), T0))).toBe('insufficient_balance');
    expect(viewOf(d.run(consume('api_calls', 50, 'req-9'), T0 + 1))).toMatchObject({
      consumed: 50,
    });
  });

  it('consume and refund of one meter are separate scopes', () => {
    const d = new Driver();
    d.run(consume('api_calls', 10, 'same'), T0);
    expect(viewOf(d.run(refund('api_calls', 4, 'same'), T0 + 1))).toMatchObject({ consumed: 6 });
    expect(viewOf(d.run(refund('api_calls', 4, 'same'), T0 + 2))).toMatchObject({ consumed: 6 });
  });

  it('keys expire after the retention (24 h)', () => {
    const d = new Driver();
    d.run(consume('storage', 1, 'k'), T0);
    d.run(consume('storage', 1, 'k'), T0 + 24 * 3600_000 - 1);
    expect(viewOf(d.run(balance('storage'), T0 + 1))).toMatchObject({ consumed: 1 });
    d.run(consume('storage', 1, 'k'), T0 + 24 * 3600_000 + 1);
    expect(viewOf(d.run(balance('storage'), T0 + 24 * 3600_000 + 2))).toMatchObject({
      consumed: 2,
    });
  });
});

describe('refund', () => {
  it('unwinds overage, then lots newest draw first, then included', () => {
    const d = new Driver();
    d.run(grant('api_calls', 'lot_a', 10), T0);
    d.run(grant('api_calls', 'lot_b', 10), T0);
    d.run(overage('api_calls', true), T0);
    d.run(consume('api_calls', 125), T0); // 100 included, 10 lot_a, 10 lot_b, 5 overage
    const meter = () => d.customers.get(`test\u0000${customerId}`)?.meters.get('api_calls');
    expect(viewOf(d.run(refund('api_calls', 3), T0))).toMatchObject({
      overage: 2,
      consumed: 122,
      balance: 0,
    });
    expect(viewOf(d.run(refund('api_calls', 4), T0))).toMatchObject({
      overage: 0,
      consumed: 118,
      balance: 2,
    });
    expect(meter()?.lots.map((l) => l.remainingMicros)).toEqual([0n, u(2)]);
    expect(viewOf(d.run(refund('api_calls', 10), T0))).toMatchObject({
      consumed: 108,
      balance: 12,
    });
    expect(meter()?.lots.map((l) => l.remainingMicros)).toEqual([u(2), u(10)]);
    expect(viewOf(d.run(refund('api_calls', 28), T0))).toMatchObject({ consumed: 80, balance: 40 });
    expect(meter()?.lots.map((l) => l.remainingMicros)).toEqual([u(10), u(10)]);
  });

  it('refund beyond refundable usage is 409 with the balance fields', () => {
    const d = new Driver();
    d.run(consume('api_calls', 5), T0);
    const outcome = d.run(refund('api_calls', 5.000001), T0);
    expect(rejectionOf(outcome)).toBe('refund_exceeds_usage');
    expect(viewOf(outcome)).toMatchObject({ consumed: 5, balance: 95 });
  });

  it('usage of an earlier period is not refundable', () => {
    const d = new Driver();
    d.run(consume('api_calls', 5), T0);
    const nextMonth = Date.UTC(2026, 3, 1, 0, 0, 0, 1);
    expect(rejectionOf(d.run(refund('api_calls', 1), nextMonth))).toBe('refund_exceeds_usage');
  });
});

describe('periods on meters', () => {
  it('resets usage on the calendar boundary and reports resets with milliseconds', () => {
    const d = new Driver();
    d.run(consume('api_calls', 40), T0);
    expect(viewOf(d.run(balance('api_calls'), T0))).toMatchObject({
      balance: 60,
      resets: '2026-04-01T00:00:00.000Z',
    });
    const april = Date.UTC(2026, 3, 1);
    expect(viewOf(d.run(balance('api_calls'), april))).toMatchObject({
      balance: 100,
      consumed: 0,
      resets: '2026-05-01T00:00:00.000Z',
    });
    expect(viewOf(d.run(balance('tokens'), T0)).resets).toBe('2026-03-16T00:00:00.000Z');
    expect(viewOf(d.run(balance('storage'), T0)).resets).toBeNull();
  });

  it('lots survive a period change but their draws stop being refundable', () => {
    const d = new Driver();
    d.run(grant('tokens', 'lot', 500), T0);
    d.run(consume('tokens', 1200), T0);
    const tomorrow = T0 + 86_400_000;
    expect(viewOf(d.run(balance('tokens'), tomorrow))).toMatchObject({
      balance: 1300,
      consumed: 0,
    });
    expect(rejectionOf(d.run(refund('tokens', 1), tomorrow))).toBe('refund_exceeds_usage');
  });
});

describe('settings and /has', () => {
  const limitSettings = (
    purchased?: number,
    autoExpansionEnabled?: boolean,
    key = 'seats',
  ): Command => ({
    op: 'limitSettings',
    environment: env,
    customerId,
    key,
    ...(purchased === undefined ? {} : { purchased }),
    ...(autoExpansionEnabled === undefined ? {} : { autoExpansionEnabled }),
  });

  it('limit settings raise the limit where expansion is allowed', () => {
    const d = new Driver();
    expect(d.run(limitSettings(3, true), T0)).toEqual({
      kind: 'limit',
      view: {
        limit: 8,
        included: 5,
        purchased: 3,
        expansionAllowed: true,
        autoExpansionEnabled: true,
      },
    });
    expect(d.run(limitSettings(undefined, false), T0)).toMatchObject({
      view: { limit: 8, autoExpansionEnabled: false },
    });
  });

  it.each([
    [limitSettings(1, undefined, 'projects'), 'expansion_not_allowed'],
    [limitSettings(undefined, true, 'projects'), 'expansion_not_allowed'],
    [limitSettings(1, undefined, 'api_calls'), 'wrong_entitlement_type'],
    [limitSettings(1, undefined, 'missing'), 'entitlement_not_found'],
  ])('limit settings rejection %#', (command, kind) => {
    expect(rejectionOf(new Driver().run(command, T0))).toBe(kind);
  });

  it('purchased 0 and autoExpansionEnabled false are fine without expansion', () => {
    expect(rejectionOf(new Driver().run(limitSettings(0, false, 'projects'), T0))).toBe('accepted');
  });

  it('overage can only be enabled where the plan allows it', () => {
    const d = new Driver();
    expect(rejectionOf(d.run(overage('tokens', true), T0))).toBe('overage_not_allowed');
    expect(rejectionOf(d.run(overage('tokens', false), T0))).toBe('accepted');
    expect(rejectionOf(d.run(overage('sso', true), T0))).toBe('wrong_entitlement_type');
  });

  it('/has answers for every entitlement type', () => {
    const d = new Driver();
    const has = (key: string): Outcome =>
      d.run({ op: 'has', environment: env, customerId, key }, T0);
    expect(has('sso')).toMatchObject({ kind: 'has', value: true });
    expect(has('audit')).toMatchObject({ kind: 'has', value: false });
    expect(has('seats')).toMatchObject({ kind: 'has', value: true });
    expect(has('projects')).toMatchObject({ kind: 'has', value: false });
    expect(has('exports')).toMatchObject({ kind: 'has', value: false });
    d.run(consume('api_calls', 100), T0);
    expect(has('api_calls')).toMatchObject({ kind: 'has', value: false });
    d.run(overage('api_calls', true), T0);
    expect(has('api_calls')).toMatchObject({ kind: 'has', value: true });
    expect(rejectionOf(has('missing'))).toBe('entitlement_not_found');
  });

  it('/limit and /usage refuse other types', () => {
    const d = new Driver();
    expect(
      rejectionOf(d.run({ op: 'limit', environment: env, customerId, key: 'api_calls' }, T0)),
    ).toBe('wrong_entitlement_type');
    expect(
      rejectionOf(d.run({ op: 'balance', environment: env, customerId, key: 'seats' }, T0)),
    ).toBe('wrong_entitlement_type');
  });

  it('an unknown customer reads as the default product with nothing stored', () => {
    const d = new Driver();
    expect(viewOf(d.run(balance('api_calls'), T0))).toEqual({
      balance: 100,
      included: 100,
      consumed: 0,
      overage: 0,
      overageAllowed: true,
      overageEnabled: false,
      resets: '2026-04-01T00:00:00.000Z',
    });
    expect(d.customers.size).toBe(0);
  });

  it('a key removed by a later push answers 404 (orphaned state is kept)', () => {
    const d = new Driver();
    d.run(consume('api_calls', 1), T0);
    const { api_calls: _removed, ...rest } = CONFIG.entitlements;
    const free = CONFIG.products['free'];
    const { api_calls: _gone, ...freeEntitlements } = free?.entitlements ?? {};
    d.config = compileConfig(
      { entitlements: rest, products: { free: { ...free, entitlements: freeEntitlements } } },
      2,
    );
    expect(rejectionOf(d.run(balance('api_calls'), T0))).toBe('entitlement_not_found');
    expect(d.customers.get(`test\u0000${customerId}`)?.meters.has('api_calls')).toBe(true);
  });

  it('environments never see each other', () => {
    const d = new Driver();
    d.run(consume('api_calls', 30), T0);
    const live = d.run({ op: 'balance', environment: 'live', customerId, key: 'api_calls' }, T0);
    expect(viewOf(live)).toMatchObject({ consumed: 0 });
  });
});

describe('contracts', () => {
  const put = (
    entitlements: Record<string, { included: number }>,
    customer = customerId,
  ): Command => ({
    op: 'putContract',
    environment: env,
    customerId: customer,
    key: '',
    contract: { priceAmount: 4900, priceInterval: 'month', entitlements },
  });
  const get = (customer = customerId): Command => ({
    op: 'getContract',
    environment: env,
    customerId: customer,
    key: '',
  });
  const del = (customer = customerId): Command => ({
    op: 'deleteContract',
    environment: env,
    customerId: customer,
    key: '',
  });
  const limit = (key: string): Command => ({ op: 'limit', environment: env, customerId, key });
  const has = (key: string): Command => ({ op: 'has', environment: env, customerId, key });

  it('overrides included amounts of limits and meters and grants or denies features', () => {
    const d = new Driver();
    const stored = d.run(
      put({
        seats: { included: 50 },
        api_calls: { included: 2.5 },
        sso: { included: 0 },
        audit: { included: 1 },
      }),
      T0,
    );
    expect(stored).toMatchObject({
      kind: 'contract',
      view: {
        customerId,
        priceAmount: 4900,
        priceInterval: 'month',
        updatedAt: new Date(T0).toISOString(),
      },
    });
    expect(d.run(limit('seats'), T0)).toMatchObject({
      view: { limit: 50, included: 50, expansionAllowed: true },
    });
    expect(viewOf(d.run(balance('api_calls'), T0))).toMatchObject({ included: 2.5, balance: 2.5 });
    expect(d.run(has('sso'), T0)).toMatchObject({ kind: 'has', value: false });
    expect(d.run(has('audit'), T0)).toMatchObject({ kind: 'has', value: true });
    expect(rejectionOf(d.run(consume('api_calls', 3), T0))).toBe('insufficient_balance');
    expect(d.run(get(), T0)).toMatchObject({ kind: 'contract' });
  });

  it('deleting restores the plan; get and delete of no contract are 404s', () => {
    const d = new Driver();
    expect(rejectionOf(d.run(get(), T0))).toBe('contract_not_found');
    expect(rejectionOf(d.run(del(), T0))).toBe('contract_not_found');
    d.run(put({ seats: { included: 50 } }), T0);
    expect(d.run(del(), T0)).toEqual({ kind: 'deleted' });
    expect(d.run(limit('seats'), T0)).toMatchObject({ view: { limit: 5 } });
    expect(rejectionOf(d.run(get(), T0))).toBe('contract_not_found');
  });

  it.each([
    [
      { nope: { included: 1 } },
      'entitlements.nope is not an entitlement of the billing configuration',
    ],
    [
      { seats: { included: 1.5 } },
      'entitlements.seats.included must be a whole number for a limit',
    ],
    [
      { api_calls: { included: 0.0000001 } },
      'entitlements.api_calls.included must have at most 6 decimal places',
    ],
  ])('refuses %j', (entitlements, detail) => {
    const d = new Driver();
    expect(d.run(put(entitlements), T0)).toEqual({
      kind: 'rejected',
      rejection: { kind: 'contract_invalid', detail },
    });
    expect(d.journal).toEqual([]);
  });

  it('a contract for an unknown customer creates the customer', () => {
    const d = new Driver();
    d.run(put({}, 'new-customer'), T0);
    expect(d.customers.has('test\u0000new-customer')).toBe(true);
  });
});
