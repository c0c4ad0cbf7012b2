/**
 * decide: what a command concludes against the current state, as events to apply or a
 * rejection, without changing anything; and `query`, which answers a read. The entitlement
 * a command must name comes from the op table (ops.ts); each write op has its case here.
 *
 * Replay uses `apply` only, so events carry everything they need (the exact draw, the
 * period they belong to, the time) and never consult the configuration. Domain outcomes
 * (unknown key, insufficient balance, refund too large) are returned values listed in
 * precedence order; broken invariants are assertion failures.
 */
import { assert } from '../../shared/assert.js';
import {
  IDEMPOTENCY_RETENTION_MS,
  LOTS_PER_METER_MAX,
  METADATA_KEYS_MAX,
  PURCHASED_MAX,
} from '../../shared/limits.js';
import type { CompiledConfig, CompiledEntitlement, EntitlementType } from '../billing-config.js';
import { minMicros, quantityToMicros } from '../fixed.js';
import { OPS } from '../ops.js';
import {
  commerceView,
  decideRecordPurchase,
  decideSetProcessorCustomer,
  decideSyncSubscription,
  subscriptionPeriod,
} from './commerce.js';
import { decideRecordOverageBill, overageView } from './overage.js';
import { decideRecordRefund, quoteRefund } from './refunds.js';
import type {
  ContextRequest,
  ContractInput,
  CustomerProfile,
  CustomerState,
  Decision,
  Environment,
  Event,
  IdempotencyRecord,
  IdempotencySeen,
  LotDraw,
  Outcome,
  ProfilePatch,
  ReadCommand,
  Rejection,
  WriteCommand,
} from './types.js';
import {
  balanceView,
  contractView,
  currentPeriodStart,
  hasEntitlement,
  hasHorizon,
  limitView,
  meterIncludedMicros,
  NO_METER,
  overageAllowed,
  planOf,
  usageIn,
} from './views.js';

function rejected(rejection: Rejection): Decision {
  return { rejection, events: [] };
}

function accepted(...events: Event[]): Decision {
  return { rejection: null, events };
}

const REPLAY: Decision = { rejection: null, events: [] };

/** An unknown key: of an environment nobody configured yet (version 0), or of its configuration. */
function notFound(config: CompiledConfig, environment: Environment, key: string): Rejection {
  return config.version === 0
    ? { kind: 'not_configured', environment }
    : { kind: 'entitlement_not_found', key };
}

/**
 * Resolves the entitlement a command's key names, of the type its op needs ('any': any
 * type), or says why it cannot: 404 (no configuration was ever pushed to the environment,
 * or the key is not in it), then wrong type 400.
 */
function resolveEntitlement(
  config: CompiledConfig,
  environment: Environment,
  key: string,
  expected: EntitlementType | 'any',
): CompiledEntitlement | Rejection {
  const ent = config.entitlements.get(key);
  if (ent === undefined) return notFound(config, environment, key);
  if (expected !== 'any' && ent.type !== expected) {
    return { kind: 'wrong_entitlement_type', key, actual: ent.type, expected };
  }
  return ent;
}

function isRejection(value: CompiledEntitlement | Rejection): value is Rejection {
  return 'kind' in value;
}

/** The entitlement resolved for an op that names one (the op table says which do). */
function entitled(ent: CompiledEntitlement | null): CompiledEntitlement {
  assert(ent !== null, 'the op table names an entitlement for this op');
  return ent;
}

