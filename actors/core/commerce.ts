/**
 * The customer's commerce: its payment-processor customer, subscriptions and purchases,
 * and the processor events already applied. Decide and apply cases of the commerce ops,
 * and the plan and billing period a subscription gives.
 *
 * The core never calls the processor. The front end reads the processor's current object
 * and hands it over as a command; a command naming a processor event id applies at most
 * once, the id being stored with the change it caused, in the same events. Reconciling
 * to the processor's current object makes duplicates and reordered events converge.
 */
import { assert } from '../../shared/assert.js';
import {
  COMMERCE_RECORDS_PER_CUSTOMER_MAX,
  LOTS_PER_METER_MAX,
  PROCESSOR_EVENTS_PER_CUSTOMER_MAX,
} from '../../shared/limits.js';
import { isoOf } from '../../shared/iso-time.js';
import type { CompiledConfig, CompiledEntitlement, CompiledProduct } from '../billing-config.js';
import { exactAmountValue } from '../fixed.js';
import type {
  CommerceState,
  CommerceView,
  CustomerState,
  Decision,
  Event,
  PurchaseRecord,
  SubscriptionRecord,
  SubscriptionView,
  WriteCommand,
} from './types.js';

const REPLAY: Decision = { rejection: null, events: [] };

/** Statuses under which a subscription's product is the customer's plan. */
const LIVE_STATUSES: ReadonlySet<string> = new Set(['active', 'trialing', 'past_due']);

export function newCommerce(): CommerceState {
  return {
    processorCustomerId: null,
    subscriptions: [],
    purchases: [],
    refunds: [],
    eventIds: [],
  };
}

/** The subscription that makes the customer's plan, if any: the newest live one. */
export function liveSubscription(customer: CustomerState | undefined): SubscriptionRecord | null {
  const subscriptions = customer?.commerce?.subscriptions ?? [];
  for (let i = subscriptions.length - 1; i >= 0; i--) {
    const subscription = subscriptions[i];
    if (subscription !== undefined && LIVE_STATUSES.has(subscription.status)) return subscription;
  }
  return null;
}

/**
 * The customer's plan: a live subscription's product (if still configured), else the default
 * product.
 */
export function subscribedPlan(
  customer: CustomerState | undefined,
  config: CompiledConfig,
): CompiledProduct | null {
  const subscription = liveSubscription(customer);
  return (
    (subscription === null ? undefined : config.products.get(subscription.productKey)) ??
    config.defaultProduct
  );
}

/**
 * The configured products of the customer's paid one-time purchases: their features and
 * limits apply on top of the plan (until refunded). Empty for almost every customer.
 */
export function purchasedProducts(
  customer: CustomerState | undefined,
  config: CompiledConfig,
): CompiledProduct[] {
  const purchases = customer?.commerce?.purchases;
  if (purchases === undefined || purchases.length === 0) return [];
  const products: CompiledProduct[] = [];
  for (const purchase of purchases) {
    const product =
      purchase.status === 'paid' ? config.products.get(purchase.productKey) : undefined;
    if (product !== undefined) products.push(product);
  }
  return products;
}

/** The live subscription as the API shows it (context's `subscription`), or null. */
export function liveSubscriptionView(
  customerId: string,
  customer: CustomerState | undefined,
): SubscriptionView | null {
  const live = liveSubscription(customer);
  return live === null ? null : subscriptionView(customerId, live);
}

function subscriptionView(customerId: string, s: SubscriptionRecord): SubscriptionView {
  return {
    id: s.id,
    customerId,
    productKey: s.productKey,
    status: s.status,
    currentPeriodStart: isoOf(s.currentPeriodStartMs),
    currentPeriodEnd: isoOf(s.currentPeriodEndMs),
    cancelAtPeriodEnd: s.cancelAtPeriodEnd,
    processor: s.processor,
    processorSubscriptionId: s.processorSubscriptionId,
  };
}

/**
 * The billing period a meter follows instead of the calendar: the live subscription's
 * period, when the meter resets at the plan's interval. Null: the calendar period applies.
 */
