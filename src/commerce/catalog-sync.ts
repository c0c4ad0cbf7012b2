/**
 * Catalog sync: before a configuration push is stored, every priced product of it is
 * created or updated at the payment processor, so that checkout can sell it.
 *
 * A product is found by its metadata (environment and product key); a price by its
 * lookup key, `<environment>:<product key>:<price version>`, the version spelling the
 * amount, currency and interval. Prices are never changed: a changed price is a new
 * lookup key, so a new price is created and the product's other active prices are
 * archived. Every call carries an idempotency key derived from the push (environment,
 * version and a digest of the pushed document), so a retried push repeats no call.
 */
import { createHash } from 'node:crypto';
import type Stripe from 'stripe';
import type {
  BillingConfig,
  PriceDefinition,
  ProductDefinition,
} from '../../actors/billing-config.js';
import type { Environment } from '../../actors/protocol.js';
import type { Processor } from './processor.js';
import { CONTRACT_CUSTOMER_META, EXPANSION_LIMIT_META } from './metadata.js';

/** What the push did at the processor for one priced product. */
export interface CatalogAction {
  readonly productKey: string;
  readonly product: 'created' | 'updated' | 'unchanged';
  readonly processorProductId: string;
  readonly price: 'created' | 'unchanged';
  readonly processorPriceId: string;
  readonly lookupKey: string;
  readonly archivedPrices: readonly string[];
}

/** The processor's metadata keys on Tally's products. */
export const META_ENVIRONMENT = 'tally_environment';
export const META_PRODUCT_KEY = 'tally_product_key';

/**
 * Stripe's bounds on a lookup key (200 characters) and an idempotency key (255): a key
 * built from a long product or customer id names it by a digest instead.
 */
export const LOOKUP_KEY_MAX = 200;
export const IDEMPOTENCY_KEY_MAX = 255;

/**
 * `prefix + id + suffix`, or with `id` replaced by a digest of it when that would be longer than
 * `max`.
 */
export function fitKey(prefix: string, id: string, suffix: string, max: number): string {
  const plain = `${prefix}${id}${suffix}`;
  if (plain.length <= max) return plain;
  return `${prefix}~${createHash('sha256').update(id).digest('base64url').slice(0, 32)}${suffix}`;
}

/** The lookup key of a product's price: a new amount, currency or interval is a new version. */
export function priceLookupKey(
  environment: Environment,
  productKey: string,
  price: PriceDefinition,
): string {
  return fitKey(
    `${environment}:`,
    productKey,
    `:${price.amount}-${price.currency}-${price.interval ?? 'once'}`,
    LOOKUP_KEY_MAX,
  );
}

/**
 * The idempotency-key prefix of a push: the version it would store and a digest of the
 * document, so a retried push (a failed one, sent again) repeats the same keys, while the
 * same document pushed again later is a new command with keys of its own.
 */
export function pushCommandKey(
  environment: Environment,
  version: number,
  config: BillingConfig,
): string {
  const digest = createHash('sha256')
    .update(JSON.stringify(config))
    .digest('base64url')
    .slice(0, 22);
  return `tally-push-${environment}-v${version}-${digest}`;
}

/** Tally's products at the processor for the environment, by product key. */
async function existingProducts(
  stripe: Stripe,
  environment: Environment,
): Promise<Map<string, Stripe.Product>> {
  const found = new Map<string, Stripe.Product>();
  for await (const product of stripe.products.list({ limit: 100 })) {
    const key = product.metadata[META_PRODUCT_KEY];
    if (product.metadata[META_ENVIRONMENT] === environment && key !== undefined && !found.has(key))
      found.set(key, product);
  }
  return found;
}

async function syncProduct(
  stripe: Stripe,
  environment: Environment,
  key: string,
  def: ProductDefinition,
  existing: Stripe.Product | undefined,
  idem: string,
) {
  const name = def.name ?? key;
  if (existing === undefined) {
    const created = await stripe.products.create(
      { name, metadata: { [META_ENVIRONMENT]: environment, [META_PRODUCT_KEY]: key } },
      { idempotencyKey: fitKey(`${idem}-product-create-`, key, '', IDEMPOTENCY_KEY_MAX) },
    );
    return { product: created, action: 'created' as const };
  }
  if (existing.name === name && existing.active)
    return { product: existing, action: 'unchanged' as const };
  const updated = await stripe.products.update(
    existing.id,
    { name, active: true },
    { idempotencyKey: fitKey(`${idem}-product-update-`, key, '', IDEMPOTENCY_KEY_MAX) },
  );
  return { product: updated, action: 'updated' as const };
}

async function syncPrice(
  stripe: Stripe,
  environment: Environment,
  key: string,
  price: PriceDefinition,
  productId: string,
  idem: string,
) {
  const lookupKey = priceLookupKey(environment, key, price);
  const found = (await stripe.prices.list({ lookup_keys: [lookupKey], active: true, limit: 1 }))
    .data[0];
  if (found !== undefined && found.product === productId)
    return { price: found, action: 'unchanged' as const, lookupKey };
  const created = await stripe.prices.create(
    {
      product: productId,
      unit_amount: price.amount,
      currency: price.currency,
      lookup_key: lookupKey,
      // A lookup key left on an archived price of another product moves to this one.
      transfer_lookup_key: true,
      metadata: { [META_ENVIRONMENT]: environment, [META_PRODUCT_KEY]: key },
      ...(price.interval === undefined ? {} : { recurring: { interval: price.interval } }),
    },
    { idempotencyKey: fitKey(`${idem}-price-`, key, '', IDEMPOTENCY_KEY_MAX) },
  );
  return { price: created, action: 'created' as const, lookupKey };
}

/**
 * Archives the product's active prices other than `keepId` (contract and expansion prices,
 * which are not the catalog's, stay).
 */
async function archiveOthers(
  stripe: Stripe,
  productId: string,
  keepId: string,
  idem: string,
): Promise<string[]> {
  const archived: string[] = [];
  for await (const price of stripe.prices.list({ product: productId, active: true, limit: 100 })) {
    const own =
      price.metadata?.[CONTRACT_CUSTOMER_META] !== undefined ||
      price.metadata?.[EXPANSION_LIMIT_META] !== undefined;
    if (price.id === keepId || own) continue;
    await stripe.prices.update(
      price.id,
      { active: false },
      { idempotencyKey: `${idem}-archive-${price.id}` },
    );
    archived.push(price.id);
  }
  return archived;
}

/**
 * Creates or updates every priced product of `config` at the processor; throws the
 * processor's error (nothing in Tally has changed then). Products that are no longer
 * priced or configured are left as they are at the processor.
 */
export async function syncCatalog(
  processor: Processor,
  environment: Environment,
  version: number,
  config: BillingConfig,
): Promise<CatalogAction[]> {
  const { stripe } = processor;
  const idem = pushCommandKey(environment, version, config);
  const existing = await existingProducts(stripe, environment);
  const actions: CatalogAction[] = [];
  for (const [key, def] of Object.entries(config.products)) {
    if (def.price === undefined) continue;
    const product = await syncProduct(stripe, environment, key, def, existing.get(key), idem);
    const price = await syncPrice(stripe, environment, key, def.price, product.product.id, idem);
    const archivedPrices = await archiveOthers(stripe, product.product.id, price.price.id, idem);
    actions.push({
      productKey: key,
      product: product.action,
      processorProductId: product.product.id,
      price: price.action,
      processorPriceId: price.price.id,
      lookupKey: price.lookupKey,
      archivedPrices,
    });
  }
  return actions;
}
