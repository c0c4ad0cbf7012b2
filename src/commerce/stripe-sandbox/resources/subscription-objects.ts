/**
 * Building subscription objects: the subscription, its items and the legacy `plan` view
 * of each item's price, shaped as the SDK's types.
 *
 * In the current API version the billing period lives on each subscription item
 * (`items.data[].current_period_start/end`); the sandbox keeps every item of a
 * subscription on the same period.
 */
import type Stripe from 'stripe';
import type { Period } from './invoices.js';
import { newId } from '../store.js';

/** The `plan` Stripe still reports next to each recurring price. */
export function planOf(price: Stripe.Price): Stripe.Plan {
  const recurring = price.recurring ?? {
    interval: 'month',
    interval_count: 1,
    trial_period_days: null,
    usage_type: 'licensed',
    meter: null,
  };
  return {
    id: price.id,
    object: 'plan',
    active: price.active,
    amount: price.unit_amount,
    amount_decimal: price.unit_amount_decimal,
    billing_scheme: 'per_unit',
    created: price.created,
    currency: price.currency,
    interval: recurring.interval,
    interval_count: recurring.interval_count,
    livemode: false,
    metadata: price.metadata,
    meter: null,
    nickname: price.nickname,
    product: price.product,
    tiers_mode: null,
    transform_usage: null,
    trial_period_days: null,
    usage_type: 'licensed',
  };
}

export interface ItemRequest {
  readonly price: Stripe.Price;
  readonly quantity: number;
}

export function subscriptionItem(
  subscriptionId: string,
  request: ItemRequest,
  period: Period,
  created: number,
): Stripe.SubscriptionItem {
  return {
    id: newId('si'),
    object: 'subscription_item',
    billing_thresholds: null,
    created,
    current_period_end: period.end,
    current_period_start: period.start,
    current_trial: null,
    discounts: [],
    metadata: {},
    plan: planOf(request.price),
    price: request.price,
    quantity: request.quantity,
    subscription: subscriptionId,
    tax_rates: [],
  };
}

export interface SubscriptionRequest {
  readonly id: string;
  readonly customer: string;
  readonly testClock: string | null;
  readonly items: readonly ItemRequest[];
  readonly metadata: Record<string, string>;
  readonly period: Period;
}

/** A new active subscription starting at `period.start` (no invoice yet). */
export function subscriptionObject(request: SubscriptionRequest): Stripe.Subscription {
  const { id, period } = request;
  const first = request.items[0];
  return {
    id,
    object: 'subscription',
    application: null,
    application_fee_percent: null,
    automatic_tax: { disabled_reason: null, enabled: false, liability: null },
    billing_cycle_anchor: period.start,
    billing_cycle_anchor_config: null,
    billing_mode: { flexible: null, type: 'classic' },
    billing_schedules: [],
    billing_thresholds: null,
    cancel_at: null,
    cancel_at_period_end: false,
    canceled_at: null,
    cancellation_details: { comment: null, feedback: null, feedback_option: null, reason: null },
    collection_method: 'charge_automatically',
    created: period.start,
    currency: first?.price.currency ?? 'usd',
    customer: request.customer,
    customer_account: null,
    days_until_due: null,
    default_payment_method: null,
    default_source: null,
    default_tax_rates: [],
    description: null,
    discounts: [],
    ended_at: null,
    invoice_settings: {
      account_tax_ids: null,
      custom_fields: null,
      description: null,
      footer: null,
      issuer: { type: 'self' },
    },
    items: {
      object: 'list',
      data: request.items.map((item) => subscriptionItem(id, item, period, period.start)),
      has_more: false,
      url: `/v1/subscription_items?subscription=${id}`,
    },
    latest_invoice: null,
    livemode: false,
    managed_payments: null,
    metadata: request.metadata,
    next_pending_invoice_item_invoice: null,
    on_behalf_of: null,
    pause_collection: null,
    payment_settings: {
      payment_method_options: null,
      payment_method_types: null,
      save_default_payment_method: 'off',
    },
    pending_invoice_item_interval: null,
    pending_setup_intent: null,
    pending_update: null,
    schedule: null,
    start_date: period.start,
    status: 'active',
    test_clock: request.testClock,
    transfer_data: null,
    trial_end: null,
    trial_settings: {
      end_behavior: { billing_cycle_anchor: null, missing_payment_method: 'create_invoice' },
    },
    trial_start: null,
  };
}

/** The current period of a subscription (that of its first item). */
export function currentPeriod(subscription: Stripe.Subscription): Period {
  const item = subscription.items.data[0];
  return {
    start: item?.current_period_start ?? subscription.start_date,
    end: item?.current_period_end ?? subscription.start_date,
  };
}

/** The subscription with every item moved to `period`. */
export function withPeriod(subscription: Stripe.Subscription, period: Period): Stripe.Subscription {
  const data = subscription.items.data.map((item) => ({
    ...item,
    current_period_start: period.start,
    current_period_end: period.end,
  }));
  return { ...subscription, items: { ...subscription.items, data } };
}
