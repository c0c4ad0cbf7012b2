/**
 * The three `X-RateLimit-*` response headers, written as one header value.
 *
 * Why this exists: these headers go on every keyed reply, so their cost is the limiter's
 * cost on the hot path (issue target: under 5% on `has`). Two things made them expensive:
 *
 * - `String(n)`, `${n}` and `n.toString()` go through V8's number-to-string cache, a
 *   table in the old generation. X-RateLimit-Remaining counts down by one per request, so
 *   each reply put a new string into that table, which kept it alive across the next
 *   scavenge: under load ~2 MB was promoted per scavenge, scavenges took 3–6 ms instead of
 *   0.3 ms and full collections followed (`has` lost ~20% and its p99 went from ~1 ms to
 *   ~6 ms; README, Performance). The digits are therefore written as bytes here.
 * - Three `writeHeader` calls cost three crossings into native code, each converting its
 *   strings to UTF-8. uWS writes a header as `name: value\r\n` from the bytes it is given,
 *   so one call whose value holds the other two lines puts exactly the same three header
 *   lines on the wire (measured: ~3% of `has` throughput). The value is built in one
 *   scratch buffer from pre-encoded pieces and returned as a preallocated view of it, so
 *   nothing is allocated per reply. uWS copies a header into its cork buffer inside
 *   `writeHeader`, so the scratch is free again once that call returns; the view must not
 *   be kept beyond it. test/rate-limit.test.ts reads the three headers back over HTTP.
 */

const ENCODER = new TextEncoder();

/** The limit and reset values as ASCII bytes, encoded once (per limiter, per window). */
export function asciiBytes(text: string): Uint8Array {
  return ENCODER.encode(text);
}

/** `x-ratelimit-limit` is the name of the `writeHeader` call; these follow its value. */
export const RATE_LIMIT_HEADER_NAME = 'x-ratelimit-limit';
const REMAINING_LINE = asciiBytes('\r\nx-ratelimit-remaining: ');
const RESET_LINE = asciiBytes('\r\nx-ratelimit-reset: ');

/**
 * A JSON reply's content type and the three lines in one call: written under
 * `content-type`, with this before the limit (`jsonWithRateLimitValue`). One native call
 * fewer per keyed JSON reply than writing the content type on its own.
 */
const JSON_THEN_LIMIT = asciiBytes('application/json\r\nx-ratelimit-limit: ');

/** Number.MAX_SAFE_INTEGER has 16 decimal digits; the limit and reset are such numbers too. */
const DIGITS_MAX = 16;
const VALUE_BYTES_MAX = JSON_THEN_LIMIT.length + DIGITS_MAX * 3 + REMAINING_LINE.length + RESET_LINE.length;

const scratch = new Uint8Array(VALUE_BYTES_MAX);
/** views[n]: the first n bytes of `scratch`. */
const views: readonly Uint8Array[] = Array.from({ length: VALUE_BYTES_MAX + 1 }, (_, n) => scratch.subarray(0, n));

const ZERO = 0x30;

/**
 * The value to write under RATE_LIMIT_HEADER_NAME: `<limit>\r\nx-ratelimit-remaining:
 * <remaining>\r\nx-ratelimit-reset: <reset>`, valid until the next call. `remaining` must
 * be a non-negative safe integer and the two byte strings at most 16 ASCII digits each;
 * anything else throws a RangeError (a caller bug: the limiter makes these).
 */
export function rateLimitHeaderValue(limit: Uint8Array, remaining: number, reset: Uint8Array): Uint8Array {
  return headerValue(0, limit, remaining, reset);
}

/**
 * The value to write under `content-type` for a keyed JSON reply: `application/json`, then
 * the three lines as `rateLimitHeaderValue` writes them. Same rules and lifetime.
 */
export function jsonWithRateLimitValue(limit: Uint8Array, remaining: number, reset: Uint8Array): Uint8Array {
  scratch.set(JSON_THEN_LIMIT, 0);
  return headerValue(JSON_THEN_LIMIT.length, limit, remaining, reset);
}

function headerValue(start: number, limit: Uint8Array, remaining: number, reset: Uint8Array): Uint8Array {
  if (!Number.isSafeInteger(remaining) || remaining < 0) throw new RangeError(`remaining must be a non-negative safe integer, got ${remaining}`);
  if (limit.length > DIGITS_MAX || reset.length > DIGITS_MAX) throw new RangeError('limit and reset must be at most 16 digits');
  scratch.set(limit, start);
  let at = start + limit.length;
  scratch.set(REMAINING_LINE, at);
  at += REMAINING_LINE.length;
  let digits = 1;
  for (let rest = remaining; rest >= 10; rest = Math.floor(rest / 10)) digits++;
  let rest = remaining;
  for (let i = at + digits - 1; i >= at; i--) {
    scratch[i] = ZERO + (rest % 10);
    rest = Math.floor(rest / 10);
  }
  at += digits;
  scratch.set(RESET_LINE, at);
  at += RESET_LINE.length;
  scratch.set(reset, at);
  at += reset.length;
  return views[at] as Uint8Array;
}
