/**
 * Customers: `/v1/customers` create, retrieve, update, list.
 *
 * A customer may be attached to a test clock at creation (`test_clock`); its
 * subscriptions then live on that clock's time. Checkout creates customers too
 * (`createCustomer`), raising the same `customer.created` event.
 */
import type Stripe from 'stripe';
import { previousAttributes } from '../events.js';
import { allowOnly, mergeMetadata, optString, type Params } from '../form.js';
import { LIST_PARAMS, listPage } from '../list.js';
import { render, renderList } from '../expand.js';
import type { Router } from '../router.js';
import type { SandboxState } from '../state.js';
import { newId } from '../store.js';

export interface CustomerFields {
  readonly email?: string | null;
  readonly name?: string | null;
  readonly description?: string | null;
  readonly phone?: string | null;
  readonly metadata?: Record<string, string>;
  readonly testClock?: string | null;
}

/** Creates and stores a customer, raising `customer.created`. */
export function createCustomer(state: SandboxState, fields: CustomerFields): Stripe.Customer {
  const created =
    fields.testClock == null
      ? state.clock.nowSeconds()
      : state.testClocks.get(fields.testClock, 'test_clock').frozen_time;
  const id = newId('cus');
  const customer: Stripe.Customer = {
    id,
    object: 'customer',
    address: null,
    balance: 0,
    created,
    currency: null,
    default_source: null,
    delinquent: false,
    description: fields.description ?? null,
    email: fields.email ?? null,
    invoice_prefix: id.slice(4, 12).toUpperCase(),
    invoice_settings: {
      custom_fields: null,
      default_payment_method: null,
      footer: null,
      rendering_options: null,
    },
    livemode: false,
    metadata: fields.metadata ?? {},
    name: fields.name ?? null,
    next_invoice_sequence: 1,
    phone: fields.phone ?? null,
    preferred_locales: [],
    shipping: null,
    tax_exempt: 'none',
    test_clock: fields.testClock ?? null,
  };
  state.customers.insert(customer);
  state.events.emit('customer.created', customer);
  return customer;
}

const EDITABLE = ['email', 'name', 'description', 'phone', 'metadata'] as const;

function editableFields(params: Params): CustomerFields {
  return {
    ...(params['email'] === undefined ? {} : { email: optString(params, 'email') || null }),
    ...(params['name'] === undefined ? {} : { name: optString(params, 'name') || null }),
    ...(params['description'] === undefined
      ? {}
      : { description: optString(params, 'description') || null }),
    ...(params['phone'] === undefined ? {} : { phone: optString(params, 'phone') || null }),
  };
}

function updateCustomer(state: SandboxState, id: string, params: Params): Stripe.Customer {
  allowOnly(params, EDITABLE);
  const before = state.customers.get(id);
  const after: Stripe.Customer = {
    ...before,
    ...editableFields(params),
    metadata: mergeMetadata(params, before.metadata),
  };
  const previous = previousAttributes(before, after);
  state.customers.update(after);
  if (Object.keys(previous).length > 0) state.events.emit('customer.updated', after, previous);
  return after;
}

function listCustomers(state: SandboxState, params: Params): Stripe.ApiList<Stripe.Customer> {
  allowOnly(params, [...LIST_PARAMS, 'email', 'test_clock']);
  const email = optString(params, 'email');
  const clock = optString(params, 'test_clock');
  const items = state.customers
    .newestFirst()
    .filter(
      (c) =>
        (email === undefined || c.email === email) &&
        (clock === undefined ? c.test_clock == null : c.test_clock === clock),
    );
  return listPage(items, params, '/v1/customers', 'customer');
}

export function registerCustomers(router: Router): void {
  router
    .add('POST', '/v1/customers', ({ state, params, expand }) => {
      allowOnly(params, [...EDITABLE, 'test_clock']);
      const customer = createCustomer(state, {
        ...editableFields(params),
        metadata: mergeMetadata(params),
        testClock: optString(params, 'test_clock') ?? null,
      });
      return render(state, customer, expand);
    })
    .add('GET', '/v1/customers/:id', ({ state, path, expand }) =>
      render(state, state.customers.get(path['id'] as string), expand),
    )
    .add('POST', '/v1/customers/:id', ({ state, path, params, expand }) =>
      render(state, updateCustomer(state, path['id'] as string, params), expand),
    )
    .add('GET', '/v1/customers', ({ state, params, expand }) =>
      renderList(state, listCustomers(state, params), expand),
    );
}