/** Answers a read without changing anything. */
export function query(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  command: ReadCommand,
  nowMs: number,
): Outcome {
  const op = OPS[command.op];
  const ent =
    op.entitlement === null
      ? null
      : resolveEntitlement(config, command.environment, command.key, op.entitlement);
  if (ent !== null && isRejection(ent)) return { kind: 'rejected', rejection: ent };
  switch (op.answer) {
    case 'has':
      return {
        kind: 'has',
        value: hasEntitlement(customer, config, entitled(ent), nowMs),
        untilMs: hasHorizon(customer, config, entitled(ent), nowMs),
      };
    case 'limit':
      return { kind: 'limit', view: limitView(customer, config, entitled(ent).key) };
    case 'balance':
      return { kind: 'balance', view: balanceView(customer, config, entitled(ent), nowMs) };
    case 'contract': {
      const contract = customer?.contract ?? null;
      if (contract === null)
        return {
          kind: 'rejected',
          rejection: { kind: 'contract_not_found', customerId: command.customerId },
        };
      return { kind: 'contract', view: contractView(command.customerId, contract) };
    }
    case 'commerce':
      return { kind: 'commerce', view: commerceView(command.customerId, customer) };
    case 'refundQuote':
      assert(command.op === 'quoteRefund', 'only a refund quote answers with one');
      return quoteRefund(customer, config, command.request);
    case 'overage':
      assert(command.op === 'overageDue', 'only an overage read answers with one');
      return { kind: 'overage', view: overageView(customer, command.period) };
    case 'refund':
    case 'deleted':
    case 'customer':
    case 'context':
      assert(false, `a read (${command.op}) answers with ${op.answer}`);
  }
}

/**
 * Decides a write. Never mutates `customer`; `execute` (or replay) applies the returned
 * events in order before the next command for the same customer is decided. `seen` is
 * what the shell holds for the command's idempotency scope (`idempotencyScope`): the
 * fingerprint and time of the write that first used the key, or null if it holds none.
 * `carry` is the key as the shell stores it with a keyed write (IdempotencyRecord): the
 * event that applies the write holds it, so the key is on disk exactly when the write is.
 */
export function decide(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  command: WriteCommand,
  nowMs: number,
  seen: IdempotencySeen | null = null,
  carry?: IdempotencyRecord,
): Decision {
  const expected = OPS[command.op].entitlement;
  const ent =
    expected === null
      ? null
      : resolveEntitlement(config, command.environment, command.key, expected);
  if (ent !== null && isRejection(ent)) return rejected(ent);
  switch (command.op) {
    case 'consume':
      return decideConsume(customer, config, entitled(ent), command, nowMs, seen, carry);
    case 'refund':
      return decideRefund(customer, config, entitled(ent), command, nowMs, seen, carry);
    case 'limitSettings':
      return decideLimitSettings(customer, config, command, nowMs);
    case 'usageSettings':
      return decideUsageSettings(customer, config, entitled(ent), command, nowMs);
    case 'grantLot':
      return decideGrantLot(customer, config, entitled(ent), command, nowMs);
    case 'putContract':
      return decidePutContract(config, command, nowMs);
    case 'deleteContract':
      return decideDeleteContract(customer, command, nowMs);
    case 'upsertCustomer':
      // An update that changes nothing is not a mutation: nothing written, stamped or audited.
      if (customer !== undefined && !patchChanges(customer.profile, command.patch)) return REPLAY;
      return decideUpsertCustomer(customer, command, nowMs);
    case 'context':
      return decideContext(customer, config, command, nowMs);
    case 'setProcessorCustomer':
      return decideSetProcessorCustomer(customer, command, nowMs);
    case 'syncSubscription':
      return decideSyncSubscription(customer, command, nowMs);
    case 'recordPurchase':
      return decideRecordPurchase(customer, config, command, nowMs);
    case 'recordRefund':
      return decideRecordRefund(customer, command, nowMs);
    case 'recordOverageBill':
      return decideRecordOverageBill(customer, command, nowMs);
  }
}

type Replay = { readonly replay: boolean } | Rejection;
const A_REPLAY: Replay = { replay: true };
const NOT_A_REPLAY: Replay = { replay: false };

/**
 * The scope an idempotency key is kept under within its customer: the op, the meter and
 * the key. Null for a command without a key. The shell looks the scope up (its own table,
 * outside the customer's state) and hands what it found to `decide` as `seen`.
 */
export function idempotencyScope(command: WriteCommand): string | null {
  if (command.op !== 'consume' && command.op !== 'refund') return null;
  if (command.idempotencyKey === undefined) return null;
  return `${command.op}\u0000${command.key}\u0000${command.idempotencyKey}`;
}

