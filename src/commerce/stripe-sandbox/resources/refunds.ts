/**
 * Refunds: `/v1/refunds` create, retrieve, list.
 *
 * A refund returns part or all of a charge, named by `charge` or by `payment_intent` (its
 * charge). It succeeds at once (the sandbox's card always takes it back). Beyond what is
 * left to refund the request is refused as Stripe does: 400 `amount_too_large`, or
 * `charge_already_refunded` when nothing is left. The charge's `amount_refunded` and
 * `refunded` follow; `refund.created` then `charge.refunded` are raised.
 */
import type Stripe from 'stripe';
import { invalidParam, invalidState } from '../errors.js';
import { render, renderList } from '../expand.js';
import { allowOnly, optEnum, optInteger, optString, type Params } from '../form.js';
import { LIST_PARAMS, listPage } from '../list.js';
import { formatAmount } from '../money.js';
import type { Router } from '../router.js';
import type { SandboxState } from '../state.js';
import { mergeMetadata } from '../form.js';
import { newId } from '../store.js';

const REASONS = ['duplicate', 'fraudulent', 'requested_by_customer'] as const;

/** The charge a refund request names (by `charge`, or by `payment_intent`'s latest charge). */
function chargeOf(state: SandboxState, params: Params): Stripe.Charge {
  const chargeId = optString(params, 'charge');
  const paymentIntentId = optString(params, 'payment_intent');
  if (chargeId !== undefined && paymentIntentId !== undefined)
    throw invalidParam('payment_intent', 'You can only pass one of charge or payment_intent.');
  if (chargeId !== undefined) return state.charges.get(chargeId, 'charge');
  if (paymentIntentId === undefined)
    throw invalidParam(
      'charge',
      'One of the following params should be provided for this request: payment_intent or charge.',
      'parameter_missing',
    );
  const paymentIntent = state.paymentIntents.get(paymentIntentId, 'payment_intent');
  const latest = paymentIntent.latest_charge;
  if (latest === null)
    throw invalidState(
      `This PaymentIntent (${paymentIntentId}) does not have a successful charge to refund.`,
    );
  return state.charges.get(String(latest), 'payment_intent');
}

function refundError(code: string, message: string): never {
  const error = invalidParam('amount', message, code);
  throw error;
}

function createRefund(state: SandboxState, params: Params): Stripe.Refund {
  allowOnly(params, ['charge', 'payment_intent', 'amount', 'metadata', 'reason']);
  const charge = chargeOf(state, params);
  const left = charge.amount - charge.amount_refunded;
  if (left <= 0)
    refundError('charge_already_refunded', `Charge ${charge.id} has already been refunded.`);
  const amount = optInteger(params, 'amount') ?? left;
  if (amount < 1)
    throw invalidParam('amount', 'Amount must be at least 1.', 'parameter_invalid_integer');
  if (amount > left)
    refundError(
      'amount_too_large',
      `Refund amount (${formatAmount(amount, charge.currency)}) is greater than unrefunded ` +
        `amount on charge (${formatAmount(left, charge.currency)})`,
    );
  const created = state.customerNow(typeof charge.customer === 'string' ? charge.customer : null);
  const refund = state.refunds.insert({
    id: newId('re'),
    object: 'refund',
    amount,
    balance_transaction: null,
    charge: charge.id,
    created,
    currency: charge.currency,
    customer: charge.customer,
    customer_account: null,
    metadata: mergeMetadata(params),
    payment_intent: charge.payment_intent,
    payment_method: charge.payment_method,
    reason: optEnum(params, 'reason', REASONS) ?? null,
    receipt_number: null,
    source_transfer_reversal: null,
    status: 'succeeded',
    transfer_reversal: null,
  });
  const refunded = charge.amount_refunded + amount;
  const after: Stripe.Charge = {
    ...charge,
    amount_refunded: refunded,
    refunded: refunded === charge.amount,
  };
  state.charges.update(after);
  state.events.emit('refund.created', refund, undefined, created);
  state.events.emit(
    'charge.refunded',
    after,
    { amount_refunded: charge.amount_refunded, refunded: charge.refunded },
    created,
  );
  return refund;
}

function listRefunds(state: SandboxState, params: Params): Stripe.ApiList<Stripe.Refund> {
  allowOnly(params, [...LIST_PARAMS, 'charge', 'payment_intent']);
  const charge = optString(params, 'charge');
  const paymentIntent = optString(params, 'payment_intent');
  const items = state.refunds
    .newestFirst()
    .filter(
      (refund) =>
        (charge === undefined || refund.charge === charge) &&
        (paymentIntent === undefined || refund.payment_intent === paymentIntent),
    );
  return listPage(items, params, '/v1/refunds', 'refund');
}

export function registerRefunds(router: Router): void {
  router
    .add('POST', '/v1/refunds', ({ state, params, expand }) =>
      render(state, createRefund(state, params), expand),
    )
    .add('GET', '/v1/refunds/:id', ({ state, path, expand }) =>
      render(state, state.refunds.get(path['id'] as string), expand),
    )
    .add('GET', '/v1/refunds', ({ state, params, expand }) =>
      renderList(state, listRefunds(state, params), expand),
    );
}
