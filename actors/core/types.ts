/**
 * The customer actor's vocabulary: its state, the commands it answers, the events that
 * record its changes and the outcomes it reports. Declarations only, so that every
 * part of the pure core (views, decide, apply, snapshot form) and the shell around it
 * share one definition.
 */
import type { EntitlementType } from '../billing-config.js';
import type { AmountJson, Micros } from '../fixed.js';
import type { CustomerProfile, CustomerView, MetadataValue } from '../../shared/customer-record.js';
import type { Environment } from '../../shared/environment.js';

export type { CustomerProfile, CustomerView, Environment, MetadataValue };

// ---------------------------------------------------------------------------
// State

export interface Lot {
  readonly id: string;
  readonly grantedMicros: Micros;
  remainingMicros: Micros;
  readonly grantedAtMs: number;
}

/** One entry of the period's lot-draw stack: micro-units drawn from one lot, in draw order. */
export type LotDraw = [lotId: string, micros: Micros];

export interface MeterState {
  /** The period the usage fields below belong to. */
  periodStartMs: number;
  includedUsedMicros: Micros;
  overageMicros: Micros;
  /** Lot draws of this period, oldest first; adjacent draws of one lot are merged. */
  lotDraws: LotDraw[];
  overageEnabled: boolean;
  /** Purchased-credit lots, oldest first. They outlive periods. */
  lots: Lot[];
  /**
   * The overage of the period before `periodStartMs`, kept when a write moved the meter on,
   * so that it can still be billed at the processor once that period's invoice is drafted.
   * Absent when that period had none.
   */
  closedOverage?: ClosedOverage;
}

export interface ClosedOverage {
  readonly periodStartMs: number;
  readonly micros: Micros;
}

export interface LimitState {
  purchased: number;
  autoExpansionEnabled: boolean;
}

/**
 * What the shell holds for an idempotency scope: the fingerprint (the amount) of the
 * write that first used the key, and when. Keys live outside the customer's state, in
 * the shard's own table; the shell looks the scope up and hands the entry to `decide`.
 */
export interface IdempotencySeen {
  readonly fingerprint: string;
  readonly atMs: number;
}

/** A per-customer contract: custom price and included amounts. */
export interface Contract {
  /** Integer minor units of the product currency, per `priceInterval`. */
  readonly priceAmount: number;
  readonly priceInterval: 'month' | 'year';
  /** Replaces the plan's included amount (limits, meters) or grants/denies a feature. */
  readonly entitlements: Readonly<Record<string, { readonly included: number }>>;
  readonly updatedAtMs: number;
}

/** A subscription at the payment processor, as last reconciled from it. */
export interface SubscriptionRecord {
  /** Tally's id: the processor's name and its subscription id (`stripe:sub_…`). */
  readonly id: string;
  readonly productKey: string;
  /** The processor's status (`active`, `trialing`, `canceled`, …). */
  readonly status: string;
  readonly currentPeriodStartMs: number;
  readonly currentPeriodEndMs: number;
  readonly cancelAtPeriodEnd: boolean;
  readonly processor: string;
  readonly processorSubscriptionId: string;
}

/** A paid one-time purchase and the credits it granted (lots named by the purchase id). */
export interface PurchaseRecord {
  /** Tally's id: the processor's name and its payment id (`stripe:pi_…`); also the lots' id. */
  readonly id: string;
  readonly productKey: string;
  /** `paid`, `partially_refunded` (some cash returned) or `refunded` (all of it). */
  readonly status: PurchaseStatus;
  /** Integer minor units of `currency`. */
  readonly amount: number;
  readonly currency: string;
  readonly refundedAmount: number;
  /** Meter key → credits granted. */
  readonly grant: Readonly<Record<string, number>>;
  readonly atMs: number;
}

export type PurchaseStatus = 'paid' | 'partially_refunded' | 'refunded';

export type RefundMode = 'prorated' | 'full';

/** What a refund is of: a subscription (`stripe:sub_…`) or a purchase (`stripe:pi_…`). */
export type RefundTarget = 'subscription' | 'purchase';

/**
 * A refund made through Tally, as recorded: also the idempotency record of its request
 * (target, key and mode) and the answer a replay gets.
 */
