/**
 * Tests of billing-configuration validation (src/config): the full example is
 * accepted and compiles; each rule has a row in a table of invalid documents with its
 * exact message(s); one push with many faults lists them all; and, as properties, any
 * accepted document compiles with every product referring to defined entitlements of
 * the right type, and no input whatever makes validation throw.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  compileConfig,
  type BillingConfig,
  type CompiledConfig,
  type EntitlementType,
} from '../actors/billing-config.js';
import { billingConfigSchema, BILLING_SCHEMA_ID } from '../src/config/billing-schema.js';
import { formatViolations, validateBillingConfig } from '../src/config/validate-config.js';
import { PRODUCT_EXAMPLE_CONFIG } from './support/product-example.js';

/** The full example configuration (test/support/product-example.ts). */
const EXAMPLE = PRODUCT_EXAMPLE_CONFIG;

// Rows edit documents freely, including into invalid shapes, so the edited view is untyped.
type Doc = Record<string, any>;

/** A deep copy of the example with `edit` applied, so each row states only its fault. */
function example(edit: (doc: Doc) => void = () => {}): Doc {
  const doc = structuredClone(EXAMPLE) as Doc;
  edit(doc);
  return doc;
}

function errorsOf(doc: unknown): string[] {
  const result = validateBillingConfig(doc);
  if (result.ok) throw new Error('expected the document to be rejected');
  return result.errors;
}

describe('__proto__ as a key', () => {
  it(
    'is refused for entitlements and products: ' + 'msgpackr would rename it in the stored record',
    () => {
      const entitlement = JSON.parse(
        '{"entitlements":{"__proto__":{"type":"feature"}},"products":{}}',
      ) as unknown;
      expect(errorsOf(entitlement).join('; ')).toContain(
        'entitlements has invalid key "__proto__"',
      );
      const product = JSON.parse(
        '{"entitlements":{"sso":{"type":"feature"}},' +
          '"products":{"__proto__":{"entitlements":{"sso":true}}}}',
      ) as unknown;
      expect(errorsOf(product).join('; ')).toContain('products has invalid key "__proto__"');
    },
  );
});

describe('the full example', () => {
  it('is valid and compiles', () => {
    const result = validateBillingConfig(example());
    expect(result).toEqual({ ok: true, config: EXAMPLE });
    if (!result.ok) return;
    const compiled = compileConfig(result.config, 1);
    expect(compiled.defaultProduct?.key).toBe('free');
    expect([...(compiled.products.get('pro')?.features ?? [])]).toEqual(['sso']);
    expect(compiled.products.get('pro')?.limits.get('seats')).toEqual({
      included: 5,
      expansionAllowed: true,
    });
    expect(compiled.products.get('pro')?.meters.get('api_calls')).toEqual({
      includedMicros: 10_000_000_000n,
      overageAllowed: true,
    });
    expect(compiled.entitlements.get('api_calls')?.reset).toBe('month');
  });

  it('stays valid with the optional parts varied', () => {
    const variants = [
      example((d) => delete d.webhooks),
      example((d) => (d.webhooks.forwarding[0].events = 'customer.created, usage.exhausted')),
      example((d) => (d.webhooks.forwarding[0].events = ['subscription.created', 'config.pushed'])),
      example((d) => (d.$schema = BILLING_SCHEMA_ID)),
      example((d) => (d.products.free.entitlements.api_calls.included = 0.000001)),
      example((d) => (d.products.credits_5k.grants.api_calls = 0.5)),
      example((d) => (d.products.pro.entitlements.sso = { included: 0 })),
      example((d) => {
        d.entitlements['a.b:c-d_e'] = { type: 'feature' };
        d.products.pro.entitlements['a.b:c-d_e'] = false;
      }),
      example((d) => (d.products.free.entitlements.seats = {})),
      example((d) => (d.products.free.default = false)),
      example((d) => (d.products.credits_5k.entitlements = { sso: true, seats: { included: 2 } })),
      { entitlements: {}, products: {} },
    ];
    for (const doc of variants)
      expect(validateBillingConfig(doc)).toEqual({ ok: true, config: doc });
  });
});

