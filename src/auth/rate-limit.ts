/**
 * Rate limits: fixed one-minute windows aligned to the whole minute (UTC).
 *
 * Server (and operator) keys have one budget per key, 1000 requests a minute by default
 * (TALLY_RATE_LIMIT_SERVER). Every request that authenticated counts, whatever it
 * answers (403s included).
 *
 * A client key is public: every visitor of the application's pages shares it, and an
 * attacker can copy it. One budget per key would let one visitor lock all others out,
 * so client-key traffic has three: per key (large: 10,000 a minute,
 * TALLY_RATE_LIMIT_CLIENT), per key and client address (200, the figure a single
 * visitor is held to, TALLY_RATE_LIMIT_CLIENT_ADDRESS), and per key and customer on
 * customer reads (600, TALLY_RATE_LIMIT_CLIENT_CUSTOMER). A request is admitted only if
 * every budget it belongs to has room, and only an admitted request is counted: a
 * flood that is refused costs the flooder's own budget nothing more and everyone else's
 * nothing at all. The headers describe the budget closest to running out.
 *
 * Only authenticated keys are tracked, so an unauthenticated flood cannot grow these
 * tables; entries of past windows are swept once a table passes its bound. An address
 * or customer the full tables have no room for in the current window is not tracked
 * (its requests still count against the key's budget): a flood of addresses cannot
 * make the front end run out of memory, nor lock out visitors it has not seen yet.
 * 0 turns a budget off; all three at 0, client keys are unlimited and get no headers.
 *
 * With several front-end threads (TALLY_FRONTENDS), a server or operator key's window is kept
 * in memory they share (shared-budgets.ts): one budget per key, whichever thread counts it.
 * Client keys are served by the first front end alone, so their tables stay its own.
 */
import type { KeyRecord } from '../../storage/control-store.js';
import type { AddressKey } from '../http/client-address.js';
import { rateLimitLines, type RateLimitLines } from '../http/rate-limit-header.js';
import type { SharedBudgets } from './shared-budgets.js';

export const WINDOW_MS = 60_000;
export const DEFAULT_RATE_LIMITS: Required<RateLimits> = {
  server: 1000,
  client: 10_000,
  clientAddress: 200,
  clientCustomer: 600,
};

/** Past-window entries are swept when the table reaches this size (keys are few). */
const SWEEP_AT_ENTRIES = 10_000;
/** Address and customer windows tracked per client key (a few MB at most). */
const CLIENT_BUCKETS_MAX = 100_000;

export interface RateLimits {
  /** Requests per minute for server (and operator) keys; 0 = unlimited, no headers. */
  readonly server: number;
  /** Requests per minute for each client key, all visitors together; 0 = unlimited. */
  readonly client: number;
  /** Requests per minute for each client key from one client address (default 200). */
  readonly clientAddress?: number;
  /** Customer reads per minute for each client key and customer (default 600). */
  readonly clientCustomer?: number;
}

/** Which budget a decision is about; it words the 429's message. */
export type RateScope =
  | 'for this key'
  | 'for this key from one address'
  | 'for this key and customer';

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
  readonly scope: RateScope;
}

interface Window {
  startMs: number;
  count: number;
  lines: RateLimitLines;
}

/** The windows of one kind of client budget, and the window its last sweep was in. */
interface Buckets<K> {
  readonly windows: Map<K, Window>;
  sweptStartMs: number;
}

/** A client key's budgets. */
interface ClientWindows {
  readonly key: Window;
  readonly addresses: Buckets<AddressKey>;
  readonly customers: Buckets<string>;
}

/**
 * The header lines of a window starting at `startMs`: X-RateLimit-Reset is its end in Unix epoch
 * seconds.
 */
function linesOf(limit: number, startMs: number): RateLimitLines {
  return rateLimitLines(limit, (startMs + WINDOW_MS) / 1000);
}

function retryAfterSec(startMs: number, nowMs: number): number {
  return Math.max(1, Math.ceil((startMs + WINDOW_MS - nowMs) / 1000));
}

export class RateLimiter {
  private readonly windows = new Map<string, Window>();
  private readonly clients = new Map<string, ClientWindows>();
  private readonly addressLimit: number;
  private readonly customerLimit: number;
  /** The header lines of the current window, per limit: shared by all its windows. */
  private readonly linesByLimit = new Map<number, RateLimitLines>();
  private linesStartMs = -1;
  /** The client key looked up last and its windows. */
  private lastClientId = '';
  private lastClientWindows: ClientWindows | null = null;

