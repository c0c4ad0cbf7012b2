/**
 * Subscription and purchase refunds in the customer's actor: whether a refund may go
 * ahead and how much a purchase's returns (the quote, read before the processor is asked),
 * and the record of a refund the processor made, with its effect, in one journaled step.
 *
 * The refund records are also the requests' idempotency records: a request is its target,
 * its key and its mode. The same key and mode answer the recorded refund again; the same
 * key with the other mode is refused. A refund the processor reports again (by its id) is
 * recorded once, whichever path reports it first (the request, or its `charge.refunded`
 * event after a crash).
 */
import { assert } from '../../shared/assert.js';
import { REFUNDS_PER_CUSTOMER_MAX } from '../../shared/limits.js';
import type { CompiledConfig } from '../billing-config.js';
import type { Micros } from '../fixed.js';
import type {
  CommerceState,
  CustomerState,
  Decision,
  Event,
  Outcome,
  PurchaseRecord,
  PurchaseStatus,
  RefundInput,
  RefundRecord,
  RefundRequest,
  RefundView,
  Rejection,
  WriteCommand,
} from './types.js';

const REPLAY: Decision = { rejection: null, events: [] };

export function refundView(record: RefundRecord): RefundView {
  return {
    id: record.targetId,
    status: record.status,
    refund: { amount: record.amount, currency: record.currency, mode: record.mode },
  };
}

/**
 * The recorded refund a request repeats (same target and key, or the same processor refund),
 * or the rejection of a key reused with the other mode; null: nothing recorded for it.
 */
function recordedFor(
  commerce: CommerceState | null | undefined,
  request: RefundRequest & { readonly processorRefundId?: string | null },
): RefundRecord | Rejection | null {
  const processorId = request.processorRefundId ?? null;
  for (const record of commerce?.refunds ?? []) {
    if (record.targetId !== request.targetId) continue;
    if (processorId !== null && record.processorRefundId === processorId) return record;
    if (request.idempotencyKey === null || record.idempotencyKey !== request.idempotencyKey)
      continue;
    return record.mode === request.mode ? record : { kind: 'idempotency_key_reused' };
  }
  return null;
}

function isRejection(value: RefundRecord | Rejection): value is Rejection {
  return 'kind' in value;
}

/** The refund a `recordRefund` answers with: the one it recorded, or the one it repeats. */
export function recordedRefund(
  customer: CustomerState | undefined,
  input: RefundInput,
): RefundView {
  const found = recordedFor(customer?.commerce, input);
  if (found !== null && !isRejection(found)) return refundView(found);
  const refunds = customer?.commerce?.refunds ?? [];
  const last = refunds.findLast((record) => record.targetId === input.targetId);
  assert(last !== undefined, 'a recorded refund answers with its record');
  return refundView(last);
}

/** Why a purchase cannot be refunded pro rata, or null when it can. */
function proratedProblem(purchase: PurchaseRecord, config: CompiledConfig): string | null {
  const meters = Object.entries(purchase.grant).filter(([, credits]) => credits > 0);
  if (meters.length === 0)
    return 'a prorated refund needs a purchase that granted metered credits; it granted none';
  if (meters.length > 1)
    return `a prorated refund needs a single credit lot; the purchase granted ${meters.length}`;
  const product = config.products.get(purchase.productKey);
  if (product !== undefined && (product.features.size > 0 || product.limits.size > 0))
    return (
      'a prorated refund needs a purchase that granted only credits; it also grants ' +
      'features or limits'
    );
  return null;
}

/** Remaining and granted micro-units of the purchase's lot on `meterKey`. */
function lotOf(
  customer: CustomerState | undefined,
  meterKey: string,
  lotId: string,
): { remaining: Micros; granted: Micros } {
  const lot = customer?.meters.get(meterKey)?.lots.find((l) => l.id === lotId);
  return lot === undefined
    ? { remaining: 0n, granted: 0n }
    : { remaining: lot.remainingMicros, granted: lot.grantedMicros };
}

