/**
 * Everything the sandbox knows: one bounded collection per resource, the clock and the
 * event log. Handlers receive it and read or change it synchronously, so one request
 * never sees another half-done.
 */
import type Stripe from 'stripe';
import type { SandboxClock } from './clock.js';
import { EventLog } from './events.js';
import { Collection, type Identified } from './store.js';

export interface SandboxLimits {
  /** Objects per resource (customers, prices, sessions, …). */
  readonly objects: number;
  /** Events kept (oldest dropped first). */
  readonly events: number;
}

export const DEFAULT_LIMITS: SandboxLimits = { objects: 10_000, events: 10_000 };

export class SandboxState {
  readonly customers: Collection<Stripe.Customer>;
  readonly products: Collection<Stripe.Product>;
  readonly prices: Collection<Stripe.Price>;
  readonly sessions: Collection<Stripe.Checkout.Session>;
  readonly subscriptions: Collection<Stripe.Subscription>;
  readonly invoices: Collection<Stripe.Invoice>;
  readonly paymentIntents: Collection<Stripe.PaymentIntent>;
  readonly charges: Collection<Stripe.Charge>;
  readonly refunds: Collection<Stripe.Refund>;
  readonly invoicePayments: Collection<Stripe.InvoicePayment>;
  readonly invoiceItems: Collection<Stripe.InvoiceItem>;
  readonly testClocks: Collection<Stripe.TestHelpers.TestClock>;
  readonly webhookEndpoints: Collection<Stripe.WebhookEndpoint>;
  readonly events: EventLog;
  /** Per checkout session: what payment needs that the session object does not show. */
  readonly checkoutExtras = new Map<
    string,
    {
      readonly subscriptionMetadata: Record<string, string>;
      readonly paymentMetadata: Record<string, string>;
    }
  >();

  /**
   * Per draft invoice: the `invoice.created` event announcing it. A draft is finalized an
   * hour after every endpoint acknowledged that event (or after 72 hours regardless).
   */
  readonly draftAnnouncements = new Map<string, string>();

  /** Secrets of the webhook endpoints (Stripe shows one only when it is created). */
  readonly webhookSecrets = new Map<string, string>();

  constructor(
    readonly clock: SandboxClock,
    /** Where the sandbox listens, for hosted page URLs (`http://127.0.0.1:port`). */
    readonly baseUrl: string,
    /**
     * Runs `task` soon, outside the current request (test clock advances); the events it
     * raises are delivered afterwards like those of a request.
     */
    readonly schedule: (task: () => void) => void,
    limits: SandboxLimits = DEFAULT_LIMITS,
  ) {
    const n = limits.objects;
    this.customers = new Collection('customer', n);
    this.products = new Collection('product', n);
    this.prices = new Collection('price', n);
    this.sessions = new Collection('checkout.session', n);
    this.subscriptions = new Collection('subscription', n);
    this.invoices = new Collection('invoice', n);
    this.paymentIntents = new Collection('payment_intent', n);
    this.charges = new Collection('charge', n);
    this.refunds = new Collection('refund', n);
    this.invoicePayments = new Collection('invoice_payment', n);
    this.invoiceItems = new Collection('invoiceitem', n);
    this.testClocks = new Collection('test_clock', n);
    this.webhookEndpoints = new Collection('webhook_endpoint', Math.min(n, 16));
    this.events = new EventLog(clock, this.webhookEndpoints, limits.events);
  }

  /** Finds any stored object by id, using Stripe's id prefixes. */
  lookup(id: string): Identified | undefined {
    const prefix = id.slice(0, id.indexOf('_') + 1);
    const byPrefix: Record<string, Collection<Identified> | undefined> = {
      cus_: this.customers,
      prod_: this.products,
      price_: this.prices,
      cs_: this.sessions,
      sub_: this.subscriptions,
      in_: this.invoices,
      pi_: this.paymentIntents,
      ch_: this.charges,
      re_: this.refunds,
      inpay_: this.invoicePayments,
      ii_: this.invoiceItems,
      clock_: this.testClocks,
      we_: this.webhookEndpoints,
      evt_: this.events.collection,
    };
    return byPrefix[prefix]?.find(id);
  }

  /** "Now" for a customer: the frozen time of its test clock, else the sandbox clock. */
  customerNow(customerId: string | null): number {
    const customer = customerId === null ? undefined : this.customers.find(customerId);
    const clockId = typeof customer?.test_clock === 'string' ? customer.test_clock : undefined;
    const testClock = clockId === undefined ? undefined : this.testClocks.find(clockId);
    return testClock?.frozen_time ?? this.clock.nowSeconds();
  }
}
