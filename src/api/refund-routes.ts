/**
 * Subscription and purchase refunds over HTTP (rows 16 and 18).
 *
 * A refund is three steps around the processor call, so that no crash can refund twice
 * or lose a refund: (1) the refunds Tally already made at the processor for this target
 * but has not recorded (a crash after the processor call) are recorded first, from the
 * processor's own record; (2) the customer's actor answers whether the refund may go ahead
 * (or replays the answer recorded under the same key) and how much a purchase returns;
 * (3) a subscription is canceled at the processor (its unused time is counted from the
 * cancellation), the processor refunds with an idempotency key derived from the request,
 * and the actor records the refund and its effect (the grant revoked, the subscription
 * canceled) in one journaled step, audited.
 *
 * The path names the subscription or purchase only: its customer is the one the
 * processor's object names in its metadata, which must be of the key's environment.
 */
import type Stripe from 'stripe';
import type {
  Command,
  RefundMode,
  RefundQuoteView,
  RefundRequest,
  RefundTarget,
} from '../../actors/customer.js';
import { ID_LENGTH_MAX } from '../../shared/limits.js';
import {
  createRefund,
  latestPaidInvoice,
  proratedAmount,
  tallyRefundsOf,
  type PaidInvoice,
} from '../commerce/refunds.js';
import { ownerOf, type Owner } from '../commerce/stripe-events.js';
import {
  Answered,
  applyAudited,
  ask,
  processorMessage,
  ShardFull,
  type CommerceDeps,
  type ShardAnswer,
} from './commerce-routes.js';
import { idParam } from './id-param.js';
import type { AnyRouteRecord, JsonSchema, RouteInput, RouteRecord } from './route-record.js';
import { renderReply } from './shard-reply.js';

export interface RefundBody {
  readonly mode: RefundMode;
  readonly idempotencyKey?: string;
}

const refundSchema = (keyRequired: boolean) =>
  ({
    type: 'object',
    properties: {
      mode: { enum: ['prorated', 'full'] },
      idempotencyKey: { type: 'string', minLength: 1, maxLength: ID_LENGTH_MAX },
    },
    required: keyRequired ? ['mode', 'idempotencyKey'] : ['mode'],
    additionalProperties: false,
  }) as const;

/** The processor's id in a Tally id (`stripe:sub_…` → `sub_…`), or null for another's. */
function processorIdOf(id: string, prefix: 'sub_' | 'pi_'): string | null {
  return id.startsWith(`stripe:${prefix}`) ? id.slice('stripe:'.length) : null;
}

function isMissing(error: unknown): boolean {
  return error instanceof Error && (error as { code?: unknown }).code === 'resource_missing';
}

/** Sends a shard's answer as it is (a rejection rendered from the catalog). */
function send(ctx: RouteInput<RefundBody>, reply: ShardAnswer): void {
  const rendered = renderReply(reply.outcome, reply.body);
  ctx.ex.send(rendered.status, rendered.body);
}

interface Located {
  readonly owner: Owner;
  /** The payment the refund goes through; null when nothing was paid. */
  readonly paymentIntentId: string | null;
  readonly subscription: Stripe.Subscription | null;
  readonly invoice: PaidInvoice | null;
}

/** The purchase's customer and payment, or null when it is not this environment's. */
async function locatePurchase(stripe: Stripe, paymentIntentId: string): Promise<Located | null> {
  let paymentIntent: Stripe.PaymentIntent;
  try {
    paymentIntent = await stripe.paymentIntents.retrieve(paymentIntentId);
  } catch (error) {
    if (isMissing(error)) return null;
    throw error;
  }
  let owner = ownerOf(paymentIntent.metadata);
  if (owner === null) {
    const sessions = await stripe.checkout.sessions.list({
      payment_intent: paymentIntentId,
      limit: 1,
    });
    owner = ownerOf(sessions.data[0]?.metadata ?? null);
  }
  if (owner === null) return null;
  return { owner, paymentIntentId, subscription: null, invoice: null };
}

/** The subscription's customer, latest paid invoice and its payment, or null. */
async function locateSubscription(stripe: Stripe, subscriptionId: string): Promise<Located | null> {
  let subscription: Stripe.Subscription;
  try {
    subscription = await stripe.subscriptions.retrieve(subscriptionId);
  } catch (error) {
    if (isMissing(error)) return null;
    throw error;
  }
  const owner = ownerOf(subscription.metadata);
  if (owner === null) return null;
  const invoice = await latestPaidInvoice(stripe, subscription.id);
  return { owner, paymentIntentId: invoice?.paymentIntentId ?? null, subscription, invoice };
}

