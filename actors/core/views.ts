/**
 * What a customer's state reads as: the plan and contract that apply, balances, limits,
 * feature checks and the objects the API shows. Pure functions of the state, the
 * configuration and the time; decide uses them to judge a command and the shard to
 * answer one.
 */
import { assert } from '../../shared/assert.js';
import { customerView } from '../../shared/customer-record.js';
import { isoOf } from '../../shared/iso-time.js';
import type { CompiledConfig, CompiledEntitlement, CompiledProduct } from '../billing-config.js';
import { formatMicros, quantityToMicros, type Micros } from '../fixed.js';
import { periodAt } from '../periods.js';
import {
  liveSubscriptionView,
  purchasedProducts,
  subscribedPlan,
  subscriptionPeriod,
} from './commerce.js';
import { NO_LOT_DRAWS, NO_LOTS } from './state.js';
import type {
  BalanceView,
  Contract,
  ContractView,
  ContextRequest,
  ContextView,
  CustomerState,
  Event,
  LimitView,
  MeterState,
} from './types.js';

export { customerView };

// Plan resolution

/**
 * The product whose entitlements apply to the customer: the product of its live
 * subscription, else the environment's default product (or nothing).
 */
export function planOf(
  customer: CustomerState | undefined,
  config: CompiledConfig,
): CompiledProduct | null {
  return customer?.commerce == null ? config.defaultProduct : subscribedPlan(customer, config);
}

/** The contract's override for `key`, if the customer has a contract naming it. */
function contractIncluded(customer: CustomerState | undefined, key: string): number | undefined {
  return customer?.contract?.entitlements[key]?.included;
}

export function meterIncludedMicros(
  customer: CustomerState | undefined,
  plan: CompiledProduct | null,
  key: string,
): Micros {
  const override = contractIncluded(customer, key);
  if (override !== undefined) {
    const micros = quantityToMicros(override);
    assert(micros !== null, 'contract amounts validated when the contract was set');
    return micros;
  }
  return plan?.meters.get(key)?.includedMicros ?? 0n;
}

export function overageAllowed(plan: CompiledProduct | null, key: string): boolean {
  return plan?.meters.get(key)?.overageAllowed ?? false;
}

// Views

/** What a meter with nothing stored reads as; frozen, since it is shared by every read. */
export const NO_METER: MeterState = Object.freeze({
  periodStartMs: 0,
  includedUsedMicros: 0n,
  overageMicros: 0n,
  lotDraws: NO_LOT_DRAWS,
  overageEnabled: false,
  lots: NO_LOTS,
});