/** How much a purchase refund returns, or why it cannot be made. */
function purchaseAmount(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  purchase: PurchaseRecord,
  request: RefundRequest,
): number | Rejection {
  const unrefunded = purchase.amount - purchase.refundedAmount;
  if (unrefunded <= 0)
    return {
      kind: 'already_refunded',
      id: purchase.id,
      detail: `purchase ${purchase.id} was refunded in full`,
    };
  if (request.mode === 'full') return unrefunded;
  const problem = proratedProblem(purchase, config);
  if (problem !== null)
    return { kind: 'refund_mode_not_allowed', id: purchase.id, detail: problem };
  const [meterKey] = Object.keys(purchase.grant).filter((key) => (purchase.grant[key] ?? 0) > 0);
  assert(meterKey !== undefined, 'a single-lot purchase has its meter');
  const lot = lotOf(customer, meterKey, purchase.id);
  if (lot.remaining === 0n || lot.granted === 0n)
    return {
      kind: 'already_refunded',
      id: purchase.id,
      detail: `purchase ${purchase.id} has no unused credits left to refund`,
    };
  // Price × unused / granted, rounded down; never more than what is left to refund.
  const prorated = Number((BigInt(purchase.amount) * lot.remaining) / lot.granted);
  return Math.min(prorated, unrefunded);
}

/**
 * Answers a refund request before the processor is asked: the recorded answer (a replay),
 * the purchase's amount to return, or why it cannot go ahead, in this order: key reused
 * with the other mode, unknown target, already refunded, mode not allowed.
 */
export function quoteRefund(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  request: RefundRequest,
): Outcome {
  const commerce = customer?.commerce;
  const recorded = recordedFor(commerce, request);
  if (recorded !== null)
    return isRejection(recorded)
      ? { kind: 'rejected', rejection: recorded }
      : {
          kind: 'refundQuote',
          view: { recorded: refundView(recorded), amount: null, currency: null },
        };
  const notFound: Rejection = {
    kind: 'refund_target_not_found',
    target: request.target,
    id: request.targetId,
  };
  if (request.target === 'subscription') {
    const subscription = commerce?.subscriptions.find((s) => s.id === request.targetId);
    if (subscription === undefined) return { kind: 'rejected', rejection: notFound };
    if (commerce?.refunds.some((r) => r.targetId === request.targetId) === true)
      return {
        kind: 'rejected',
        rejection: {
          kind: 'already_refunded',
          id: request.targetId,
          detail: `subscription ${request.targetId} was already refunded`,
        },
      };
    return { kind: 'refundQuote', view: { recorded: null, amount: null, currency: null } };
  }
  const purchase = commerce?.purchases.find((p) => p.id === request.targetId);
  if (purchase === undefined) return { kind: 'rejected', rejection: notFound };
  const amount = purchaseAmount(customer, config, purchase, request);
  if (typeof amount !== 'number') return { kind: 'rejected', rejection: amount };
  return { kind: 'refundQuote', view: { recorded: null, amount, currency: purchase.currency } };
}

/** The credits a purchase refund revokes: all that remain of the purchase's lots. */
function revokedCredits(
  customer: CustomerState | undefined,
  purchase: PurchaseRecord,
): Array<readonly [string, Micros]> {
  const revoked: Array<readonly [string, Micros]> = [];
  for (const meterKey of Object.keys(purchase.grant)) {
    const { remaining } = lotOf(customer, meterKey, purchase.id);
    if (remaining > 0n) revoked.push([meterKey, remaining]);
  }
  return revoked;
}

/**
 * Records a refund the processor made, with its effect. It is a fact at the processor, so
 * it is recorded even when Tally's own view would not have allowed it (the refunded total
 * stays within the amount paid); only an unknown target or a reused key is refused.
 */