export interface RefundRecord {
  readonly target: RefundTarget;
  /** The subscription's or purchase's id. */
  readonly targetId: string;
  /** The caller's key; null for a subscription refund asked without one. */
  readonly idempotencyKey: string | null;
  readonly mode: RefundMode;
  /** Integer minor units returned to the customer (0: nothing was left to return). */
  readonly amount: number;
  readonly currency: string;
  /** The subscription's or purchase's status once refunded (the answer's `status`). */
  readonly status: string;
  /** The processor's refund id (`re_…`), null when nothing was returned. */
  readonly processorRefundId: string | null;
  readonly atMs: number;
}

/** What the payment processor knows of the customer, and the processor events already applied. */
export interface CommerceState {
  processorCustomerId: string | null;
  subscriptions: SubscriptionRecord[];
  purchases: PurchaseRecord[];
  /** Refunds made through Tally, oldest first (at most two a purchase, one a subscription). */
  refunds: RefundRecord[];
  /**
   * The subscription periods whose overage was billed (`<subscription id>@<period start
   * ms>`), newest last; bounded: OVERAGE_BILLS_PER_CUSTOMER_MAX. Absent before the first.
   */
  overageBilled?: string[];
  /** Processor event ids applied, oldest first (bounded: PROCESSOR_EVENTS_PER_CUSTOMER_MAX). */
  eventIds: string[];
}

export interface CustomerState {
  readonly environment: Environment;
  readonly id: string;
  readonly createdAtMs: number;
  profile: CustomerProfile;
  contract: Contract | null;
  readonly meters: Map<string, MeterState>;
  /** Null until the first limit setting (see state.ts). */
  limits: Map<string, LimitState> | null;
  /** Null until the first processor change (see state.ts). */
  commerce: CommerceState | null;
  /**
   * Marks of the snapshot copies that may be in progress at once, a lane each (a shard's
   * own snapshot and an operator's online one): the number of the lane's latest copy that
   * has copied this customer, or that it is newer than. The shell's: the core creates them
   * at 0, and neither reads them nor carries them into a snapshot.
   */
  copyMark0: number;
  copyMark1: number;
}

// ---------------------------------------------------------------------------
// Commands, events, outcomes

export interface Addressed {
  readonly environment: Environment;
  readonly customerId: string;
  readonly key: string;
}

export type ContractInput = Omit<Contract, 'updatedAtMs'>;

export interface ContextRequest {
  readonly features: readonly string[];
  readonly usage: readonly string[];
  readonly limits: readonly string[];
  /** Whether to answer the customer's live subscription too. */
  readonly subscription?: true;
}

export interface ContextView {
  readonly customer: CustomerView;
  readonly features: Readonly<Record<string, boolean>>;
  readonly usage: Readonly<Record<string, BalanceView>>;
  readonly limits: Readonly<Record<string, LimitView>>;
  /** Only when asked for: the live subscription, or null. */
  readonly subscription?: SubscriptionView | null;
}

export interface ProfilePatch {
  readonly name?: string | null;
  readonly email?: string | null;
  readonly metadata?: Readonly<Record<string, MetadataValue>>;
}

export type ReadCommand =
  | (Addressed & { readonly op: 'has' })
  | (Addressed & { readonly op: 'limit' })
  | (Addressed & { readonly op: 'balance' })
  /** Customer-level: `key` is unused (''). */
  | (Addressed & { readonly op: 'getContract' })
  /** Customer-level: the processor customer, subscriptions and purchases. */
  | (Addressed & { readonly op: 'getCommerce' })
  /**
   * Customer-level: whether a refund may go ahead, and (for a purchase) how much it
   * returns, before the processor is asked to refund.
   */
  | (Addressed & { readonly op: 'quoteRefund'; readonly request: RefundRequest })
  /** Customer-level: the overage of a subscription period, and whether it was billed. */
  | (Addressed & { readonly op: 'overageDue'; readonly period: OveragePeriod });

/** A subscription's billing period (the one an invoice bills the overage of). */
export interface OveragePeriod {
  readonly subscriptionId: string;
  readonly periodStartMs: number;
}

/** One meter's overage billed on a processor invoice. */
export interface OverageLine {
  readonly meterKey: string;
  readonly micros: Micros;
  /** Minor units per unit of usage, from the plan's `overage.unitAmount`. */
  readonly unitAmount: number;
  /** Minor units billed: micros × unitAmount ÷ 10^6, rounded to the nearest. */
  readonly amount: number;
  readonly processorItemId: string;
}

