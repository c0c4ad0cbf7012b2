/**
 * Subscription billing: starting a subscription and renewing it period after period.
 *
 * Starting one (from checkout or `POST /v1/subscriptions`) opens the first period at the
 * customer's "now" (its test clock's frozen time, if it has one), issues the first paid
 * invoice and raises `customer.subscription.created` then `invoice.paid`. Renewal moves
 * an active subscription whose period has ended into the next period and invoices it
 * (`customer.subscription.updated`, then `invoice.paid`, dated at the period boundary; or,
 * when an endpoint listens for `invoice.created`, a draft that is finalized an hour after
 * that event was acknowledged), or ends it if it was set to cancel at period end
 * (`customer.subscription.deleted`). Subscriptions on a test clock renew when the clock
 * advances; the others renew against the sandbox clock, checked before each request.
 */
import type Stripe from 'stripe';
import { addIntervals, asInterval, nextPeriodEnd } from './clock.js';
import { invalidParam } from './errors.js';
import { endpointWants } from './events.js';
import {
  DRAFT_OPEN_SECONDS,
  finalizeInvoice,
  invoiceForPeriod,
  type Period,
} from './resources/invoices.js';
import {
  currentPeriod,
  subscriptionObject,
  withPeriod,
  type ItemRequest,
} from './resources/subscription-objects.js';
import type { SandboxState } from './state.js';
import { newId } from './store.js';

/** Renewals done for one subscription in one pass, so a far jump cannot spin forever. */
const RENEWALS_PER_PASS_MAX = 1_000;

/** Checks that items can form one subscription: recurring prices on a single interval. */
export function checkRecurringItems(items: readonly ItemRequest[], param: string): void {
  const first = items[0]?.price.recurring;
  for (const [index, item] of items.entries()) {
    const recurring = item.price.recurring;
    if (recurring === null)
      throw invalidParam(
        `${param}[${index}][price]`,
        `The price \`${item.price.id}\` is a one-time price; a subscription needs ` +
          `recurring prices.`,
      );
    if (
      recurring.interval !== first?.interval ||
      recurring.interval_count !== first.interval_count
    ) {
      throw invalidParam(
        `${param}[${index}][price]`,
        'All prices on a subscription must have the same recurring interval and interval_count.',
      );
    }
    if (item.price.currency !== items[0]?.price.currency)
      throw invalidParam(
        `${param}[${index}][price]`,
        'All prices on a subscription must share one currency.',
      );
  }
}

function recurringOf(subscription: Stripe.Subscription): Stripe.Price.Recurring {
  const recurring = subscription.items.data[0]?.price.recurring;
  if (recurring == null) throw new Error(`subscription ${subscription.id} has no recurring item`);
  return recurring;
}

export interface StartRequest {
  readonly customer: string;
  readonly items: readonly ItemRequest[];
  readonly metadata: Record<string, string>;
}

/** Opens a subscription and bills its first period. */
export function startSubscription(
  state: SandboxState,
  request: StartRequest,
): { subscription: Stripe.Subscription; invoice: Stripe.Invoice } {
  const customer = state.customers.get(request.customer, 'customer');
  const testClock = typeof customer.test_clock === 'string' ? customer.test_clock : null;
  const now = state.customerNow(customer.id);
  const recurring = request.items[0]?.price.recurring;
  if (recurring == null)
    throw invalidParam('items', 'A subscription needs at least one recurring price.');
  const period = {
    start: now,
    end: addIntervals(now, asInterval(recurring.interval), recurring.interval_count),
  };
  const draft = subscriptionObject({
    id: newId('sub'),
    customer: customer.id,
    testClock,
    items: request.items,
    metadata: request.metadata,
    period,
  });
  const invoice = invoiceForPeriod(state, {
    subscription: draft,
    period,
    invoicePeriod: { start: now, end: now },
    reason: 'subscription_create',
    created: now,
  });
  const subscription = state.subscriptions.insert({ ...draft, latest_invoice: invoice.id });
  state.events.emit('customer.subscription.created', subscription, undefined, now);
  state.events.emit('invoice.paid', invoice, undefined, now);
  return { subscription, invoice };
}

/** Ends a subscription that was set to cancel at the end of its period. */
function endAtPeriodEnd(
  state: SandboxState,
  subscription: Stripe.Subscription,
  end: number,
): Stripe.Subscription {
  const ended: Stripe.Subscription = {
    ...subscription,
    status: 'canceled',
    ended_at: end,
    canceled_at: subscription.canceled_at ?? end,
    cancel_at_period_end: false,
  };
  state.subscriptions.update(ended);
  state.events.emit('customer.subscription.deleted', ended, undefined, end);
  return ended;
}

