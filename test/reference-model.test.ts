/**
 * Model-based property test of the customer core: random command sequences run through
 * the real core (actors/customer.ts `execute`/`query`, rendered as the shard renders
 * them) and through the reference model (support/reference-model.ts) side by side. Every
 * reply must be equal (status and body), and after every command every read of the
 * touched customer (has on every key, balance, limit, contract) must agree. At the end
 * the state rebuilt from the journal alone (`apply` over the events read back through
 * the codec) must answer every read exactly as the model does, so an event from decide
 * that differs from what happened is seen even though live state applied the same event.
 *
 * Generated: consume and refund (with and without idempotency keys, reused keys with
 * other amounts), usage and limit settings, lot grants, contracts (valid and invalid),
 * customer upserts and contexts (metadata additions and deletions), every read, unknown
 * and wrong-type keys, configuration changes between two configurations and time steps
 * across day, week and month boundaries.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { compileConfig, type BillingConfig } from '../actors/billing-config.js';
import type { Command, Environment } from '../actors/customer.js';
import { renderOutcome } from './support/render-reply.js';
import { CONFIG, Driver, T0 } from './support/core-fixtures.js';
import { observingReads, parseReply, ReferenceModel } from './support/reference-model.js';

/**
 * A second configuration: other allowances, a weekly meter, no seat expansion, overage on exports.
 */
const CONFIG_B: BillingConfig = {
  entitlements: { ...CONFIG.entitlements, tokens: { type: 'meter', reset: 'week' } },
  products: {
    basic: {
      default: true,
      entitlements: {
        audit: true,
        seats: { included: 2 },
        projects: { included: 3, expansion: { unitAmount: 100 } },
        api_calls: { included: 50.5 },
        tokens: { included: 10 },
        exports: { included: 3, overage: { unitAmount: 2 } },
      },
    },
  },
};
const CONFIGS = [CONFIG, CONFIG_B];

const ENVIRONMENTS = ['test', 'live'] as const;
const CUSTOMERS = ['a', 'b'] as const;
const KEYS = [...Object.keys(CONFIG.entitlements), 'nope'];
const METERS = ['api_calls', 'tokens', 'storage', 'exports'];

const amountMicros = fc.oneof(
  fc.bigInt({ min: 1n, max: 5_000_000n }),
  fc.bigInt({ min: 1n, max: 150_000_000n }),
  fc.constantFrom(1n, 500_000n, 100_000_000n, 1_000_000_000n),
);
// Mostly one customer, so that settings, lots, contracts and usage meet often.
const who = fc.record({
  environment: fc.oneof(
    { weight: 5, arbitrary: fc.constant('test' as const) },
    { weight: 1, arbitrary: fc.constant('live' as const) },
  ),
  customerId: fc.oneof(
    { weight: 5, arbitrary: fc.constant('a') },
    { weight: 1, arbitrary: fc.constant('b') },
  ),
});
// Weighted towards a few meters so usage, lots and refunds meet: exports has no
// allowance in CONFIG (consumes draw lots at once), api_calls and tokens do.
const anyKey = fc.oneof(
  { weight: 4, arbitrary: fc.constant('api_calls') },
  { weight: 3, arbitrary: fc.constant('exports') },
  { weight: 2, arbitrary: fc.constant('tokens') },
  { weight: 1, arbitrary: fc.constantFrom(...METERS) },
  { weight: 1, arbitrary: fc.constantFrom(...KEYS) },
);
const idem = fc.option(fc.constantFrom('k1', 'k2', 'k3'), { nil: undefined });
const metadata = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.dictionary(
      fc.constantFrom('plan', 'region', 'tier'),
      fc.oneof(fc.constant(null), fc.constantFrom('eu', 'us', 1, true)),
      { maxKeys: 2 },
    ),
  },
  // Many keys at once, around the 50-key cap.
  {
    weight: 1,
    arbitrary: fc
      .tuple(fc.constantFrom(0, 25), fc.constantFrom(25, 26, 50, 51))
      .map(([from, n]) =>
        Object.fromEntries(Array.from({ length: n }, (_, i) => [`m${from + i}`, i])),
      ),
  },
);
const patch = fc.record(
  { name: fc.constantFrom('Acme', 'Beta', null), email: fc.constantFrom('a@x.io', null), metadata },
  { requiredKeys: [] },
);
const keyList = fc.uniqueArray(fc.constantFrom(...KEYS), { maxLength: 3 });