/** A period's overage billed at the processor, to record. */
export interface OverageBill extends OveragePeriod {
  readonly periodEndMs: number;
  readonly invoiceId: string;
  readonly currency: string;
  readonly lines: readonly OverageLine[];
}

/** A refund as asked for: of what, how, and under which key. */
export interface RefundRequest {
  readonly target: RefundTarget;
  readonly targetId: string;
  readonly mode: RefundMode;
  readonly idempotencyKey: string | null;
}

/** A refund the processor made, to record: the request plus what was returned. */
export interface RefundInput extends RefundRequest {
  readonly amount: number;
  readonly currency: string;
  readonly processorRefundId: string | null;
}

export type WriteCommand =
  | (Addressed & {
      readonly op: 'consume';
      readonly amountMicros: Micros;
      readonly idempotencyKey?: string;
    })
  | (Addressed & {
      readonly op: 'refund';
      readonly amountMicros: Micros;
      readonly idempotencyKey?: string;
    })
  | (Addressed & {
      readonly op: 'limitSettings';
      readonly purchased?: number;
      readonly autoExpansionEnabled?: boolean;
    })
  | (Addressed & { readonly op: 'usageSettings'; readonly overageEnabled: boolean })
  | (Addressed & { readonly op: 'grantLot'; readonly lotId: string; readonly amountMicros: Micros })
  | (Addressed & { readonly op: 'putContract'; readonly contract: ContractInput })
  /** Customer-level (`key` ''): fields given replace; metadata merges, null removes a key. */
  | (Addressed & { readonly op: 'upsertCustomer'; readonly patch: ProfilePatch })
  /** Row 8: upsert the customer, then answer the named features, meters and limits. */
  | (Addressed & {
      readonly op: 'context';
      readonly patch: ProfilePatch;
      readonly request: ContextRequest;
    })
  | (Addressed & { readonly op: 'deleteContract' })
  /**
   * Customer-level: the processor's customer id, set once (a later one is ignored), unless
   * `replaces` names the stored one (it no longer exists at the processor).
   */
  | (Addressed & {
      readonly op: 'setProcessorCustomer';
      readonly processorCustomerId: string;
      readonly replaces?: string;
    })
  /** Customer-level: the subscription as the processor has it now; `eventId` applies once. */
  | (Addressed & {
      readonly op: 'syncSubscription';
      readonly eventId: string | null;
      readonly subscription: SubscriptionInput;
    })
  /** Customer-level: a paid one-time purchase; grants its product's credits once. */
  | (Addressed & {
      readonly op: 'recordPurchase';
      readonly eventId: string | null;
      readonly purchase: PurchaseInput;
    })
  /**
   * Customer-level: a refund the processor made, recorded with its effect in one step (a
   * subscription is canceled; a purchase's remaining credits are revoked). A refund
   * already recorded under its key is a replay.
   */
  | (Addressed & { readonly op: 'recordRefund'; readonly refund: RefundInput })
  /** Customer-level: a period's overage was billed at the processor; recorded once. */
  | (Addressed & { readonly op: 'recordOverageBill'; readonly bill: OverageBill });

export type SubscriptionInput = Omit<SubscriptionRecord, 'id'>;
export type PurchaseInput = Pick<PurchaseRecord, 'id' | 'productKey' | 'amount' | 'currency'>;

export type Command = ReadCommand | WriteCommand;

interface EventBase extends Addressed {
  readonly atMs: number;
}

/**
 * The idempotency key a consume or refund event used, as its journal record keeps it: the
 * shell hands `decide` the key of a keyed write (the scope's digest and the fingerprint)
 * and the event that applies the write holds it, so that the key is on disk exactly when
 * its write is; the shell holds the keys of recent records in memory again at start. The
 * core reads nothing of it. Events of older data dirs carry the fingerprint alone (their
 * keys were logged in tables of their own), or, from when keys lived in the customer's
 * state, the scope's text too, which the migration of such a data dir reads.
 */
export interface IdempotencyRecord {
  readonly fingerprint: string;
  readonly digest?: string;
  readonly scope?: string;
}

