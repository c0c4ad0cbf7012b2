/**
 * Prices: `/v1/prices` create, retrieve, update, list.
 *
 * A price is one-time or recurring (`recurring[interval]`, `recurring[interval_count]`)
 * with a whole `unit_amount` in the currency's smallest unit. As on Stripe, a price's
 * amount, currency, product and interval never change: update accepts only `active`,
 * `nickname`, `lookup_key` and `metadata`. A `lookup_key` belongs to one price at a time;
 * taking it for another needs `transfer_lookup_key=true`. Lists filter by `active`,
 * `product`, `type`, `currency` and `lookup_keys[]`.
 */
import Stripe from 'stripe';
import { INTERVALS } from '../clock.js';
import { invalidParam } from '../errors.js';
import { render, renderList } from '../expand.js';
import { previousAttributes } from '../events.js';
import {
  allowOnly,
  mergeMetadata,
  optBoolean,
  optEnum,
  optInteger,
  optObject,
  optString,
  optStringArray,
  reqString,
  type Params,
} from '../form.js';
import { LIST_PARAMS, listPage } from '../list.js';
import type { Router } from '../router.js';
import type { SandboxState } from '../state.js';
import { newId } from '../store.js';

const AMOUNT_MAX = 99_999_999;

function recurringOf(params: Params): Stripe.Price.Recurring | null {
  const recurring = optObject(params, 'recurring');
  if (recurring === undefined) return null;
  allowOnly(recurring, ['interval', 'interval_count']);
  const interval = optEnum(recurring, 'interval', INTERVALS);
  if (interval === undefined)
    throw invalidParam(
      'recurring[interval]',
      'Missing required param: recurring[interval].',
      'parameter_missing',
    );
  const count = optInteger(recurring, 'interval_count', 365) ?? 1;
  if (count < 1)
    throw invalidParam('recurring[interval_count]', 'Invalid interval_count: must be at least 1.');
  return {
    interval,
    interval_count: count,
    meter: null,
    trial_period_days: null,
    usage_type: 'licensed',
  };
}

/** Frees `lookupKey` for `priceId`, or refuses when another price holds it without a transfer. */
function claimLookupKey(
  state: SandboxState,
  lookupKey: string,
  priceId: string,
  transfer: boolean,
): void {
  for (const price of state.prices.all()) {
    if (price.lookup_key !== lookupKey || price.id === priceId) continue;
    if (!transfer) {
      throw invalidParam(
        'lookup_key',
        `A price (\`${price.id}\`) already uses that lookup key.`,
        'lookup_key_already_used',
      );
    }
    const freed = state.prices.update({ ...price, lookup_key: null });
    state.events.emit('price.updated', freed, { lookup_key: lookupKey });
  }
}

function currencyOf(params: Params): string {
  const currency = reqString(params, 'currency').toLowerCase();
  if (!/^[a-z]{3}$/.test(currency))
    throw invalidParam('currency', `Invalid currency: ${currency}.`);
  return currency;
}

function createPrice(state: SandboxState, params: Params): Stripe.Price {
  allowOnly(params, [
    'currency',
    'product',
    'unit_amount',
    'recurring',
    'lookup_key',
    'transfer_lookup_key',
    'active',
    'nickname',
    'metadata',
  ]);
  const product = state.products.get(reqString(params, 'product'), 'product');
  const unitAmount = optInteger(params, 'unit_amount', AMOUNT_MAX);
  if (unitAmount === undefined)
    throw invalidParam('unit_amount', 'Missing required param: unit_amount.', 'parameter_missing');
  const recurring = recurringOf(params);
  const id = newId('price');
  const lookupKey = optString(params, 'lookup_key') || null;
  if (lookupKey !== null)
    claimLookupKey(state, lookupKey, id, optBoolean(params, 'transfer_lookup_key') ?? false);
  const price: Stripe.Price = {
    id,
    object: 'price',
    active: optBoolean(params, 'active') ?? true,
    billing_scheme: 'per_unit',
    created: state.clock.nowSeconds(),
    currency: currencyOf(params),
    custom_unit_amount: null,
    livemode: false,
    lookup_key: lookupKey,
    metadata: mergeMetadata(params),
    nickname: optString(params, 'nickname') || null,
    product: product.id,
    recurring,
    tax_behavior: 'unspecified',
    tiers_mode: null,
    transform_quantity: null,
    type: recurring === null ? 'one_time' : 'recurring',
    unit_amount: unitAmount,
    unit_amount_decimal: Stripe.Decimal.from(String(unitAmount)),
  };
  state.prices.insert(price);
  state.events.emit('price.created', price);
  return price;
}

function updatePrice(state: SandboxState, id: string, params: Params): Stripe.Price {
  allowOnly(params, ['active', 'nickname', 'lookup_key', 'transfer_lookup_key', 'metadata']);
  const before = state.prices.get(id);
  const lookupKey =
    params['lookup_key'] === undefined
      ? before.lookup_key
      : optString(params, 'lookup_key') || null;
  if (lookupKey !== null && lookupKey !== before.lookup_key)
    claimLookupKey(state, lookupKey, id, optBoolean(params, 'transfer_lookup_key') ?? false);
  const after: Stripe.Price = {
    ...before,
    active: optBoolean(params, 'active') ?? before.active,
    nickname:
      params['nickname'] === undefined ? before.nickname : optString(params, 'nickname') || null,
    lookup_key: lookupKey,
    metadata: mergeMetadata(params, before.metadata),
  };
  const previous = previousAttributes(before, after);
  if (Object.keys(previous).length === 0) return before;
  state.prices.update(after);
  state.events.emit('price.updated', after, previous);
  return after;
}

function listPrices(state: SandboxState, params: Params): Stripe.ApiList<Stripe.Price> {
  allowOnly(params, [...LIST_PARAMS, 'active', 'product', 'type', 'currency', 'lookup_keys']);
  const active = optBoolean(params, 'active');
  const product = optString(params, 'product');
  const type = optEnum(params, 'type', ['one_time', 'recurring'] as const);
  const currency = optString(params, 'currency')?.toLowerCase();
  const lookupKeys = optStringArray(params, 'lookup_keys');
  if (lookupKeys !== undefined && lookupKeys.length > 10)
    throw invalidParam('lookup_keys', 'You can pass at most 10 lookup keys.');
  const items = state.prices
    .newestFirst()
    .filter(
      (p) =>
        (active === undefined || p.active === active) &&
        (product === undefined || p.product === product) &&
        (type === undefined || p.type === type) &&
        (currency === undefined || p.currency === currency) &&
        (lookupKeys === undefined || (p.lookup_key !== null && lookupKeys.includes(p.lookup_key))),
    );
  return listPage(items, params, '/v1/prices', 'price');
}

export function registerPrices(router: Router): void {
  router
    .add('POST', '/v1/prices', ({ state, params, expand }) =>
      render(state, createPrice(state, params), expand),
    )
    .add('GET', '/v1/prices/:id', ({ state, path, expand }) =>
      render(state, state.prices.get(path['id'] as string), expand),
    )
    .add('POST', '/v1/prices/:id', ({ state, path, params, expand }) =>
      render(state, updatePrice(state, path['id'] as string, params), expand),
    )
    .add('GET', '/v1/prices', ({ state, params, expand }) =>
      renderList(state, listPrices(state, params), expand),
    );
}