  /** `shared`: the per-key windows of server and operator keys, when several threads count. */
  constructor(
    private readonly limits: RateLimits,
    private readonly shared: SharedBudgets | null = null,
  ) {
    this.addressLimit = limits.clientAddress ?? DEFAULT_RATE_LIMITS.clientAddress;
    this.customerLimit = limits.clientCustomer ?? DEFAULT_RATE_LIMITS.clientCustomer;
  }

  /** Whether client keys have a per-address budget (else their address need not be read). */
  get limitsAddresses(): boolean {
    return this.addressLimit > 0;
  }

  /** Whether client keys are limited at all (else they get no headers). */
  get limitsClients(): boolean {
    return this.limits.client + this.addressLimit + this.customerLimit > 0;
  }

  /**
   * Counts one request for a server or operator key at `nowMs`; null when unlimited.
   * (Client keys use `takeClient`; `take` on one applies only the per-key budget.)
   */
  take(key: KeyRecord, nowMs: number): RateDecision | null {
    const client = key.keyClass === 'client';
    const limit = client ? this.limits.client : this.limits.server;
    if (limit === 0) return null;
    const startMs = nowMs - (nowMs % WINDOW_MS);
    const slot = this.shared === null || client ? -1 : this.shared.slotOf(key.id);
    if (slot >= 0) {
      const count = (this.shared as SharedBudgets).count(slot, startMs / WINDOW_MS);
      return this.decision(count <= limit, limit, 'for this key', limit - count, startMs, nowMs);
    }
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
      retryAfterSec: retryAfterSec(startMs, nowMs),
      scope: 'for this key',
    };
  }

  /**
   * Admits a client-key request from `address` at `nowMs` if both the key's and the
   * address's budgets have room, and only then counts it against both; null when client
   * keys are unlimited. A customer read then also takes `takeCustomer`.
   */
  takeClient(key: KeyRecord, address: AddressKey, nowMs: number): RateDecision | null {
    if (!this.limitsClients) return null;
    const startMs = nowMs - (nowMs % WINDOW_MS);
    const windows = this.clientWindows(key.id, startMs);
    const keyWindow = this.current(windows.key, this.limits.client, startMs);
    const addressWindow = this.bucket(windows.addresses, address, this.addressLimit, startMs);
    const refused =
      this.full(keyWindow, this.limits.client, 'for this key', startMs, nowMs) ??
      this.full(addressWindow, this.addressLimit, 'for this key from one address', startMs, nowMs);
    if (refused !== null) return refused;
    keyWindow.count++;
    if (addressWindow !== null) addressWindow.count++;
    return this.closest(
      keyWindow,
      this.limits.client,
      'for this key',
      addressWindow,
      this.addressLimit,
      'for this key from one address',
      startMs,
      nowMs,
    );
  }

  /**
   * The customer budget of a client-key read already admitted by `takeClient` (whose
   * decision is `admitted`). When the customer's budget is used up, the request is
   * refused and uncounted again from the key's and the address's budgets.
   */
  takeCustomer(
    key: KeyRecord,
    address: AddressKey,
    customerId: string,
    admitted: RateDecision,
    nowMs: number,
  ): RateDecision {
    const startMs = nowMs - (nowMs % WINDOW_MS);
    const windows = this.clientWindows(key.id, startMs);
    const customerWindow = this.bucket(windows.customers, customerId, this.customerLimit, startMs);
    if (customerWindow === null) return admitted;
    const refused = this.full(
      customerWindow,
      this.customerLimit,
      'for this key and customer',
      startMs,
      nowMs,
    );
    if (refused !== null) {
      this.untakeClient(key, address, nowMs);
      return refused;
    }
    customerWindow.count++;
    const remaining = this.customerLimit - customerWindow.count;
    return remaining < admitted.remaining
      ? this.decision(
          true,
          this.customerLimit,
          'for this key and customer',
          remaining,
          startMs,
          nowMs,
        )
      : admitted;
  }

  /**
   * Takes back what `takeClient` counted for a request at `nowMs` that was then refused
   * (a customer budget used up, a bad customer token): refused requests count nowhere.
   */
  untakeClient(key: KeyRecord, address: AddressKey, nowMs: number): void {
    const windows = this.clients.get(key.id);
    if (windows === undefined) return;
    const startMs = nowMs - (nowMs % WINDOW_MS);
    if (windows.key.startMs === startMs && windows.key.count > 0) windows.key.count--;
    const addressWindow = windows.addresses.windows.get(address);
    if (addressWindow !== undefined && addressWindow.startMs === startMs && addressWindow.count > 0)
      addressWindow.count--;
  }

  get trackedKeys(): number {
    return this.windows.size + this.clients.size;
  }

  private clientWindows(keyId: string, startMs: number): ClientWindows {
    // `takeCustomer` follows `takeClient` for the same key: skip the second lookup.
    if (keyId === this.lastClientId && this.lastClientWindows !== null)
      return this.lastClientWindows;
    let windows = this.clients.get(keyId);
    if (windows === undefined) {
      if (this.clients.size >= SWEEP_AT_ENTRIES) this.clients.clear();
      windows = {
        key: { startMs, count: 0, lines: this.linesOf(this.limits.client, startMs) },
        addresses: { windows: new Map(), sweptStartMs: -1 },
        customers: { windows: new Map(), sweptStartMs: -1 },
      };
      this.clients.set(keyId, windows);
    }
    this.lastClientId = keyId;
    this.lastClientWindows = windows;
    return windows;
  }

  /** `window` moved to the window starting at `startMs`. */
  private current(window: Window, limit: number, startMs: number): Window {
    if (window.startMs !== startMs) {
      window.startMs = startMs;
      window.count = 0;
      window.lines = this.linesOf(limit, startMs);
    }
    return window;
  }

  /**
   * The current window of `id` in `buckets`; null when its budget is off, or when the table
   * is full of current windows (the id then goes untracked this minute). A full table is
   * swept of past windows at most once per window, so a flood of new ids costs one sweep,
   * not one per request.
   */
  private bucket<K>(buckets: Buckets<K>, id: K, limit: number, startMs: number): Window | null {
    if (limit === 0) return null;
    const table = buckets.windows;
    const window = table.get(id);
    if (window !== undefined) return this.current(window, limit, startMs);
    if (table.size >= CLIENT_BUCKETS_MAX) {
      if (buckets.sweptStartMs === startMs) return null;
      buckets.sweptStartMs = startMs;
      for (const [other, old] of table) if (old.startMs < startMs) table.delete(other);
      if (table.size >= CLIENT_BUCKETS_MAX) return null;
    }
    const created = { startMs, count: 0, lines: this.linesOf(limit, startMs) };
    table.set(id, created);
    return created;
  }

  /** A refusal when `window` has no room left, else null. */
  private full(
    window: Window | null,
    limit: number,
    scope: RateScope,
    startMs: number,
    nowMs: number,
  ): RateDecision | null {
    if (window === null || limit === 0 || window.count < limit) return null;
    return this.decision(false, limit, scope, 0, startMs, nowMs);
  }

  /** The admitted decision of whichever of two budgets has fewer requests left. */
  private closest(
    a: Window,
    aLimit: number,
    aScope: RateScope,
    b: Window | null,
    bLimit: number,
    bScope: RateScope,
    startMs: number,
    nowMs: number,
  ): RateDecision {
    const aLeft = aLimit === 0 ? Number.MAX_SAFE_INTEGER : aLimit - a.count;
    const bLeft = b === null ? Number.MAX_SAFE_INTEGER : bLimit - b.count;
    return aLeft <= bLeft
      ? this.decision(true, aLimit, aScope, aLeft, startMs, nowMs)
      : this.decision(true, bLimit, bScope, bLeft, startMs, nowMs);
  }

  private decision(
    allowed: boolean,
    limit: number,
    scope: RateScope,
    remaining: number,
    startMs: number,
    nowMs: number,
  ): RateDecision {
    return {
      allowed,
      limit,
      lines: this.linesOf(limit, startMs),
      remaining: Math.min(Math.max(0, remaining), limit),
      retryAfterSec: retryAfterSec(startMs, nowMs),
      scope,
    };
  }

  /** The header lines of `limit` for the window at `startMs`, made once per limit and window. */
  private linesOf(limit: number, startMs: number): RateLimitLines {
    if (startMs !== this.linesStartMs) {
      this.linesByLimit.clear();
      this.linesStartMs = startMs;
    }
    let lines = this.linesByLimit.get(limit);
    if (lines === undefined) {
      lines = linesOf(limit, startMs);
      this.linesByLimit.set(limit, lines);
    }
    return lines;
  }

  private sweep(currentStartMs: number): void {
    for (const [id, window] of this.windows) {
      if (window.startMs < currentStartMs) this.windows.delete(id);
    }
  }
}
