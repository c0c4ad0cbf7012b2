/**
 * Which webhook events each write op emits: one table, `EVENTS_OF_OP`, keyed by op. An event
 * is produced by the shard in the same step as the change it reports and stored in the same
 * LMDB transaction as the journal record that holds the change (storage/outbox.ts), so there
 * is an event exactly when the change is durable. Pure: it reads the command, the customer
 * after the change and the answer, never a clock.
 *
 * One rule holds for every op and is not in the table: a write that brings a customer into
 * existence (an upsert, or a consume, settings call, contract or checkout that creates it
 * implicitly) emits `customer.created` first. To give an op events, add its entry here with
 * the kinds it may emit (docs/webhooks.md lists them and their payloads).
 */
import type { Environment } from '../shared/environment.js';
import type { EventKind } from '../shared/event-kinds.js';
import { commerceView } from './core/commerce.js';
import type { CustomerState, Event, Outcome, WriteCommand } from './core/types.js';
import { customerView } from './core/views.js';

/** An event as the shard emits it; the shell names it (`evt_…`) when it stores it. */
export interface Notice {
  readonly type: EventKind;
  readonly environment: Environment;
  readonly customerId: string;
  readonly atMs: number;
  readonly data: Readonly<Record<string, unknown>>;
}

type WriteOp = WriteCommand['op'];
type CommandOf<O extends WriteOp> = Extract<WriteCommand, { readonly op: O }>;

/** What an entry sees of an accepted write that changed something. */
export interface NoticeInput<C extends WriteCommand, P> {
  readonly command: C;
  /** What the entry's `capture` read before the change (the change updates state in place). */
  readonly captured: P;
  /** The customer after the change. */
  readonly customer: CustomerState;
  /** Whether this write created the customer. */
  readonly created: boolean;
  readonly events: readonly Event[];
  readonly outcome: Outcome;
  readonly nowMs: number;
}

export interface EventRule<C extends WriteCommand, P = undefined> {
  /** Every kind the entry may emit (docs and tests read this). */
  readonly kinds: readonly EventKind[];
  // Method syntax on purpose: the table below holds rules of different `P` as one type.
  /** Reads what the entry needs from the state before the change, if anything. */
  capture?(customer: CustomerState | undefined, command: C): P;
  notices(input: NoticeInput<C, P>): Notice[];
}

function notice(
  type: EventKind,
  input: { command: WriteCommand; nowMs: number },
  data: Record<string, unknown>,
): Notice {
  const { environment, customerId } = input.command;
  return { type, environment, customerId, atMs: input.nowMs, data };
}

/** An upsert (customers, context) that changed an existing customer's profile. */
const customerUpdated: EventRule<CommandOf<'upsertCustomer' | 'context'>> = {
  kinds: ['customer.updated'],
  notices: (input) =>
    input.created
      ? []
      : [notice('customer.updated', input, { customer: customerView(input.customer) })],
};

/**
 * A consume that took the meter's balance (included allowance and credit lots) from above
 * zero to zero. A refused consume changes nothing and emits nothing; a consume drawn from
 * overage alone (the balance was already zero) emits nothing either.
 */
const usageExhausted: EventRule<CommandOf<'consume'>> = {
  kinds: ['usage.exhausted'],
  notices: (input) => {
    const consumed = input.events.find((event) => event.type === 'consumed');
    if (consumed?.type !== 'consumed' || input.outcome.kind !== 'balance') return [];
    const drewBalance = consumed.includedMicros > 0n || consumed.lotDraws.length > 0;
    if (!drewBalance || input.outcome.view.balance !== 0) return [];
    return [
      notice('usage.exhausted', input, {
        customerId: input.command.customerId,
        key: input.command.key,
        balance: input.outcome.view,
      }),
    ];
  },
};

/** The processor's subscription: created, canceled, or otherwise changed. */
const subscriptionChanged: EventRule<CommandOf<'syncSubscription'>, string | null> = {
  kinds: ['subscription.created', 'subscription.updated', 'subscription.canceled'],
  capture: (customer, command) =>
    customer?.commerce?.subscriptions.find(
      (s) => s.processorSubscriptionId === command.subscription.processorSubscriptionId,
    )?.status ?? null,
  notices: (input) => {
    const synced = input.events.find((event) => event.type === 'subscriptionSynced');
    if (synced?.type !== 'subscriptionSynced') return [];
    const view = commerceView(input.command.customerId, input.customer).subscriptions.find(
      (s) => s.id === synced.subscription.id,
    );
    if (view === undefined) return [];
    const previous = input.captured;
    const type: EventKind =
      previous === null
        ? 'subscription.created'
        : view.status === 'canceled' && previous !== 'canceled'
          ? 'subscription.canceled'
          : 'subscription.updated';
    return [notice(type, input, { subscription: view, previousStatus: previous })];
  },
};

/** A paid one-time purchase, recorded once. */
const purchaseCompleted: EventRule<CommandOf<'recordPurchase'>> = {
  kinds: ['purchase.completed'],
  notices: (input) => {
    const recorded = input.events.find((event) => event.type === 'purchaseRecorded');
    if (recorded?.type !== 'purchaseRecorded') return [];
    const view = commerceView(input.command.customerId, input.customer).purchases.find(
      (p) => p.id === recorded.purchase.id,
    );
    return view === undefined ? [] : [notice('purchase.completed', input, { purchase: view })];
  },
};

/**
 * THE table: op → the events it emits (besides `customer.created`). An op not listed emits
 * only `customer.created`, when it creates the customer.
 */
export const EVENTS_OF_OP: { readonly [O in WriteOp]?: EventRule<CommandOf<O>, unknown> } = {
  upsertCustomer: customerUpdated,
  context: customerUpdated,
  consume: usageExhausted,
  syncSubscription: subscriptionChanged,
  recordPurchase: purchaseCompleted,
};

/** The rule of `op`, with its input types erased (the shard calls it generically). */
function ruleOf(op: WriteOp): EventRule<WriteCommand, unknown> | undefined {
  return EVENTS_OF_OP[op] as EventRule<WriteCommand, unknown> | undefined;
}

/** What the op's rule needs from the state before the change (undefined for most ops). */
export function captureBefore(customer: CustomerState | undefined, command: WriteCommand): unknown {
  return ruleOf(command.op)?.capture?.(customer, command);
}

/**
 * The events of an accepted write that changed something (`events` non-empty): first
 * `customer.created` when it created the customer, then the op's own.
 */
export function noticesOf(input: NoticeInput<WriteCommand, unknown>): Notice[] {
  const own = ruleOf(input.command.op)?.notices(input) ?? [];
  if (!input.created) return own;
  return [notice('customer.created', input, { customer: customerView(input.customer) }), ...own];
}