/**
 * The shared start of a consume or refund: the amount is positive (validated at the edge),
 * and what the shell's lookup of its key's scope found means: a live entry with the same
 * fingerprint (the amount) is a replay, one with another fingerprint a reuse; an expired
 * one is as good as none (the shell sweeps it later).
 */
function amountIdempotency(
  command: Extract<WriteCommand, { op: 'consume' | 'refund' }>,
  seen: IdempotencySeen | null,
  nowMs: number,
): Replay {
  assert(command.amountMicros > 0n, `${command.op} amount must be positive`);
  if (command.idempotencyKey === undefined || seen === null) return NOT_A_REPLAY;
  if (seen.atMs <= nowMs - IDEMPOTENCY_RETENTION_MS) return NOT_A_REPLAY;
  if (seen.fingerprint !== idempotencyFingerprint(command)) {
    return { kind: 'idempotency_key_reused' };
  }
  return A_REPLAY;
}

/** What must match for a retry to be the same request: the amount. */
export function idempotencyFingerprint(
  command: Extract<WriteCommand, { op: 'consume' | 'refund' }>,
): string {
  return String(command.amountMicros);
}

function decideConsume(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
  command: Extract<WriteCommand, { op: 'consume' }>,
  nowMs: number,
  seen: IdempotencySeen | null,
  carry: IdempotencyRecord | undefined,
): Decision {
  const amount = command.amountMicros;
  const idem = amountIdempotency(command, seen, nowMs);
  if ('kind' in idem) return rejected(idem);
  if (idem.replay) return REPLAY;

  const meter = customer?.meters.get(ent.key) ?? NO_METER;
  const plan = planOf(customer, config);
  const periodStartMs = currentPeriodStart(
    ent,
    meter,
    nowMs,
    subscriptionPeriod(customer, config, ent),
  );
  const usedIncluded = usageIn(meter, periodStartMs).included;
  const includedMicros = meterIncludedMicros(customer, plan, ent.key);
  let need = amount;
  const fromIncluded = minMicros(
    need,
    includedMicros > usedIncluded ? includedMicros - usedIncluded : 0n,
  );
  need -= fromIncluded;
  const lotDraws: LotDraw[] = [];
  for (const lot of meter.lots) {
    if (need === 0n) break;
    const take = minMicros(need, lot.remainingMicros);
    if (take > 0n) lotDraws.push([lot.id, take]);
    need -= take;
  }
  if (need > 0n && !(meter.overageEnabled && overageAllowed(plan, ent.key))) {
    return rejected({
      kind: 'insufficient_balance',
      key: ent.key,
      view: balanceView(customer, config, ent, nowMs),
    });
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
    // Always present (undefined without a key): one object shape for every consume.
    idempotency: carry,
  };
  return accepted(event);
}