const K255 = 'k'.repeat(255);
const K256 = 'k'.repeat(256);
const KEY_RULE = 'keys are 1-255 characters of A-Z, a-z, 0-9 and _ . : - (not __proto__)';

/** [what, document, every expected message in order]. */
const INVALID: ReadonlyArray<readonly [string, Doc, readonly string[]]> = [
  // Top level.
  ['missing products', example((d) => delete d.products), ['products is required']],
  [
    'unknown top-level property',
    example((d) => (d.webhook = {})),
    ['configuration has unknown property "webhook"'],
  ],
  // Entitlement definitions.
  [
    'unknown type',
    example((d) => (d.entitlements.sso.type = 'flag')),
    ['entitlements.sso.type must be one of feature, limit, meter'],
  ],
  [
    'missing type',
    example((d) => delete d.entitlements.sso.type),
    ['entitlements.sso.type is required'],
  ],
  [
    'unknown reset',
    example((d) => (d.entitlements.api_calls.reset = 'hour')),
    ['entitlements.api_calls.reset must be one of day, week, month, year, never'],
  ],
  [
    'reset on a feature',
    example((d) => (d.entitlements.sso.reset = 'month')),
    ['entitlements.sso.reset is only allowed on a meter; "sso" is a feature'],
  ],
  [
    'reset on a limit',
    example((d) => (d.entitlements.seats.reset = 'never')),
    ['entitlements.seats.reset is only allowed on a meter; "seats" is a limit'],
  ],
  [
    'empty name',
    example((d) => (d.entitlements.sso.name = '')),
    ['entitlements.sso.name must not be empty'],
  ],
  [
    'typo in a definition',
    example((d) => (d.entitlements.sso.nmae = 'SSO')),
    ['entitlements.sso has unknown property "nmae"'],
  ],
  // Keys.
  [
    'key with a space',
    example((d) => (d.products['has space'] = {})),
    [`products has invalid key "has space": ${KEY_RULE}`],
  ],
  [
    'empty key',
    example((d) => (d.entitlements[''] = { type: 'feature' })),
    [`entitlements has invalid key "": ${KEY_RULE}`],
  ],
  [
    'key of 256 characters',
    example((d) => (d.products[K256] = {})),
    [`products has invalid key "${'k'.repeat(64)}…": ${KEY_RULE}`],
  ],
  [
    'key with a slash',
    example((d) => (d.products.pro.entitlements['a/b'] = true)),
    [
      `products.pro.entitlements has invalid key "a/b": ${KEY_RULE}`,
      'products.pro.entitlements["a/b"] is not a defined entitlement',
    ],
  ],
  // Products: shape.
  [
    'typo in a product',
    example((d) => (d.products.pro.prise = d.products.pro.price)),
    ['products.pro has unknown property "prise"'],
  ],
  [
    'fractional price',
    example((d) => (d.products.pro.price.amount = 19.99)),
    ['products.pro.price.amount must be an integer'],
  ],
  [
    'negative price',
    example((d) => (d.products.pro.price.amount = -1)),
    ['products.pro.price.amount must be >= 0'],
  ],
  [
    'uppercase currency',
    example((d) => (d.products.pro.price.currency = 'USD')),
    [
      'products.pro.price.currency must be a three-letter lowercase ISO 4217 currency ' +
        'code, e.g. usd',
    ],
  ],
  [
    'missing currency',
    example((d) => delete d.products.pro.price.currency),
    ['products.pro.price.currency is required'],
  ],
  [
    'weekly interval',
    example((d) => (d.products.pro.price.interval = 'week')),
    ['products.pro.price.interval must be one of month, year'],
  ],
  [
    'default as a string',
    example((d) => (d.products.free.default = 'yes')),
    ['products.free.default must be a boolean'],
  ],
  [
    'entitlement value a number',
    example((d) => (d.products.pro.entitlements.sso = 1)),
    ['products.pro.entitlements.sso must be a boolean or an object'],
  ],
  [
    'negative included',
    example((d) => (d.products.pro.entitlements.seats.included = -1)),
    ['products.pro.entitlements.seats.included must be >= 0'],
  ],
  [
    'included over the cap',
    example((d) => (d.products.pro.entitlements.api_calls.included = 1e12 + 1)),
    ['products.pro.entitlements.api_calls.included must be <= 1000000000000'],
  ],
  [
    'included as a string',
    example((d) => (d.products.pro.entitlements.api_calls.included = '10')),
    ['products.pro.entitlements.api_calls.included must be a number'],
  ],
  [
    'fractional unit amount',
    example((d) => (d.products.pro.entitlements.seats.expansion.unitAmount = 0.5)),
    ['products.pro.entitlements.seats.expansion.unitAmount must be an integer'],
  ],
  [
    'expansion without unitAmount',
    example((d) => (d.products.pro.entitlements.seats.expansion = {})),
    ['products.pro.entitlements.seats.expansion.unitAmount is required'],
  ],
  [
    'typo in a grant',
    example((d) => (d.products.pro.entitlements.api_calls.overrage = { unitAmount: 1 })),
    ['products.pro.entitlements.api_calls has unknown property "overrage"'],
  ],
  [
    'zero grant',
    example((d) => (d.products.credits_5k.grants.api_calls = 0)),
    ['products.credits_5k.grants.api_calls must be > 0'],
  ],
  // Products: semantics.
  [
    'undefined entitlement',
    example((d) => (d.products.pro.entitlements.sms = true)),
    ['products.pro.entitlements.sms is not a defined entitlement'],
  ],
  [
    'an Object.prototype name',
    example((d) => (d.products.pro.entitlements.toString = true)),
    ['products.pro.entitlements.toString is not a defined entitlement'],
  ],
  [
    'undefined key with a dot',
    example((d) => (d.products.pro.entitlements['a.b'] = true)),
    ['products.pro.entitlements["a.b"] is not a defined entitlement'],
  ],
  [
    'grant of an undefined meter',
    example((d) => (d.products.credits_5k.grants.sms = 10)),
    ['products.credits_5k.grants.sms is not a defined entitlement'],
  ],
  [
    'grant of a limit',
    example((d) => (d.products.credits_5k.grants.seats = 10)),
    ['products.credits_5k.grants.seats must name a meter; "seats" is a limit'],
  ],
  [
    'grants on a plan',
    example((d) => (d.products.pro.grants = { api_calls: 10 })),
    ['products.pro.grants is only allowed on a one-time product (price without interval)'],
  ],
  [
    'grants on a free product',
    example((d) => (d.products.free.grants = { api_calls: 10 })),
    ['products.free.grants is only allowed on a one-time product (price without interval)'],
  ],
  [
    'limit given true',
    example((d) => (d.products.pro.entitlements.seats = true)),
    [
      'products.pro.entitlements.seats must be an object such as {"included": 1}, not a ' +
        'boolean; "seats" is a limit',
    ],
  ],
  [
    'meter given false',
    example((d) => (d.products.pro.entitlements.api_calls = false)),
    [
      'products.pro.entitlements.api_calls must be an object such as {"included": 1}, not ' +
        'a boolean; "api_calls" is a meter',
    ],
  ],
  [
    'feature with expansion',
    example(
      (d) => (d.products.pro.entitlements.sso = { included: 1, expansion: { unitAmount: 1 } }),
    ),
    ['products.pro.entitlements.sso.expansion is only allowed on a limit; "sso" is a feature'],
  ],
  [
    'feature with overage',
    example((d) => (d.products.pro.entitlements.sso = { overage: { unitAmount: 1 } })),
    ['products.pro.entitlements.sso.overage is only allowed on a meter; "sso" is a feature'],
  ],
  [
    'expansion on a meter',
    example((d) => (d.products.pro.entitlements.api_calls.expansion = { unitAmount: 1 })),
    [
      'products.pro.entitlements.api_calls.expansion is only allowed on a limit; ' +
        '"api_calls" is a meter',
    ],
  ],
  [
    'overage on a limit',
    example((d) => (d.products.pro.entitlements.seats.overage = { unitAmount: 1 })),
    ['products.pro.entitlements.seats.overage is only allowed on a meter; "seats" is a limit'],
  ],
  [
    'fractional limit',
    example((d) => (d.products.pro.entitlements.seats.included = 1.5)),
    ['products.pro.entitlements.seats.included must be a whole number for a limit'],
  ],
  [
    'seven decimals on a meter',
    example((d) => (d.products.pro.entitlements.api_calls.included = 0.1234567)),
    ['products.pro.entitlements.api_calls.included must have at most 6 decimal places'],
  ],
  [
    '1e-7 on a meter',
    example((d) => (d.products.pro.entitlements.api_calls.included = 1e-7)),
    ['products.pro.entitlements.api_calls.included must have at most 6 decimal places'],
  ],
  [
    'seven decimals on a feature',
    example((d) => (d.products.pro.entitlements.sso = { included: 0.1234567 })),
    ['products.pro.entitlements.sso.included must have at most 6 decimal places'],
  ],
  [
    'seven decimals in a grant',
    example((d) => (d.products.credits_5k.grants.api_calls = 2.0000001)),
    ['products.credits_5k.grants.api_calls must have at most 6 decimal places'],
  ],
  [
    'meter in a one-time product',
    example((d) => (d.products.credits_5k.entitlements = { api_calls: { included: 5 } })),
    [
      'products.credits_5k.entitlements.api_calls: a one-time product adds meter credits ' +
        'through grants, not entitlements',
    ],
  ],
  [
    'two defaults',
    example((d) => (d.products.basic = { default: true })),
    ['products has 2 default products ("free", "basic"); at most one may be default'],
  ],
  [
    'default with a recurring price',
    example((d) => {
      d.products.pro.default = true;
      delete d.products.free.default;
    }),
    ['products.pro is default but has a price; the default product must be free (no price)'],
  ],
  [
    'one-time default',
    example((d) => {
      d.products.credits_5k.default = true;
      delete d.products.free.default;
    }),
    [
      'products.credits_5k is default but is a one-time product (price without interval); ' +
        'the default product must be free (no price)',
    ],
  ],
  // Webhooks.
  [
    'path without a slash',
    example((d) => (d.webhooks.forwarding[0].path = 'api/auth/tally')),
    ['webhooks.forwarding[0].path must start with / and contain no whitespace'],
  ],
  [
    'missing events',
    example((d) => delete d.webhooks.forwarding[0].events),
    ['webhooks.forwarding[0].events is required'],
  ],
  [
    'events a number',
    example((d) => (d.webhooks.forwarding[0].events = 1)),
    ['webhooks.forwarding[0].events must be a string or an array'],
  ],
  [
    'empty events string',
    example((d) => (d.webhooks.forwarding[0].events = '')),
    ['webhooks.forwarding[0].events must not be empty'],
  ],
  [
    'empty events array',
    example((d) => (d.webhooks.forwarding[0].events = [])),
    ['webhooks.forwarding[0].events must have at least 1 item(s)'],
  ],
  [
    'unknown kind in a string',
    example((d) => (d.webhooks.forwarding[0].events = 'customer.created,customer.deleted')),
    ['webhooks.forwarding[0].events names unknown event kind "customer.deleted"'],
  ],
  [
    'empty entry in a string',
    example((d) => (d.webhooks.forwarding[0].events = 'customer.created,,usage.exhausted')),
    ['webhooks.forwarding[0].events has an empty entry'],
  ],
  [
    'unknown kind in an array',
    example((d) => (d.webhooks.forwarding[0].events = ['customer.deleted'])),
    [
      `webhooks.forwarding[0].events[0] must be one of *, customer.created, ` +
        `customer.updated, subscription.created, subscription.updated, ` +
        `subscription.canceled, subscription.refunded, purchase.completed, ` +
        `purchase.refunded, usage.exhausted, config.pushed`,
    ],
  ],
  [
    '"*" with others',
    example((d) => (d.webhooks.forwarding[0].events = '*, usage.exhausted')),
    ['webhooks.forwarding[0].events: "*" must stand alone'],
  ],
  [
    'repeated kind',
    example((d) => (d.webhooks.forwarding[0].events = ['usage.exhausted', 'usage.exhausted'])),
    ['webhooks.forwarding[0].events has duplicate items (0 and 1)'],
  ],
  [
    'duplicate forwarding key',
    example((d) => d.webhooks.forwarding.push({ key: 'app', path: '/hooks', events: '*' })),
    ['webhooks.forwarding[1].key duplicates webhooks.forwarding[0].key'],
  ],
  [
    'typo in forwarding',
    example((d) => (d.webhooks.forwarding[0].autoregister = true)),
    ['webhooks.forwarding[0] has unknown property "autoregister"'],
  ],
  [
    'devTunnel as a string',
    example((d) => (d.webhooks.devTunnel = 'true')),
    ['webhooks.devTunnel must be a boolean'],
  ],
];