export function decideRecordRefund(
  customer: CustomerState | undefined,
  command: Extract<WriteCommand, { op: 'recordRefund' }>,
  nowMs: number,
): Decision {
  const { environment, customerId, refund: input } = command;
  const commerce = customer?.commerce;
  const recorded = recordedFor(commerce, input);
  if (recorded !== null)
    return isRejection(recorded) ? { rejection: recorded, events: [] } : REPLAY;
  if ((commerce?.refunds.length ?? 0) >= REFUNDS_PER_CUSTOMER_MAX)
    return { rejection: { kind: 'too_many_records' }, events: [] };
  const notFound: Rejection = {
    kind: 'refund_target_not_found',
    target: input.target,
    id: input.targetId,
  };
  const base = { environment, customerId, key: '', atMs: nowMs } as const;
  const record = (status: string): RefundRecord => ({
    target: input.target,
    targetId: input.targetId,
    idempotencyKey: input.idempotencyKey,
    mode: input.mode,
    amount: input.amount,
    currency: input.currency,
    status,
    processorRefundId: input.processorRefundId,
    atMs: nowMs,
  });
  if (input.target === 'subscription') {
    const subscription = commerce?.subscriptions.find((s) => s.id === input.targetId);
    if (subscription === undefined) return { rejection: notFound, events: [] };
    const event: Event = {
      type: 'subscriptionRefunded',
      ...base,
      subscriptionId: subscription.id,
      productKey: subscription.productKey,
      refund: record('canceled'),
    };
    return { rejection: null, events: [event] };
  }
  const purchase = commerce?.purchases.find((p) => p.id === input.targetId);
  if (purchase === undefined) return { rejection: notFound, events: [] };
  const refundedAmount = Math.min(purchase.amount, purchase.refundedAmount + input.amount);
  const status: PurchaseStatus =
    refundedAmount >= purchase.amount ? 'refunded' : 'partially_refunded';
  const event: Event = {
    type: 'purchaseRefunded',
    ...base,
    purchaseId: purchase.id,
    productKey: purchase.productKey,
    refund: record(status),
    refundedAmount,
    status,
    revoked: revokedCredits(customer, purchase),
  };
  return { rejection: null, events: [event] };
}

/** Folds a refund event into the state (apply.ts hands these over). */
export function applyRefund(
  state: CustomerState,
  commerce: CommerceState,
  event: Extract<Event, { type: 'purchaseRefunded' | 'subscriptionRefunded' }>,
): void {
  if (event.type === 'subscriptionRefunded') {
    const index = commerce.subscriptions.findIndex((s) => s.id === event.subscriptionId);
    const subscription = commerce.subscriptions[index];
    assert(subscription !== undefined, 'a refunded subscription is recorded');
    commerce.subscriptions[index] = {
      ...subscription,
      status: 'canceled',
      cancelAtPeriodEnd: false,
    };
  } else {
    const index = commerce.purchases.findIndex((p) => p.id === event.purchaseId);
    const purchase = commerce.purchases[index];
    assert(purchase !== undefined, 'a refunded purchase is recorded');
    commerce.purchases[index] = {
      ...purchase,
      refundedAmount: event.refundedAmount,
      status: event.status,
    };
    for (const [meterKey, micros] of event.revoked) {
      const lot = state.meters.get(meterKey)?.lots.find((l) => l.id === event.purchaseId);
      assert(lot !== undefined && lot.remainingMicros >= micros, 'revoked credits remain');
      lot.remainingMicros -= micros;
    }
  }
  commerce.refunds.push(event.refund);
}

/**
 * Whether a credit lot was revoked by its purchase's refund: credits a usage refund would
 * give back to it are not restored (the customer has had that money back).
 */
export function lotRevoked(state: CustomerState, lotId: string): boolean {
  const purchase = state.commerce?.purchases.find((p) => p.id === lotId);
  return purchase !== undefined && purchase.status !== 'paid';
}
