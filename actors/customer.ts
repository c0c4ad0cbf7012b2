/**
 * The customer actor: per-customer billing state and the pure functions that change it.
 *
 * `decide(customer, config, command, nowMs)` validates a command against the current
 * state and returns an outcome plus the events that record it; `apply(state, event)`
 * folds an event into the state. Replay uses `apply` only, so events carry everything
 * they need (the exact draw, the period they belong to, the time) and never consult
 * the configuration. Nothing here reads a clock, touches IO or imports from node:*;
 * the shard shell injects `nowMs` and makes the events durable before anyone is told.
 *
 * Domain outcomes (unknown key, insufficient balance, refund too large) are returned
 * values listed in precedence order; broken invariants are assertion failures.
 */
import { assert } from './assert.js';
import type { CompiledConfig, CompiledEntitlement, CompiledProduct, EntitlementType } from './billing-config.js';
import { formatMicros, minMicros, quantityToMicros, type AmountJson, type Micros } from './fixed.js';
import {
  METADATA_KEYS_MAX,
  IDEMPOTENCY_ENTRIES_PER_CUSTOMER_MAX,
  IDEMPOTENCY_RETENTION_MS,
  LOTS_PER_METER_MAX,
  PURCHASED_MAX,
} from './limits.js';
import { isoOf, periodAt } from './periods.js';

export type Environment = 'test' | 'live';

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

/** Customer metadata values: strings, numbers, booleans or null. */
export type MetadataValue = string | number | boolean | null;

/** The customer record of rows 9–11, kept with the billing state. */
export interface CustomerProfile {
  name: string | null;
  email: string | null;
  metadata: Record<string, MetadataValue>;
  updatedAtMs: number;
}

export interface CustomerState {
  readonly environment: Environment;
  readonly id: string;
  readonly createdAtMs: number;
  profile: CustomerProfile;
  contract: Contract | null;
  readonly meters: Map<string, MeterState>;
  /** Null until the first limit setting (see "Memory" below). */
  limits: Map<string, LimitState> | null;
  /**
   * Keyed by `op \0 entitlementKey \0 idempotencyKey`, insertion (= time) ordered. Null
   * until the first idempotency key (see "Memory" below).
   */
  idempotency: Map<string, IdempotencyEntry> | null;
}

/*
 * Memory: a shard keeps every customer it owns in memory, millions of them, so the state
 * shares what is empty instead of allocating it per customer. An empty Map costs about
 * 180 bytes and an empty array 32, which for a customer with three meters would be more
 * than the billing state itself (measured by `npm run bench:recovery`). Maps nobody has used
 * are null; empty arrays and metadata are the frozen shared values below, replaced by an
 * own copy on the first write (a write to a shared one would throw, never leak into
 * other customers).
 */
const NO_LOT_DRAWS = Object.freeze([]) as unknown as LotDraw[];
const NO_LOTS = Object.freeze([]) as unknown as Lot[];
const NO_METADATA = Object.freeze({}) as Record<string, MetadataValue>;

/** Bound on `internedKeys`: far more entitlement keys than any configuration has. */
const INTERNED_KEYS_MAX = 4096;
const internedKeys = new Map<string, string>();

/**
 * One copy of an entitlement key string for all meters that use it: events decoded from
 * the journal each carry their own copy, and a meter keeps the one it was created with.
 * A bounded memo with no effect on results (like periods.ts's caches).
 */
function internKey(key: string): string {
  const interned = internedKeys.get(key);
  if (interned !== undefined) return interned;
  if (internedKeys.size >= INTERNED_KEYS_MAX) internedKeys.clear();
  internedKeys.set(key, key);
  return key;
}

/** The string literal rather than the caller's copy (one per decoded event). */
function canonicalEnvironment(environment: Environment): Environment {
  assert(environment === 'test' || environment === 'live', `unknown environment ${String(environment)}`);
  return environment === 'live' ? 'live' : 'test';
}

// ---------------------------------------------------------------------------
// Commands, events, outcomes