describe('invalid documents', () => {
  it.each(INVALID)('%s', (_what, doc, expected) => {
    expect(errorsOf(doc)).toEqual(expected);
  });

  it('accepts keys of exactly 255 characters', () => {
    const doc = example((d) => {
      d.entitlements[K255] = { type: 'feature' };
      d.products[K255] = { entitlements: { [K255]: true } };
    });
    expect(validateBillingConfig(doc).ok).toBe(true);
  });

  it('bounds the number of products', () => {
    const products = Object.fromEntries(Array.from({ length: 1001 }, (_, i) => [`p${i}`, {}]));
    expect(errorsOf({ entitlements: {}, products })).toEqual([
      'products has more than 1000 entries',
    ]);
  });

  it('rejects NaN and Infinity from JS callers', () => {
    expect(
      errorsOf(example((d) => (d.products.pro.entitlements.api_calls.included = NaN))),
    ).toEqual(['products.pro.entitlements.api_calls.included must be a number']);
    expect(errorsOf(example((d) => (d.products.credits_5k.grants.api_calls = Infinity)))).toEqual([
      'products.credits_5k.grants.api_calls must be a number',
    ]);
  });
});

describe('several violations', () => {
  it('lists every one in one message, schema first', () => {
    const doc = example((d) => {
      d.products.pro.prise = 1;
      d.products.pro.entitlements.seats = true;
      d.products.pro.entitlements.sms = true;
      d.products.basic = { default: true };
      d.entitlements.sso.reset = 'day';
      d.products.free.entitlements.api_calls.included = -5;
    });
    const errors = errorsOf(doc);
    expect(errors).toEqual([
      'products.free.entitlements.api_calls.included must be >= 0',
      'products.pro has unknown property "prise"',
      'entitlements.sso.reset is only allowed on a meter; "sso" is a feature',
      'products.pro.entitlements.seats must be an object such as {"included": 1}, not a ' +
        'boolean; "seats" is a limit',
      'products.pro.entitlements.sms is not a defined entitlement',
      'products has 2 default products ("free", "basic"); at most one may be default',
    ]);
    expect(formatViolations(errors)).toBe(`invalid billing configuration: ${errors.join('; ')}`);
  });

  it('lists every violation, however many', () => {
    const errors = Array.from({ length: 500 }, (_, i) => `e${i}`);
    const message = formatViolations(errors);
    expect(message).toBe(`invalid billing configuration: ${errors.join('; ')}`);
  });

  it('a push of 60 bad entitlements is refused with all 60 named', () => {
    const entitlements = Object.fromEntries(
      Array.from({ length: 60 }, (_, i) => [`e${i}`, { type: 'bogus' }]),
    );
    const result = validateBillingConfig({ entitlements, products: {} });
    expect(result.ok).toBe(false);
    if (result.ok) return;
    const message = formatViolations(result.errors);
    for (let i = 0; i < 60; i++) expect(message).toContain(`entitlements.e${i}.type`);
  });

  it('refuses to format no violations (a caller bug)', () => {
    expect(() => formatViolations([])).toThrow();
  });
});

