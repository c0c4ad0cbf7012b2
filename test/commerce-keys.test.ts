/**
 * The keys Tally derives for the processor: price lookup keys (read back into product
 * keys when a subscription is reconciled) and idempotency keys, within Stripe's lengths.
 */
import { describe, expect, it } from 'vitest';
import {
  fitKey,
  IDEMPOTENCY_KEY_MAX,
  LOOKUP_KEY_MAX,
  priceLookupKey,
  pushCommandKey,
} from '../src/commerce/catalog-sync.js';
import { productOfLookupKey } from '../src/commerce/stripe-events.js';

const MONTHLY = { amount: 2000, currency: 'usd', interval: 'month' } as const;

describe('processor keys', () => {
  it('a price lookup key names environment, product and price version, and reads back', () => {
    expect(priceLookupKey('test', 'pro', MONTHLY)).toBe('test:pro:2000-usd-month');
    expect(priceLookupKey('live', 'pack', { amount: 500, currency: 'eur' })).toBe(
      'live:pack:500-eur-once',
    );
    expect(productOfLookupKey('test', 'test:pro:2000-usd-month')).toBe('pro');
    expect(productOfLookupKey('test', priceLookupKey('test', 'team:eu', MONTHLY))).toBe('team:eu');
    expect(productOfLookupKey('live', 'test:pro:2000-usd-month')).toBeUndefined();
    expect(productOfLookupKey('test', null)).toBeUndefined();
  });

  it('long ids are named by a digest, within the processor limits', () => {
    const long = 'p'.repeat(255);
    const key = priceLookupKey('test', long, MONTHLY);
    expect(key.length).toBeLessThanOrEqual(LOOKUP_KEY_MAX);
    expect(key).toBe(priceLookupKey('test', long, MONTHLY));
    expect(key).not.toBe(priceLookupKey('test', `${long.slice(1)}q`, MONTHLY));
    expect(productOfLookupKey('test', key)).toBeUndefined();
    expect(
      fitKey('tally-test-customer-', 'c'.repeat(255), '-after-cus_123', IDEMPOTENCY_KEY_MAX).length,
    ).toBeLessThanOrEqual(IDEMPOTENCY_KEY_MAX);
  });

  it('a push keys its calls by environment, version and document', () => {
    const config = { entitlements: {}, products: {} };
    expect(pushCommandKey('test', 2, config)).toBe(pushCommandKey('test', 2, config));
    expect(pushCommandKey('test', 3, config)).not.toBe(pushCommandKey('test', 2, config));
    expect(pushCommandKey('live', 2, config)).not.toBe(pushCommandKey('test', 2, config));
    expect(
      pushCommandKey('test', 2, { entitlements: {}, products: { free: { default: true } } }),
    ).not.toBe(pushCommandKey('test', 2, config));
  });
});