type Step =
  | { readonly kind: 'command'; readonly command: Command }
  | { readonly kind: 'config'; readonly environment: Environment; readonly config: number | null };

const command: fc.Arbitrary<Command> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.tuple(who, anyKey, amountMicros, idem).map(
      ([w, key, amountMicros, k]): Command => ({
        op: 'consume',
        ...w,
        key,
        amountMicros,
        ...(k ? { idempotencyKey: k } : {}),
      }),
    ),
  },
  {
    weight: 3,
    arbitrary: fc.tuple(who, anyKey, amountMicros, idem).map(
      ([w, key, amountMicros, k]): Command => ({
        op: 'refund',
        ...w,
        key,
        amountMicros,
        ...(k ? { idempotencyKey: k } : {}),
      }),
    ),
  },
  {
    weight: 2,
    arbitrary: fc
      .tuple(who, anyKey, fc.boolean())
      .map(
        ([w, key, overageEnabled]): Command => ({ op: 'usageSettings', ...w, key, overageEnabled }),
      ),
  },
  {
    weight: 3,
    arbitrary: fc
      .tuple(
        who,
        anyKey,
        fc.integer({ min: 0, max: 4 }),
        fc.oneof(amountMicros, fc.bigInt({ min: 1n, max: 3_000_000n })),
      )
      .map(
        ([w, key, n, amountMicros]): Command => ({
          op: 'grantLot',
          ...w,
          key,
          lotId: `lot${n}`,
          amountMicros,
        }),
      ),
  },
  {
    weight: 2,
    arbitrary: fc
      .tuple(
        who,
        fc.constantFrom('seats', 'seats', 'projects', 'api_calls', 'nope'),
        fc.option(fc.integer({ min: 0, max: 4 }), { nil: undefined, freq: 2 }),
        fc.option(fc.boolean(), { nil: undefined, freq: 2 }),
      )
      .map(
        ([w, key, purchased, auto]): Command => ({
          op: 'limitSettings',
          ...w,
          key,
          ...(purchased === undefined ? {} : { purchased }),
          ...(auto === undefined ? {} : { autoExpansionEnabled: auto }),
        }),
      ),
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(
        who,
        fc.dictionary(
          fc.constantFrom('api_calls', 'seats', 'sso', 'tokens', 'nope'),
          fc.constantFrom(0, 1, 7, 2.5, 0.0000001),
        ),
      )
      .map(
        ([w, entitlements]): Command => ({
          op: 'putContract',
          ...w,
          key: '',
          contract: {
            priceAmount: 900,
            priceInterval: 'month',
            entitlements: Object.fromEntries(
              Object.entries(entitlements).map(([k, v]) => [k, { included: v }]),
            ),
          },
        }),
      ),
  },
  { weight: 1, arbitrary: who.map((w): Command => ({ op: 'deleteContract', ...w, key: '' })) },
  {
    weight: 1,
    arbitrary: fc
      .tuple(who, patch)
      .map(([w, p]): Command => ({ op: 'upsertCustomer', ...w, key: '', patch: p })),
  },
  {
    weight: 2,
    arbitrary: fc.tuple(who, patch, keyList, keyList, keyList).map(
      ([w, p, features, usage, limits]): Command => ({
        op: 'context',
        ...w,
        key: '',
        patch: p,
        request: { features, usage, limits },
      }),
    ),
  },
  {
    weight: 2,
    arbitrary: fc
      .tuple(who, fc.constantFrom(...KEYS), fc.constantFrom('has', 'balance', 'limit'))
      .map(([w, key, op]): Command => ({ op, ...w, key })),
  },
  { weight: 1, arbitrary: who.map((w): Command => ({ op: 'getContract', ...w, key: '' })) },
);

const step: fc.Arbitrary<Step> = fc.oneof(
  { weight: 30, arbitrary: command.map((c): Step => ({ kind: 'command', command: c })) },
  {
    weight: 1,
    arbitrary: fc
      .tuple(fc.constantFrom(...ENVIRONMENTS), fc.constantFrom(0, 1, null))
      .map(([environment, config]): Step => ({ kind: 'config', environment, config })),
  },
);
/** Mostly milliseconds, sometimes hours to weeks (period boundaries, idempotency expiry). */
const dt = fc.oneof(
  fc.constant(0),
  fc.integer({ min: 1, max: 1000 }),
  fc.integer({ min: 3_600_000, max: 20 * 86_400_000 }),
);
const scenario = fc.array(fc.tuple(step, dt), { minLength: 1, maxLength: 80, size: 'max' });