describe('non-object inputs', () => {
  it.each([
    ['null', null],
    ['an array', [EXAMPLE]],
    ['a string', JSON.stringify(EXAMPLE)],
    ['a number', 42],
    ['a boolean', true],
    ['undefined', undefined],
  ])('rejects %s cleanly', (_what, doc) => {
    expect(validateBillingConfig(doc)).toEqual({
      ok: false,
      errors: ['configuration must be an object'],
    });
  });

  it('reports both missing sections of an empty object', () => {
    expect(errorsOf({})).toEqual(['entitlements is required', 'products is required']);
  });
});

describe('the schema', () => {
  it('is draft 2020-12 with an id and a title', () => {
    expect(billingConfigSchema.$schema).toBe('https://json-schema.org/draft/2020-12/schema');
    expect(billingConfigSchema.$id).toBe('https://tally.dev/schemas/billing-config.json');
    expect(billingConfigSchema.title).toBeTruthy();
  });

  it('describes every property', () => {
    const undescribed: string[] = [];
    const visit = (node: unknown, path: string): void => {
      if (typeof node !== 'object' || node === null) return;
      const record = node as Record<string, unknown>;
      const properties = record.properties as Record<string, Record<string, unknown>> | undefined;
      for (const [name, schema] of Object.entries(properties ?? {})) {
        if (typeof schema.description !== 'string') undescribed.push(`${path}.${name}`);
      }
      for (const [name, child] of Object.entries(record)) visit(child, `${path}.${name}`);
    };
    visit(billingConfigSchema, '#');
    expect(undescribed).toEqual([]);
  });
});

