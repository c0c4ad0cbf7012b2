/**
 * One-time payments: payment intents and their charges.
 *
 * A `payment`-mode checkout collects its amount with `collectPayment`: a succeeded
 * payment intent and the captured charge behind it (the sandbox's card always
 * succeeds), raising `charge.succeeded` then `payment_intent.succeeded`. Both can be read
 * back through `/v1/payment_intents` and `/v1/charges` (retrieve; list by `customer`,
 * and charges also by `payment_intent`).
 */
import type Stripe from 'stripe';
import { render, renderList } from '../expand.js';
import { allowOnly, optString, type Params } from '../form.js';
import { LIST_PARAMS, listPage } from '../list.js';
import type { Router } from '../router.js';
import type { SandboxState } from '../state.js';
import { newId, randomToken } from '../store.js';

export interface PaymentRequest {
  readonly customer: Stripe.Customer;
  readonly amount: number;
  readonly currency: string;
  readonly description: string | null;
  readonly metadata: Record<string, string>;
  /** When it was paid; default: the customer's now. */
  readonly created?: number;
}

function chargeObject(
  request: PaymentRequest,
  ids: { charge: string; paymentIntent: string; paymentMethod: string },
  created: number,
): Stripe.Charge {
  const { customer, amount, currency } = request;
  return {
    id: ids.charge,
    object: 'charge',
    amount,
    amount_captured: amount,
    amount_refunded: 0,
    application: null,
    application_fee: null,
    application_fee_amount: null,
    balance_transaction: null,
    billing_details: {
      address: null,
      email: customer.email,
      name: customer.name ?? null,
      phone: null,
      tax_id: null,
    },
    calculated_statement_descriptor: 'STRIPE SANDBOX',
    captured: true,
    created,
    currency,
    customer: customer.id,
    description: request.description,
    disputed: false,
    failure_balance_transaction: null,
    failure_code: null,
    failure_message: null,
    fraud_details: {},
    livemode: false,
    metadata: request.metadata,
    on_behalf_of: null,
    outcome: null,
    paid: true,
    payment_intent: ids.paymentIntent,
    payment_method: ids.paymentMethod,
    payment_method_details: null,
    receipt_email: customer.email,
    receipt_number: null,
    receipt_url: null,
    refunded: false,
    review: null,
    shipping: null,
    source: null,
    source_transfer: null,
    statement_descriptor: null,
    statement_descriptor_suffix: null,
    status: 'succeeded',
    transfer_data: null,
    transfer_group: null,
  };
}

function paymentIntentObject(
  request: PaymentRequest,
  ids: { charge: string; paymentIntent: string; paymentMethod: string },
  created: number,
): Stripe.PaymentIntent {
  return {
    id: ids.paymentIntent,
    object: 'payment_intent',
    allowed_payment_method_types: null,
    amount: request.amount,
    amount_capturable: 0,
    amount_received: request.amount,
    application: null,
    application_fee_amount: null,
    automatic_payment_methods: null,
    canceled_at: null,
    cancellation_reason: null,
    capture_method: 'automatic',
    client_secret: `${ids.paymentIntent}_secret_${randomToken(24)}`,
    confirmation_method: 'automatic',
    created,
    currency: request.currency,
    customer: request.customer.id,
    customer_account: null,
    description: request.description,
    excluded_payment_method_types: null,
    last_payment_error: null,
    latest_charge: ids.charge,
    livemode: false,
    managed_payments: null,
    metadata: request.metadata,
    next_action: null,
    on_behalf_of: null,
    payment_method: ids.paymentMethod,
    payment_method_configuration_details: null,
    payment_method_options: null,
    payment_method_types: ['card'],
    payment_record: null,
    processing: null,
    receipt_email: request.customer.email,
    review: null,
    setup_future_usage: null,
    shipping: null,
    source: null,
    statement_descriptor: null,
    statement_descriptor_suffix: null,
    status: 'succeeded',
    transfer_group: null,
  };
}

/**
 * Charges the customer's (simulated) card: a succeeded payment intent and its charge,
 * raising `charge.succeeded` and `payment_intent.succeeded` unless `quiet` (an invoice's
 * payment, whose events the sandbox does not raise).
 */
export function collectPayment(
  state: SandboxState,
  request: PaymentRequest,
  quiet = false,
): Stripe.PaymentIntent {
  const created = request.created ?? state.customerNow(request.customer.id);
  const ids = { charge: newId('ch'), paymentIntent: newId('pi'), paymentMethod: newId('pm') };
  const charge = state.charges.insert(chargeObject(request, ids, created));
  const paymentIntent = state.paymentIntents.insert(paymentIntentObject(request, ids, created));
  if (quiet) return paymentIntent;
  state.events.emit('charge.succeeded', charge, undefined, created);
  state.events.emit('payment_intent.succeeded', paymentIntent, undefined, created);
  return paymentIntent;
}

function listPaymentIntents(
  state: SandboxState,
  params: Params,
): Stripe.ApiList<Stripe.PaymentIntent> {
  allowOnly(params, [...LIST_PARAMS, 'customer']);
  const customer = optString(params, 'customer');
  const items = state.paymentIntents
    .newestFirst()
    .filter((pi) => customer === undefined || pi.customer === customer);
  return listPage(items, params, '/v1/payment_intents', 'payment_intent');
}

function listCharges(state: SandboxState, params: Params): Stripe.ApiList<Stripe.Charge> {
  allowOnly(params, [...LIST_PARAMS, 'customer', 'payment_intent']);
  const customer = optString(params, 'customer');
  const paymentIntent = optString(params, 'payment_intent');
  const items = state.charges
    .newestFirst()
    .filter(
      (ch) =>
        (customer === undefined || ch.customer === customer) &&
        (paymentIntent === undefined || ch.payment_intent === paymentIntent),
    );
  return listPage(items, params, '/v1/charges', 'charge');
}

export function registerPayments(router: Router): void {
  router
    .add('GET', '/v1/payment_intents/:id', ({ state, path, expand }) =>
      render(state, state.paymentIntents.get(path['id'] as string), expand),
    )
    .add('GET', '/v1/payment_intents', ({ state, params, expand }) =>
      renderList(state, listPaymentIntents(state, params), expand),
    )
    .add('GET', '/v1/charges/:id', ({ state, path, expand }) =>
      render(state, state.charges.get(path['id'] as string), expand),
    )
    .add('GET', '/v1/charges', ({ state, params, expand }) =>
      renderList(state, listCharges(state, params), expand),
    );
}
