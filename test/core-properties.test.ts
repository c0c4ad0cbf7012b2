/**
 * Property tests of the customer actor (fast-check): replay rebuilds the live state,
 * nothing overdraws, retries apply once, and a refund undoes a consume exactly. The
 * generated scenarios mix every write op of the op table with each other. These compare
 * the core with itself; test/reference-model.test.ts compares it with an independent
 * model (every reply, every balance, the journal-rebuilt state).
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  toSnapshot,
  type Command,
  type CustomerSnapshot,
  type CustomerState,
  type MeterState,
  type Outcome,
} from '../actors/customer.js';
import { OPS_BY_CODE } from '../actors/ops.js';
import { periodAt } from '../actors/periods.js';
import { COMPILED, Driver, T0 } from './support/core-fixtures.js';

const METERS = ['api_calls', 'tokens', 'storage', 'exports'] as const;
const LIMITS = ['seats', 'projects'] as const;
const CUSTOMERS = ['a', 'b', 'c'] as const;

/** Amounts in micros: small enough to hit boundaries often, with fractional parts. */
const amountMicros = fc.oneof(
  fc.bigInt({ min: 1n, max: 5_000_000n }),
  fc.bigInt({ min: 1n, max: 150_000_000n }),
  fc.constantFrom(1n, 100_000n, 100_000_000n),
);

const addressed = fc.record({
  environment: fc.constantFrom('test' as const, 'live' as const),
  customerId: fc.constantFrom(...CUSTOMERS),
  key: fc.constantFrom(...METERS),
});

const idempotencyKey = fc.option(fc.constantFrom('k1', 'k2', 'k3', 'k4'), { nil: undefined });

/** Profile changes drawn from a few values, so that repeats (which change nothing) are common. */
const profilePatch = fc.record(
  {
    name: fc.constantFrom('Ada', 'Grace', null),
    email: fc.constantFrom('ada@example.com', null),
    metadata: fc.dictionary(
      fc.constantFrom('plan', 'region', 'tier'),
      fc.oneof(
        fc.constantFrom('eu', 'us'),
        fc.integer({ min: 0, max: 3 }),
        fc.boolean(),
        fc.constant(null),
      ),
      { maxKeys: 3 },
    ),
  },
  { requiredKeys: [] },
);

/** What a context call asks for; usage sometimes names a limit, which the call rejects. */
const contextRequest = fc.record({
  features: fc.subarray(['sso', 'audit', 'seats', 'api_calls']),
  usage: fc.subarray(['api_calls', 'tokens', 'seats']),
  limits: fc.subarray([...LIMITS]),
});

/** Processor event ids from a few values, so that redeliveries are common. */
const processorEventId = fc.option(fc.constantFrom('evt_1', 'evt_2', 'evt_3'), { nil: null });

const limitSettings = fc.record(
  { purchased: fc.integer({ min: 0, max: 5 }), autoExpansionEnabled: fc.boolean() },
  { requiredKeys: [] },
);