// ---------------------------------------------------------------------------------
// Properties

const ENTITLEMENT_KEYS = ['f1', 'f2', 'l1', 'l2', 'm1', 'm2'] as const;
const ENTITLEMENT_TYPES = ['feature', 'limit', 'meter'] as const;

/** The type a key's first letter intends (f, l, m); the generator departs from it now and then. */
function intendedType(key: string): EntitlementType {
  return key.startsWith('f') ? 'feature' : key.startsWith('l') ? 'limit' : 'meter';
}

/** Mostly well-formed values with the edges of decimals, range and sign mixed in. */
const quantity = fc.oneof(
  { arbitrary: fc.nat(10_000), weight: 30 },
  { arbitrary: fc.constantFrom(0.5, 1.25, 0.000001, 123.456789, 1e12), weight: 6 },
  { arbitrary: fc.constantFrom(1e-7, 2.1234567, -1, 1e12 + 1, 0), weight: 1 },
  { arbitrary: fc.double({ min: 0, max: 1e6, noNaN: true }), weight: 1 },
);
const wholeQuantity = fc.oneof(
  { arbitrary: fc.nat(10_000), weight: 9 },
  { arbitrary: quantity, weight: 1 },
);
const unitPrice = fc.record({ unitAmount: fc.nat(10_000) });