/** The real core per environment (configs differ per environment), rendered as a shard renders. */
class Real {
  readonly drivers = {
    test: new Driver(compileConfig(CONFIG, 1)),
    live: new Driver(compileConfig(CONFIG, 1)),
  };
  run(command: Command, now: number) {
    const r = renderOutcome(command, this.drivers[command.environment].run(command, now));
    return parseReply(r.status, r.body);
  }
}

function runScenario(steps: ReadonlyArray<readonly [Step, number]>): {
  real: Real;
  models: Record<Environment, ReferenceModel>;
  configs: Record<Environment, BillingConfig | null>;
  now: number;
} {
  const real = new Real();
  const models = { test: new ReferenceModel(), live: new ReferenceModel() };
  const configs: Record<Environment, BillingConfig | null> = { test: CONFIG, live: CONFIG };
  let now = T0;
  let version = 1;
  for (const [s, delta] of steps) {
    now += delta;
    if (s.kind === 'config') {
      const config =
        s.config === null
          ? { entitlements: {}, products: {} }
          : (CONFIGS[s.config] as BillingConfig);
      configs[s.environment] = config;
      real.drivers[s.environment].config = compileConfig(config, ++version);
      continue;
    }
    const c = s.command;
    const expected = models[c.environment].exec(configs[c.environment], c, now);
    expect(real.run(c, now), `reply to ${stringify(c)} at ${now}`).toEqual(expected);
    for (const read of observingReads(CONFIG, [c.environment], [c.customerId], ['nope'])) {
      expect(real.run(read, now), `after ${stringify(c)}: ${stringify(read)}`).toEqual(
        models[c.environment].exec(configs[c.environment], read, now),
      );
    }
  }
  return { real, models, configs, now };
}

function stringify(value: unknown): string {
  return JSON.stringify(value, (_k, v: unknown) => (typeof v === 'bigint' ? `${v}n` : v));
}

describe('the core against the reference model', () => {
  it(
    'answers every command and every read as the model does, and replay rebuilds the model ' +
      'state',
    () => {
      fc.assert(
        fc.property(scenario, (steps) => {
          const { real, models, configs, now } = runScenario(steps);
          for (const environment of ENVIRONMENTS) {
            const replayed = new Driver(real.drivers[environment].config);
            for (const [id, customer] of real.drivers[environment].replayed())
              replayed.customers.set(id, customer);
            for (const read of observingReads(CONFIG, [environment], CUSTOMERS, ['nope'])) {
              const r = renderOutcome(read, replayed.run(read, now));
              expect(parseReply(r.status, r.body), `replayed: ${stringify(read)}`).toEqual(
                models[environment].exec(configs[environment], read, now),
              );
            }
          }
        }),
        { numRuns: 150 },
      );
    },
  );

  it(
    'never lets used exceed included, a lot go below zero or above its grant, or a balance ' +
      'go negative',
    () => {
      // Without contract or configuration changes the allowance is fixed, so its usage can be
      // checked against it on the raw state (not the clamped view).
      const fixed = scenario.map((steps) =>
        steps.filter(([s]) => s.kind === 'command' && s.command.op !== 'putContract'),
      );
      fc.assert(
        fc.property(fixed, (steps) => {
          const { real } = runScenario(steps);
          for (const driver of Object.values(real.drivers)) {
            for (const customer of driver.customers.values()) {
              for (const [key, meter] of customer.meters) {
                const included =
                  driver.config.defaultProduct?.meters.get(key)?.includedMicros ?? 0n;
                expect(
                  meter.includedUsedMicros >= 0n && meter.includedUsedMicros <= included,
                  `${key}: used ${meter.includedUsedMicros} of ${included}`,
                ).toBe(true);
                expect(meter.overageMicros >= 0n).toBe(true);
                for (const lot of meter.lots)
                  expect(
                    lot.remainingMicros >= 0n && lot.remainingMicros <= lot.grantedMicros,
                  ).toBe(true);
              }
            }
          }
        }),
        { numRuns: 150 },
      );
    },
  );
});
