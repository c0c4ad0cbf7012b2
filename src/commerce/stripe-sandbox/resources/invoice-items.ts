/**
 * Invoice items: `/v1/invoiceitems` create, retrieve, list.
 *
 * An item adds a line to a draft invoice (`invoice`, which must still be a draft: a
 * renewal's invoice stays one for an hour after `invoice.created` was acknowledged), as
 * integrations add usage to the invoice of the period that just ended. It has an `amount`
 * and `currency` (the invoice's), a `description`, a `period` and `metadata`. Pending
 * items (no `invoice`, collected by the next invoice) are not modelled and are refused.
 */
import Stripe from 'stripe';
import { invalidParam, invalidState } from '../errors.js';
import { render, renderList } from '../expand.js';
import {
  allowOnly,
  mergeMetadata,
  optInteger,
  optObject,
  optString,
  reqString,
  type Params,
} from '../form.js';
import { LIST_PARAMS, listPage } from '../list.js';
import type { Router } from '../router.js';
import type { SandboxState } from '../state.js';
import { newId } from '../store.js';

const AMOUNT_MAX = 99_999_999;

function periodOf(params: Params, at: number): { start: number; end: number } {
  const period = optObject(params, 'period');
  if (period === undefined) return { start: at, end: at };
  allowOnly(period, ['start', 'end']);
  const start = optInteger(period, 'start');
  const end = optInteger(period, 'end');
  if (start === undefined || end === undefined || end < start)
    throw invalidParam('period', 'period needs start and end, end not before start.');
  return { start, end };
}

function lineOf(item: Stripe.InvoiceItem, invoiceId: string): Stripe.InvoiceLineItem {
  return {
    id: newId('il'),
    object: 'line_item',
    amount: item.amount,
    currency: item.currency,
    description: item.description,
    discount_amounts: [],
    discountable: item.discountable,
    discounts: [],
    invoice: invoiceId,
    livemode: false,
    metadata: item.metadata ?? {},
    parent: {
      invoice_item_details: {
        invoice_item: item.id,
        proration: false,
        proration_details: null,
        subscription: item.parent?.subscription_details?.subscription ?? null,
      },
      subscription_item_details: null,
      type: 'invoice_item_details',
    },
    period: item.period,
    pretax_credit_amounts: [],
    pricing: null,
    quantity: 1,
    quantity_decimal: Stripe.Decimal.from('1'),
    subscription: item.parent?.subscription_details?.subscription ?? null,
    subtotal: item.amount,
    taxes: [],
  };
}

function createItem(state: SandboxState, params: Params): Stripe.InvoiceItem {
  allowOnly(params, [
    'customer',
    'invoice',
    'subscription',
    'amount',
    'currency',
    'description',
    'period',
    'metadata',
  ]);
  const customer = state.customers.get(reqString(params, 'customer'), 'customer');
  const invoiceId = optString(params, 'invoice');
  if (invoiceId === undefined)
    throw invalidParam(
      'invoice',
      'The Stripe sandbox adds invoice items to draft invoices only: pass invoice.',
      'parameter_missing',
    );
  const invoice = state.invoices.get(invoiceId, 'invoice');
  if (invoice.status !== 'draft')
    throw invalidState(`Invoice ${invoice.id} is not a draft; items can only be added to drafts.`);
  if (invoice.customer !== customer.id)
    throw invalidParam('invoice', `Invoice ${invoice.id} belongs to another customer.`);
  const amount = optInteger(params, 'amount', AMOUNT_MAX);
  if (amount === undefined)
    throw invalidParam('amount', 'Missing required param: amount.', 'parameter_missing');
  const currency = reqString(params, 'currency');
  if (currency !== invoice.currency)
    throw invalidParam('currency', `The invoice's currency is ${invoice.currency}.`);
  const subscription = optString(params, 'subscription');
  const date = state.customerNow(customer.id);
  const item = state.invoiceItems.insert({
    id: newId('ii'),
    object: 'invoiceitem',
    amount,
    currency,
    customer: customer.id,
    customer_account: null,
    date,
    description: optString(params, 'description') ?? null,
    discountable: true,
    discounts: null,
    invoice: invoice.id,
    livemode: false,
    metadata: mergeMetadata(params),
    parent:
      subscription === undefined
        ? null
        : { subscription_details: { subscription }, type: 'subscription_details' },
    period: periodOf(params, date),
    pricing: null,
    proration: false,
    quantity: 1,
    quantity_decimal: Stripe.Decimal.from('1'),
    tax_rates: null,
    test_clock: customer.test_clock ?? null,
  });
  const data = [...invoice.lines.data, lineOf(item, invoice.id)];
  const total = data.reduce((sum, line) => sum + line.amount, 0);
  state.invoices.update({
    ...invoice,
    amount_due: total,
    lines: { ...invoice.lines, data },
    subtotal: total,
    subtotal_excluding_tax: total,
    total,
    total_excluding_tax: total,
  });
  return item;
}

export function registerInvoiceItems(router: Router): void {
  router
    .add('POST', '/v1/invoiceitems', ({ state, params, expand }) =>
      render(state, createItem(state, params), expand),
    )
    .add('GET', '/v1/invoiceitems/:id', ({ state, path, expand }) =>
      render(state, state.invoiceItems.get(path['id'] as string), expand),
    )
    .add('GET', '/v1/invoiceitems', ({ state, params, expand }) => {
      allowOnly(params, [...LIST_PARAMS, 'customer', 'invoice']);
      const customer = optString(params, 'customer');
      const invoice = optString(params, 'invoice');
      const items = state.invoiceItems
        .newestFirst()
        .filter(
          (item) =>
            (customer === undefined || item.customer === customer) &&
            (invoice === undefined || item.invoice === invoice),
        );
      return renderList(state, listPage(items, params, '/v1/invoiceitems', 'invoiceitem'), expand);
    });
}