/** Any grant value at all, of any type: the mismatches the semantic pass must catch. */
const anyGrantValue = fc.oneof(
  fc.boolean(),
  fc.record({ included: quantity, expansion: unitPrice, overage: unitPrice }, { requiredKeys: [] }),
);

const grantValueOfType: Record<EntitlementType, fc.Arbitrary<unknown>> = {
  feature: fc.oneof(fc.boolean(), fc.record({ included: quantity }, { requiredKeys: [] })),
  limit: fc.record({ included: wholeQuantity, expansion: unitPrice }, { requiredKeys: [] }),
  meter: fc.record({ included: quantity, overage: unitPrice }, { requiredKeys: [] }),
};

function grantValueFor(key: string): fc.Arbitrary<unknown> {
  return fc.oneof(
    { arbitrary: grantValueOfType[intendedType(key)], weight: 40 },
    { arbitrary: anyGrantValue, weight: 1 },
  );
}

function definitionFor(key: string): fc.Arbitrary<Record<string, unknown>> {
  const type = fc.oneof(
    { arbitrary: fc.constant(intendedType(key)), weight: 40 },
    { arbitrary: fc.constantFrom(...ENTITLEMENT_TYPES), weight: 1 },
  );
  const reset = fc.constantFrom('day', 'week', 'month', 'year', 'never');
  const definition = fc.record(
    { type, name: fc.string({ minLength: 1, maxLength: 10 }), reset },
    { requiredKeys: ['type'] },
  );
  // A reset on a feature or limit is a violation: keep one now and then.
  return fc
    .tuple(definition, fc.nat(40))
    .map(([{ reset: kept, ...rest }, dice]) =>
      kept !== undefined && (rest.type === 'meter' || dice === 0) ? { ...rest, reset: kept } : rest,
    );
}