export type Event =
  | (EventBase & {
      readonly type: 'consumed';
      readonly periodStartMs: number;
      readonly includedMicros: Micros;
      readonly lotDraws: readonly LotDraw[];
      readonly overageMicros: Micros;
      /** A keyed write's key (IdempotencyRecord); undefined without one. */
      readonly idempotency?: IdempotencyRecord | null | undefined;
    })
  | (EventBase & {
      readonly type: 'refunded';
      readonly periodStartMs: number;
      readonly overageMicros: Micros;
      readonly lotRestores: readonly LotDraw[];
      readonly includedMicros: Micros;
      /** A keyed write's key (IdempotencyRecord); undefined without one. */
      readonly idempotency?: IdempotencyRecord | null | undefined;
    })
  | (EventBase & {
      readonly type: 'limitSettingsSet';
      readonly purchased: number;
      readonly autoExpansionEnabled: boolean;
    })
  | (EventBase & { readonly type: 'usageSettingsSet'; readonly overageEnabled: boolean })
  | (EventBase & { readonly type: 'lotGranted'; readonly lotId: string; readonly micros: Micros })
  | (EventBase & { readonly type: 'contractSet'; readonly contract: ContractInput })
  | (EventBase & { readonly type: 'contractDeleted' })
  | (EventBase & { readonly type: 'customerUpserted'; readonly patch: ProfilePatch })
  | (EventBase & { readonly type: 'processorCustomerSet'; readonly processorCustomerId: string })
  | (EventBase & {
      readonly type: 'subscriptionSynced';
      readonly eventId: string | null;
      readonly subscription: SubscriptionRecord;
    })
  /** The purchase's lots follow as lotGranted events of the same decision. */
  | (EventBase & {
      readonly type: 'purchaseRecorded';
      readonly eventId: string | null;
      readonly purchase: PurchaseRecord;
    })
  /** A processor event that changed nothing (the record already matched): remembered only. */
  | (EventBase & { readonly type: 'processorEventNoted'; readonly eventId: string })
  /**
   * A purchase refunded: the refund, the purchase's refunded total and status after it,
   * and the credits revoked from its lots (meter key → micro-units taken away).
   */
  | (EventBase & {
      readonly type: 'purchaseRefunded';
      readonly purchaseId: string;
      readonly productKey: string;
      readonly refund: RefundRecord;
      readonly refundedAmount: number;
      readonly status: PurchaseStatus;
      readonly revoked: readonly (readonly [meterKey: string, micros: Micros])[];
    })
  /** A subscription period's overage billed on the processor's invoice for it. */
  | (EventBase & { readonly type: 'overageBilled'; readonly bill: OverageBill })
  /** A subscription refunded and canceled at once. */
  | (EventBase & {
      readonly type: 'subscriptionRefunded';
      readonly subscriptionId: string;
      readonly productKey: string;
      readonly refund: RefundRecord;
    });

export interface BalanceView {
  // Exact at any size once rendered through exactJson (actors/fixed.ts).
  readonly balance: AmountJson;
  readonly included: AmountJson;
  readonly consumed: AmountJson;
  readonly overage: AmountJson;
  readonly overageAllowed: boolean;
  readonly overageEnabled: boolean;
  readonly resets: string | null;
}

export interface LimitView {
  readonly limit: number;
  readonly included: number;
  readonly purchased: number;
  readonly expansionAllowed: boolean;
  readonly autoExpansionEnabled: boolean;
}

/** Business outcomes that are not successes, in the order they are checked. */
export type Rejection =
  | { readonly kind: 'not_configured'; readonly environment: Environment }
  | { readonly kind: 'entitlement_not_found'; readonly key: string }
  | {
      readonly kind: 'wrong_entitlement_type';
      readonly key: string;
      readonly actual: EntitlementType;
      readonly expected: EntitlementType;
    }
  | { readonly kind: 'idempotency_key_reused' }
  | {
      readonly kind: 'expansion_not_allowed';
      readonly key: string;
      readonly field: 'purchased' | 'autoExpansionEnabled';
    }
  | { readonly kind: 'overage_not_allowed'; readonly key: string }
  | { readonly kind: 'too_many_lots'; readonly key: string }
  | { readonly kind: 'insufficient_balance'; readonly key: string; readonly view: BalanceView }
  | { readonly kind: 'refund_exceeds_usage'; readonly key: string; readonly view: BalanceView }
  | { readonly kind: 'contract_not_found'; readonly customerId: string }
  | { readonly kind: 'contract_invalid'; readonly detail: string }
  | { readonly kind: 'metadata_too_large'; readonly keys: number }
  /** The shard refused a write that would grow the environment past an operator's quota. */
  | {
      readonly kind: 'quota_exceeded';
      readonly quota: 'customers' | 'idempotencyKeys' | 'auditEntriesPerDay';
      readonly environment: Environment;
      readonly limit: number;
    }
  | { readonly kind: 'too_many_records' }
  | { readonly kind: 'refund_target_not_found'; readonly target: RefundTarget; readonly id: string }
  /** A prorated refund of a purchase that did not grant a single credit lot (why, in words). */
  | { readonly kind: 'refund_mode_not_allowed'; readonly id: string; readonly detail: string }
  /** Nothing left to refund: a refunded purchase or subscription, or a canceled one. */
  | { readonly kind: 'already_refunded'; readonly id: string; readonly detail: string };

