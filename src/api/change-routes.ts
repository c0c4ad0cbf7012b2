/**
 * Plan changes over HTTP (row 15): `POST /v1/subscriptions/change {customerId, planKey}`
 * moves the customer's active subscription to another recurring product.
 *
 * The subscription item's price is swapped at the processor with the proration invoiced
 * and paid at once (`proration_behavior: always_invoice`). Tally's own record, and with it
 * the customer's entitlements, follows when the processor confirms the change (its
 * `customer.subscription.updated` and `invoice.paid` events, reconciled as every other
 * processor change); the answer is the subscription as the processor has it after the
 * change.
 */
import type Stripe from 'stripe';
import type { BillingConfig } from '../../actors/billing-config.js';
import type { SubscriptionView } from '../../actors/customer.js';
import { ID_LENGTH_MAX } from '../../shared/limits.js';
import { isoOf } from '../../shared/iso-time.js';
import { subscriptionPrice } from '../commerce/contract-prices.js';
import { META } from '../commerce/metadata.js';
import { productOfLookupKey } from '../commerce/stripe-events.js';
import {
  commerceOf,
  contractOf,
  freshRef,
  processorMessage,
  ShardFull,
  type CommerceDeps,
} from './commerce-routes.js';
import type { AnyRouteRecord, JsonSchema, RouteInput, RouteRecord } from './route-record.js';

export interface ChangeBody {
  readonly customerId: string;
  readonly planKey: string;
}

const id = { type: 'string', minLength: 1, maxLength: ID_LENGTH_MAX } as const;
const changeSchema = {
  type: 'object',
  properties: { customerId: id, planKey: id },
  required: ['customerId', 'planKey'],
  additionalProperties: false,
} as const;

/** Statuses of a subscription that can change plans. */
const CHANGEABLE: ReadonlySet<string> = new Set(['active', 'trialing', 'past_due']);

function viewOf(
  customerId: string,
  planKey: string,
  subscription: Stripe.Subscription,
): SubscriptionView {
  const item = subscription.items.data[0];
  return {
    id: `stripe:${subscription.id}`,
    customerId,
    productKey: planKey,
    status: subscription.status,
    currentPeriodStart: isoOf((item?.current_period_start ?? 0) * 1000),
    currentPeriodEnd: isoOf((item?.current_period_end ?? 0) * 1000),
    cancelAtPeriodEnd: subscription.cancel_at_period_end,
    processor: 'stripe',
    processorSubscriptionId: subscription.id,
  };
}

/** The checks and the processor call; resolves once answered. */
async function change(deps: CommerceDeps, ctx: RouteInput<ChangeBody>): Promise<void> {
  const { customerId, planKey } = ctx.body;
  const latest = deps.control.latestConfig(ctx.environment);
  if (latest === null) return ctx.ex.fail('not_configured', { environment: ctx.environment });
  const config = latest.config as BillingConfig;
  const product = config.products[planKey];
  const price = product?.price;
  if (product === undefined)
    return ctx.ex.fail('plan_not_recurring', { planKey, detail: 'is not a product' });
  if (price?.interval === undefined)
    return ctx.ex.fail('plan_not_recurring', {
      planKey,
      detail: price === undefined ? 'is a free product' : 'is a one-time product',
    });
  const view = await commerceOf(deps.pool, ctx.environment, customerId);
  const live = view.subscriptions.findLast(
    (s) => CHANGEABLE.has(s.status) && s.processor === 'stripe',
  );
  if (live === undefined) return ctx.ex.fail('no_active_subscription', { customerId });
  const { stripe } = deps.processor;
  const current = await stripe.subscriptions.retrieve(live.processorSubscriptionId);
  const item = current.items.data[0];
  if (item === undefined) throw new Error(`subscription ${current.id} has no item`);
  // The plan it is on is the processor's: a change not yet confirmed to Tally counts.
  const onPlan = productOfLookupKey(ctx.environment, item.price.lookup_key) ?? live.productKey;
  if (onPlan === planKey) return ctx.ex.fail('already_on_plan', { id: live.id, planKey });
  const contract = await contractOf(deps.pool, ctx.environment, customerId);
  const target = await subscriptionPrice(
    stripe,
    ctx.environment,
    customerId,
    planKey,
    price,
    contract,
  );
  const updated = await stripe.subscriptions.update(
    current.id,
    {
      items: [{ id: item.id, price: target.id }],
      proration_behavior: 'always_invoice',
      metadata: { [META.productKey]: planKey },
    },
    { idempotencyKey: `tally-${ctx.environment}-change-${freshRef()}` },
  );
  const invoice = updated.latest_invoice;
  await deps.audit.append(
    ctx.environment,
    {
      action: 'subscription.change',
      resourceType: 'subscription',
      resourceId: customerId,
      actor: ctx.key.id,
      data: {
        id: live.id,
        from: onPlan,
        to: planKey,
        prorationInvoiceId: typeof invoice === 'string' ? invoice : (invoice?.id ?? null),
      },
    },
    Date.now(),
  );
  ctx.ex.json(200, viewOf(customerId, planKey, updated));
}

function handle(ctx: RouteInput<ChangeBody>, deps: CommerceDeps): void {
  change(deps, ctx).catch((error: unknown) => {
    if (ctx.ex.done) return;
    if (error instanceof ShardFull) return ctx.ex.fail('overloaded', {}, [['retry-after', '1']]);
    ctx.ex.logWarn('plan change failed', { error: processorMessage(error) });
    ctx.ex.fail('processor_error', { detail: processorMessage(error) });
  });
}

const ref = (name: string): JsonSchema => ({ $ref: `#/components/schemas/${name}` });

/** The plan change route: a record of the API route table (routes.ts spreads it in). */
export const CHANGE_ROUTES: ReadonlyArray<AnyRouteRecord<CommerceDeps>> = [
  route({
    method: 'POST',
    path: '/v1/subscriptions/change',
    keys: 'server',
    audited: true,
    body: { schema: changeSchema, numbers: 'as-parsed' },
    doc: {
      operationId: 'changeSubscription',
      tag: 'commerce',
      sharded: true,
      summary: "Move the customer's active subscription to another recurring product",
      description:
        'The price is swapped at the processor and the proration invoiced and paid at once. ' +
        'Entitlements switch when the processor confirms the change (its webhook events). ' +
        'Answers the subscription as the processor has it after the change.',
      ok: { description: 'The subscription after the change.', schema: ref('Subscription') },
      errors: [
        'not_configured',
        'plan_not_recurring',
        'no_active_subscription',
        'already_on_plan',
        'processor_error',
      ],
    },
    handle,
  }),
];

function route(record: RouteRecord<CommerceDeps, ChangeBody>): AnyRouteRecord<CommerceDeps> {
  return record;
}