function decideRefund(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
  command: Extract<WriteCommand, { op: 'refund' }>,
  nowMs: number,
  seen: IdempotencySeen | null,
  carry: IdempotencyRecord | undefined,
): Decision {
  const amount = command.amountMicros;
  const idem = amountIdempotency(command, seen, nowMs);
  if ('kind' in idem) return rejected(idem);
  if (idem.replay) return REPLAY;

  const meter = customer?.meters.get(ent.key) ?? NO_METER;
  const periodStartMs = currentPeriodStart(
    ent,
    meter,
    nowMs,
    subscriptionPeriod(customer, config, ent),
  );
  const usage = usageIn(meter, periodStartMs);
  if (amount > usage.overage + usage.lots + usage.included) {
    return rejected({
      kind: 'refund_exceeds_usage',
      key: ent.key,
      view: balanceView(customer, config, ent, nowMs),
    });
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
    idempotency: carry,
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
  assert(
    Number.isInteger(purchased) && purchased >= 0 && purchased <= PURCHASED_MAX,
    'purchased validated at the edge',
  );
  if (!current.expansionAllowed) {
    if (command.purchased !== undefined && command.purchased > 0) {
      return rejected({ kind: 'expansion_not_allowed', key: command.key, field: 'purchased' });
    }
    if (command.autoExpansionEnabled === true) {
      return rejected({
        kind: 'expansion_not_allowed',
        key: command.key,
        field: 'autoExpansionEnabled',
      });
    }
  }
  // Settings that repeat what is stored are not a mutation: nothing written, stamped or audited.
  if (purchased === current.purchased && autoExpansionEnabled === current.autoExpansionEnabled)
    return REPLAY;
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
  if (command.overageEnabled === (customer?.meters.get(ent.key)?.overageEnabled ?? false))
    return REPLAY;
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
  _config: CompiledConfig,
  ent: CompiledEntitlement,
  command: Extract<WriteCommand, { op: 'grantLot' }>,
  nowMs: number,
): Decision {
  assert(command.amountMicros > 0n, 'lot amount must be positive');
  const meter = customer?.meters.get(ent.key);
  // A lot id names its grant (a purchase): granting it again is a replay, not a second lot.
  if (meter?.lots.some((lot) => lot.id === command.lotId) === true) return REPLAY;
  if (meter !== undefined && meter.lots.length >= LOTS_PER_METER_MAX)
    return rejected({ kind: 'too_many_lots', key: ent.key });
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

/**
 * A contract may only name entitlements of the current configuration, with amounts the
 * type can hold: whole numbers for limits, at most 6 decimals for meters, and for a
 * feature any number (> 0 grants, 0 denies). Returns the first violation, or null.
 */
function contractViolation(config: CompiledConfig, contract: ContractInput): string | null {
  for (const [key, value] of Object.entries(contract.entitlements)) {
    const ent = config.entitlements.get(key);
    if (ent === undefined)
      return `entitlements.${key} is not an entitlement of the billing configuration`;
    if (ent.type === 'limit' && !Number.isInteger(value.included))
      return `entitlements.${key}.included must be a whole number for a limit`;
    if (ent.type === 'meter' && quantityToMicros(value.included) === null) {
      return `entitlements.${key}.included must have at most 6 decimal places`;
    }
  }
  return null;
}

function decidePutContract(
  config: CompiledConfig,
  command: Extract<WriteCommand, { op: 'putContract' }>,
  nowMs: number,
): Decision {
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
  return accepted({
    type: 'contractDeleted',
    environment: command.environment,
    customerId: command.customerId,
    key: '',
    atMs: nowMs,
  });
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

/**
 * Every key must exist (404) and, for usage and limits, be of that type (400); first failure wins.
 */
function contextRejection(
  config: CompiledConfig,
  environment: Environment,
  request: ContextRequest,
): Rejection | null {
  const lists: ReadonlyArray<readonly [readonly string[], EntitlementType | null]> = [
    [request.features, null],
    [request.usage, 'meter'],
    [request.limits, 'limit'],
  ];
  for (const [keys, expected] of lists) {
    for (const key of keys) {
      const ent = config.entitlements.get(key);
      if (ent === undefined) return notFound(config, environment, key);
      if (expected !== null && ent.type !== expected)
        return { kind: 'wrong_entitlement_type', key, actual: ent.type, expected };
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
  // The application's hot path repeats the same profile on every call: only a change is written
  // (and audited).
  if (customer !== undefined && !patchChanges(customer.profile, command.patch)) return REPLAY;
  return decideUpsertCustomer(customer, { ...command, op: 'upsertCustomer' }, nowMs);
}

/** Whether applying `patch` would change anything in `profile` (besides its update time). */
function patchChanges(profile: CustomerProfile, patch: ProfilePatch): boolean {
  if (patch.name !== undefined && patch.name !== profile.name) return true;
  if (patch.email !== undefined && patch.email !== profile.email) return true;
  for (const [key, value] of Object.entries(patch.metadata ?? {})) {
    if (value === null ? Object.hasOwn(profile.metadata, key) : profile.metadata[key] !== value)
      return true;
  }
  return false;
}
