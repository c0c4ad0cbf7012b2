/**
 * Per-environment quotas an operator sets (TALLY_QUOTA_*): how many customers and how
 * many idempotency keys an environment may hold, so that traffic in one environment
 * (a test key in a loop) cannot grow the process without bound for everyone.
 *
 * Customers hash onto LOGICAL_SHARDS logical shards dealt over the workers, so each
 * worker enforces its share of a quota: the quota times the fraction of logical shards it
 * owns, rounded up. An environment may therefore end slightly above or below the exact
 * number when customers hash unevenly; the quota bounds growth, it is not a billing count.
 */
import type { Environment } from './environment.js';
import { LOGICAL_SHARDS } from './limits.js';

/** A limit per environment; 0 = unlimited. */
export type PerEnvironment = Readonly<Record<Environment, number>>;

export interface Quotas {
  readonly customers: PerEnvironment;
  readonly idempotencyKeys: PerEnvironment;
  /** Audit entries a day (UTC): enforced by the front end, which appends them. */
  readonly auditEntriesPerDay: PerEnvironment;
}

export const UNLIMITED: PerEnvironment = { test: 0, live: 0 };
export const NO_QUOTAS: Quotas = {
  customers: UNLIMITED,
  idempotencyKeys: UNLIMITED,
  auditEntriesPerDay: UNLIMITED,
};

/** A quota as one worker enforces it: the operator's number and this worker's share of it. */
export interface QuotaShare {
  readonly limit: number;
  readonly share: number;
}

export interface WorkerQuotas {
  readonly customers: Readonly<Record<Environment, QuotaShare>>;
  readonly idempotencyKeys: Readonly<Record<Environment, QuotaShare>>;
}

/** Logical shards worker `index` of `workers` owns (they are dealt round-robin). */
function ownedLogicalShards(index: number, workers: number): number {
  return Math.floor(LOGICAL_SHARDS / workers) + (index < LOGICAL_SHARDS % workers ? 1 : 0);
}

/** Worker `index`'s shares of `quotas`. */
export function workerQuotas(quotas: Quotas, index: number, workers: number): WorkerQuotas {
  const fraction = ownedLogicalShards(index, workers) / LOGICAL_SHARDS;
  const shares = (limits: PerEnvironment): Record<Environment, QuotaShare> => ({
    test: { limit: limits.test, share: Math.ceil(limits.test * fraction) },
    live: { limit: limits.live, share: Math.ceil(limits.live * fraction) },
  });
  return { customers: shares(quotas.customers), idempotencyKeys: shares(quotas.idempotencyKeys) };
}

/**
 * Parses a setting: a whole number for both environments (`1000`), or per environment
 * (`test:1000,live:0`; an environment left out is unlimited). Throws naming the problem.
 */
export function parsePerEnvironment(raw: string): PerEnvironment {
  if (/^\d+$/.test(raw)) return { test: Number(raw), live: Number(raw) };
  const result = { test: 0, live: 0 };
  for (const part of raw.split(',')) {
    const match = /^\s*(test|live)\s*:\s*(\d+)\s*$/.exec(part);
    if (match === null)
      throw new Error(`expected a whole number or test:N,live:M, got ${JSON.stringify(raw)}`);
    result[match[1] as Environment] = Number(match[2]);
  }
  return result;
}
