/**
 * What a Stripe event means for Tally. The event is a trigger, not the truth: for each
 * event that matters the current object is read back from the processor and turned into
 * a command for the customer's actor (the subscription as it is now, or a paid purchase),
 * carrying the event id so that the actor applies it at most once. Reading the current
 * object makes duplicated and reordered deliveries converge to the same state.
 *
 * Objects Tally did not create (no Tally metadata, or another environment's lookup key)
 * are acknowledged and ignored.
 */
import type Stripe from 'stripe';
import type { PurchaseInput, RefundInput, SubscriptionInput } from '../../actors/customer.js';
import type { Environment } from '../../actors/protocol.js';
import { ID_LENGTH_MAX } from '../../shared/limits.js';
import { META } from './metadata.js';
import { tallyRefundOf } from './refunds.js';

export { META } from './metadata.js';

/** A command the receiver hands to the customer's actor (its op, address and payload). */
export type ProcessorCommand =
  | {
      readonly op: 'syncSubscription';
      readonly environment: Environment;
      readonly customerId: string;
      readonly eventId: string;
      readonly subscription: SubscriptionInput;
    }
  | {
      readonly op: 'recordPurchase';
      readonly environment: Environment;
      readonly customerId: string;
      readonly eventId: string;
      readonly purchase: PurchaseInput;
    }
  | {
      readonly op: 'recordRefund';
      readonly environment: Environment;
      readonly customerId: string;
      readonly refund: RefundInput;
    };

export interface Owner {
  readonly environment: Environment;
  readonly customerId: string;
  readonly productKey: string | undefined;
}

/** The Tally customer an object's metadata names, or null for an object Tally did not create. */
export function ownerOf(metadata: Stripe.Metadata | null): Owner | null {
  const environment = metadata?.[META.environment];
  const customerId = metadata?.[META.customerId];
  if (
    (environment !== 'test' && environment !== 'live') ||
    customerId === undefined ||
    customerId === '' ||
    customerId.length > ID_LENGTH_MAX
  )
    return null;
  return { environment, customerId, productKey: metadata?.[META.productKey] };
}

/**
 * The product key a price's lookup key names (`<environment>:<product key>:<version>`; a
 * product key may itself hold colons), if it is Tally's and not a digest of a long key.
 */
export function productOfLookupKey(
  environment: Environment,
  lookupKey: string | null | undefined,
): string | undefined {
  const prefix = `${environment}:`;
  if (lookupKey === undefined || lookupKey === null || !lookupKey.startsWith(prefix))
    return undefined;
  const key = lookupKey.slice(prefix.length, lookupKey.lastIndexOf(':'));
  return key === '' || key.startsWith('~') ? undefined : key;
}

/** The subscription as the processor has it now, as a command for its customer. */
async function subscriptionCommand(
  stripe: Stripe,
  eventId: string,
  subscriptionId: string,
): Promise<ProcessorCommand | null> {
  const subscription = await stripe.subscriptions.retrieve(subscriptionId);
  const owner = ownerOf(subscription.metadata);
  const item = subscription.items.data[0];
  if (owner === null || item === undefined) return null;
  // The current price says which product it is now; the metadata says what was bought.
  const productKey =
    productOfLookupKey(owner.environment, item.price.lookup_key) ?? owner.productKey;
  if (productKey === undefined) return null;
  return {
    op: 'syncSubscription',
    environment: owner.environment,
    customerId: owner.customerId,
    eventId,
    subscription: {
      productKey,
      status: subscription.status,
      currentPeriodStartMs: item.current_period_start * 1000,
      currentPeriodEndMs: item.current_period_end * 1000,
      cancelAtPeriodEnd: subscription.cancel_at_period_end,
      processor: 'stripe',
      processorSubscriptionId: subscription.id,
    },
  };
}

/** A completed checkout: its subscription as it is now, or its paid one-time purchase. */
async function checkoutCommand(
  stripe: Stripe,
  eventId: string,
  sessionId: string,
): Promise<ProcessorCommand | null> {
  const session = await stripe.checkout.sessions.retrieve(sessionId);
  const owner = ownerOf(session.metadata);
  if (owner === null || session.status !== 'complete') return null;
  if (session.mode === 'subscription') {
    const subscription =
      typeof session.subscription === 'string' ? session.subscription : session.subscription?.id;
    return subscription === undefined ? null : subscriptionCommand(stripe, eventId, subscription);
  }
  const paymentIntent =
    typeof session.payment_intent === 'string'
      ? session.payment_intent
      : session.payment_intent?.id;
  if (
    session.mode !== 'payment' ||
    session.payment_status !== 'paid' ||
    paymentIntent === undefined ||
    owner.productKey === undefined
  )
    return null;
  return {
    op: 'recordPurchase',
    environment: owner.environment,
    customerId: owner.customerId,
    eventId,
    purchase: {
      id: `stripe:${paymentIntent}`,
      productKey: owner.productKey,
      amount: session.amount_total ?? 0,
      currency: session.currency ?? '',
    },
  };
}

/** The subscription a paid invoice bills, if it bills one. */
async function invoiceCommand(
  stripe: Stripe,
  eventId: string,
  invoiceId: string,
): Promise<ProcessorCommand | null> {
  const invoice = await stripe.invoices.retrieve(invoiceId);
  const ref = invoice.parent?.subscription_details?.subscription;
  const subscription = typeof ref === 'string' ? ref : ref?.id;
  return subscription === undefined ? null : subscriptionCommand(stripe, eventId, subscription);
}

/**
 * The refunds Tally made through a refunded charge, as commands recording them (each is
 * recorded once, by its processor id: most were recorded by the request that made them).
 */
async function refundCommands(stripe: Stripe, chargeId: string): Promise<ProcessorCommand[]> {
  const commands: ProcessorCommand[] = [];
  for await (const refund of stripe.refunds.list({ charge: chargeId, limit: 100 })) {
    const tally = tallyRefundOf(refund);
    if (tally !== null) commands.unshift({ op: 'recordRefund', ...tally, refund: tally.input });
  }
  return commands;
}

/**
 * The commands an event calls for, read from the processor's current objects; none:
 * nothing to do, also when the processor no longer has the object (there is nothing to
 * reconcile with). Any other failure is thrown, so the event is delivered again.
 */
export async function commandsForEvent(
  stripe: Stripe,
  event: Stripe.Event,
): Promise<ProcessorCommand[]> {
  try {
    if (event.type === 'charge.refunded') return await refundCommands(stripe, event.data.object.id);
    const command = await readCommand(stripe, event);
    return command === null ? [] : [command];
  } catch (error) {
    if (error instanceof Error && (error as { code?: unknown }).code === 'resource_missing')
      return [];
    throw error;
  }
}

async function readCommand(stripe: Stripe, event: Stripe.Event): Promise<ProcessorCommand | null> {
  switch (event.type) {
    case 'checkout.session.completed':
      return checkoutCommand(stripe, event.id, event.data.object.id);
    case 'customer.subscription.created':
    case 'customer.subscription.updated':
    case 'customer.subscription.deleted':
      return subscriptionCommand(stripe, event.id, event.data.object.id);
    case 'invoice.paid':
      return event.data.object.id === undefined
        ? null
        : invoiceCommand(stripe, event.id, event.data.object.id);
    default:
      return null;
  }
}