/** Hours a draft waits for its `invoice.created` to be acknowledged before it is finalized. */
const DRAFT_WAIT_MAX_SECONDS = 72 * 3600;

/**
 * Whether a renewal's invoice starts as a draft: as on Stripe, only when an endpoint listens
 * for `invoice.created` (it may add items); otherwise it is finalized and paid at once.
 */
function draftsWanted(state: SandboxState): boolean {
  return [...state.webhookEndpoints.all()].some((endpoint) =>
    endpointWants(endpoint, 'invoice.created'),
  );
}

/**
 * Finalizes and pays the subscription's drafts that are due by `upTo`: an hour after their
 * `invoice.created` was acknowledged by every endpoint, or 72 hours after they were created.
 */
function finalizeDue(state: SandboxState, subscriptionId: string, upTo: number): void {
  for (const [invoiceId, announced] of [...state.draftAnnouncements]) {
    const invoice = state.invoices.get(invoiceId);
    if (invoice.parent?.subscription_details?.subscription !== subscriptionId) continue;
    const acknowledged = (state.events.collection.find(announced)?.pending_webhooks ?? 0) === 0;
    const at = acknowledged
      ? invoice.created + DRAFT_OPEN_SECONDS
      : invoice.created + DRAFT_WAIT_MAX_SECONDS;
    if (at > upTo) continue;
    const paid = finalizeInvoice(state, invoiceId, at);
    state.draftAnnouncements.delete(invoiceId);
    state.events.emit('invoice.finalized', paid, undefined, at);
    state.events.emit('invoice.paid', paid, undefined, at);
  }
}

/** Moves a subscription into its next period and bills it. */
function renewOnce(state: SandboxState, subscription: Stripe.Subscription): Stripe.Subscription {
  const old = currentPeriod(subscription);
  const recurring = recurringOf(subscription);
  const next: Period = {
    start: old.end,
    end: nextPeriodEnd(
      subscription.billing_cycle_anchor,
      asInterval(recurring.interval),
      recurring.interval_count,
      old.end,
    ),
  };
  const moved = withPeriod(subscription, next);
  const invoice = invoiceForPeriod(state, {
    subscription: moved,
    period: next,
    invoicePeriod: old,
    reason: 'subscription_cycle',
    created: next.start,
    draft: draftsWanted(state),
  });
  const renewed: Stripe.Subscription = { ...moved, latest_invoice: invoice.id };
  state.subscriptions.update(renewed);
  state.events.emit(
    'customer.subscription.updated',
    renewed,
    { items: subscription.items, latest_invoice: subscription.latest_invoice },
    next.start,
  );
  if (invoice.status === 'draft' && invoice.id !== undefined) {
    const created = state.events.emit('invoice.created', invoice, undefined, next.start);
    state.draftAnnouncements.set(invoice.id, created.id);
  } else state.events.emit('invoice.paid', invoice, undefined, next.start);
  return renewed;
}

/** Renews (or ends) `subscription` for every period that ended by `upTo`. */
export function renewThrough(
  state: SandboxState,
  subscription: Stripe.Subscription,
  upTo: number,
): Stripe.Subscription {
  let current = subscription;
  for (let pass = 0; pass < RENEWALS_PER_PASS_MAX; pass += 1) {
    const { end } = currentPeriod(current);
    finalizeDue(state, current.id, Math.min(end, upTo));
    if (current.status !== 'active' || end > upTo) return current;
    current = current.cancel_at_period_end
      ? endAtPeriodEnd(state, current, end)
      : renewOnce(state, current);
  }
  return current;
}

/** Renews the subscriptions of the customers on `clockId` up to `frozenTime`. */
export function renewOnClock(state: SandboxState, clockId: string, frozenTime: number): void {
  for (const subscription of [...state.subscriptions.all()]) {
    if (subscription.test_clock === clockId) renewThrough(state, subscription, frozenTime);
  }
}

/** Renews the subscriptions that are not on a test clock up to the sandbox's now. */
export function renewDue(state: SandboxState): void {
  const now = state.clock.nowSeconds();
  // Open drafts are few: finalize theirs first, then renew only what is due.
  const drafted = new Set<string>();
  for (const invoiceId of state.draftAnnouncements.keys()) {
    const ref = state.invoices.find(invoiceId)?.parent?.subscription_details?.subscription;
    if (typeof ref === 'string') drafted.add(ref);
  }
  for (const subscriptionId of drafted) {
    const subscription = state.subscriptions.find(subscriptionId);
    if (subscription?.test_clock === null) finalizeDue(state, subscriptionId, now);
  }
  for (const subscription of [...state.subscriptions.all()]) {
    if (
      subscription.test_clock === null &&
      subscription.status === 'active' &&
      currentPeriod(subscription).end <= now
    )
      renewThrough(state, subscription, now);
  }
}
