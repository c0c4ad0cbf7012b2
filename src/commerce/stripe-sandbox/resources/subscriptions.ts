/**
 * Subscriptions: `/v1/subscriptions` create, retrieve, update, list, cancel (DELETE).
 *
 * Created by checkout or directly (`customer`, `items[n][price]`, the payment always
 * succeeds). Update swaps an item's price (`items[0][id]` + `items[0][price]`), changes a
 * quantity, adds an item, sets `cancel_at_period_end` or `metadata`. With
 * `proration_behavior=always_invoice` a swap is prorated and invoiced at once
 * (proration.ts); with `none` (or nothing) it applies from the next period's invoice.
 * `create_prorations` (pending proration items) is not modelled and is refused rather
 * than silently ignored. DELETE cancels at once.
 * `/v1/subscription_items?subscription=…` lists a subscription's items.
 */
import type Stripe from 'stripe';
import { checkRecurringItems, startSubscription } from '../billing.js';
import { invalidParam, invalidState } from '../errors.js';
import { render, renderList } from '../expand.js';
import { previousAttributes } from '../events.js';
import { prorateChange } from '../proration.js';
import {
  allowOnly,
  mergeMetadata,
  optBoolean,
  optEnum,
  optInteger,
  optObjectArray,
  optString,
  reqString,
  type Params,
} from '../form.js';
import { LIST_PARAMS, listPage } from '../list.js';
import type { Router } from '../router.js';
import type { SandboxState } from '../state.js';
import {
  currentPeriod,
  planOf,
  subscriptionItem,
  type ItemRequest,
} from './subscription-objects.js';

const QUANTITY_MAX = 10_000;

/** `items[n][price]` (+ `quantity`) as active prices. */
export function itemRequests(
  state: SandboxState,
  entries: readonly Params[],
  param: string,
): ItemRequest[] {
  return entries.map((entry, index) => {
    const price = state.prices.get(reqString(entry, 'price'), `${param}[${index}][price]`);
    if (!price.active)
      throw invalidParam(`${param}[${index}][price]`, `The price \`${price.id}\` is not active.`);
    return { price, quantity: optInteger(entry, 'quantity', QUANTITY_MAX) ?? 1 };
  });
}

function createSubscription(state: SandboxState, params: Params): Stripe.Subscription {
  allowOnly(params, ['customer', 'items', 'metadata']);
  const entries = optObjectArray(params, 'items') ?? [];
  if (entries.length === 0)
    throw invalidParam('items', 'Missing required param: items.', 'parameter_missing');
  const items = itemRequests(state, entries, 'items');
  checkRecurringItems(items, 'items');
  return startSubscription(state, {
    customer: reqString(params, 'customer'),
    items,
    metadata: mergeMetadata(params),
  }).subscription;
}

function applyItemChange(
  state: SandboxState,
  subscription: Stripe.Subscription,
  entry: Params,
  index: number,
): Stripe.SubscriptionItem[] {
  allowOnly(entry, ['id', 'price', 'quantity']);
  const items = subscription.items.data;
  const id = optString(entry, 'id');
  const priceId = optString(entry, 'price');
  const price =
    priceId === undefined
      ? undefined
      : itemRequests(state, [{ price: priceId }], 'items')[0]?.price;
  const quantity = optInteger(entry, 'quantity', QUANTITY_MAX);
  if (id === undefined) {
    if (price === undefined)
      throw invalidParam(
        `items[${index}][price]`,
        'Missing required param: price.',
        'parameter_missing',
      );
    const added = subscriptionItem(
      subscription.id,
      { price, quantity: quantity ?? 1 },
      currentPeriod(subscription),
      state.clock.nowSeconds(),
    );
    return [...items, added];
  }
  if (!items.some((item) => item.id === id))
    throw invalidParam(
      `items[${index}][id]`,
      `No such subscription item: '${id}'`,
      'resource_missing',
    );
  const swapped = price === undefined ? {} : { price, plan: planOf(price) };
  return items.map((item) =>
    item.id !== id ? item : { ...item, ...swapped, quantity: quantity ?? item.quantity ?? 1 },
  );
}

