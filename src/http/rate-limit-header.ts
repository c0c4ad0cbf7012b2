/**
 * The three `X-RateLimit-*` response headers, written as one header value.
 *
 * Why this exists: these headers go on every keyed reply, so their cost is the limiter's
 * cost on the hot path (target: under 5% on `has`; docs/performance.md). Three things
 * would make them expensive:
 *
 * - `String(n)`, `${n}` and `n.toString()` go through V8's number-to-string cache, a
 *   table in the old generation. X-RateLimit-Remaining counts down by one per request, so
 *   each reply would put a new string into that table, which keeps it alive across the
 *   next scavenge: under load that promotes ~2 MB per scavenge, scavenges take 3–6 ms
 *   instead of 0.3 ms and full collections follow (`has` loses ~20% and its p99 rises
 *   from ~1 ms to ~6 ms). The digits are therefore written as bytes here.
 * - Three `writeHeader` calls cost three crossings into native code, each converting its
 *   strings to UTF-8. uWS writes a header as `name: value\r\n` from the bytes it is given,
 *   so one call whose value holds the other two lines puts exactly the same three header
 *   lines on the wire (measured: ~3% of `has` throughput).
 * - Assembling that value from four pieces per reply (four typed-array copies) costs more
 *   than the accounting itself. Only `remaining` changes from one reply to the next, so
 *   the lines go out in the order limit, reset, remaining: everything before the digits is
 *   a per-window prefix (`rateLimitLines`, encoded when a key's window starts), which
 *   stays in the scratch buffer while consecutive replies share it. A reply then writes
 *   only its digits. Header order carries no meaning in HTTP (RFC 9110 §5.3).
 *
 * The value is returned as a preallocated view of the scratch buffer, so nothing is
 * allocated per reply. uWS copies a header into its cork buffer inside `writeHeader`, so
 * the scratch is free again once that call returns; the view must not be kept beyond it.
 * test/rate-limit.test.ts reads the three headers back over HTTP.
 */

const ENCODER = new TextEncoder();

/** `x-ratelimit-limit` is the name of the `writeHeader` call; these follow its value. */
export const RATE_LIMIT_HEADER_NAME = 'x-ratelimit-limit';

/**
 * A JSON reply's content type and the three lines in one call: written under
 * `content-type`, with this before the limit (`jsonWithRateLimitValue`). One native call
 * fewer per keyed JSON reply than writing the content type on its own.
 */
const JSON_THEN_LIMIT = 'application/json\r\nx-ratelimit-limit: ';

/** Number.MAX_SAFE_INTEGER has 16 decimal digits; the limit and reset are such numbers too. */
const DIGITS_MAX = 16;

/**
 * Everything of the value up to the remaining count's digits, for one limit and one
 * window: `application/json\r\nx-ratelimit-limit: <limit>\r\nx-ratelimit-reset: <reset>
 * \r\nx-ratelimit-remaining: ` as ASCII bytes. Make one per window (it is compared by
 * identity to skip the copy when consecutive replies share it) and keep it unchanged.
 */
export type RateLimitLines = Uint8Array & { readonly __rateLimitLines: true };

/**
 * The prefix for `limit` requests per window ending at `resetSec` (Unix seconds); both safe
 * integers ≥ 0.
 */
export function rateLimitLines(limit: number, resetSec: number): RateLimitLines {
  for (const value of [limit, resetSec]) {
    if (!Number.isSafeInteger(value) || value < 0)
      throw new RangeError(`limit and reset must be non-negative safe integers, got ${value}`);
  }
  return ENCODER.encode(
    `${JSON_THEN_LIMIT}${limit}\r\nx-ratelimit-reset: ${resetSec}\r\nx-ratelimit-remaining: `,
  ) as RateLimitLines;
}

const PREFIX_BYTES_MAX = rateLimitLines(Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER).length;
const VALUE_BYTES_MAX = PREFIX_BYTES_MAX + DIGITS_MAX;
/** Where the value written under RATE_LIMIT_HEADER_NAME starts: after the content type's part. */
const LIMIT_AT = JSON_THEN_LIMIT.length;

const scratch = new Uint8Array(VALUE_BYTES_MAX);
/** The prefix `scratch` holds now (null: none yet). */
let held: RateLimitLines | null = null;
/** jsonViews[n]: scratch bytes 0..n; limitViews[n]: bytes LIMIT_AT..n. */
const jsonViews: readonly Uint8Array[] = Array.from({ length: VALUE_BYTES_MAX + 1 }, (_, n) =>
  scratch.subarray(0, n),
);
const limitViews: readonly Uint8Array[] = Array.from({ length: VALUE_BYTES_MAX + 1 }, (_, n) =>
  scratch.subarray(Math.min(LIMIT_AT, n), n),
);

const ZERO = 0x30;

/** Puts `lines` then `remaining`'s digits in the scratch buffer; returns the end offset. */
function fill(lines: RateLimitLines, remaining: number): number {
  if (!Number.isSafeInteger(remaining) || remaining < 0)
    throw new RangeError(`remaining must be a non-negative safe integer, got ${remaining}`);
  if (held !== lines) {
    scratch.set(lines, 0);
    held = lines;
  }
  let digits = 1;
  for (let power = 10; power <= remaining; power *= 10) digits++;
  const at = lines.length;
  let i = at + digits - 1;
  let rest = remaining;
  // Below 2^31 the digits come from int32 arithmetic, which V8 runs without float division.
  for (; rest > 0x7fffffff; i--) {
    scratch[i] = ZERO + (rest % 10);
    rest = Math.floor(rest / 10);
  }
  for (let small = rest | 0; i >= at; i--) {
    const next = (small / 10) | 0;
    scratch[i] = ZERO + small - next * 10;
    small = next;
  }
  return at + digits;
}

/**
 * The value to write under `content-type` for a keyed JSON reply: `application/json`,
 * then the lines `x-ratelimit-limit`, `x-ratelimit-reset` and `x-ratelimit-remaining`,
 * valid until the next call. `remaining` must be a non-negative safe integer (a
 * RangeError otherwise: a caller bug, the limiter makes these).
 */
export function jsonWithRateLimitValue(lines: RateLimitLines, remaining: number): Uint8Array {
  return jsonViews[fill(lines, remaining)] as Uint8Array;
}

/**
 * The value to write under RATE_LIMIT_HEADER_NAME for a reply of another type: the same three
 * lines.
 */
export function rateLimitHeaderValue(lines: RateLimitLines, remaining: number): Uint8Array {
  return limitViews[fill(lines, remaining)] as Uint8Array;
}
