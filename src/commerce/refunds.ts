/**
 * Refunds at the processor: what a subscription's latest paid invoice paid and for which
 * period, the payment a refund goes through, the refunds Tally already made there, and
 * making one.
 *
 * Every refund Tally makes carries metadata that says everything needed to record it (the
 * environment, customer, what was refunded, the mode and the caller's key), so that a
 * refund made at the processor but not yet recorded in Tally (a crash in between) is
 * recorded later from the processor alone: by the retried request, or by the
 * `charge.refunded` event. Its idempotency key is derived from the same request, so a
 * retried call never refunds twice.
 */
import { createHash } from 'node:crypto';
import type Stripe from 'stripe';
import type { RefundInput, RefundMode, RefundTarget } from '../../actors/customer.js';
import type { Environment } from '../../actors/protocol.js';
import { ID_LENGTH_MAX } from '../../shared/limits.js';
import { META, REFUND_META } from './metadata.js';

/** The request a refund at the processor answers: its address and its recordable input. */
export interface ProcessorRefund {
  readonly environment: Environment;
  readonly customerId: string;
  readonly input: RefundInput;
}

/** The Tally refund a processor refund records, or null for one Tally did not make. */
export function tallyRefundOf(refund: Stripe.Refund): ProcessorRefund | null {
  const meta = refund.metadata ?? {};
  const environment = meta[META.environment];
  const customerId = meta[META.customerId];
  const target = meta[REFUND_META.target];
  const targetId = meta[REFUND_META.targetId];
  const mode = meta[REFUND_META.mode];
  const key = meta[REFUND_META.key];
  if (
    (environment !== 'test' && environment !== 'live') ||
    customerId === undefined ||
    customerId === '' ||
    customerId.length > ID_LENGTH_MAX ||
    (target !== 'subscription' && target !== 'purchase') ||
    targetId === undefined ||
    (mode !== 'prorated' && mode !== 'full') ||
    key === undefined
  )
    return null;
  return {
    environment,
    customerId,
    input: {
      target,
      targetId,
      mode,
      idempotencyKey: key === '' ? null : key,
      amount: refund.amount,
      currency: refund.currency,
      processorRefundId: refund.id,
    },
  };
}

/** The refunds Tally made through a payment intent, oldest first. */
export async function tallyRefundsOf(
  stripe: Stripe,
  paymentIntentId: string,
): Promise<ProcessorRefund[]> {
  const found: ProcessorRefund[] = [];
  for await (const refund of stripe.refunds.list({ payment_intent: paymentIntentId, limit: 100 })) {
    const tally = tallyRefundOf(refund);
    if (tally !== null) found.unshift(tally);
  }
  return found;
}

/** A subscription's latest paid invoice as a refund needs it. */
export interface PaidInvoice {
  readonly id: string;
  readonly amountPaid: number;
  readonly currency: string;
  /** The paid service period, Unix seconds: the span of its charged lines' periods. */
  readonly periodStart: number;
  readonly periodEnd: number;
  /** The payment it was paid with; null when nothing was charged (all paid by credit). */
  readonly paymentIntentId: string | null;
}

/** The latest paid invoice of a subscription, or null when it has none. */
export async function latestPaidInvoice(
  stripe: Stripe,
  subscriptionId: string,
): Promise<PaidInvoice | null> {
  const invoice = (
    await stripe.invoices.list({ subscription: subscriptionId, status: 'paid', limit: 1 })
  ).data[0];
  if (invoice?.id === undefined) return null;
  const charged = invoice.lines.data.filter((line) => line.amount > 0);
  const lines = charged.length > 0 ? charged : invoice.lines.data;
  const periodStart = Math.min(...lines.map((line) => line.period.start));
  const periodEnd = Math.max(...lines.map((line) => line.period.end));
  const payment = (await stripe.invoicePayments.list({ invoice: invoice.id, limit: 10 })).data.find(
    (p) => p.status === 'paid' && p.payment.type === 'payment_intent',
  );
  const paymentIntent = payment?.payment.payment_intent;
  return {
    id: invoice.id,
    amountPaid: invoice.amount_paid,
    currency: invoice.currency,
    periodStart: Number.isFinite(periodStart) ? periodStart : invoice.period_start,
    periodEnd: Number.isFinite(periodEnd) ? periodEnd : invoice.period_end,
    paymentIntentId:
      paymentIntent === undefined
        ? null
        : typeof paymentIntent === 'string'
          ? paymentIntent
          : paymentIntent.id,
  };
}

/**
 * The unused part of a paid period, rounded down: `amount × (end − now) / (end − start)`,
 * the period measured in seconds, so each month counts with its own length (28, 29, 30 or
 * 31 days) and a year with 365 or 366. Before the period it is the whole amount; after it,
 * nothing.
 */
export function proratedAmount(
  amount: number,
  period: { readonly start: number; readonly end: number },
  nowSeconds: number,
): number {
  const length = period.end - period.start;
  if (length <= 0 || nowSeconds >= period.end) return 0;
  const unused = Math.min(length, period.end - nowSeconds);
  return Number((BigInt(amount) * BigInt(unused)) / BigInt(length));
}

export interface RefundCall {
  readonly environment: Environment;
  readonly customerId: string;
  readonly target: RefundTarget;
  readonly targetId: string;
  readonly mode: RefundMode;
  readonly idempotencyKey: string | null;
  readonly amount: number;
  readonly paymentIntentId: string;
}

/**
 * Refunds `amount` through the payment at the processor, with an idempotency key derived
 * from the request (environment, customer, target, key and mode): a retry of the same
 * request gets the same refund back. Throws the processor's error (such as
 * `amount_too_large`).
 */
export function createRefund(stripe: Stripe, call: RefundCall): Promise<Stripe.Refund> {
  const request = [
    call.customerId,
    call.target,
    call.targetId,
    call.idempotencyKey ?? '',
    call.mode,
  ];
  return stripe.refunds.create(
    {
      payment_intent: call.paymentIntentId,
      amount: call.amount,
      reason: 'requested_by_customer',
      metadata: {
        [META.environment]: call.environment,
        [META.customerId]: call.customerId,
        [REFUND_META.target]: call.target,
        [REFUND_META.targetId]: call.targetId,
        [REFUND_META.mode]: call.mode,
        [REFUND_META.key]: call.idempotencyKey ?? '',
      },
    },
    {
      idempotencyKey: `tally-${call.environment}-refund-${digest(JSON.stringify(request))}`,
    },
  );
}

function digest(text: string): string {
  return createHash('sha256').update(text).digest('base64url');
}