function updateSubscription(state: SandboxState, id: string, params: Params): Stripe.Subscription {
  allowOnly(params, ['items', 'cancel_at_period_end', 'metadata', 'proration_behavior']);
  const before = state.subscriptions.get(id);
  if (before.status === 'canceled')
    throw invalidState(
      'A canceled subscription can only update its cancellation_details and metadata.',
    );
  const proration = optEnum(params, 'proration_behavior', [
    'none',
    'create_prorations',
    'always_invoice',
  ] as const);
  if (proration === 'create_prorations')
    throw invalidParam(
      'proration_behavior',
      'The Stripe sandbox invoices prorations at once only; use always_invoice or none.',
    );
  let data = before.items.data;
  for (const [index, entry] of (optObjectArray(params, 'items') ?? []).entries()) {
    data = applyItemChange(state, { ...before, items: { ...before.items, data } }, entry, index);
  }
  checkRecurringItems(
    data.map((item) => ({ price: item.price, quantity: item.quantity ?? 1 })),
    'items',
  );
  const cancelAtPeriodEnd =
    optBoolean(params, 'cancel_at_period_end') ?? before.cancel_at_period_end;
  const changed: Stripe.Subscription = {
    ...before,
    items: { ...before.items, data },
    cancel_at_period_end: cancelAtPeriodEnd,
    cancel_at: cancelAtPeriodEnd ? currentPeriod(before).end : null,
    canceled_at: cancelAtPeriodEnd
      ? (before.canceled_at ?? state.customerNow(String(before.customer)))
      : null,
    metadata: mergeMetadata(params, before.metadata),
  };
  const { subscription: after, invoice } =
    proration === 'always_invoice'
      ? prorateChange(state, before, changed)
      : { subscription: changed, invoice: null };
  const previous = previousAttributes(before, after);
  if (Object.keys(previous).length === 0) return before;
  state.subscriptions.update(after);
  const at = state.customerNow(String(before.customer));
  state.events.emit('customer.subscription.updated', after, previous, at);
  if (invoice !== null) state.events.emit('invoice.paid', invoice, undefined, at);
  return after;
}

function cancelSubscription(state: SandboxState, id: string): Stripe.Subscription {
  const before = state.subscriptions.get(id);
  if (before.status === 'canceled')
    throw invalidState(`The subscription ${id} is already canceled.`);
  const now = state.customerNow(String(before.customer));
  const canceled: Stripe.Subscription = {
    ...before,
    status: 'canceled',
    canceled_at: now,
    ended_at: now,
    cancel_at_period_end: false,
    cancellation_details: {
      comment: null,
      feedback: null,
      feedback_option: null,
      reason: 'cancellation_requested',
    },
  };
  state.subscriptions.update(canceled);
  state.events.emit('customer.subscription.deleted', canceled);
  return canceled;
}

const STATUSES = [
  'active',
  'past_due',
  'unpaid',
  'canceled',
  'incomplete',
  'incomplete_expired',
  'trialing',
  'paused',
  'all',
  'ended',
] as const;

function listSubscriptions(
  state: SandboxState,
  params: Params,
): Stripe.ApiList<Stripe.Subscription> {
  allowOnly(params, [...LIST_PARAMS, 'customer', 'price', 'status', 'test_clock']);
  const customer = optString(params, 'customer');
  const price = optString(params, 'price');
  const status = optEnum(params, 'status', STATUSES);
  const clock = optString(params, 'test_clock');
  const statusMatches = (s: Stripe.Subscription): boolean =>
    status === 'all' ||
    (status === undefined
      ? s.status !== 'canceled'
      : status === 'ended'
        ? s.status === 'canceled'
        : s.status === status);
  const items = state.subscriptions
    .newestFirst()
    .filter(
      (s) =>
        statusMatches(s) &&
        (customer === undefined || s.customer === customer) &&
        (clock === undefined || s.test_clock === clock) &&
        (price === undefined || s.items.data.some((item) => item.price.id === price)),
    );
  return listPage(items, params, '/v1/subscriptions', 'subscription');
}

export function registerSubscriptions(router: Router): void {
  router
    .add('POST', '/v1/subscriptions', ({ state, params, expand }) =>
      render(state, createSubscription(state, params), expand),
    )
    .add('GET', '/v1/subscriptions/:id', ({ state, path, expand }) =>
      render(state, state.subscriptions.get(path['id'] as string), expand),
    )
    .add('POST', '/v1/subscriptions/:id', ({ state, path, params, expand }) =>
      render(state, updateSubscription(state, path['id'] as string, params), expand),
    )
    .add('DELETE', '/v1/subscriptions/:id', ({ state, path, params, expand }) => {
      allowOnly(params, ['invoice_now', 'prorate']);
      return render(state, cancelSubscription(state, path['id'] as string), expand);
    })
    .add('GET', '/v1/subscriptions', ({ state, params, expand }) =>
      renderList(state, listSubscriptions(state, params), expand),
    )
    .add('GET', '/v1/subscription_items', ({ state, params, expand }) => {
      allowOnly(params, [...LIST_PARAMS, 'subscription']);
      const subscription = state.subscriptions.get(
        reqString(params, 'subscription'),
        'subscription',
      );
      const url = `/v1/subscription_items?subscription=${subscription.id}`;
      return renderList(
        state,
        listPage(subscription.items.data, params, url, 'subscription_item'),
        expand,
      );
    });
}