interface Addressed {
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
  | { readonly kind: 'metadata_too_large'; readonly keys: number };

export interface CustomerView {
  readonly id: string;
  readonly name: string | null;
  readonly email: string | null;
  readonly metadata: Readonly<Record<string, MetadataValue>>;
  readonly createdAt: string;
  readonly updatedAt: string;
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
  /** `unchanged`: a settings write that repeated what is stored (nothing written or audited). */
  | { readonly kind: 'limit'; readonly view: LimitView; readonly unchanged?: true }
  | { readonly kind: 'balance'; readonly view: BalanceView; readonly unchanged?: true }
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

// ---------------------------------------------------------------------------
// Plan resolution

/**
 * The product whose entitlements apply to the customer. Until commerce lands every
 * customer is on the environment's default product (or on nothing).
 */
function planOf(_customer: CustomerState | undefined, config: CompiledConfig): CompiledProduct | null {
  return config.defaultProduct;
}

/** The contract's override for `key`, if the customer has a contract naming it. */
function contractIncluded(customer: CustomerState | undefined, key: string): number | undefined {
  return customer?.contract?.entitlements[key]?.included;
}

function meterIncludedMicros(customer: CustomerState | undefined, plan: CompiledProduct | null, key: string): Micros {
  const override = contractIncluded(customer, key);
  if (override !== undefined) {
    const micros = quantityToMicros(override);
    assert(micros !== null, 'contract amounts validated when the contract was set');
    return micros;
  }
  return plan?.meters.get(key)?.includedMicros ?? 0n;
}

function overageAllowed(plan: CompiledProduct | null, key: string): boolean {
  return plan?.meters.get(key)?.overageAllowed ?? false;
}

// ---------------------------------------------------------------------------
// Views (reads)

/** What a meter with nothing stored reads as; frozen, since it is shared by every read. */
const NO_METER: MeterState = Object.freeze({
  periodStartMs: 0,
  includedUsedMicros: 0n,
  overageMicros: 0n,
  lotDraws: NO_LOT_DRAWS,
  overageEnabled: false,
  lots: NO_LOTS,
});

/** The meter's usage as of `periodStartMs`: usage of an earlier period counts as nothing. */
function usageIn(meter: MeterState, periodStartMs: number): { included: Micros; overage: Micros; lots: Micros } {
  if (meter.periodStartMs < periodStartMs) return { included: 0n, overage: 0n, lots: 0n };
  let lots = 0n;
  for (const draw of meter.lotDraws) lots += draw[1];
  return { included: meter.includedUsedMicros, overage: meter.overageMicros, lots };
}

function lotsRemaining(meter: MeterState): Micros {
  let total = 0n;
  for (const lot of meter.lots) total += lot.remainingMicros;
  return total;
}

/** Start of the current period; never earlier than usage already recorded (clock skew). */
function currentPeriodStart(ent: CompiledEntitlement, meter: MeterState, nowMs: number): number {
  return Math.max(periodAt(ent.reset, nowMs).startMs, meter.periodStartMs);
}

function balanceMicros(meter: MeterState, includedMicros: Micros, periodStartMs: number): Micros {
  const used = usageIn(meter, periodStartMs).included;
  const includedLeft = includedMicros > used ? includedMicros - used : 0n;
  return includedLeft + lotsRemaining(meter);
}

/** A customer's meter as of `nowMs`: its state, plan, included allowance and current period. */
function meterAt(customer: CustomerState | undefined, config: CompiledConfig, ent: CompiledEntitlement, nowMs: number) {
  const meter = customer?.meters.get(ent.key) ?? NO_METER;
  const plan = planOf(customer, config);
  return { meter, plan, includedMicros: meterIncludedMicros(customer, plan, ent.key), periodStartMs: currentPeriodStart(ent, meter, nowMs) };
}

function balanceView(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
  nowMs: number,
): BalanceView {
  const { meter, plan, includedMicros, periodStartMs } = meterAt(customer, config, ent, nowMs);
  const usage = usageIn(meter, periodStartMs);
  const period = periodAt(ent.reset, Math.max(nowMs, periodStartMs));
  return {
    balance: formatMicros(balanceMicros(meter, includedMicros, periodStartMs)),
    included: formatMicros(includedMicros),
    consumed: formatMicros(usage.included + usage.lots + usage.overage),
    overage: formatMicros(usage.overage),
    overageAllowed: overageAllowed(plan, ent.key),
    overageEnabled: meter.overageEnabled,
    resets: period.endMs === null ? null : isoOf(period.endMs),
  };
}

function limitView(customer: CustomerState | undefined, config: CompiledConfig, key: string): LimitView {
  const grant = planOf(customer, config)?.limits.get(key);
  const settings = customer?.limits?.get(key);
  const included = contractIncluded(customer, key) ?? grant?.included ?? 0;
  const purchased = settings?.purchased ?? 0;
  return {
    limit: included + purchased,
    included,
    purchased,
    expansionAllowed: grant?.expansionAllowed ?? false,
    autoExpansionEnabled: settings?.autoExpansionEnabled ?? false,
  };
}

function hasEntitlement(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
  nowMs: number,
): boolean {
  switch (ent.type) {
    case 'feature': {
      const override = contractIncluded(customer, ent.key);
      if (override !== undefined) return override > 0;
      return planOf(customer, config)?.features.has(ent.key) ?? false;
    }
    case 'limit':
      return limitView(customer, config, ent.key).limit > 0;
    case 'meter': {
      // Judged on micro-units: the view's amounts are for rendering only.
      const { meter, plan, includedMicros, periodStartMs } = meterAt(customer, config, ent, nowMs);
      return balanceMicros(meter, includedMicros, periodStartMs) > 0n || (meter.overageEnabled && overageAllowed(plan, ent.key));
    }
  }
}

// ---------------------------------------------------------------------------
// decide

const EXPECTED_TYPE: Record<Command['op'], EntitlementType | null> = {
  has: null,
  limit: 'limit',
  balance: 'meter',
  consume: 'meter',
  refund: 'meter',
  limitSettings: 'limit',
  usageSettings: 'meter',
  grantLot: 'meter',
  getContract: null,
  putContract: null,
  upsertCustomer: null,
  context: null,
  deleteContract: null,
};

function rejected(rejection: Rejection): Decision {
  return { rejection, events: [] };
}

function accepted(...events: Event[]): Decision {
  return { rejection: null, events };
}

const REPLAY: Decision = { rejection: null, events: [] };

/** An unknown key: of an environment nobody configured yet (version 0), or of its configuration. */
function notFound(config: CompiledConfig, environment: Environment, key: string): Rejection {
  return config.version === 0 ? { kind: 'not_configured', environment } : { kind: 'entitlement_not_found', key };
}

/**
 * Resolves the command's entitlement or says why it cannot: 404 (no configuration was
 * ever pushed to the environment, or the key is not in it), then wrong type 400.
 */
function resolveEntitlement(config: CompiledConfig, command: Command): CompiledEntitlement | Rejection {
  const ent = config.entitlements.get(command.key);
  if (ent === undefined) return notFound(config, command.environment, command.key);
  const expected = EXPECTED_TYPE[command.op];
  if (expected !== null && ent.type !== expected) {
    return { kind: 'wrong_entitlement_type', key: command.key, actual: ent.type, expected };
  }
  return ent;
}

function isRejection(value: CompiledEntitlement | Rejection): value is Rejection {
  return 'kind' in value;
}

/** Answers a read without changing anything. */
export function query(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  command: ReadCommand,
  nowMs: number,
): Outcome {
  if (command.op === 'getContract') {
    const contract = customer?.contract ?? null;
    if (contract === null) return { kind: 'rejected', rejection: { kind: 'contract_not_found', customerId: command.customerId } };
    return { kind: 'contract', view: contractView(command.customerId, contract) };
  }
  const ent = resolveEntitlement(config, command);
  if (isRejection(ent)) return { kind: 'rejected', rejection: ent };
  switch (command.op) {
    case 'has':
      return { kind: 'has', value: hasEntitlement(customer, config, ent, nowMs) };
    case 'limit':
      return { kind: 'limit', view: limitView(customer, config, ent.key) };
    case 'balance':
      return { kind: 'balance', view: balanceView(customer, config, ent, nowMs) };
  }
}

/**
 * Decides a write. Never mutates `customer`; `execute` (or replay) applies the returned
 * events in order before the next command for the same customer is decided.
 */
export function decide(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  command: WriteCommand,
  nowMs: number,
): Decision {
  if (command.op === 'putContract') return decidePutContract(config, command, nowMs);
  if (command.op === 'upsertCustomer') {
    // An update that changes nothing is not a mutation: nothing written, stamped or audited.
    if (customer !== undefined && !patchChanges(customer.profile, command.patch)) return REPLAY;
    return decideUpsertCustomer(customer, command, nowMs);
  }
  if (command.op === 'context') return decideContext(customer, config, command, nowMs);
  if (command.op === 'deleteContract') return decideDeleteContract(customer, command, nowMs);
  const ent = resolveEntitlement(config, command);
  if (isRejection(ent)) return rejected(ent);
  switch (command.op) {
    case 'consume':
      return decideConsume(customer, config, ent, command, nowMs);
    case 'refund':
      return decideRefund(customer, config, ent, command, nowMs);
    case 'limitSettings':
      return decideLimitSettings(customer, config, command, nowMs);
    case 'usageSettings':
      return decideUsageSettings(customer, config, ent, command, nowMs);
    case 'grantLot':
      return decideGrantLot(customer, config, ent, command, nowMs);
  }
}

type Replay = { readonly replay: true } | { readonly replay: false; readonly record: IdempotencyRecord | null } | Rejection;

/** Looks the idempotency key up: a live entry with the same fingerprint is a replay. */
function checkIdempotency(
  customer: CustomerState | undefined,
  op: string,
  key: string,
  idempotencyKey: string | undefined,
  fingerprint: string,
  nowMs: number,
): Replay {
  if (idempotencyKey === undefined) return { replay: false, record: null };
  const scope = `${op}\u0000${key}\u0000${idempotencyKey}`;
  const entry = customer?.idempotency?.get(scope);
  if (entry === undefined || entry.atMs <= nowMs - IDEMPOTENCY_RETENTION_MS) {
    return { replay: false, record: { scope, fingerprint } };
  }
  if (entry.fingerprint !== fingerprint) return { kind: 'idempotency_key_reused' };
  return { replay: true };
}

function decideConsume(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
  command: Extract<WriteCommand, { op: 'consume' }>,
  nowMs: number,
): Decision {
  const amount = command.amountMicros;
  assert(amount > 0n, 'consume amount must be positive');
  const idem = checkIdempotency(customer, 'consume', ent.key, command.idempotencyKey, String(amount), nowMs);
  if ('kind' in idem) return rejected(idem);
  if (idem.replay) return REPLAY;

  const meter = customer?.meters.get(ent.key) ?? NO_METER;
  const plan = planOf(customer, config);
  const periodStartMs = currentPeriodStart(ent, meter, nowMs);
  const usedIncluded = usageIn(meter, periodStartMs).included;
  const includedMicros = meterIncludedMicros(customer, plan, ent.key);
  let need = amount;
  const fromIncluded = minMicros(need, includedMicros > usedIncluded ? includedMicros - usedIncluded : 0n);
  need -= fromIncluded;
  const lotDraws: LotDraw[] = [];
  for (const lot of meter.lots) {
    if (need === 0n) break;
    const take = minMicros(need, lot.remainingMicros);
    if (take > 0n) lotDraws.push([lot.id, take]);
    need -= take;
  }
  if (need > 0n && !(meter.overageEnabled && overageAllowed(plan, ent.key))) {
    return rejected({ kind: 'insufficient_balance', key: ent.key, view: balanceView(customer, config, ent, nowMs) });
  }
  const event: Event = {
    type: 'consumed',
    environment: command.environment,
    customerId: command.customerId,
    key: ent.key,
    atMs: nowMs,
    periodStartMs,
    includedMicros: fromIncluded,
    lotDraws,
    overageMicros: need,
    idempotency: idem.record,
  };
  return accepted(event);
}

function decideRefund(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
  command: Extract<WriteCommand, { op: 'refund' }>,
  nowMs: number,
): Decision {
  const amount = command.amountMicros;
  assert(amount > 0n, 'refund amount must be positive');
  const idem = checkIdempotency(customer, 'refund', ent.key, command.idempotencyKey, String(amount), nowMs);
  if ('kind' in idem) return rejected(idem);
  if (idem.replay) return REPLAY;

  const meter = customer?.meters.get(ent.key) ?? NO_METER;
  const periodStartMs = currentPeriodStart(ent, meter, nowMs);
  const usage = usageIn(meter, periodStartMs);
  if (amount > usage.overage + usage.lots + usage.included) {
    return rejected({ kind: 'refund_exceeds_usage', key: ent.key, view: balanceView(customer, config, ent, nowMs) });
  }
  let left = amount;
  const fromOverage = minMicros(left, usage.overage);
  left -= fromOverage;
  const lotRestores: LotDraw[] = [];
  for (let i = meter.lotDraws.length - 1; i >= 0 && left > 0n; i--) {
    const draw = meter.lotDraws[i];
    assert(draw !== undefined, 'lot draw index in range');
    const take = minMicros(left, draw[1]);
    lotRestores.push([draw[0], take]);
    left -= take;
  }
  const event: Event = {
    type: 'refunded',
    environment: command.environment,
    customerId: command.customerId,
    key: ent.key,
    atMs: nowMs,
    periodStartMs,
    overageMicros: fromOverage,
    lotRestores,
    includedMicros: left,
    idempotency: idem.record,
  };
  return accepted(event);
}

function decideLimitSettings(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  command: Extract<WriteCommand, { op: 'limitSettings' }>,
  nowMs: number,
): Decision {
  const current = limitView(customer, config, command.key);
  const purchased = command.purchased ?? current.purchased;
  const autoExpansionEnabled = command.autoExpansionEnabled ?? current.autoExpansionEnabled;
  assert(Number.isInteger(purchased) && purchased >= 0 && purchased <= PURCHASED_MAX, 'purchased validated at the edge');
  if (!current.expansionAllowed) {
    if (command.purchased !== undefined && command.purchased > 0) {
      return rejected({ kind: 'expansion_not_allowed', key: command.key, field: 'purchased' });
    }
    if (command.autoExpansionEnabled === true) {
      return rejected({ kind: 'expansion_not_allowed', key: command.key, field: 'autoExpansionEnabled' });
    }
  }
  // Settings that repeat what is stored are not a mutation: nothing written, stamped or audited.
  if (purchased === current.purchased && autoExpansionEnabled === current.autoExpansionEnabled) return REPLAY;
  const event: Event = {
    type: 'limitSettingsSet',
    environment: command.environment,
    customerId: command.customerId,
    key: command.key,
    atMs: nowMs,
    purchased,
    autoExpansionEnabled,
  };
  return accepted(event);
}

function decideUsageSettings(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
  command: Extract<WriteCommand, { op: 'usageSettings' }>,
  nowMs: number,
): Decision {
  if (command.overageEnabled && !overageAllowed(planOf(customer, config), ent.key)) {
    return rejected({ kind: 'overage_not_allowed', key: ent.key });
  }
  // A repeat of the stored setting is not a mutation (as for limit settings above).
  if (command.overageEnabled === (customer?.meters.get(ent.key)?.overageEnabled ?? false)) return REPLAY;
  const event: Event = {
    type: 'usageSettingsSet',
    environment: command.environment,
    customerId: command.customerId,
    key: ent.key,
    atMs: nowMs,
    overageEnabled: command.overageEnabled,
  };
  return accepted(event);
}

function decideGrantLot(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
  command: Extract<WriteCommand, { op: 'grantLot' }>,
  nowMs: number,
): Decision {
  assert(command.amountMicros > 0n, 'lot amount must be positive');
  const meter = customer?.meters.get(ent.key);
  // A lot id names its grant (a purchase): granting it again is a replay, not a second lot.
  if (meter?.lots.some((lot) => lot.id === command.lotId) === true) return REPLAY;
  if (meter !== undefined && meter.lots.length >= LOTS_PER_METER_MAX) return rejected({ kind: 'too_many_lots', key: ent.key });
  const event: Event = {
    type: 'lotGranted',
    environment: command.environment,
    customerId: command.customerId,
    key: ent.key,
    atMs: nowMs,
    lotId: command.lotId,
    micros: command.amountMicros,
  };
  return accepted(event);
}

function cloneMeter(meter: MeterState): MeterState {
  return {
    ...meter,
    lotDraws: meter.lotDraws.length === 0 ? NO_LOT_DRAWS : meter.lotDraws.map((d): LotDraw => [d[0], d[1]]),
    lots: meter.lots.length === 0 ? NO_LOTS : meter.lots.map((lot) => ({ ...lot })),
  };
}

/**
 * A contract may only name entitlements of the current configuration, with amounts the
 * type can hold: whole numbers for limits, at most 6 decimals for meters, and for a
 * feature any number (> 0 grants, 0 denies). Returns the first violation, or null.
 */
function contractViolation(config: CompiledConfig, contract: ContractInput): string | null {
  for (const [key, value] of Object.entries(contract.entitlements)) {
    const ent = config.entitlements.get(key);
    if (ent === undefined) return `entitlements.${key} is not an entitlement of the billing configuration`;
    if (ent.type === 'limit' && !Number.isInteger(value.included)) return `entitlements.${key}.included must be a whole number for a limit`;
    if (ent.type === 'meter' && quantityToMicros(value.included) === null) {
      return `entitlements.${key}.included must have at most 6 decimal places`;
    }
  }
  return null;
}

function decidePutContract(config: CompiledConfig, command: Extract<WriteCommand, { op: 'putContract' }>, nowMs: number): Decision {
  const violation = contractViolation(config, command.contract);
  if (violation !== null) return rejected({ kind: 'contract_invalid', detail: violation });
  return accepted({
    type: 'contractSet',
    environment: command.environment,
    customerId: command.customerId,
    key: '',
    atMs: nowMs,
    contract: command.contract,
  });
}

function decideDeleteContract(
  customer: CustomerState | undefined,
  command: Extract<WriteCommand, { op: 'deleteContract' }>,
  nowMs: number,
): Decision {
  if (customer?.contract === null || customer === undefined) {
    return rejected({ kind: 'contract_not_found', customerId: command.customerId });
  }
  return accepted({ type: 'contractDeleted', environment: command.environment, customerId: command.customerId, key: '', atMs: nowMs });
}

function decideUpsertCustomer(
  customer: CustomerState | undefined,
  command: Extract<WriteCommand, { op: 'upsertCustomer' }>,
  nowMs: number,
): Decision {
  const merged = { ...(customer?.profile.metadata ?? {}), ...command.patch.metadata };
  const keys = Object.values(merged).filter((value) => value !== null).length;
  if (keys > METADATA_KEYS_MAX) return rejected({ kind: 'metadata_too_large', keys });
  return accepted({
    type: 'customerUpserted',
    environment: command.environment,
    customerId: command.customerId,
    key: '',
    atMs: nowMs,
    patch: command.patch,
  });
}

/** Every key must exist (404) and, for usage and limits, be of that type (400); first failure wins. */
function contextRejection(config: CompiledConfig, environment: Environment, request: ContextRequest): Rejection | null {
  const lists: ReadonlyArray<readonly [readonly string[], EntitlementType | null]> = [
    [request.features, null],
    [request.usage, 'meter'],
    [request.limits, 'limit'],
  ];
  for (const [keys, expected] of lists) {
    for (const key of keys) {
      const ent = config.entitlements.get(key);
      if (ent === undefined) return notFound(config, environment, key);
      if (expected !== null && ent.type !== expected) return { kind: 'wrong_entitlement_type', key, actual: ent.type, expected };
    }
  }
  return null;
}

function decideContext(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  command: Extract<WriteCommand, { op: 'context' }>,
  nowMs: number,
): Decision {
  const rejection = contextRejection(config, command.environment, command.request);
  if (rejection !== null) return rejected(rejection);
  // The application's hot path repeats the same profile on every call: only a change is written (and audited).
  if (customer !== undefined && !patchChanges(customer.profile, command.patch)) return REPLAY;
  return decideUpsertCustomer(customer, { ...command, op: 'upsertCustomer' }, nowMs);
}

/** Whether applying `patch` would change anything in `profile` (besides its update time). */
function patchChanges(profile: CustomerProfile, patch: ProfilePatch): boolean {
  if (patch.name !== undefined && patch.name !== profile.name) return true;
  if (patch.email !== undefined && patch.email !== profile.email) return true;
  for (const [key, value] of Object.entries(patch.metadata ?? {})) {
    if (value === null ? Object.hasOwn(profile.metadata, key) : profile.metadata[key] !== value) return true;
  }
  return false;
}

function contextView(customer: CustomerState, config: CompiledConfig, request: ContextRequest, nowMs: number): ContextView {
  const entitlement = (key: string): CompiledEntitlement => {
    const ent = config.entitlements.get(key);
    assert(ent !== undefined, 'context keys resolved by decide');
    return ent;
  };
  return {
    customer: customerView(customer),
    features: Object.fromEntries(request.features.map((key) => [key, hasEntitlement(customer, config, entitlement(key), nowMs)])),
    usage: Object.fromEntries(request.usage.map((key) => [key, balanceView(customer, config, entitlement(key), nowMs)])),
    limits: Object.fromEntries(request.limits.map((key) => [key, limitView(customer, config, key)])),
  };
}

/** The API's customer object; a snapshot item has the same fields, so restore needs no state. */
export function customerView(customer: Pick<CustomerState, 'id' | 'createdAtMs' | 'profile'>): CustomerView {
  return {
    id: customer.id,
    name: customer.profile.name,
    email: customer.profile.email,
    metadata: customer.profile.metadata,
    createdAt: isoOf(customer.createdAtMs),
    updatedAt: isoOf(customer.profile.updatedAtMs),
  };
}

function contractView(customerId: string, contract: Contract): ContractView {
  return {
    customerId,
    priceAmount: contract.priceAmount,
    priceInterval: contract.priceInterval,
    entitlements: contract.entitlements,
    updatedAt: isoOf(contract.updatedAtMs),
  };
}

// ---------------------------------------------------------------------------
// execute: decide, apply, answer

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

/** Decides a write, applies its events to `customer` in place, and answers with the new view. */
export function execute(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  command: WriteCommand,
  nowMs: number,
): Execution {
  const decision = decide(customer, config, command, nowMs);
  if (decision.rejection !== null) {
    return { customer, outcome: { kind: 'rejected', rejection: decision.rejection }, events: [] };
  }
  let state = customer;
  for (const event of decision.events) state = apply(state, event);
  if (command.op === 'putContract') {
    assert(state?.contract != null, 'contractSet applied');
    return { customer: state, outcome: { kind: 'contract', view: contractView(command.customerId, state.contract) }, events: decision.events };
  }
  if (command.op === 'deleteContract') return { customer: state, outcome: { kind: 'deleted' }, events: decision.events };
  if (command.op === 'context') {
    assert(state !== undefined, 'context created the customer');
    const outcome: Outcome = { kind: 'context', view: contextView(state, config, command.request, nowMs), wrote: decision.events.length > 0 };
    return decision.events.length === 0 ? { customer: state, outcome, events: [], isRead: true } : { customer: state, outcome, events: decision.events };
  }
  if (command.op === 'upsertCustomer') {
    assert(state !== undefined, 'customerUpserted applied');
    const outcome: Outcome = { kind: 'customer', view: customerView(state), created: customer === undefined, changed: decision.events.length > 0 };
    return { customer: state, outcome, events: decision.events };
  }
  // A settings call that repeats what is stored decided no event: it answers the current
  // state, flagged so that nothing is audited (refund replays, also eventless, are audited).
  const unchanged = (command.op === 'limitSettings' || command.op === 'usageSettings') && decision.events.length === 0 ? { unchanged: true as const } : {};
  if (command.op === 'limitSettings') {
    return { customer: state, outcome: { kind: 'limit', view: limitView(state, config, command.key), ...unchanged }, events: decision.events };
  }
  const ent = config.entitlements.get(command.key);
  assert(ent !== undefined, 'decide resolved the entitlement');
  return { customer: state, outcome: { kind: 'balance', view: balanceView(state, config, ent, nowMs), ...unchanged }, events: decision.events };
}

// ---------------------------------------------------------------------------
// apply

export function newCustomer(environment: Environment, id: string, createdAtMs: number): CustomerState {
  const profile: CustomerProfile = { name: null, email: null, metadata: NO_METADATA, updatedAtMs: createdAtMs };
  return { environment: canonicalEnvironment(environment), id, createdAtMs, profile, contract: null, meters: new Map(), limits: null, idempotency: null };
}

/**
 * Folds one event into the customer's state, creating the customer if needed. Mutates
 * and returns `customer` (or the new customer). Assumes the event was produced by
 * `decide` against this very state; anything else is an assertion failure.
 */
export function apply(customer: CustomerState | undefined, event: Event): CustomerState {
  const state = customer ?? newCustomer(event.environment, event.customerId, event.atMs);
  assert(state.id === event.customerId && state.environment === event.environment, 'event addressed to this customer');
  switch (event.type) {
    case 'consumed':
      applyConsumed(meterFor(state, event.key), event);
      break;
    case 'refunded':
      applyRefunded(meterFor(state, event.key), event);
      break;
    case 'limitSettingsSet':
      (state.limits ??= new Map()).set(event.key, { purchased: event.purchased, autoExpansionEnabled: event.autoExpansionEnabled });
      break;
    case 'usageSettingsSet':
      meterFor(state, event.key).overageEnabled = event.overageEnabled;
      break;
    case 'contractSet':
      state.contract = { ...event.contract, updatedAtMs: event.atMs };
      break;
    case 'contractDeleted':
      state.contract = null;
      break;
    case 'customerUpserted':
      applyProfile(state.profile, event.patch, event.atMs);
      break;
    case 'lotGranted':
      ownLots(meterFor(state, event.key)).push({
        id: event.lotId,
        grantedMicros: event.micros,
        remainingMicros: event.micros,
        grantedAtMs: event.atMs,
      });
      break;
  }
  if ((event.type === 'consumed' || event.type === 'refunded') && event.idempotency !== null) {
    remember(state, event.idempotency, event.atMs);
  }
  return state;
}

function applyProfile(profile: CustomerProfile, patch: ProfilePatch, atMs: number): void {
  if (patch.name !== undefined) profile.name = patch.name;
  if (patch.email !== undefined) profile.email = patch.email;
  if (patch.metadata !== undefined) {
    const metadata = { ...profile.metadata };
    for (const [key, value] of Object.entries(patch.metadata)) {
      if (value === null) delete metadata[key];
      else metadata[key] = value;
    }
    profile.metadata = metadata;
  }
  profile.updatedAtMs = atMs;
}

function meterFor(state: CustomerState, key: string): MeterState {
  let meter = state.meters.get(key);
  if (meter === undefined) {
    meter = { periodStartMs: 0, includedUsedMicros: 0n, overageMicros: 0n, lotDraws: NO_LOT_DRAWS, overageEnabled: false, lots: NO_LOTS };
    state.meters.set(internKey(key), meter);
  }
  return meter;
}

/** The meter's own lots array, replacing the shared empty one before the first write. */
function ownLots(meter: MeterState): Lot[] {
  if (meter.lots === NO_LOTS) meter.lots = [];
  return meter.lots;
}

function ownLotDraws(meter: MeterState): LotDraw[] {
  if (meter.lotDraws === NO_LOT_DRAWS) meter.lotDraws = [];
  return meter.lotDraws;
}

/** Moves the meter into `periodStartMs`, dropping the usage of an earlier period. */
function enterPeriod(meter: MeterState, periodStartMs: number): void {
  assert(periodStartMs >= meter.periodStartMs, 'periods only move forward');
  if (periodStartMs === meter.periodStartMs) return;
  meter.periodStartMs = periodStartMs;
  meter.includedUsedMicros = 0n;
  meter.overageMicros = 0n;
  meter.lotDraws = NO_LOT_DRAWS;
}

function findLot(meter: MeterState, lotId: string): Lot {
  const lot = meter.lots.find((l) => l.id === lotId);
  assert(lot !== undefined, `lot ${lotId} exists`);
  return lot;
}

function applyConsumed(meter: MeterState, event: Extract<Event, { type: 'consumed' }>): void {
  enterPeriod(meter, event.periodStartMs);
  // Adding 0n still allocates a new bigint, which the meter would then keep.
  if (event.includedMicros !== 0n) meter.includedUsedMicros += event.includedMicros;
  if (event.overageMicros !== 0n) meter.overageMicros += event.overageMicros;
  for (const [lotId, micros] of event.lotDraws) {
    const lot = findLot(meter, lotId);
    assert(lot.remainingMicros >= micros, 'lot draw within remaining credit');
    lot.remainingMicros -= micros;
    const last = meter.lotDraws[meter.lotDraws.length - 1];
    if (last !== undefined && last[0] === lotId) last[1] += micros;
    else ownLotDraws(meter).push([lotId, micros]);
  }
}

function applyRefunded(meter: MeterState, event: Extract<Event, { type: 'refunded' }>): void {
  assert(event.periodStartMs === meter.periodStartMs, 'refunds only unwind the current period');
  assert(meter.overageMicros >= event.overageMicros, 'refund within overage');
  assert(meter.includedUsedMicros >= event.includedMicros, 'refund within included usage');
  meter.overageMicros -= event.overageMicros;
  for (const [lotId, micros] of event.lotRestores) {
    const last = meter.lotDraws[meter.lotDraws.length - 1];
    assert(last !== undefined && last[0] === lotId && last[1] >= micros, 'lot restores unwind the newest draws');
    last[1] -= micros;
    if (last[1] === 0n) meter.lotDraws.pop();
    findLot(meter, lotId).remainingMicros += micros;
  }
  meter.includedUsedMicros -= event.includedMicros;
}

/** Records an idempotency key, evicting expired entries and, past the cap, the oldest. */
function remember(state: CustomerState, record: IdempotencyRecord, atMs: number): void {
  const cache = (state.idempotency ??= new Map());
  cache.delete(record.scope);
  cache.set(record.scope, { fingerprint: record.fingerprint, atMs });
  for (const [scope, entry] of cache) {
    if (entry.atMs > atMs - IDEMPOTENCY_RETENTION_MS && cache.size <= IDEMPOTENCY_ENTRIES_PER_CUSTOMER_MAX) break;
    cache.delete(scope);
  }
}

// ---------------------------------------------------------------------------
// Snapshots: a plain, msgpack-friendly form of the state.

export interface CustomerSnapshot {
  readonly environment: Environment;
  readonly id: string;
  readonly createdAtMs: number;
  readonly profile: CustomerProfile;
  readonly contract: Contract | null;
  readonly meters: Array<[string, MeterState]>;
  readonly limits: Array<[string, LimitState]>;
  readonly idempotency: Array<[string, string, number]>;
}

export function toSnapshot(state: CustomerState): CustomerSnapshot {
  return {
    environment: state.environment,
    id: state.id,
    createdAtMs: state.createdAtMs,
    profile: state.profile,
    contract: state.contract,
    meters: [...state.meters],
    limits: state.limits === null ? [] : [...state.limits],
    idempotency: state.idempotency === null ? [] : [...state.idempotency].map(([scope, e]): [string, string, number] => [scope, e.fingerprint, e.atMs]),
  };
}

/** Builds live state from a snapshot item; copies everything, so `snapshot` stays the caller's. */
export function fromSnapshot(snapshot: CustomerSnapshot): CustomerState {
  const { metadata } = snapshot.profile;
  return {
    environment: canonicalEnvironment(snapshot.environment),
    id: snapshot.id,
    createdAtMs: snapshot.createdAtMs,
    profile: { ...snapshot.profile, metadata: Object.keys(metadata).length === 0 ? NO_METADATA : { ...metadata } },
    contract: snapshot.contract ?? null,
    meters: new Map(snapshot.meters.map(([k, m]): [string, MeterState] => [internKey(k), cloneMeter(m)])),
    limits: snapshot.limits.length === 0 ? null : new Map(snapshot.limits.map(([k, l]): [string, LimitState] => [k, { ...l }])),
    idempotency:
      snapshot.idempotency.length === 0
        ? null
        : new Map(snapshot.idempotency.map(([s, fingerprint, atMs]): [string, IdempotencyEntry] => [s, { fingerprint, atMs }])),
  };
}
