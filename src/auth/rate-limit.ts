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
import { rateLimitLines, type RateLimitLines } from '../http/rate-limit-header.js';

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
 * reset lines are encoded once per key and window, so that writing the headers converts
 * no string per request (src/http/rate-limit-header.ts).
 */
export interface RateDecision {
  readonly allowed: boolean;
  readonly limit: number;
  /** X-RateLimit-Limit and X-RateLimit-Reset, shared by the whole window. */
  readonly lines: RateLimitLines;
  readonly remaining: number;
  /** Whole seconds until the window ends, at least 1 (for Retry-After on a 429). */
  readonly retryAfterSec: number;
}

interface Window {
  startMs: number;
  count: number;
  lines: RateLimitLines;
}

/**
 * The header lines of a window starting at `startMs`: X-RateLimit-Reset is its end in Unix epoch
 * seconds.
 */
function linesOf(limit: number, startMs: number): RateLimitLines {
  return rateLimitLines(limit, (startMs + WINDOW_MS) / 1000);
}

export class RateLimiter {
  private readonly windows = new Map<string, Window>();

  constructor(private readonly limits: RateLimits) {}

  /** Counts one request for `key` at `nowMs`; null when this key class is unlimited. */
  take(key: KeyRecord, nowMs: number): RateDecision | null {
    const client = key.keyClass === 'client';
    const limit = client ? this.limits.client : this.limits.server;
    if (limit === 0) return null;
    const startMs = nowMs - (nowMs % WINDOW_MS);
    let window = this.windows.get(key.id);
    if (window === undefined) {
      if (this.windows.size >= SWEEP_AT_ENTRIES) this.sweep(startMs);
      window = { startMs, count: 0, lines: linesOf(limit, startMs) };
      this.windows.set(key.id, window);
    } else if (window.startMs !== startMs) {
      window.startMs = startMs;
      window.count = 0;
      window.lines = linesOf(limit, startMs);
    }
    window.count++;
    return {
      allowed: window.count <= limit,
      limit,
      lines: window.lines,
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
