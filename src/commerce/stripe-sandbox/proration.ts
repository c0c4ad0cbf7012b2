/**
 * Prorating a subscription change, as Stripe does with `proration_behavior:
 * always_invoice`: the change takes effect at once and is invoiced and paid at once.
 *
 * For each item whose price or quantity changed, the unused time of the old price is
 * credited and the remaining time of the new one charged, each as a proration line over
 * `[now, period end]` whose amount is the full amount times the remaining fraction of the
 * period, measured in seconds and rounded to the nearest minor unit. A change to another
 * interval restarts the billing cycle now, as on Stripe: the old price's unused time is
 * credited and a full period of the new price charged. A total below zero stays as credit
 * on the customer's balance for the next invoices.
 */
import type Stripe from 'stripe';
import { addIntervals, asInterval } from './clock.js';
import { issueInvoice, type LineRequest, type Period } from './resources/invoices.js';
import { currentPeriod, withPeriod } from './resources/subscription-objects.js';
import type { SandboxState } from './state.js';

function itemAmount(item: Stripe.SubscriptionItem): number {
  return (item.price.unit_amount ?? 0) * (item.quantity ?? 1);
}

function changed(before: Stripe.SubscriptionItem, after: Stripe.SubscriptionItem): boolean {
  return before.price.id !== after.price.id || before.quantity !== after.quantity;
}

function dateOf(seconds: number): string {
  return new Date(seconds * 1000).toISOString().slice(0, 10);
}

function productName(state: SandboxState, item: Stripe.SubscriptionItem): string {
  return state.products.get(String(item.price.product)).name;
}

/** The proration lines of a change at `now` within `period`. */
function prorationLines(
  state: SandboxState,
  before: Stripe.Subscription,
  after: Stripe.Subscription,
  now: number,
  next: Period,
): LineRequest[] {
  const period = currentPeriod(before);
  const remaining = (period.end - now) / (period.end - period.start);
  const restarts = next.start !== period.start;
  const lines: LineRequest[] = [];
  for (const item of after.items.data) {
    const old = before.items.data.find((candidate) => candidate.id === item.id);
    if (old !== undefined && !changed(old, item)) continue;
    if (old !== undefined)
      lines.push({
        item: old,
        period: { start: now, end: period.end },
        amount: -Math.round(itemAmount(old) * remaining),
        proration: true,
        description: `Unused time on ${productName(state, old)} after ${dateOf(now)}`,
      });
    lines.push({
      item,
      period: restarts ? next : { start: now, end: period.end },
      amount: restarts ? itemAmount(item) : Math.round(itemAmount(item) * remaining),
      proration: true,
      description: `Remaining time on ${productName(state, item)} after ${dateOf(now)}`,
    });
  }
  return lines;
}

/**
 * Applies a prorated change to `after` (the subscription with its new items) and bills it;
 * answers the subscription to store, with the proration invoice as its latest invoice, or
 * `after` unchanged when nothing billable changed.
 */
export function prorateChange(
  state: SandboxState,
  before: Stripe.Subscription,
  after: Stripe.Subscription,
): { subscription: Stripe.Subscription; invoice: Stripe.Invoice | null } {
  const now = state.customerNow(String(before.customer));
  const period = currentPeriod(before);
  const oldRecurring = before.items.data[0]?.price.recurring;
  const newRecurring = after.items.data[0]?.price.recurring;
  if (oldRecurring == null || newRecurring == null) return { subscription: after, invoice: null };
  const restarts =
    oldRecurring.interval !== newRecurring.interval ||
    oldRecurring.interval_count !== newRecurring.interval_count;
  const next: Period = restarts
    ? {
        start: now,
        end: addIntervals(now, asInterval(newRecurring.interval), newRecurring.interval_count),
      }
    : period;
  const lines = prorationLines(state, before, after, now, next);
  if (lines.length === 0) return { subscription: after, invoice: null };
  const moved = restarts ? { ...withPeriod(after, next), billing_cycle_anchor: now } : after;
  const invoice = issueInvoice(state, {
    subscription: moved,
    lines,
    invoicePeriod: { start: now, end: now },
    reason: 'subscription_update',
    created: now,
  });
  return { subscription: { ...moved, latest_invoice: invoice.id }, invoice };
}
