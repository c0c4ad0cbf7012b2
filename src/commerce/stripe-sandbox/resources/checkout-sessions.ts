/**
 * Checkout sessions: `/v1/checkout/sessions` create, retrieve, list, expire, and
 * `/line_items`.
 *
 * A session sells its `line_items` in `payment` mode (one-time prices) or `subscription`
 * mode (recurring prices). Its `url` is the sandbox's hosted page
 * (`<sandbox>/checkout/<id>`, see checkout-page.ts); paying there completes it
 * (checkout-completion.ts). Sessions expire at `expires_at` (24 hours after creation
 * unless given, between 30 minutes and 24 hours) or when expired through the API,
 * raising `checkout.session.expired`; an expired session cannot be paid.
 */
import type Stripe from 'stripe';
import { checkRecurringItems } from '../billing.js';
import { invalidParam, invalidState } from '../errors.js';
import { render, renderList } from '../expand.js';
import {
  allowOnly,
  mergeMetadata,
  optEnum,
  optInteger,
  optObject,
  optObjectArray,
  optString,
  reqString,
  type Params,
} from '../form.js';
import { LIST_PARAMS, listPage } from '../list.js';
import type { Router } from '../router.js';
import type { SandboxState } from '../state.js';
import { newId } from '../store.js';
import { itemRequests } from './subscriptions.js';
import type { ItemRequest } from './subscription-objects.js';

const DAY = 86_400;
const EXPIRY_MIN = 30 * 60;

function lineItem(item: ItemRequest, product: Stripe.Product): Stripe.LineItem {
  const amount = (item.price.unit_amount ?? 0) * item.quantity;
  return {
    id: newId('li'),
    object: 'item',
    adjustable_quantity: null,
    amount_discount: 0,
    amount_subtotal: amount,
    amount_tax: 0,
    amount_total: amount,
    currency: item.price.currency,
    description: product.name,
    metadata: {},
    price: item.price,
    quantity: item.quantity,
  };
}

function sessionItems(
  state: SandboxState,
  params: Params,
  mode: Stripe.Checkout.Session.Mode,
): ItemRequest[] {
  const entries = optObjectArray(params, 'line_items') ?? [];
  if (entries.length === 0)
    throw invalidParam('line_items', 'Missing required param: line_items.', 'parameter_missing');
  for (const entry of entries) allowOnly(entry, ['price', 'quantity']);
  const items = itemRequests(state, entries, 'line_items');
  if (mode === 'subscription') checkRecurringItems(items, 'line_items');
  items.forEach((item, index) => {
    if (mode === 'payment' && item.price.recurring !== null) {
      throw invalidParam(
        `line_items[${index}][price]`,
        'You specified `payment` mode but passed a recurring price. Either switch to ' +
          '`subscription` mode or use only one-time prices.',
      );
    }
    if (item.price.currency !== items[0]?.price.currency)
      throw invalidParam(`line_items[${index}][price]`, 'All line items must share one currency.');
  });
  return items;
}

function expiryOf(params: Params, created: number): number {
  const expiresAt = optInteger(params, 'expires_at');
  if (expiresAt === undefined) return created + DAY;
  if (expiresAt < created + EXPIRY_MIN || expiresAt > created + DAY) {
    throw invalidParam(
      'expires_at',
      'The `expires_at` timestamp must be between 30 minutes and 24 hours from Checkout ' +
        'Session creation.',
    );
  }
  return expiresAt;
}

function createSession(state: SandboxState, params: Params): Stripe.Checkout.Session {
  allowOnly(params, [
    'mode',
    'line_items',
    'customer',
    'customer_email',
    'metadata',
    'client_reference_id',
    'success_url',
    'cancel_url',
    'expires_at',
    'subscription_data',
    'payment_intent_data',
  ]);
  const mode = optEnum(params, 'mode', ['payment', 'subscription'] as const);
  if (mode === undefined)
    throw invalidParam('mode', 'Missing required param: mode.', 'parameter_missing');
  const customer = optString(params, 'customer');
  if (customer !== undefined) state.customers.get(customer, 'customer');
  const subscriptionData = optObject(params, 'subscription_data') ?? {};
  allowOnly(subscriptionData, ['metadata']);
  if (mode !== 'subscription' && params['subscription_data'] !== undefined)
    throw invalidParam(
      'subscription_data',
      'You can only pass subscription_data in `subscription` mode.',
    );
  const paymentData = optObject(params, 'payment_intent_data') ?? {};
  allowOnly(paymentData, ['metadata']);
  if (mode !== 'payment' && params['payment_intent_data'] !== undefined)
    throw invalidParam(
      'payment_intent_data',
      'You can only pass payment_intent_data in `payment` mode.',
    );
  const items = sessionItems(state, params, mode);
  const created = state.clock.nowSeconds();
  const id = newId('cs_test');
  const lines = items.map((item) => lineItem(item, state.products.get(String(item.price.product))));
  const session = sessionObject(state, params, {
    id,
    mode,
    created,
    lines,
    customer: customer ?? null,
  });
  state.sessions.insert(session);
  state.checkoutExtras.set(id, {
    subscriptionMetadata: mergeMetadata(subscriptionData),
    paymentMetadata: mergeMetadata(paymentData),
  });
  return session;
}

interface SessionSeed {
  readonly id: string;
  readonly mode: 'payment' | 'subscription';
  readonly created: number;
  readonly lines: readonly Stripe.LineItem[];
  readonly customer: string | null;
}

