/**
 * Invoices: built by subscription billing (`invoiceForPeriod`, `issueInvoice`), read through
 * `/v1/invoices` (retrieve, list filtered by `customer`, `subscription`, `status`), and their
 * payments through `/v1/invoice_payments`.
 *
 * An invoice is paid in full when it is finalized (the card always succeeds): `status:
 * paid`, `amount_paid` = total less the customer's credit; a renewal's invoice may first stay
 * a draft that invoice items are added to (billing.ts). Each subscription item becomes one
 * line whose `period` is the service period it pays for; the invoice names its subscription under
 * `parent.subscription_details` (where the current API version puts it) and each line under
 * `subscription`. `/v1/invoices/:id/lines` pages through the lines. Invoice
 * `period_start`/`period_end` follow Stripe's meaning (the period that just ended, equal to the
 * creation time on a subscription's first invoice).
 */
import Stripe from 'stripe';
import { render, renderList } from '../expand.js';
import { allowOnly, optEnum, optString, type Params } from '../form.js';
import { LIST_PARAMS, listPage } from '../list.js';
import { formatPrice } from '../money.js';
import type { Router } from '../router.js';
import type { SandboxState } from '../state.js';
import { newId } from '../store.js';
import { collectPayment } from './payments.js';

export interface Period {
  readonly start: number;
  readonly end: number;
}

/** One line of an invoice: a subscription item over a period, at an amount. */
export interface LineRequest {
  readonly item: Stripe.SubscriptionItem;
  readonly period: Period;
  /** Minor units; negative for the credit of a proration. */
  readonly amount: number;
  readonly proration: boolean;
  /** What the line says; default `1 × Product (at $20.00 / month)`. */
  readonly description?: string;
}

function invoiceLine(
  state: SandboxState,
  invoiceId: string,
  subscription: Stripe.Subscription,
  line: LineRequest,
): Stripe.InvoiceLineItem {
  const { item, amount, period } = line;
  const quantity = item.quantity ?? 1;
  const product = state.products.get(String(item.price.product));
  return {
    id: newId('il'),
    object: 'line_item',
    amount,
    currency: item.price.currency,
    description:
      line.description ?? `${quantity} × ${product.name} (at ${formatPrice(item.price)})`,
    discount_amounts: [],
    discountable: !line.proration,
    discounts: [],
    invoice: invoiceId,
    livemode: false,
    metadata: {},
    parent: {
      invoice_item_details: null,
      subscription_item_details: {
        invoice_item: null,
        proration: line.proration,
        proration_details: { credited_items: null },
        subscription: subscription.id,
        subscription_item: item.id,
      },
      type: 'subscription_item_details',
    },
    period: { start: period.start, end: period.end },
    pretax_credit_amounts: [],
    pricing: {
      price_details: { price: item.price.id, product: product.id },
      type: 'price_details',
      unit_amount_decimal: Stripe.Decimal.from(String(item.price.unit_amount ?? 0)),
    },
    quantity,
    quantity_decimal: Stripe.Decimal.from(String(quantity)),
    subscription: subscription.id,
    subtotal: amount,
    taxes: [],
  };
}

/** The next invoice number of a customer (`PREFIX-0001`), advancing its sequence. */
function nextNumber(state: SandboxState, customerId: string): string {
  const customer = state.customers.get(customerId);
  const sequence = customer.next_invoice_sequence ?? 1;
  state.customers.update({ ...customer, next_invoice_sequence: sequence + 1 });
  return `${customer.invoice_prefix ?? 'SANDBOX'}-${String(sequence).padStart(4, '0')}`;
}

export interface InvoiceRequest {
  readonly subscription: Stripe.Subscription;
  /** The service period the lines pay for. */
  readonly period: Period;
  /** The invoice's own `period_start`/`period_end`. */
  readonly invoicePeriod: Period;
  readonly reason: 'subscription_create' | 'subscription_cycle';
  readonly created: number;
  readonly draft?: boolean;
}

/** Builds and stores a paid invoice for one period of a subscription (no events). */
export function invoiceForPeriod(state: SandboxState, request: InvoiceRequest): Stripe.Invoice {
  const { subscription, period } = request;
  return issueInvoice(state, {
    ...request,
    lines: subscription.items.data.map((item) => ({
      item,
      period,
      amount: (item.price.unit_amount ?? 0) * (item.quantity ?? 1),
      proration: false,
    })),
  });
}

