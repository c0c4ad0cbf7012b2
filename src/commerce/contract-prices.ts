/**
 * The price a subscription is sold at: the plan's list price, or the customer's contract.
 *
 * A customer with a contract (`priceAmount` per `priceInterval`) subscribes to any recurring
 * plan at that price: Tally creates a price of its own for the customer under the plan's
 * processor product (in the plan's currency), once per contract amount and interval, found
 * again by its lookup key `<environment>:<plan>:contract-<customer digest>-<amount>-
 * <currency>-<interval>` (which still names the plan, so the processor's events map the
 * subscription back to it). Checkout and plan changes use it; renewals charge the
 * subscription's price, so they charge it too. Contract prices are the customer's, not
 * the catalog's: a configuration push leaves them active.
 */
import { createHash } from 'node:crypto';
import type Stripe from 'stripe';
import type { PriceDefinition } from '../../actors/billing-config.js';
import type { ContractView } from '../../actors/customer.js';
import type { Environment } from '../../actors/protocol.js';
import { fitKey, LOOKUP_KEY_MAX, priceLookupKey } from './catalog-sync.js';
import { CONTRACT_CUSTOMER_META, META } from './metadata.js';

function digest(text: string, length: number): string {
  return createHash('sha256').update(text).digest('base64url').slice(0, length);
}

async function activePrice(stripe: Stripe, lookupKey: string): Promise<Stripe.Price | undefined> {
  return (await stripe.prices.list({ lookup_keys: [lookupKey], active: true, limit: 1 })).data[0];
}

/**
 * The processor price to subscribe `customerId` to `productKey` at: the contract's when
 * there is a contract, else the plan's. Throws when the plan's price is not at the processor
 * (the configuration must be pushed again) or the processor fails.
 */
export async function subscriptionPrice(
  stripe: Stripe,
  environment: Environment,
  customerId: string,
  productKey: string,
  price: PriceDefinition,
  contract: ContractView | null,
): Promise<Stripe.Price> {
  const listKey = priceLookupKey(environment, productKey, price);
  const listed = await activePrice(stripe, listKey);
  if (listed === undefined)
    throw new Error(`no price ${listKey} at the processor: push the configuration again`);
  if (contract === null) return listed;
  const { priceAmount, priceInterval } = contract;
  const customer = digest(customerId, 16);
  const version = `contract-${customer}-${priceAmount}-${price.currency}-${priceInterval}`;
  const lookupKey = fitKey(`${environment}:`, productKey, `:${version}`, LOOKUP_KEY_MAX);
  const found = await activePrice(stripe, lookupKey);
  if (found !== undefined) return found;
  return stripe.prices.create(
    {
      product: typeof listed.product === 'string' ? listed.product : listed.product.id,
      currency: price.currency,
      unit_amount: priceAmount,
      recurring: { interval: priceInterval },
      lookup_key: lookupKey,
      nickname: `Contract price of ${customerId}`,
      metadata: {
        [META.environment]: environment,
        [META.customerId]: customerId,
        [META.productKey]: productKey,
        [CONTRACT_CUSTOMER_META]: customerId,
      },
    },
    { idempotencyKey: `tally-${environment}-contract-price-${digest(lookupKey, 43)}` },
  );
}
