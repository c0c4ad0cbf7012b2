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

export interface IdempotencyEntry {
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

export interface CustomerState {
  readonly environment: Environment;
  readonly id: string;
  readonly createdAtMs: number;
  profile: CustomerProfile;
  contract: Contract | null;
  readonly meters: Map<string, MeterState>;
  /** Null until the first limit setting (see state.ts). */
  limits: Map<string, LimitState> | null;
  /**
   * Keyed by `op \0 entitlementKey \0 idempotencyKey`, insertion (= time) ordered. Null
   * until the first idempotency key (see state.ts).
   */
  idempotency: Map<string, IdempotencyEntry> | null;
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
}

export interface ContextView {
  readonly customer: CustomerView;
  readonly features: Readonly<Record<string, boolean>>;
  readonly usage: Readonly<Record<string, BalanceView>>;
  readonly limits: Readonly<Record<string, LimitView>>;
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
  | (Addressed & { readonly op: 'getContract' });

export type WriteCommand =
  | (Addressed & { readonly op: 'consume'; readonly amountMicros: Micros; readonly idempotencyKey?: string })
  | (Addressed & { readonly op: 'refund'; readonly amountMicros: Micros; readonly idempotencyKey?: string })
  | (Addressed & { readonly op: 'limitSettings'; readonly purchased?: number; readonly autoExpansionEnabled?: boolean })
  | (Addressed & { readonly op: 'usageSettings'; readonly overageEnabled: boolean })
  | (Addressed & { readonly op: 'grantLot'; readonly lotId: string; readonly amountMicros: Micros })
  | (Addressed & { readonly op: 'putContract'; readonly contract: ContractInput })
  /** Customer-level (`key` ''): fields given replace; metadata merges, null removes a key. */
  | (Addressed & { readonly op: 'upsertCustomer'; readonly patch: ProfilePatch })
  /** Row 8: upsert the customer, then answer the named features, meters and limits. */
  | (Addressed & { readonly op: 'context'; readonly patch: ProfilePatch; readonly request: ContextRequest })
  | (Addressed & { readonly op: 'deleteContract' });

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
  | (EventBase & { readonly type: 'limitSettingsSet'; readonly purchased: number; readonly autoExpansionEnabled: boolean })
  | (EventBase & { readonly type: 'usageSettingsSet'; readonly overageEnabled: boolean })
  | (EventBase & { readonly type: 'lotGranted'; readonly lotId: string; readonly micros: Micros })
  | (EventBase & { readonly type: 'contractSet'; readonly contract: ContractInput })
  | (EventBase & { readonly type: 'contractDeleted' })
  | (EventBase & { readonly type: 'customerUpserted'; readonly patch: ProfilePatch });

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
  | { readonly kind: 'wrong_entitlement_type'; readonly key: string; readonly actual: EntitlementType; readonly expected: EntitlementType }
  | { readonly kind: 'idempotency_key_reused' }
  | { readonly kind: 'expansion_not_allowed'; readonly key: string; readonly field: 'purchased' | 'autoExpansionEnabled' }
  | { readonly kind: 'overage_not_allowed'; readonly key: string }
  | { readonly kind: 'too_many_lots'; readonly key: string }
  | { readonly kind: 'insufficient_balance'; readonly key: string; readonly view: BalanceView }
  | { readonly kind: 'refund_exceeds_usage'; readonly key: string; readonly view: BalanceView }
  | { readonly kind: 'contract_not_found'; readonly customerId: string }
  | { readonly kind: 'contract_invalid'; readonly detail: string }
  | { readonly kind: 'metadata_too_large'; readonly keys: number }
  /** The shard refused a write that would grow the environment past an operator's quota. */
  | { readonly kind: 'quota_exceeded'; readonly quota: 'customers' | 'idempotencyKeys' | 'auditEntriesPerDay'; readonly environment: Environment; readonly limit: number };

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
  | { readonly kind: 'customer'; readonly view: CustomerView; readonly created: boolean; readonly changed: boolean }
  /** `wrote`: the call created or changed the customer (the front end audits it). */
  | { readonly kind: 'context'; readonly view: ContextView; readonly wrote: boolean }
  | { readonly kind: 'rejected'; readonly rejection: Rejection };

/**
 * What `decide` concludes: either a rejection, or the events to apply (none for an
 * idempotent replay). The success answer is a view of the state after the events,
 * computed by `execute` once they are applied, so decide never copies state.
 */
export type Decision =
  | { readonly rejection: Rejection; readonly events: readonly [] }
  | { readonly rejection: null; readonly events: readonly Event[] };
