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
  readonly status: 'paid';
  /** Integer minor units of `currency`. */
  readonly amount: number;
  readonly currency: string;
  readonly refundedAmount: number;
  /** Meter key → credits granted. */
  readonly grant: Readonly<Record<string, number>>;
  readonly atMs: number;
}

/** What the payment processor knows of the customer, and the processor events already applied. */
export interface CommerceState {
  processorCustomerId: string | null;
  subscriptions: SubscriptionRecord[];
  purchases: PurchaseRecord[];
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
  | (Addressed & { readonly op: 'getCommerce' });

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
    });

export type SubscriptionInput = Omit<SubscriptionRecord, 'id'>;
export type PurchaseInput = Pick<PurchaseRecord, 'id' | 'productKey' | 'amount' | 'currency'>;

export type Command = ReadCommand | WriteCommand;

interface EventBase extends Addressed {
  readonly atMs: number;
}

export interface IdempotencyRecord {
  readonly scope: string;
  readonly fingerprint: string;
}

export type Event =
  | (EventBase & {
      readonly type: 'consumed';
      readonly periodStartMs: number;
      readonly includedMicros: Micros;
      readonly lotDraws: readonly LotDraw[];
      readonly overageMicros: Micros;
      readonly idempotency: IdempotencyRecord | null;
    })
  | (EventBase & {
      readonly type: 'refunded';
      readonly periodStartMs: number;
      readonly overageMicros: Micros;
      readonly lotRestores: readonly LotDraw[];
      readonly includedMicros: Micros;
      readonly idempotency: IdempotencyRecord | null;
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
  | (EventBase & { readonly type: 'processorEventNoted'; readonly eventId: string });

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
  | { readonly kind: 'too_many_records' };

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

export interface ContractView {
  readonly customerId: string;
  readonly priceAmount: number;
  readonly priceInterval: 'month' | 'year';
  readonly entitlements: Readonly<Record<string, { readonly included: number }>>;
  readonly updatedAt: string;
}

export type Outcome =
  | { readonly kind: 'has'; readonly value: boolean }
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
  | { readonly kind: 'rejected'; readonly rejection: Rejection };

/**
 * What `decide` concludes: either a rejection, or the events to apply (none for an
 * idempotent replay). The success answer is a view of the state after the events,
 * computed by `execute` once they are applied, so decide never copies state.
 */
export type Decision =
  | { readonly rejection: Rejection; readonly events: readonly [] }
  | { readonly rejection: null; readonly events: readonly Event[] };
