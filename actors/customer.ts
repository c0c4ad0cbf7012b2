/**
 * The customer actor: per-customer billing state and the pure functions that change it.
 *
 * `decide(customer, config, command, nowMs)` validates a command against the current
 * state and returns the events that record it (core/decide.ts); `apply(state, event)`
 * folds an event into the state (core/apply.ts); `execute` does both for a live write
 * and answers with a view of the result. Nothing in the core reads a clock, touches IO
 * or imports from node:*; the shard shell injects `nowMs` and makes the events durable
 * before anyone is told. This module is the core's public face: the shell imports the
 * core from here.
 */
import { assert } from '../shared/assert.js';
import type { CompiledConfig } from './billing-config.js';
import { apply } from './core/apply.js';
import { decide } from './core/decide.js';
import { OPS } from './ops.js';
import type {
  CustomerState,
  Event,
  IdempotencyRecord,
  IdempotencySeen,
  Outcome,
  Rejection,
  WriteCommand,
} from './core/types.js';
import { commerceView } from './core/commerce.js';
import { recordedRefund } from './core/refunds.js';
import { balanceView, contextView, contractView, customerView, limitView } from './core/views.js';

export type * from './core/types.js';
export { apply } from './core/apply.js';
export { decide, idempotencyFingerprint, idempotencyScope, query } from './core/decide.js';
export { fromSnapshot, toSnapshot, type CustomerSnapshot } from './core/snapshot-form.js';
export { newCustomer } from './core/state.js';
export { customerView, onlyAnswerChangedBy } from './core/views.js';

export interface Execution {
  /** The customer after the events (undefined only when nothing was ever stored). */
  readonly customer: CustomerState | undefined;
  readonly outcome: Outcome;
  readonly events: readonly Event[];
  /**
   * True when the answer is a read: it acknowledges no write, so it need not wait for the
   * journal (a context that changed nothing). A replayed consume is not a read: it
   * acknowledges the original write.
   */
  readonly isRead?: true;
}

/**
 * The shell's say over an accepted decision before anything is applied: null to let it
 * through, or the rejection to answer instead (an operator's quota). Must be pure.
 */
export type Admission = (
  command: WriteCommand,
  customer: CustomerState | undefined,
  events: readonly Event[],
) => Rejection | null;

/**
 * Decides a write, applies its events to `customer` in place, and answers with the new
 * view. `admit`, when given, may refuse an accepted decision before it is applied;
 * `seen` is the shell's entry for the command's idempotency scope and `carry` the key its
 * event holds (see `decide`).
 */
export function execute(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  command: WriteCommand,
  nowMs: number,
  admit?: Admission,
  seen: IdempotencySeen | null = null,
  carry?: IdempotencyRecord,
): Execution {
  const decision = decide(customer, config, command, nowMs, seen, carry);
  const rejection =
    decision.rejection ??
    (admit === undefined || decision.events.length === 0
      ? null
      : admit(command, customer, decision.events));
  if (rejection !== null) {
    return { customer, outcome: { kind: 'rejected', rejection }, events: [] };
  }
  let state = customer;
  for (const event of decision.events) state = apply(state, event);
  const outcome = answer(customer, state, config, command, decision.events.length > 0, nowMs);
  // A write whose op says so answers a call that changed nothing as a read (a context call).
  if (decision.events.length === 0 && OPS[command.op].unchangedIsRead)
    return { customer: state, outcome, events: [], isRead: true };
  return { customer: state, outcome, events: decision.events };
}

/**
 * The answer to an accepted write: a view of the customer after its events, of the kind its op
 * answers with.
 */
function answer(
  before: CustomerState | undefined,
  state: CustomerState | undefined,
  config: CompiledConfig,
  command: WriteCommand,
  wrote: boolean,
  nowMs: number,
): Outcome {
  const kind = OPS[command.op].answer;
  switch (kind) {
    case 'contract':
      assert(state?.contract != null, `${command.op} left a contract`);
      return { kind, view: contractView(command.customerId, state.contract) };
    case 'deleted':
      return { kind };
    case 'context':
      assert(
        state !== undefined && command.op === 'context',
        'a context call created the customer',
      );
      return { kind, view: contextView(state, config, command.request, nowMs), wrote };
    case 'customer':
      assert(state !== undefined, `${command.op} left a customer`);
      return { kind, view: customerView(state), created: before === undefined, changed: wrote };
    case 'limit':
      return { kind, view: limitView(state, config, command.key) };
    case 'balance': {
      const ent = config.entitlements.get(command.key);
      assert(ent !== undefined, 'decide resolved the entitlement');
      return { kind, view: balanceView(state, config, ent, nowMs) };
    }
    case 'commerce':
      return { kind, view: commerceView(command.customerId, state) };
    case 'refund':
      assert(command.op === 'recordRefund', 'only a refund answers with one');
      return { kind, view: recordedRefund(state, command.refund) };
    case 'refundQuote':
    case 'overage':
    case 'has':
      assert(false, `a write (${command.op}) answers with a view`);
  }
}
