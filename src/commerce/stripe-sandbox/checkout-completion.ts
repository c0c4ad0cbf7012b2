/**
 * Completing a checkout session, as a successful payment on Stripe's hosted page does.
 *
 * The buyer becomes a customer (created if the session named none), then `subscription`
 * mode opens a subscription and bills its first period (a paid invoice whose line covers
 * the period), and `payment` mode collects the total (a succeeded payment intent and
 * charge). The session ends `complete`/`paid`. Events come in Stripe's order:
 * `customer.created` (new customer only), then `customer.subscription.created` and
 * `invoice.paid`, or `charge.succeeded` and `payment_intent.succeeded`, and last
 * `checkout.session.completed`.
 */
import type Stripe from 'stripe';
import { startSubscription } from './billing.js';
import { createCustomer } from './resources/customers.js';
import { collectPayment } from './resources/payments.js';
import type { ItemRequest } from './resources/subscription-objects.js';
import type { SandboxState } from './state.js';

/** Why a session cannot be paid: it expired, or it was paid already. */
export class SessionClosedError extends Error {
  constructor(readonly status: 'expired' | 'complete') {
    super(`checkout session is ${status}`);
  }
}

export interface PaymentDetails {
  /** What the buyer typed on the page, if anything. */
  readonly email?: string;
}

function buyer(
  state: SandboxState,
  session: Stripe.Checkout.Session,
  details: PaymentDetails,
): Stripe.Customer {
  if (typeof session.customer === 'string') return state.customers.get(session.customer);
  const email = details.email || session.customer_email || null;
  return createCustomer(state, { email });
}

function itemsOf(session: Stripe.Checkout.Session): ItemRequest[] {
  return (session.line_items?.data ?? []).flatMap((line) =>
    line.price === null ? [] : [{ price: line.price, quantity: line.quantity ?? 1 }],
  );
}

function customerDetails(customer: Stripe.Customer): Stripe.Checkout.Session.CustomerDetails {
  return {
    address: null,
    business_name: null,
    email: customer.email,
    individual_name: null,
    name: customer.name ?? null,
    phone: null,
    tax_exempt: 'none',
    tax_ids: [],
  };
}

/** Pays an open session; throws `SessionClosedError` for an expired or completed one. */
export function completeSession(
  state: SandboxState,
  sessionId: string,
  details: PaymentDetails,
): Stripe.Checkout.Session {
  const session = state.sessions.get(sessionId);
  if (session.status === 'expired') throw new SessionClosedError('expired');
  if (session.status === 'complete') throw new SessionClosedError('complete');
  const customer = buyer(state, session, details);
  let outcome: Partial<Stripe.Checkout.Session>;
  if (session.mode === 'subscription') {
    const metadata = state.checkoutExtras.get(session.id)?.subscriptionMetadata ?? {};
    const { subscription, invoice } = startSubscription(state, {
      customer: customer.id,
      items: itemsOf(session),
      metadata,
    });
    outcome = { subscription: subscription.id, invoice: invoice.id };
  } else {
    const amount = session.amount_total ?? 0;
    const paymentIntent = collectPayment(state, {
      customer,
      amount,
      currency: session.currency ?? 'usd',
      description: null,
      metadata: state.checkoutExtras.get(session.id)?.paymentMetadata ?? {},
    });
    outcome = { payment_intent: paymentIntent.id };
  }
  const completed: Stripe.Checkout.Session = {
    ...session,
    ...outcome,
    customer: customer.id,
    customer_details: customerDetails(customer),
    payment_status: 'paid',
    status: 'complete',
    url: null,
  };
  state.sessions.update(completed);
  state.events.emit('checkout.session.completed', completed);
  return completed;
}