const command: fc.Arbitrary<Command> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.tuple(addressed, amountMicros, idempotencyKey).map(
      ([a, amountMicros, k]): Command => ({
        op: 'consume',
        ...a,
        amountMicros,
        ...(k ? { idempotencyKey: k } : {}),
      }),
    ),
  },
  {
    weight: 3,
    arbitrary: fc.tuple(addressed, amountMicros, idempotencyKey).map(
      ([a, amountMicros, k]): Command => ({
        op: 'refund',
        ...a,
        amountMicros,
        ...(k ? { idempotencyKey: k } : {}),
      }),
    ),
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(addressed, fc.boolean())
      .map(([a, overageEnabled]): Command => ({ op: 'usageSettings', ...a, overageEnabled })),
  },
  {
    weight: 1,
    arbitrary: fc.tuple(addressed, amountMicros, fc.integer({ min: 0, max: 5 })).map(
      ([a, amountMicros, n]): Command => ({
        op: 'grantLot',
        ...a,
        lotId: `lot_${n}`,
        amountMicros,
      }),
    ),
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(addressed, fc.integer({ min: 0, max: 200 }), fc.integer({ min: 0, max: 10 }))
      .map(
        ([a, meterIncluded, seats]): Command => ({
          op: 'putContract',
          ...a,
          key: '',
          contract: {
            priceAmount: 1000,
            priceInterval: 'month',
            entitlements: { [a.key]: { included: meterIncluded }, seats: { included: seats } },
          },
        }),
      ),
  },
  {
    weight: 1,
    arbitrary: addressed.map((a): Command => ({ op: 'deleteContract', ...a, key: '' })),
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(addressed, fc.constantFrom(...LIMITS), limitSettings)
      .map(([a, key, settings]): Command => ({ op: 'limitSettings', ...a, key, ...settings })),
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(addressed, profilePatch)
      .map(([a, patch]): Command => ({ op: 'upsertCustomer', ...a, key: '', patch })),
  },
  {
    weight: 1,
    arbitrary: fc.tuple(addressed, fc.integer({ min: 0, max: 2 })).map(
      ([a, n]): Command => ({
        op: 'setProcessorCustomer',
        ...a,
        key: '',
        processorCustomerId: `cus_${n}`,
      }),
    ),
  },
  {
    // Subscriptions whose product leaves the plan and periods as they are (a canceled one, or
    // one of a product no longer configured), so the calendar-period normalisation above holds;
    // plans and billing periods from subscriptions are tested end to end (test/commerce.test.ts).
    weight: 1,
    arbitrary: fc
      .tuple(addressed, processorEventId, fc.integer({ min: 0, max: 2 }), fc.boolean())
      .map(
        ([a, eventId, n, gone]): Command => ({
          op: 'syncSubscription',
          ...a,
          key: '',
          eventId,
          subscription: {
            productKey: gone ? 'retired' : 'pro',
            status: gone ? 'active' : 'canceled',
            currentPeriodStartMs: T0,
            currentPeriodEndMs: T0 + 30 * 86_400_000,
            cancelAtPeriodEnd: false,
            processor: 'stripe',
            processorSubscriptionId: `sub_${n}`,
          },
        }),
      ),
  },
  {
    weight: 1,
    arbitrary: fc.tuple(addressed, processorEventId, fc.integer({ min: 0, max: 3 })).map(
      ([a, eventId, n]): Command => ({
        op: 'recordPurchase',
        ...a,
        key: '',
        eventId,
        purchase: { id: `stripe:pi_${n}`, productKey: 'pack', amount: 500, currency: 'usd' },
      }),
    ),
  },
  {
    // Refunds the processor made of purchases and subscriptions that may or may not exist,
    // under repeated keys and processor ids: replayed, they must rebuild the same state.
    weight: 1,
    arbitrary: fc
      .tuple(
        addressed,
        fc.boolean(),
        fc.integer({ min: 0, max: 3 }),
        fc.constantFrom('prorated' as const, 'full' as const),
        fc.option(fc.constantFrom('k0', 'k1'), { nil: null }),
        fc.integer({ min: 0, max: 600 }),
        fc.integer({ min: 0, max: 3 }),
      )
      .map(
        ([a, ofPurchase, n, mode, idempotencyKey, amount, refundId]): Command => ({
          op: 'recordRefund',
          ...a,
          key: '',
          refund: {
            target: ofPurchase ? 'purchase' : 'subscription',
            targetId: ofPurchase ? `stripe:pi_${n}` : `stripe:sub_${n}`,
            mode,
            idempotencyKey: ofPurchase ? (idempotencyKey ?? 'k') : idempotencyKey,
            amount,
            currency: 'usd',
            processorRefundId: `re_${refundId}`,
          },
        }),
      ),
  },
  {
    // Overage bills of a few periods, some repeated: each is recorded once.
    weight: 1,
    arbitrary: fc
      .tuple(addressed, fc.integer({ min: 0, max: 2 }), fc.integer({ min: 0, max: 2 }))
      .map(
        ([a, n, p]): Command => ({
          op: 'recordOverageBill',
          ...a,
          key: '',
          bill: {
            subscriptionId: `stripe:sub_${n}`,
            periodStartMs: T0 + p * 30 * 86_400_000,
            periodEndMs: T0 + (p + 1) * 30 * 86_400_000,
            invoiceId: `in_${n}_${p}`,
            currency: 'usd',
            lines: [
              {
                meterKey: 'api_calls',
                micros: 1_000_000n,
                unitAmount: 2,
                amount: 2,
                processorItemId: `ii_${n}_${p}`,
              },
            ],
          },
        }),
      ),
  },
  {
    weight: 2,
    arbitrary: fc
      .tuple(addressed, profilePatch, contextRequest)
      .map(([a, patch, request]): Command => ({ op: 'context', ...a, key: '', patch, request })),
  },
);