/**
 * Records the refunds Tally made at the processor for this target that Tally has not
 * recorded yet (a crash between the processor call and the record). Each is recorded once.
 */
async function recordMadeRefunds(
  deps: CommerceDeps,
  located: Located,
  targetId: string,
  actor: string,
): Promise<void> {
  if (located.paymentIntentId === null) return;
  const made = await tallyRefundsOf(deps.processor.stripe, located.paymentIntentId);
  for (const refund of made) {
    if (
      refund.input.targetId !== targetId ||
      refund.environment !== located.owner.environment ||
      refund.customerId !== located.owner.customerId
    )
      continue;
    const reply = await applyAudited(
      deps,
      { op: 'recordRefund', ...located.owner, key: '', refund: refund.input },
      actor,
    );
    if (reply.outcome === 'rejected')
      throw new Error(`recording refund ${refund.input.processorRefundId} was refused`);
  }
}

/** What is left to refund of a payment: the charge's amount less what it has refunded. */
async function unrefundedOf(stripe: Stripe, paymentIntentId: string): Promise<number> {
  const paymentIntent = await stripe.paymentIntents.retrieve(paymentIntentId, {
    expand: ['latest_charge'],
  });
  const charge = paymentIntent.latest_charge;
  if (charge === null || typeof charge === 'string') return 0;
  return charge.amount - charge.amount_refunded;
}

/** A subscription refund's amount: the unused part of the invoice, or all of it unrefunded. */
async function subscriptionAmount(
  stripe: Stripe,
  located: Located,
  mode: RefundMode,
): Promise<number> {
  const { invoice, subscription } = located;
  if (invoice === null || located.paymentIntentId === null || subscription === null) return 0;
  const unrefunded = await unrefundedOf(stripe, located.paymentIntentId);
  if (mode === 'full') return unrefunded;
  // Measured from the cancellation, as the processor timed it (its test clock's time too).
  const now = subscription.ended_at ?? subscription.canceled_at ?? Math.floor(Date.now() / 1000);
  const period = { start: invoice.periodStart, end: invoice.periodEnd };
  return Math.min(unrefunded, proratedAmount(invoice.amountPaid, period, now));
}

/** Cancels the subscription at the processor now, unless it already ended; answers it. */
async function cancelNow(stripe: Stripe, subscriptionId: string): Promise<Stripe.Subscription> {
  const current = await stripe.subscriptions.retrieve(subscriptionId);
  if (current.status === 'canceled' || current.status === 'incomplete_expired') return current;
  return stripe.subscriptions.cancel(subscriptionId);
}

interface Plan {
  readonly target: RefundTarget;
  readonly targetId: string;
  readonly processorId: string;
  readonly locate: (stripe: Stripe, processorId: string) => Promise<Located | null>;
}

/** The steps of a refund; resolves once it is answered. */
async function refund(deps: CommerceDeps, ctx: RouteInput<RefundBody>, plan: Plan): Promise<void> {
  const { stripe } = deps.processor;
  const located = await plan.locate(stripe, plan.processorId);
  if (located === null || located.owner.environment !== ctx.environment) {
    ctx.ex.fail(`${plan.target}_not_found`, { id: plan.targetId });
    return;
  }
  const address = { environment: located.owner.environment, customerId: located.owner.customerId };
  await recordMadeRefunds(deps, located, plan.targetId, ctx.key.id);
  const request: RefundRequest = {
    target: plan.target,
    targetId: plan.targetId,
    mode: ctx.body.mode,
    idempotencyKey: ctx.body.idempotencyKey ?? null,
  };
  const quoted = await ask(deps.pool, { op: 'quoteRefund', ...address, key: '', request });
  if (quoted.outcome === 'rejected') return send(ctx, quoted);
  const quote = JSON.parse(quoted.body) as RefundQuoteView;
  if (quote.recorded !== null) {
    if (plan.target === 'subscription') await cancelNow(stripe, plan.processorId);
    ctx.ex.json(200, quote.recorded);
    return;
  }
  // A subscription is canceled first: the unused part of its period is counted from then.
  const ended =
    plan.target === 'subscription'
      ? { ...located, subscription: await cancelNow(stripe, plan.processorId) }
      : located;
  const made = await refundAtProcessor(deps, ctx, ended, request, quote);
  if (made === null) return;
  const command: Command = {
    op: 'recordRefund',
    ...address,
    key: '',
    refund: { ...request, ...made },
  };
  send(ctx, await applyAudited(deps, command, ctx.key.id));
}

