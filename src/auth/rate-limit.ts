/**
 * Per-key rate limits: fixed one-minute windows aligned to the whole minute (UTC).
 *
 * Every request that authenticated counts, whatever it answers (403s included). Only
 * authenticated keys are tracked, so an unauthenticated flood cannot grow this table;
 * entries of past windows are swept once the table passes SWEEP_AT_ENTRIES. The limits
 * are requests per minute per key: 1000 for server keys (and the operator key), 200
 * for client keys, overridable with TALLY_RATE_LIMIT_SERVER / TALLY_RATE_LIMIT_CLIENT;
 * 0 turns rate limiting off.
 */
import type { KeyRecord } from '../../storage/control-store.js';
import { asciiBytes } from '../http/rate-limit-header.js';

export const WINDOW_MS = 60_000;
export const DEFAULT_RATE_LIMITS: RateLimits = { server: 1000, client: 200 };

/** Past-window entries are swept when the table reaches this size (keys are few). */
const SWEEP_AT_ENTRIES = 10_000;

export interface RateLimits {
  /** Requests per minute for server (and operator) keys; 0 = unlimited, no headers. */
  readonly server: number;
  /** Requests per minute for client keys; 0 = unlimited, no headers. */
  readonly client: number;
}

/**
 * The rate-limit state of one request: what its reply's headers say. The limit and
 * reset values are ASCII bytes encoded once per limiter and per window, so that writing
 * the headers converts no string per request (src/http/rate-limit-header.ts).
 */
export interface RateDecision {
  readonly allowed: boolean;
  readonly limit: number;
  /** X-RateLimit-Limit and X-RateLimit-Reset values, shared by the whole window. */
  readonly limitBytes: Uint8Array;
  readonly resetBytes: Uint8Array;
  readonly remaining: number;
  /** Whole seconds until the window ends, at least 1 (for Retry-After on a 429). */
  readonly retryAfterSec: number;
}

interface Window {
  startMs: number;
  count: number;
  resetBytes: Uint8Array;
}

/** X-RateLimit-Reset of the window starting at `startMs`: its end in Unix epoch seconds. */
function resetBytes(startMs: number): Uint8Array {
  return asciiBytes(String((startMs + WINDOW_MS) / 1000));
}

export class RateLimiter {
  private readonly windows = new Map<string, Window>();
  private readonly serverBytes: Uint8Array;
  private readonly clientBytes: Uint8Array;

  constructor(private readonly limits: RateLimits) {
    this.serverBytes = asciiBytes(String(limits.server));
    this.clientBytes = asciiBytes(String(limits.client));
  }

  /** Counts one request for `key` at `nowMs`; null when this key class is unlimited. */
  take(key: KeyRecord, nowMs: number): RateDecision | null {
    const client = key.keyClass === 'client';
    const limit = client ? this.limits.client : this.limits.server;
    if (limit === 0) return null;
    const startMs = nowMs - (nowMs % WINDOW_MS);
    let window = this.windows.get(key.id);
    if (window === undefined) {
      if (this.windows.size >= SWEEP_AT_ENTRIES) this.sweep(startMs);
      window = { startMs, count: 0, resetBytes: resetBytes(startMs) };
      this.windows.set(key.id, window);
    } else if (window.startMs !== startMs) {
      window.startMs = startMs;
      window.count = 0;
      window.resetBytes = resetBytes(startMs);
    }
    window.count++;
    return {
      allowed: window.count <= limit,
      limit,
      limitBytes: client ? this.clientBytes : this.serverBytes,
      resetBytes: window.resetBytes,
      remaining: Math.max(0, limit - window.count),
      retryAfterSec: Math.max(1, Math.ceil((startMs + WINDOW_MS - nowMs) / 1000)),
    };
  }

  get trackedKeys(): number {
    return this.windows.size;
  }

  private sweep(currentStartMs: number): void {
    for (const [id, window] of this.windows) {
      if (window.startMs < currentStartMs) this.windows.delete(id);
    }
  }
}