/** Steps in time: mostly milliseconds, sometimes across day/month boundaries. */
const step = fc.oneof(
  fc.constant(0),
  fc.integer({ min: 1, max: 1000 }),
  fc.integer({ min: 3_600_000, max: 40 * 86_400_000 }),
);

const scenario = fc.array(fc.tuple(command, step), { minLength: 1, maxLength: 60 });

function snapshotAll(customers: Map<string, CustomerState>): unknown {
  return [...customers.entries()]
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .map(([k, c]) => [k, toSnapshot(c)]);
}

/**
 * The snapshot as of `nowMs`: usage recorded in an earlier period is what the actor
 * reports as nothing, so a consume entering the new period may drop it. Normalise both
 * sides to "current period" bookkeeping before comparing.
 */
function currentPeriodOnly(snapshot: CustomerSnapshot, nowMs: number): CustomerSnapshot {
  const meters = snapshot.meters
    .map(([key, meter]): [string, MeterState] => {
      const reset = COMPILED.entitlements.get(key)?.reset ?? 'never';
      const start = periodAt(reset, nowMs).startMs;
      if (meter.periodStartMs >= start) return [key, { ...meter, periodStartMs: start }];
      return [
        key,
        { ...meter, periodStartMs: start, includedUsedMicros: 0n, overageMicros: 0n, lotDraws: [] },
      ];
    })
    // A meter entry with nothing in it reads exactly like an absent one.
    .filter(
      ([, m]) =>
        m.includedUsedMicros !== 0n ||
        m.overageMicros !== 0n ||
        m.lots.length > 0 ||
        m.overageEnabled,
    );
  return { ...snapshot, meters };
}

function runAll(driver: Driver, steps: ReadonlyArray<readonly [Command, number]>): number {
  let now = T0;
  for (const [cmd, dt] of steps) {
    now += dt;
    driver.run(cmd, now);
  }
  return now;
}

function assertNoOverdraw(customers: Map<string, CustomerState>): void {
  for (const customer of customers.values()) {
    for (const meter of customer.meters.values()) {
      expect(meter.includedUsedMicros >= 0n).toBe(true);
      expect(meter.overageMicros >= 0n).toBe(true);
      for (const lot of meter.lots) {
        expect(lot.remainingMicros >= 0n && lot.remainingMicros <= lot.grantedMicros).toBe(true);
      }
      for (const [, micros] of meter.lotDraws) expect(micros > 0n).toBe(true);
    }
  }
}