function sessionObject(
  state: SandboxState,
  params: Params,
  seed: SessionSeed,
): Stripe.Checkout.Session {
  const { id, mode, created } = seed;
  const total = seed.lines.reduce((sum, line) => sum + line.amount_total, 0);
  return {
    ...sessionDefaults(),
    id,
    amount_subtotal: total,
    amount_total: total,
    cancel_url: optString(params, 'cancel_url') || null,
    client_reference_id: optString(params, 'client_reference_id') || null,
    created,
    currency: seed.lines[0]?.currency ?? null,
    customer: seed.customer,
    customer_creation: seed.customer === null && mode === 'payment' ? 'if_required' : null,
    customer_email: optString(params, 'customer_email') || null,
    expires_at: expiryOf(params, created),
    line_items: {
      object: 'list',
      data: [...seed.lines],
      has_more: false,
      url: `/v1/checkout/sessions/${id}/line_items`,
    },
    metadata: mergeMetadata(params),
    mode,
    payment_method_collection: mode === 'subscription' ? 'always' : null,
    success_url: reqString(params, 'success_url'),
    url: `${state.baseUrl}/checkout/${id}`,
  };
}

/** What every sandbox session has the same: hosted page, card only, no tax or discounts. */
function sessionDefaults() {
  return {
    object: 'checkout.session',
    adaptive_pricing: null,
    after_expiration: null,
    allow_promotion_codes: null,
    allowed_payment_method_types: null,
    automatic_tax: { enabled: false, liability: null, provider: null, status: null },
    billing_address_collection: null,
    client_secret: null,
    collected_information: null,
    consent: null,
    consent_collection: null,
    currency_conversion: null,
    custom_fields: [],
    custom_text: {
      after_submit: null,
      shipping_address: null,
      submit: null,
      terms_of_service_acceptance: null,
    },
    customer_account: null,
    customer_details: null,
    discounts: [],
    integration_identifier: null,
    invoice: null,
    invoice_creation: null,
    livemode: false,
    locale: null,
    managed_payments: null,
    origin_context: null,
    payment_intent: null,
    payment_link: null,
    payment_method_configuration_details: null,
    payment_method_options: null,
    payment_method_types: ['card'],
    payment_status: 'unpaid',
    permissions: null,
    recovered_from: null,
    saved_payment_method_options: null,
    setup_intent: null,
    shipping_address_collection: null,
    shipping_cost: null,
    shipping_options: [],
    status: 'open',
    submit_type: null,
    subscription: null,
    total_details: { amount_discount: 0, amount_shipping: 0, amount_tax: 0 },
    ui_mode: 'hosted',
    wallet_options: null,
  } as const satisfies Partial<Stripe.Checkout.Session>;
}

/** Expires an open session, raising `checkout.session.expired`. */
export function expireSession(
  state: SandboxState,
  session: Stripe.Checkout.Session,
): Stripe.Checkout.Session {
  if (session.status !== 'open')
    throw invalidState(
      `Only Checkout Sessions with a status of \`open\` can be expired. This session has ` +
        `a status of \`${String(session.status)}\`.`,
    );
  const expired: Stripe.Checkout.Session = { ...session, status: 'expired', url: null };
  state.sessions.update(expired);
  state.events.emit('checkout.session.expired', expired);
  return expired;
}

/** Expires the open sessions whose `expires_at` has passed. */
export function expireDue(state: SandboxState): void {
  const now = state.clock.nowSeconds();
  for (const session of [...state.sessions.all()]) {
    if (session.status === 'open' && session.expires_at <= now) expireSession(state, session);
  }
}

function listSessions(
  state: SandboxState,
  params: Params,
): Stripe.ApiList<Stripe.Checkout.Session> {
  allowOnly(params, [...LIST_PARAMS, 'customer', 'subscription', 'payment_intent', 'status']);
  const filters = {
    customer: optString(params, 'customer'),
    subscription: optString(params, 'subscription'),
    payment_intent: optString(params, 'payment_intent'),
  };
  const status = optEnum(params, 'status', ['open', 'complete', 'expired'] as const);
  const items = state.sessions
    .newestFirst()
    .filter(
      (session) =>
        (status === undefined || session.status === status) &&
        Object.entries(filters).every(
          ([key, value]) => value === undefined || session[key as keyof typeof filters] === value,
        ),
    );
  return listPage(items, params, '/v1/checkout/sessions', 'checkout.session');
}

function listLineItems(
  state: SandboxState,
  id: string,
  params: Params,
): Stripe.ApiList<Stripe.LineItem> {
  allowOnly(params, LIST_PARAMS);
  const session = state.sessions.get(id);
  return listPage(
    session.line_items?.data ?? [],
    params,
    `/v1/checkout/sessions/${id}/line_items`,
    'line_item',
  );
}

export function registerCheckoutSessions(router: Router): void {
  router
    .add('POST', '/v1/checkout/sessions', ({ state, params, expand }) =>
      render(state, createSession(state, params), expand),
    )
    .add('GET', '/v1/checkout/sessions/:id', ({ state, path, expand }) =>
      render(state, state.sessions.get(path['id'] as string), expand),
    )
    .add('POST', '/v1/checkout/sessions/:id/expire', ({ state, path, params, expand }) => {
      allowOnly(params, []);
      return render(state, expireSession(state, state.sessions.get(path['id'] as string)), expand);
    })
    .add('GET', '/v1/checkout/sessions/:id/line_items', ({ state, path, params, expand }) =>
      renderList(state, listLineItems(state, path['id'] as string, params), expand),
    )
    .add('GET', '/v1/checkout/sessions', ({ state, params, expand }) =>
      renderList(state, listSessions(state, params), expand),
    );
}