/** The meter's usage as of `periodStartMs`: usage of an earlier period counts as nothing. */
export function usageIn(
  meter: MeterState,
  periodStartMs: number,
): { included: Micros; overage: Micros; lots: Micros } {
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

/**
 * Start of the current period: the subscription's billing period for a meter that resets
 * at the plan's interval, else the calendar's; never earlier than usage already recorded
 * (clock skew, or a subscription that has moved on).
 */
export function currentPeriodStart(
  ent: CompiledEntitlement,
  meter: MeterState,
  nowMs: number,
  billing: { startMs: number } | null = null,
): number {
  return Math.max(billing?.startMs ?? periodAt(ent.reset, nowMs).startMs, meter.periodStartMs);
}

function balanceMicros(meter: MeterState, includedMicros: Micros, periodStartMs: number): Micros {
  const used = usageIn(meter, periodStartMs).included;
  const includedLeft = includedMicros > used ? includedMicros - used : 0n;
  return includedLeft + lotsRemaining(meter);
}

/** A customer's meter as of `nowMs`: its state, plan, included allowance and current period. */
function meterAt(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
  nowMs: number,
) {
  const meter = customer?.meters.get(ent.key) ?? NO_METER;
  const plan = planOf(customer, config);
  const billing = subscriptionPeriod(customer, config, ent);
  return {
    meter,
    plan,
    billing,
    includedMicros: meterIncludedMicros(customer, plan, ent.key),
    periodStartMs: currentPeriodStart(ent, meter, nowMs, billing),
  };
}

export function balanceView(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
  nowMs: number,
): BalanceView {
  const { meter, plan, billing, includedMicros, periodStartMs } = meterAt(
    customer,
    config,
    ent,
    nowMs,
  );
  const usage = usageIn(meter, periodStartMs);
  const period = billing ?? periodAt(ent.reset, Math.max(nowMs, periodStartMs));
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

export function limitView(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  key: string,
): LimitView {
  const grant = planOf(customer, config)?.limits.get(key);
  const settings = customer?.limits?.get(key);
  let included = contractIncluded(customer, key) ?? grant?.included ?? 0;
  // Paid one-time products add their limits on top.
  for (const product of purchasedProducts(customer, config))
    included += product.limits.get(key)?.included ?? 0;
  const purchased = settings?.purchased ?? 0;
  return {
    limit: included + purchased,
    included,
    purchased,
    expansionAllowed: grant?.expansionAllowed ?? false,
    autoExpansionEnabled: settings?.autoExpansionEnabled ?? false,
  };
}

export function hasEntitlement(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
  nowMs: number,
): boolean {
  switch (ent.type) {
    case 'feature': {
      const override = contractIncluded(customer, ent.key);
      if (override !== undefined) return override > 0;
      if (planOf(customer, config)?.features.has(ent.key) === true) return true;
      return purchasedProducts(customer, config).some((product) => product.features.has(ent.key));
    }
    case 'limit':
      return limitView(customer, config, ent.key).limit > 0;
    case 'meter': {
      // Judged on micro-units: the view's amounts are for rendering only.
      const { meter, plan, includedMicros, periodStartMs } = meterAt(customer, config, ent, nowMs);
      return (
        balanceMicros(meter, includedMicros, periodStartMs) > 0n ||
        (meter.overageEnabled && overageAllowed(plan, ent.key))
      );
    }
  }
}

/**
 * Until when `hasEntitlement` keeps its answer if neither the customer nor the configuration
 * changes: the only thing time alone changes is a meter's calendar period (its usage counts
 * for nothing once the next period starts). A meter that follows a subscription's billing
 * period moves only when the processor renews it, which is a write. Infinity: never.
 */
export function hasHorizon(
  customer: CustomerState | undefined,
  config: CompiledConfig,
  ent: CompiledEntitlement,
  nowMs: number,
): number {
  if (ent.type !== 'meter' || subscriptionPeriod(customer, config, ent) !== null) return Infinity;
  return periodAt(ent.reset, nowMs).endMs ?? Infinity;
}

/**
 * The one key whose `hasEntitlement` answer a write's `events` can change, or null when they
 * may change others: consumes and refunds of one meter of a customer that `existed` change
 * that meter alone (`apply`), and the answers to features, limits and other meters read none
 * of it. A write that creates its customer may change any answer given while it did not
 * exist.
 */
export function onlyAnswerChangedBy(existed: boolean, events: readonly Event[]): string | null {
  if (!existed) return null;
  let key: string | null = null;
  for (const event of events) {
    if (event.type !== 'consumed' && event.type !== 'refunded') return null;
    if (key !== null && key !== event.key) return null;
    key = event.key;
  }
  return key;
}

export function contextView(
  customer: CustomerState,
  config: CompiledConfig,
  request: ContextRequest,
  nowMs: number,
): ContextView {
  const entitlement = (key: string): CompiledEntitlement => {
    const ent = config.entitlements.get(key);
    assert(ent !== undefined, 'context keys resolved by decide');
    return ent;
  };
  return {
    customer: customerView(customer),
    features: Object.fromEntries(
      request.features.map((key) => [
        key,
        hasEntitlement(customer, config, entitlement(key), nowMs),
      ]),
    ),
    usage: Object.fromEntries(
      request.usage.map((key) => [key, balanceView(customer, config, entitlement(key), nowMs)]),
    ),
    limits: Object.fromEntries(
      request.limits.map((key) => [key, limitView(customer, config, key)]),
    ),
    ...(request.subscription === true
      ? { subscription: liveSubscriptionView(customer.id, customer) }
      : {}),
  };
}

export function contractView(customerId: string, contract: Contract): ContractView {
  return {
    customerId,
    priceAmount: contract.priceAmount,
    priceInterval: contract.priceInterval,
    entitlements: contract.entitlements,
    updatedAt: isoOf(contract.updatedAtMs),
  };
}