describe('customer actor properties', () => {
  it('scenarios cover every write op of the op table', () => {
    const generated = new Set(fc.sample(command, 2000).map((c) => c.op));
    const writes = OPS_BY_CODE.filter((op) => op.access === 'write').map((op) => op.op);
    expect(writes.filter((op) => !generated.has(op))).toEqual([]);
  });

  it('replaying the journal rebuilds exactly the live state', () => {
    fc.assert(
      fc.property(scenario, (steps) => {
        const driver = new Driver();
        runAll(driver, steps);
        expect(snapshotAll(driver.replayed())).toEqual(snapshotAll(driver.customers));
      }),
      { numRuns: 300 },
    );
  });

  it('no interleaving overdraws a lot or leaves a negative usage counter', () => {
    fc.assert(
      fc.property(scenario, (steps) => {
        const driver = new Driver();
        let now = T0;
        for (const [cmd, dt] of steps) {
          now += dt;
          driver.run(cmd, now);
          // (That overage grows only while enabled is the next property's; used within
          // included is checked on the raw state in reference-model.test.ts.)
          assertNoOverdraw(driver.customers);
        }
      }),
      { numRuns: 300 },
    );
  });

  it('overage only grows while overage is enabled', () => {
    fc.assert(
      fc.property(scenario, (steps) => {
        const driver = new Driver();
        let now = T0;
        for (const [cmd, dt] of steps) {
          now += dt;
          const before = driver.run(
            {
              op: 'balance',
              environment: cmd.environment,
              customerId: cmd.customerId,
              key: cmd.key,
            },
            now,
          );
          const outcome = driver.run(cmd, now);
          if (
            cmd.op === 'consume' &&
            outcome.kind === 'balance' &&
            before.kind === 'balance' &&
            outcome.view.overage > before.view.overage
          ) {
            expect(before.view.overageEnabled).toBe(true);
          }
        }
      }),
      { numRuns: 200 },
    );
  });

  it('a retried command is applied once', () => {
    fc.assert(
      fc.property(scenario, fc.array(fc.nat(), { maxLength: 10 }), (steps, retryPicks) => {
        const once = new Driver();
        const twice = new Driver();
        let now = T0;
        const keyed = steps.map(
          ([cmd], i): Command =>
            cmd.op === 'consume' || cmd.op === 'refund'
              ? { ...cmd, idempotencyKey: `req-${i}` }
              : cmd,
        );
        const retry = new Set(retryPicks.map((n) => n % keyed.length));
        keyed.forEach((cmd, i) => {
          now += 1; // stay well inside the retention window
          const first = once.run(cmd, now);
          twice.run(cmd, now);
          if (retry.has(i) && first.kind !== 'rejected') twice.run(cmd, now);
        });
        expect(snapshotAll(twice.customers)).toEqual(snapshotAll(once.customers));
      }),
      { numRuns: 300 },
    );
  });

  it('refund after consume restores the exact prior state', () => {
    fc.assert(
      fc.property(scenario, addressed, amountMicros, (steps, target, amount) => {
        const driver = new Driver();
        const now = runAll(driver, steps);
        const read = (): Outcome => driver.run({ op: 'balance', ...target }, now);
        const key = `${target.environment}\u0000${target.customerId}`;
        const stored = driver.customers.get(key);
        const before =
          stored === undefined ? null : currentPeriodOnly(structuredClone(toSnapshot(stored)), now);
        const beforeView = read();
        const consumed = driver.run({ op: 'consume', ...target, amountMicros: amount }, now);
        fc.pre(consumed.kind === 'balance');
        const refunded = driver.run({ op: 'refund', ...target, amountMicros: amount }, now);
        expect(refunded).toEqual(beforeView);
        const after = currentPeriodOnly(
          toSnapshot(driver.customers.get(key) as CustomerState),
          now,
        );
        if (before === null) {
          // The consume created the customer: everything it recorded is unwound again.
          for (const [, meter] of after.meters)
            expect([meter.includedUsedMicros, meter.overageMicros, meter.lotDraws]).toEqual([
              0n,
              0n,
              [],
            ]);
        } else {
          expect(after).toEqual(before);
        }
      }),
      { numRuns: 300 },
    );
  });
});
