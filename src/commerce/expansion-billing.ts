/**
 * Limit expansion billed through the processor: a customer's `purchased` units of a limit
 * whose plan prices its expansion (`expansion.unitAmount` per unit and billing period) are
 * a second item of its subscription, at an expansion price of the plan's product, with
 * `purchased` as its quantity. Raising or lowering `purchased` sets that quantity with the
 * proration invoiced at once (`always_invoice`), as Stripe prorates a seat change; renewals
 * charge the quantity with the plan.
 *
 * The quantity is set, not added to, so a retried request converges on the same
 * subscription and bills nothing twice. Expansion prices are created once per plan, limit,
 * unit amount, currency and interval, found again by their lookup key; a configuration push
 * leaves them active.
 */
import { createHash } from 'node:crypto';
import type Stripe from 'stripe';
import type { BillingConfig } from '../../actors/billing-config.js';
import type { SubscriptionView } from '../../actors/customer.js';
import type { Environment } from '../../actors/protocol.js';
import { fitKey, LOOKUP_KEY_MAX } from './catalog-sync.js';
import { EXPANSION_LIMIT_META, META } from './metadata.js';

function digest(text: string, length: number): string {
  return createHash('sha256').update(text).digest('base64url').slice(0, length);
}

/** The expansion price of `limitKey` on the plan item's product and interval. */
async function expansionPrice(
  stripe: Stripe,
  environment: Environment,
  productKey: string,
  limitKey: string,
  unitAmount: number,
  plan: Stripe.Price,
): Promise<Stripe.Price> {
  const recurring = plan.recurring;
  if (recurring === null) throw new Error(`price ${plan.id} is not recurring`);
  const interval = `${recurring.interval_count}${recurring.interval}`;
  const version = `expansion-${digest(limitKey, 12)}-${unitAmount}-${plan.currency}-${interval}`;
  const lookupKey = fitKey(`${environment}:`, productKey, `:${version}`, LOOKUP_KEY_MAX);
  const found = (await stripe.prices.list({ lookup_keys: [lookupKey], active: true, limit: 1 }))
    .data[0];
  if (found !== undefined) return found;
  return stripe.prices.create(
    {
      product: typeof plan.product === 'string' ? plan.product : plan.product.id,
      currency: plan.currency,
      unit_amount: unitAmount,
      recurring: { interval: recurring.interval, interval_count: recurring.interval_count },
      lookup_key: lookupKey,
      nickname: `${limitKey} expansion`,
      metadata: {
        [META.environment]: environment,
        [META.productKey]: productKey,
        [EXPANSION_LIMIT_META]: limitKey,
      },
    },
    { idempotencyKey: `tally-${environment}-expansion-price-${digest(lookupKey, 43)}` },
  );
}

/**
 * Sets the subscription's expansion quantity of `limitKey` to `purchased`, prorated and
 * invoiced at once; answers the proration invoice's id, or null when there is nothing to
 * bill (no live subscription, an unpriced expansion, or the quantity already set). Throws
 * the processor's error.
 */
export async function syncExpansion(
  stripe: Stripe,
  environment: Environment,
  limitKey: string,
  purchased: number,
  live: SubscriptionView | null,
  config: BillingConfig | null,
  idempotencyKey: string,
): Promise<string | null> {
  if (live === null || live.processor !== 'stripe') return null;
  const grant = config?.products[live.productKey]?.entitlements?.[limitKey];
  const unitAmount = typeof grant === 'object' ? grant.expansion?.unitAmount : undefined;
  if (unitAmount === undefined || unitAmount <= 0) return null;
  const subscription = await stripe.subscriptions.retrieve(live.processorSubscriptionId);
  const plan = subscription.items.data[0];
  if (plan === undefined || subscription.status === 'canceled') return null;
  const item = subscription.items.data.find(
    (candidate) => candidate.price.metadata?.[EXPANSION_LIMIT_META] === limitKey,
  );
  if ((item?.quantity ?? 0) === purchased) return null;
  const change =
    item !== undefined
      ? { id: item.id, quantity: purchased }
      : {
          price: (
            await expansionPrice(
              stripe,
              environment,
              live.productKey,
              limitKey,
              unitAmount,
              plan.price,
            )
          ).id,
          quantity: purchased,
        };
  const updated = await stripe.subscriptions.update(
    subscription.id,
    { items: [change], proration_behavior: 'always_invoice' },
    { idempotencyKey },
  );
  const invoice = updated.latest_invoice;
  return typeof invoice === 'string' ? invoice : (invoice?.id ?? null);
}