export interface IssueRequest {
  readonly subscription: Stripe.Subscription;
  readonly lines: readonly LineRequest[];
  readonly invoicePeriod: Period;
  readonly reason: Stripe.Invoice.BillingReason;
  readonly created: number;
  /** Left as a draft (lines can be added) until `finalizeInvoice`; else paid at once. */
  readonly draft?: boolean;
}

/** How long a renewal's draft stays open for invoice items, as on Stripe: one hour. */
export const DRAFT_OPEN_SECONDS = 3600;

/**
 * Builds, stores and pays an invoice (no events). The customer's credit balance (from a
 * downgrade's proration) is applied first; what remains due is charged to the card: a
 * payment intent and charge, named by an invoice payment. A total below zero is left as
 * credit on the customer's balance.
 */
export function issueInvoice(state: SandboxState, request: IssueRequest): Stripe.Invoice {
  const { subscription, created } = request;
  const id = newId('in');
  const lines = request.lines.map((line) => invoiceLine(state, id, subscription, line));
  const total = lines.reduce((sum, line) => sum + line.amount, 0);
  const customerId = String(subscription.customer);
  const customer = state.customers.get(customerId);
  const invoice: Stripe.Invoice = {
    ...invoiceDefaults(),
    id,
    amount_due: total,
    amount_paid: 0,
    billing_reason: request.reason,
    created,
    currency: subscription.currency,
    customer: customerId,
    customer_email: customer.email,
    customer_name: customer.name ?? null,
    effective_at: null,
    ending_balance: null,
    lines: { object: 'list', data: lines, has_more: false, url: `/v1/invoices/${id}/lines` },
    number: nextNumber(state, customerId),
    parent: {
      quote_details: null,
      subscription_details: { metadata: subscription.metadata, subscription: subscription.id },
      type: 'subscription_details',
    },
    period_end: request.invoicePeriod.end,
    period_start: request.invoicePeriod.start,
    starting_balance: 0,
    status: 'draft',
    status_transitions: {
      finalized_at: null,
      marked_uncollectible_at: null,
      paid_at: null,
      voided_at: null,
    },
    subtotal: total,
    subtotal_excluding_tax: total,
    test_clock: subscription.test_clock,
    total,
    total_excluding_tax: total,
    webhooks_delivered_at: null,
    automatically_finalizes_at: request.draft === true ? created + DRAFT_OPEN_SECONDS : null,
  };
  state.invoices.insert(invoice);
  return request.draft === true ? invoice : finalizeInvoice(state, invoice.id, created);
}

/**
 * Finalizes a draft at `at` and pays it: the customer's credit balance (from a downgrade's
 * proration) is applied first, what remains due is charged to the card.
 */
export function finalizeInvoice(
  state: SandboxState,
  invoiceId: string,
  at: number,
): Stripe.Invoice {
  const draft = state.invoices.get(invoiceId);
  const total = draft.lines.data.reduce((sum, line) => sum + line.amount, 0);
  const customer = state.customers.get(String(draft.customer));
  const startingBalance = customer.balance;
  const due = Math.max(0, total + startingBalance);
  const endingBalance = Math.min(0, total + startingBalance);
  state.customers.update({ ...customer, balance: endingBalance });
  const invoice = state.invoices.update({
    ...draft,
    amount_due: due,
    amount_paid: due,
    automatically_finalizes_at: null,
    effective_at: at,
    ending_balance: endingBalance,
    starting_balance: startingBalance,
    status: 'paid',
    status_transitions: { ...draft.status_transitions, finalized_at: at, paid_at: at },
    subtotal: total,
    subtotal_excluding_tax: total,
    total,
    total_excluding_tax: total,
    webhooks_delivered_at: at,
  });
  if (due > 0) payInvoice(state, invoice, customer);
  return invoice;
}

/** Charges an invoice's amount due and records the payment (`/v1/invoice_payments`). */
function payInvoice(state: SandboxState, invoice: Stripe.Invoice, customer: Stripe.Customer): void {
  const paymentIntent = collectPayment(
    state,
    {
      customer,
      amount: invoice.amount_paid,
      currency: invoice.currency,
      description: `Payment for Invoice ${invoice.number ?? invoice.id}`,
      metadata: {},
      created: invoice.effective_at ?? invoice.created,
    },
    true,
  );
  state.invoicePayments.insert({
    id: newId('inpay'),
    object: 'invoice_payment',
    amount_paid: invoice.amount_paid,
    amount_requested: invoice.amount_due,
    created: invoice.effective_at ?? invoice.created,
    currency: invoice.currency,
    invoice: invoice.id,
    is_default: true,
    livemode: false,
    payment: {
      type: 'payment_intent',
      payment_intent: paymentIntent.id,
      charge: String(paymentIntent.latest_charge),
    },
    status: 'paid',
    status_transitions: { canceled_at: null, paid_at: invoice.effective_at ?? invoice.created },
  });
}