export function subscriptionPeriod(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
): { startMs: number; endMs: number } | null {
  const subscription = liveSubscription(customer);
  if (subscription === null) return null;
  const product = config.products.get(subscription.productKey);
  if (product === undefined || product.interval === null || product.interval !== ent.reset)
    return null;
  return { startMs: subscription.currentPeriodStartMs, endMs: subscription.currentPeriodEndMs };
}

function seen(customer: CustomerState | undefined, eventId: string | null): boolean {
  return eventId !== null && (customer?.commerce?.eventIds.includes(eventId) ?? false);
}

function noted(
  command: { environment: CustomerState['environment']; customerId: string },
  eventId: string | null,
  nowMs: number,
): Decision {
  if (eventId === null) return REPLAY;
  return {
    rejection: null,
    events: [
      {
        type: 'processorEventNoted',
        environment: command.environment,
        customerId: command.customerId,
        key: '',
        atMs: nowMs,
        eventId,
      },
    ],
  };
}

export function decideSetProcessorCustomer(
  customer: CustomerState | undefined,
  command: Extract<WriteCommand, { op: 'setProcessorCustomer' }>,
  nowMs: number,
): Decision {
  // The first processor customer stays: a second (a race between two checkouts) is ignored,
  // unless it replaces the stored one, which the processor no longer has.
  const stored = customer?.commerce?.processorCustomerId ?? null;
  if (stored !== null && (command.replaces !== stored || stored === command.processorCustomerId))
    return REPLAY;
  const { environment, customerId, processorCustomerId } = command;
  return {
    rejection: null,
    events: [
      {
        type: 'processorCustomerSet',
        environment,
        customerId,
        key: '',
        atMs: nowMs,
        processorCustomerId,
      },
    ],
  };
}

function sameSubscription(a: SubscriptionRecord, b: SubscriptionRecord): boolean {
  return (
    a.productKey === b.productKey &&
    a.status === b.status &&
    a.currentPeriodStartMs === b.currentPeriodStartMs &&
    a.currentPeriodEndMs === b.currentPeriodEndMs &&
    a.cancelAtPeriodEnd === b.cancelAtPeriodEnd
  );
}

/** Statuses a subscription never leaves. */
const TERMINAL_STATUSES: ReadonlySet<string> = new Set(['canceled', 'incomplete_expired']);

/**
 * A read of the processor older than what is stored (two deliveries read it concurrently
 * and the older read arrived last): a subscription never leaves a terminal status and its
 * period never moves back.
 */
function isStale(stored: SubscriptionRecord, incoming: SubscriptionRecord): boolean {
  if (TERMINAL_STATUSES.has(stored.status) && !TERMINAL_STATUSES.has(incoming.status)) return true;
  return incoming.currentPeriodStartMs < stored.currentPeriodStartMs;
}

export function decideSyncSubscription(
  customer: CustomerState | undefined,
  command: Extract<WriteCommand, { op: 'syncSubscription' }>,
  nowMs: number,
): Decision {
  if (seen(customer, command.eventId)) return REPLAY;
  const input = command.subscription;
  const subscription: SubscriptionRecord = {
    ...input,
    id: `${input.processor}:${input.processorSubscriptionId}`,
  };
  const stored = customer?.commerce?.subscriptions.find((s) => s.id === subscription.id);
  if (
    stored !== undefined &&
    (sameSubscription(stored, subscription) || isStale(stored, subscription))
  )
    return noted(command, command.eventId, nowMs);
  if (
    stored === undefined &&
    (customer?.commerce?.subscriptions.length ?? 0) >= COMMERCE_RECORDS_PER_CUSTOMER_MAX
  ) {
    return { rejection: { kind: 'too_many_records' }, events: [] };
  }
  const { environment, customerId, eventId } = command;
  return {
    rejection: null,
    events: [
      {
        type: 'subscriptionSynced',
        environment,
        customerId,
        key: '',
        atMs: nowMs,
        eventId,
        subscription,
      },
    ],
  };
}