/**
 * Makes the refund at the processor; answers what to record, or null once the request is
 * answered (a refund the processor refuses as too large).
 */
async function refundAtProcessor(
  deps: CommerceDeps,
  ctx: RouteInput<RefundBody>,
  located: Located,
  request: RefundRequest,
  quote: RefundQuoteView,
): Promise<{ amount: number; currency: string; processorRefundId: string | null } | null> {
  const { stripe } = deps.processor;
  const { subscription, invoice } = located;
  const amount = quote.amount ?? (await subscriptionAmount(stripe, located, request.mode));
  const currency = quote.currency ?? invoice?.currency ?? subscription?.currency ?? '';
  if (amount === 0 || located.paymentIntentId === null)
    return { amount: 0, currency, processorRefundId: null };
  try {
    const made = await createRefund(stripe, {
      ...located.owner,
      ...request,
      amount,
      paymentIntentId: located.paymentIntentId,
    });
    return { amount: made.amount, currency: made.currency, processorRefundId: made.id };
  } catch (error) {
    const code = (error as { code?: unknown }).code;
    if (code !== 'amount_too_large' && code !== 'charge_already_refunded') throw error;
    ctx.ex.fail('already_refunded', { detail: processorMessage(error) });
    return null;
  }
}

/** The handler of a refund route for `target`. */
function refundRoute(target: RefundTarget) {
  const prefix = target === 'subscription' ? 'sub_' : 'pi_';
  return (ctx: RouteInput<RefundBody>, deps: CommerceDeps): void => {
    const targetId = ctx.param;
    const processorId = processorIdOf(targetId, prefix);
    if (processorId === null) return ctx.ex.fail(`${target}_not_found`, { id: targetId });
    const locate = target === 'subscription' ? locateSubscription : locatePurchase;
    refund(deps, ctx, { target, targetId, processorId, locate }).catch((error: unknown) => {
      if (error instanceof Answered || ctx.ex.done) return;
      if (error instanceof ShardFull) return ctx.ex.fail('overloaded', {}, [['retry-after', '1']]);
      ctx.ex.logWarn(`${target} refund failed`, { id: targetId, error: processorMessage(error) });
      ctx.ex.fail('processor_error', { detail: processorMessage(error) });
    });
  };
}

const ref = (name: string): JsonSchema => ({ $ref: `#/components/schemas/${name}` });

/** The refund routes: records of the API route table (routes.ts spreads them in). */
export const REFUND_ROUTES: ReadonlyArray<AnyRouteRecord<CommerceDeps>> = [
  route({
    method: 'POST',
    path: '/v1/subscriptions/:subscriptionId/refunds',
    keys: 'server',
    param: idParam('subscriptionId'),
    audited: true,
    body: { schema: refundSchema(false), numbers: 'as-parsed' },
    doc: {
      operationId: 'refundSubscription',
      tag: 'commerce',
      sharded: true,
      summary: 'Refund a subscription and cancel it at once',
      description:
        '`prorated` returns the unused part of the latest paid invoice (its paid period ' +
        'measured in calendar time), `full` what is left of it; both cancel the ' +
        'subscription now. The same `idempotencyKey` and mode answer the same refund again.',
      ok: { description: 'The refund.', schema: ref('Refund') },
      errors: [
        'subscription_not_found',
        'already_refunded',
        'idempotency_key_reused',
        'processor_error',
      ],
    },
    handle: refundRoute('subscription'),
  }),
  route({
    method: 'POST',
    path: '/v1/purchases/:purchaseId/refunds',
    keys: 'server',
    param: idParam('purchaseId'),
    audited: true,
    body: { schema: refundSchema(true), numbers: 'as-parsed' },
    doc: {
      operationId: 'refundPurchase',
      tag: 'commerce',
      sharded: true,
      summary: 'Refund a purchase and revoke what is left of its grant',
      description:
        '`full` returns all unrefunded money; `prorated` (a purchase that granted a single ' +
        'credit lot only) returns the price times the unused share of the lot. Both revoke ' +
        'the unused credits. `idempotencyKey` is required.',
      ok: { description: 'The refund.', schema: ref('Refund') },
      errors: [
        'purchase_not_found',
        'refund_mode_not_allowed',
        'already_refunded',
        'idempotency_key_reused',
        'processor_error',
      ],
    },
    handle: refundRoute('purchase'),
  }),
];

function route(record: RouteRecord<CommerceDeps, RefundBody>): AnyRouteRecord<CommerceDeps> {
  return record;
}
