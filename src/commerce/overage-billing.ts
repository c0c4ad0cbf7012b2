/**
 * Overage billed to the processor at the end of each period.
 *
 * When a subscription renews, the processor drafts the invoice of the period that ended
 * (`invoice.created`, `billing_reason: subscription_cycle`) and keeps it open for an hour so
 * that usage can be added. Tally then adds one invoice item per meter whose plan prices its
 * overage (`overage.unitAmount`): the overage recorded in that period times the unit
 * amount, in minor units, rounded to the nearest. Invoice items rather than metered prices:
 * Tally already meters every unit exactly and decides what is overage (included allowance,
 * credit lots and overage are drawn in order), so it bills the result once, on the invoice
 * the customer expects it on, instead of reporting every consumption to the processor and
 * keeping a second meter there in step.
 *
 * A period is billed once: the items carry idempotency keys and metadata derived from the
 * customer, subscription, period and meter (an item already on the invoice is not added
 * again), and the bill is recorded in the customer's journal once it is complete, so a
 * redelivered or replayed event, or a restart half way, adds nothing twice.
 */
import { createHash } from 'node:crypto';
import type Stripe from 'stripe';
import type { BillingConfig } from '../../actors/billing-config.js';
import type {
  Command,
  OverageBill,
  OverageLine,
  OveragePeriod,
  OverageView,
} from '../../actors/customer.js';
import type { Environment } from '../../actors/protocol.js';
import { META } from './metadata.js';
import { ownerOf, productOfLookupKey } from './stripe-events.js';

/** Metadata of an overage invoice item, naming its meter and period. */
const OVERAGE_META = { meter: 'tally_overage_meter', period: 'tally_overage_period' } as const;

/** What billing needs from the service: the processor, configurations and the actors. */
export interface OverageIo {
  readonly stripe: Stripe;
  readonly latestConfig: (environment: Environment) => BillingConfig | null;
  /** Hands a command to the customer's actor; resolves with its answer's body (or throws). */
  readonly run: (command: Command) => Promise<string>;
}

/** Minor units for `micros` of usage at `unitAmount` per unit, rounded to the nearest. */
export function overageAmount(micros: bigint, unitAmount: number): number {
  return Number((micros * BigInt(unitAmount) + 500_000n) / 1_000_000n);
}

/** Meter key → overage unit amount of a plan. */
function overagePrices(config: BillingConfig | null, productKey: string): Map<string, number> {
  const prices = new Map<string, number>();
  const entitlements = config?.products[productKey]?.entitlements ?? {};
  for (const [meterKey, value] of Object.entries(entitlements)) {
    if (typeof value === 'object' && value.overage !== undefined && value.overage.unitAmount > 0)
      prices.set(meterKey, value.overage.unitAmount);
  }
  return prices;
}

function digest(text: string): string {
  return createHash('sha256').update(text).digest('base64url');
}

/** The overage items already on the invoice, by meter key → invoice item id. */
function itemsOn(invoice: Stripe.Invoice, periodStartMs: number): Map<string, string> {
  const found = new Map<string, string>();
  for (const line of invoice.lines.data) {
    const item = line.parent?.invoice_item_details?.invoice_item;
    const meter = line.metadata?.[OVERAGE_META.meter];
    if (
      item !== undefined &&
      meter !== undefined &&
      line.metadata[OVERAGE_META.period] === String(periodStartMs)
    )
      found.set(meter, item);
  }
  return found;
}

/**
 * Adds the ended period's overage to the drafted invoice `invoiceId` and records the bill;
 * does nothing for an invoice that is not a renewal's draft or not Tally's. Throws on a
 * processor or actor failure, so the event is delivered again.
 */
export async function billOverage(io: OverageIo, invoiceId: string): Promise<void> {
  const { stripe } = io;
  const invoice = await stripe.invoices.retrieve(invoiceId);
  const ref = invoice.parent?.subscription_details?.subscription;
  const subscriptionId = typeof ref === 'string' ? ref : ref?.id;
  if (
    invoice.status !== 'draft' ||
    invoice.billing_reason !== 'subscription_cycle' ||
    subscriptionId === undefined
  )
    return;
  const subscription = await stripe.subscriptions.retrieve(subscriptionId);
  const owner = ownerOf(subscription.metadata);
  const item = subscription.items.data[0];
  if (owner === null || item === undefined) return;
  const productKey =
    productOfLookupKey(owner.environment, item.price.lookup_key) ?? owner.productKey;
  const prices = overagePrices(io.latestConfig(owner.environment), productKey ?? '');
  if (prices.size === 0) return;
  const address = { environment: owner.environment, customerId: owner.customerId, key: '' };
  const period: OveragePeriod = {
    subscriptionId: `stripe:${subscription.id}`,
    periodStartMs: invoice.period_start * 1000,
  };
  const due = JSON.parse(await io.run({ op: 'overageDue', ...address, period })) as OverageView;
  if (due.billed) return;
  const existing = itemsOn(invoice, period.periodStartMs);
  const lines: OverageLine[] = [];
  for (const { meterKey, micros } of due.meters) {
    const unitAmount = prices.get(meterKey);
    if (unitAmount === undefined) continue;
    const amount = overageAmount(BigInt(micros), unitAmount);
    if (amount <= 0) continue;
    const made =
      existing.get(meterKey) ??
      (
        await stripe.invoiceItems.create(
          {
            customer: String(invoice.customer),
            invoice: invoiceId,
            subscription: subscription.id,
            amount,
            currency: invoice.currency,
            description: `${meterKey} overage`,
            period: { start: invoice.period_start, end: invoice.period_end },
            metadata: {
              [META.environment]: owner.environment,
              [META.customerId]: owner.customerId,
              [OVERAGE_META.meter]: meterKey,
              [OVERAGE_META.period]: String(period.periodStartMs),
            },
          },
          {
            idempotencyKey: `tally-${owner.environment}-overage-${digest(
              JSON.stringify([
                owner.customerId,
                period.subscriptionId,
                period.periodStartMs,
                meterKey,
              ]),
            )}`,
          },
        )
      ).id;
    lines.push({ meterKey, micros: BigInt(micros), unitAmount, amount, processorItemId: made });
  }
  if (lines.length === 0) return;
  const bill: OverageBill = {
    ...period,
    periodEndMs: invoice.period_end * 1000,
    invoiceId,
    currency: invoice.currency,
    lines,
  };
  await io.run({ op: 'recordOverageBill', ...address, bill });
}