export interface CommerceView {
  readonly customerId: string;
  readonly processorCustomerId: string | null;
  readonly subscriptions: readonly SubscriptionView[];
  readonly purchases: readonly PurchaseView[];
}

export interface SubscriptionView {
  readonly id: string;
  readonly customerId: string;
  readonly productKey: string;
  readonly status: string;
  readonly currentPeriodStart: string;
  readonly currentPeriodEnd: string;
  readonly cancelAtPeriodEnd: boolean;
  readonly processor: string;
  readonly processorSubscriptionId: string;
}

export interface PurchaseView {
  readonly id: string;
  readonly customerId: string;
  readonly productKey: string;
  readonly status: string;
  readonly amount: number;
  readonly currency: string;
  readonly refundedAmount: number;
  readonly grant: Readonly<Record<string, number>>;
  readonly createdAt: string;
}

/** The answer of a refund (PRODUCT: `{id, status, refund: {amount, currency, mode}}`). */
export interface RefundView {
  readonly id: string;
  readonly status: string;
  readonly refund: {
    readonly amount: number;
    readonly currency: string;
    readonly mode: RefundMode;
  };
}

/**
 * What a refund would do: the answer already recorded under the request's key (a replay),
 * or, for a purchase, the amount to return (a subscription's comes from its invoice).
 */
export interface RefundQuoteView {
  readonly recorded: RefundView | null;
  readonly amount: number | null;
  readonly currency: string | null;
}

/** A subscription period's overage per meter (exact micro-units as strings). */
export interface OverageView {
  readonly billed: boolean;
  readonly meters: ReadonlyArray<{ readonly meterKey: string; readonly micros: string }>;
}

export interface ContractView {
  readonly customerId: string;
  readonly priceAmount: number;
  readonly priceInterval: 'month' | 'year';
  readonly entitlements: Readonly<Record<string, { readonly included: number }>>;
  readonly updatedAt: string;
}

export type Outcome =
  /** `untilMs`: the answer holds until then unless a write or a configuration changes it. */
  | { readonly kind: 'has'; readonly value: boolean; readonly untilMs: number }
  | { readonly kind: 'limit'; readonly view: LimitView }
  | { readonly kind: 'balance'; readonly view: BalanceView }
  | { readonly kind: 'contract'; readonly view: ContractView }
  | { readonly kind: 'deleted' }
  /** `changed`: the call created or changed the customer (else it repeated what is stored). */
  | {
      readonly kind: 'customer';
      readonly view: CustomerView;
      readonly created: boolean;
      readonly changed: boolean;
    }
  /** `wrote`: the call created or changed the customer (the front end audits it). */
  | { readonly kind: 'context'; readonly view: ContextView; readonly wrote: boolean }
  | { readonly kind: 'commerce'; readonly view: CommerceView }
  | { readonly kind: 'refund'; readonly view: RefundView }
  | { readonly kind: 'refundQuote'; readonly view: RefundQuoteView }
  | { readonly kind: 'overage'; readonly view: OverageView }
  | { readonly kind: 'rejected'; readonly rejection: Rejection };

/**
 * What `decide` concludes: either a rejection, or the events to apply (none for an
 * idempotent replay). The success answer is a view of the state after the events,
 * computed by `execute` once they are applied, so decide never copies state.
 */
export type Decision =
  | { readonly rejection: Rejection; readonly events: readonly [] }
  | { readonly rejection: null; readonly events: readonly Event[] };
