/**
 * apply: folds one event into a customer's state. The only function that changes state,
 * used both right after decide and when recovery replays the journal, so it never reads
 * the configuration or the clock: everything it needs is in the event.
 */
import { assert } from '../../shared/assert.js';
import { applyCommerce, commerceOf } from './commerce.js';
import { applyOverageBilled } from './overage.js';
import { applyRefund, lotRevoked } from './refunds.js';
import { internKey, newCustomer, NO_LOT_DRAWS, NO_LOTS } from './state.js';
import type {
  CustomerProfile,
  CustomerState,
  Event,
  Lot,
  LotDraw,
  MeterState,
  ProfilePatch,
} from './types.js';

/**
 * Folds one event into the customer's state, creating the customer if needed. Mutates
 * and returns `customer` (or the new customer). Assumes the event was produced by
 * `decide` against this very state; anything else is an assertion failure.
 */
export function apply(customer: CustomerState | undefined, event: Event): CustomerState {
  const state = customer ?? newCustomer(event.environment, event.customerId, event.atMs);
  assert(
    state.id === event.customerId && state.environment === event.environment,
    'event addressed to this customer',
  );
  switch (event.type) {
    case 'consumed':
      applyConsumed(meterFor(state, event.key), event);
      break;
    case 'refunded':
      applyRefunded(state, meterFor(state, event.key), event);
      break;
    case 'limitSettingsSet':
      (state.limits ??= new Map()).set(event.key, {
        purchased: event.purchased,
        autoExpansionEnabled: event.autoExpansionEnabled,
      });
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
    case 'processorCustomerSet':
    case 'subscriptionSynced':
    case 'purchaseRecorded':
    case 'processorEventNoted':
      applyCommerce(state, event);
      break;
    case 'overageBilled':
      applyOverageBilled(commerceOf(state), event);
      break;
    case 'purchaseRefunded':
    case 'subscriptionRefunded':
      applyRefund(state, commerceOf(state), event);
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
    meter = {
      periodStartMs: 0,
      includedUsedMicros: 0n,
      overageMicros: 0n,
      lotDraws: NO_LOT_DRAWS,
      overageEnabled: false,
      lots: NO_LOTS,
    };
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
  // The ended period's overage stays known until its invoice is drafted (overage.ts).
  if (meter.overageMicros > 0n)
    meter.closedOverage = { periodStartMs: meter.periodStartMs, micros: meter.overageMicros };
  else if (meter.closedOverage !== undefined) delete meter.closedOverage;
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

function applyRefunded(
  state: CustomerState,
  meter: MeterState,
  event: Extract<Event, { type: 'refunded' }>,
): void {
  assert(event.periodStartMs === meter.periodStartMs, 'refunds only unwind the current period');
  assert(meter.overageMicros >= event.overageMicros, 'refund within overage');
  assert(meter.includedUsedMicros >= event.includedMicros, 'refund within included usage');
  meter.overageMicros -= event.overageMicros;
  for (const [lotId, micros] of event.lotRestores) {
    const last = meter.lotDraws[meter.lotDraws.length - 1];
    assert(
      last !== undefined && last[0] === lotId && last[1] >= micros,
      'lot restores unwind the newest draws',
    );
    last[1] -= micros;
    if (last[1] === 0n) meter.lotDraws.pop();
    // A revoked lot gets nothing back: its unused credits were refunded as money.
    if (!lotRevoked(state, lotId)) findLot(meter, lotId).remainingMicros += micros;
  }
  meter.includedUsedMicros -= event.includedMicros;
}