/** The fields every sandbox invoice has the same: paid in full, no tax, no discount. */
function invoiceDefaults() {
  return {
    object: 'invoice',
    account_country: 'US',
    account_name: 'Stripe sandbox',
    account_tax_ids: null,
    amount_overpaid: 0,
    amount_remaining: 0,
    amount_shipping: 0,
    application: null,
    attempt_count: 1,
    attempted: true,
    auto_advance: false,
    automatic_tax: {
      disabled_reason: null,
      enabled: false,
      liability: null,
      provider: null,
      status: null,
    },
    automatically_finalizes_at: null,
    collection_method: 'charge_automatically',
    custom_fields: null,
    customer_account: null,
    customer_address: null,
    customer_phone: null,
    customer_shipping: null,
    customer_tax_exempt: 'none',
    customer_tax_ids: [],
    default_payment_method: null,
    default_source: null,
    default_tax_rates: [],
    description: null,
    discounts: [],
    due_date: null,
    footer: null,
    from_invoice: null,
    hosted_invoice_url: null,
    invoice_pdf: null,
    issuer: { type: 'self' },
    last_finalization_error: null,
    latest_revision: null,
    livemode: false,
    metadata: {},
    next_payment_attempt: null,
    on_behalf_of: null,
    payment_settings: {
      default_mandate: null,
      payment_method_options: null,
      payment_method_types: null,
    },
    post_payment_credit_notes_amount: 0,
    pre_payment_credit_notes_amount: 0,
    receipt_number: null,
    rendering: null,
    shipping_cost: null,
    shipping_details: null,
    statement_descriptor: null,
    total_discount_amounts: [],
    total_pretax_credit_amounts: [],
    total_taxes: [],
  } as const satisfies Partial<Stripe.Invoice>;
}

function listInvoices(state: SandboxState, params: Params): Stripe.ApiList<Stripe.Invoice> {
  allowOnly(params, [...LIST_PARAMS, 'customer', 'subscription', 'status']);
  const customer = optString(params, 'customer');
  const subscription = optString(params, 'subscription');
  const status = optEnum(params, 'status', [
    'draft',
    'open',
    'paid',
    'uncollectible',
    'void',
  ] as const);
  const items = state.invoices
    .newestFirst()
    .filter(
      (invoice) =>
        (customer === undefined || invoice.customer === customer) &&
        (subscription === undefined ||
          invoice.parent?.subscription_details?.subscription === subscription) &&
        (status === undefined || invoice.status === status),
    );
  return listPage(items, params, '/v1/invoices', 'invoice');
}

export function registerInvoices(router: Router): void {
  router
    .add('GET', '/v1/invoices/:id', ({ state, path, expand }) =>
      render(state, state.invoices.get(path['id'] as string), expand),
    )
    .add('GET', '/v1/invoices/:id/lines', ({ state, path, params, expand }) => {
      allowOnly(params, LIST_PARAMS);
      const invoice = state.invoices.get(path['id'] as string);
      return renderList(
        state,
        listPage(invoice.lines.data, params, `/v1/invoices/${invoice.id}/lines`, 'line_item'),
        expand,
      );
    })
    .add('GET', '/v1/invoices', ({ state, params, expand }) =>
      renderList(state, listInvoices(state, params), expand),
    )
    .add('GET', '/v1/invoice_payments/:id', ({ state, path, expand }) =>
      render(state, state.invoicePayments.get(path['id'] as string), expand),
    )
    .add('GET', '/v1/invoice_payments', ({ state, params, expand }) => {
      allowOnly(params, [...LIST_PARAMS, 'invoice', 'status']);
      const invoice = optString(params, 'invoice');
      const status = optString(params, 'status');
      const items = state.invoicePayments
        .newestFirst()
        .filter(
          (payment) =>
            (invoice === undefined || payment.invoice === invoice) &&
            (status === undefined || payment.status === status),
        );
      return renderList(
        state,
        listPage(items, params, '/v1/invoice_payments', 'invoice_payment'),
        expand,
      );
    });
}