/**
 * A paid purchase: recorded once by its id, with a credit lot (named by the purchase) per meter its
 * product grants.
 */
export function decideRecordPurchase(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  command: Extract<WriteCommand, { op: 'recordPurchase' }>,
  nowMs: number,
): Decision {
  if (seen(customer, command.eventId)) return REPLAY;
  const { environment, customerId, eventId, purchase: input } = command;
  if (customer?.commerce?.purchases.some((p) => p.id === input.id) === true)
    return noted(command, eventId, nowMs);
  if ((customer?.commerce?.purchases.length ?? 0) >= COMMERCE_RECORDS_PER_CUSTOMER_MAX)
    return { rejection: { kind: 'too_many_records' }, events: [] };
  const grants = [
    ...(config.products.get(input.productKey)?.grants ?? new Map<string, bigint>()),
  ].filter(([key]) => config.entitlements.get(key)?.type === 'meter');
  for (const [key] of grants) {
    if ((customer?.meters.get(key)?.lots.length ?? 0) >= LOTS_PER_METER_MAX)
      return { rejection: { kind: 'too_many_lots', key }, events: [] };
  }
  const grant = Object.fromEntries(
    grants.map(([key, micros]) => [key, Number(exactAmountValue(micros))]),
  );
  const purchase: PurchaseRecord = {
    ...input,
    status: 'paid',
    refundedAmount: 0,
    grant,
    atMs: nowMs,
  };
  const base = { environment, customerId, atMs: nowMs } as const;
  const events: Event[] = [{ type: 'purchaseRecorded', ...base, key: '', eventId, purchase }];
  for (const [key, micros] of grants)
    if (micros > 0n) events.push({ type: 'lotGranted', ...base, key, lotId: input.id, micros });
  return { rejection: null, events };
}

export function commerceOf(state: CustomerState): CommerceState {
  return (state.commerce ??= newCommerce());
}

function rememberEvent(commerce: CommerceState, eventId: string | null): void {
  if (eventId === null) return;
  commerce.eventIds.push(eventId);
  if (commerce.eventIds.length > PROCESSOR_EVENTS_PER_CUSTOMER_MAX) commerce.eventIds.shift();
}

/** Folds a commerce event into the state (apply.ts hands these over). */
export function applyCommerce(
  state: CustomerState,
  event: Extract<
    Event,
    {
      type:
        | 'processorCustomerSet'
        | 'subscriptionSynced'
        | 'purchaseRecorded'
        | 'processorEventNoted';
    }
  >,
): void {
  const commerce = commerceOf(state);
  switch (event.type) {
    case 'processorCustomerSet':
      commerce.processorCustomerId = event.processorCustomerId;
      return;
    case 'subscriptionSynced': {
      const index = commerce.subscriptions.findIndex((s) => s.id === event.subscription.id);
      if (index === -1) commerce.subscriptions.push(event.subscription);
      else commerce.subscriptions[index] = event.subscription;
      rememberEvent(commerce, event.eventId);
      return;
    }
    case 'purchaseRecorded':
      assert(
        !commerce.purchases.some((p) => p.id === event.purchase.id),
        'a purchase is recorded once',
      );
      commerce.purchases.push(event.purchase);
      rememberEvent(commerce, event.eventId);
      return;
    case 'processorEventNoted':
      rememberEvent(commerce, event.eventId);
      return;
  }
}

export function commerceView(
  customerId: string,
  customer: CustomerState | undefined,
): CommerceView {
  const commerce = customer?.commerce ?? null;
  return {
    customerId,
    processorCustomerId: commerce?.processorCustomerId ?? null,
    subscriptions: (commerce?.subscriptions ?? []).map((s) => subscriptionView(customerId, s)),
    purchases: (commerce?.purchases ?? []).map((p) => ({
      id: p.id,
      customerId,
      productKey: p.productKey,
      status: p.status,
      amount: p.amount,
      currency: p.currency,
      refundedAmount: p.refundedAmount,
      grant: p.grant,
      createdAt: isoOf(p.atMs),
    })),
  };
}