/** Maps each key to its own arbitrary, each key present or absent. */
function someOf(keys: readonly string[], valueFor: (key: string) => fc.Arbitrary<unknown>) {
  return fc.record(Object.fromEntries(keys.map((key) => [key, valueFor(key)])), {
    requiredKeys: [],
  });
}

const productName = fc.string({ minLength: 1, maxLength: 10 });
const freeProduct = fc.record(
  {
    name: productName,
    default: fc.boolean(),
    entitlements: someOf(ENTITLEMENT_KEYS, grantValueFor),
  },
  { requiredKeys: [] },
);
const planProduct = fc.record(
  {
    name: productName,
    price: fc.record({
      amount: fc.nat(100_000),
      currency: fc.constant('usd'),
      interval: fc.constantFrom('month', 'year'),
    }),
    entitlements: someOf(ENTITLEMENT_KEYS, grantValueFor),
  },
  { requiredKeys: ['price'] },
);
const oneTimeProduct = fc.record(
  {
    name: productName,
    price: fc.record({ amount: fc.nat(100_000), currency: fc.constant('usd') }),
    entitlements: someOf(['f1', 'f2', 'l1', 'l2'], grantValueFor),
    grants: someOf(['m1', 'm2'], () => quantity),
  },
  { requiredKeys: ['price'] },
);
/** Anything goes: a default with a price, grants on a plan, undefined and mistyped keys. */
const wildProduct = fc.record(
  {
    default: fc.boolean(),
    price: fc.record(
      {
        amount: fc.nat(100_000),
        currency: fc.constant('usd'),
        interval: fc.constantFrom('month', 'year'),
      },
      { requiredKeys: ['amount', 'currency'] },
    ),
    entitlements: fc.dictionary(fc.constantFrom(...ENTITLEMENT_KEYS, 'x'), anyGrantValue, {
      maxKeys: 4,
    }),
    grants: fc.dictionary(fc.constantFrom(...ENTITLEMENT_KEYS, 'x'), quantity, { maxKeys: 2 }),
  },
  { requiredKeys: [] },
);
const anyProduct = fc.oneof(
  { arbitrary: freeProduct, weight: 3 },
  { arbitrary: planProduct, weight: 3 },
  { arbitrary: oneTimeProduct, weight: 3 },
  { arbitrary: wildProduct, weight: 1 },
);

/** f1, l1 and m1 are always defined; one document in eight drops some of f2, l2 and m2. */
const entitlementDefinitions = fc
  .tuple(
    fc.record(Object.fromEntries(ENTITLEMENT_KEYS.map((key) => [key, definitionFor(key)]))),
    fc.subarray(['f2', 'l2', 'm2']),
    fc.nat(7),
  )
  .map(([definitions, droppable, dice]) => {
    const drop = new Set(dice === 0 ? droppable : []);
    return Object.fromEntries(Object.entries(definitions).filter(([key]) => !drop.has(key)));
  });

