/**
 * The snapshot form of a customer: a plain, msgpack-friendly copy of its state, and the
 * state rebuilt from one. Snapshots bound replay time; the shard writes them and loads
 * them back at start.
 */
import { canonicalEnvironment, internKey, NO_LOT_DRAWS, NO_LOTS, NO_METADATA } from './state.js';
import type {
  CommerceState,
  Contract,
  CustomerProfile,
  CustomerState,
  Environment,
  LimitState,
  LotDraw,
  MeterState,
} from './types.js';

export interface CustomerSnapshot {
  readonly environment: Environment;
  readonly id: string;
  readonly createdAtMs: number;
  readonly profile: CustomerProfile;
  readonly contract: Contract | null;
  readonly meters: Array<[string, MeterState]>;
  readonly limits: Array<[string, LimitState]>;
  /**
   * Only in snapshots of format 1, written when idempotency keys lived in the customer's
   * state: `[scope, fingerprint, atMs]`. The shard worker moves them into its key table
   * when it loads such a snapshot (the automatic migration); the state never holds them.
   */
  readonly idempotency?: Array<[string, string, number]>;
  /**
   * Only in the items of an online snapshot (and of a shard restored from one): the
   * customer's idempotency keys as `[scope digest, fingerprint, atMs]`, which the shard
   * worker moves into its key table at start. The state never holds them.
   */
  readonly keys?: Array<[string, string, number]>;
  /** Absent in snapshots of customers without any commerce. */
  readonly commerce?: CommerceState;
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
    ...(state.commerce === null ? {} : { commerce: state.commerce }),
  };
}

/** Builds live state from a snapshot item; copies everything, so `snapshot` stays the caller's. */
export function fromSnapshot(snapshot: CustomerSnapshot): CustomerState {
  const { metadata } = snapshot.profile;
  return {
    environment: canonicalEnvironment(snapshot.environment),
    id: snapshot.id,
    createdAtMs: snapshot.createdAtMs,
    profile: {
      ...snapshot.profile,
      metadata: Object.keys(metadata).length === 0 ? NO_METADATA : { ...metadata },
    },
    contract: snapshot.contract ?? null,
    meters: new Map(
      snapshot.meters.map(([k, m]): [string, MeterState] => [internKey(k), cloneMeter(m)]),
    ),
    limits:
      snapshot.limits.length === 0
        ? null
        : new Map(snapshot.limits.map(([k, l]): [string, LimitState] => [k, { ...l }])),
    commerce: snapshot.commerce === undefined ? null : cloneCommerce(snapshot.commerce),
    copyMark0: 0,
    copyMark1: 0,
  };
}

function cloneCommerce(commerce: CommerceState): CommerceState {
  return {
    processorCustomerId: commerce.processorCustomerId,
    subscriptions: commerce.subscriptions.map((s) => ({ ...s })),
    purchases: commerce.purchases.map((p) => ({ ...p, grant: { ...p.grant } })),
    // Absent in snapshots taken before refunds existed.
    refunds: (commerce.refunds ?? []).map((r) => ({ ...r })),
    ...(commerce.overageBilled === undefined ? {} : { overageBilled: [...commerce.overageBilled] }),
    eventIds: [...commerce.eventIds],
  };
}

function cloneMeter(meter: MeterState): MeterState {
  return {
    ...meter,
    lotDraws:
      meter.lotDraws.length === 0 ? NO_LOT_DRAWS : meter.lotDraws.map((d): LotDraw => [d[0], d[1]]),
    lots: meter.lots.length === 0 ? NO_LOTS : meter.lots.map((lot) => ({ ...lot })),
  };
}