/**
 * Documents near the boundary of validity: keys from small pools, so references
 * sometimes dangle; types, values and product kinds mostly agree and now and then do
 * not, so that both accepted and rejected documents are common.
 */
const nearValidDocument = fc.record({
  entitlements: entitlementDefinitions,
  products: fc.record(
    { free: freeProduct, plan: planProduct, oneTime: oneTimeProduct, other: anyProduct },
    { requiredKeys: [] },
  ),
});

/**
 * A compiled configuration with a default product and at least one feature, limit and meter
 * granted.
 */
function isRich(compiled: CompiledConfig): boolean {
  const products = [...compiled.products.values()];
  return (
    compiled.defaultProduct !== null &&
    products.some((product) => product.features.size > 0) &&
    products.some((product) => product.limits.size > 0) &&
    products.some((product) => product.meters.size > 0)
  );
}

function assertCompilesConsistently(config: BillingConfig): CompiledConfig {
  const compiled = compileConfig(config, 7);
  const typeOf = (key: string) => compiled.entitlements.get(key)?.type;
  for (const compiledProduct of compiled.products.values()) {
    for (const key of compiledProduct.features) expect(typeOf(key)).toBe('feature');
    for (const [key, grant] of compiledProduct.limits) {
      expect(typeOf(key)).toBe('limit');
      expect(Number.isInteger(grant.included)).toBe(true);
    }
    for (const key of compiledProduct.meters.keys()) expect(typeOf(key)).toBe('meter');
  }
  const products = Object.entries(config.products);
  for (const [, definition] of products) {
    for (const key of Object.keys(definition.grants ?? {})) expect(typeOf(key)).toBe('meter');
    for (const key of Object.keys(definition.entitlements ?? {})) expect(typeOf(key)).toBeDefined();
  }
  const defaults = products.filter(([, definition]) => definition.default === true);
  expect(defaults.length).toBeLessThanOrEqual(1);
  for (const [, definition] of defaults) expect(definition.price).toBeUndefined();
  return compiled;
}

describe('properties', () => {
  it('whatever is accepted compiles, with every reference of the right type', () => {
    let accepted = 0;
    let acceptedRich = 0;
    let rejected = 0;
    fc.assert(
      fc.property(nearValidDocument, (doc) => {
        const result = validateBillingConfig(doc);
        if (!result.ok) {
          rejected += 1;
          expect(result.errors.length).toBeGreaterThan(0);
          return;
        }
        accepted += 1;
        if (isRich(assertCompilesConsistently(result.config))) acceptedRich += 1;
      }),
      { numRuns: 2000 },
    );
    // Guard against a vacuous property: both sides of the boundary are exercised
    // (about a third is accepted), and accepted documents are not just trivial ones.
    expect(accepted).toBeGreaterThan(300);
    expect(rejected).toBeGreaterThan(300);
    expect(acceptedRich).toBeGreaterThan(100);
  });

  it('rejects any edit of a valid document that breaks a reference', () => {
    fc.assert(
      fc.property(fc.constantFrom('f9', 'toString', '__proto__', 'constructor'), (missing) => {
        const doc = example((d) => {
          d.products.pro.entitlements = JSON.parse(`{${JSON.stringify(missing)}: true}`);
        });
        expect(errorsOf(doc)).toContain(
          `products.pro.entitlements.${missing} is not a defined entitlement`,
        );
      }),
    );
  });

  it('never throws, whatever the input', () => {
    fc.assert(
      fc.property(
        fc.oneof(
          fc.anything(),
          fc.jsonValue(),
          nearValidDocument.map((d) => ({ ...d, extra: 1 })),
        ),
        (doc) => {
          const result = validateBillingConfig(doc);
          if (result.ok) assertCompilesConsistently(result.config);
          else
            expect(
              result.errors.every((error) => typeof error === 'string' && error.length > 0),
            ).toBe(true);
        },
      ),
      { numRuns: 1000 },
    );
  });
});
