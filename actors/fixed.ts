/**
 * Exact fixed-point usage amounts.
 *
 * Usage is metered in micro-units (10^-6) held as bigint so that sums never drift
 * (0.1 + 0.2 consumed is exactly 0.3) and so that a busy meter cannot overflow the
 * 2^53 range of a double within a period. Amounts cross the HTTP edge as JSON
 * numbers; `parseAmount` is the only way in and `formatMicros` the only way out.
 */

export type Micros = bigint;

export const DECIMALS_MAX = 6;
const MICROS_PER_UNIT = 10n ** BigInt(DECIMALS_MAX);
/** Largest usage amount one request may carry; far above any real single consume. */
export const AMOUNT_UNITS_MAX = 1e12;

export type AmountParse =
  | { readonly ok: true; readonly micros: Micros }
  | { readonly ok: false; readonly reason: 'not_number' | 'not_positive' | 'too_many_decimals' | 'too_large' };

/**
 * Converts a JSON number into micro-units exactly. The shortest decimal string of the
 * double is what the client wrote, so its digits are what count; whole amounts are exact
 * as they are, and fractional ones up to EXACT_UNITS_MAX reach the same answer without
 * building that string (see `microsWithoutDigits`). Fails (as a value) for non-finite,
 * non-positive, over-precise or over-large numbers.
 */
export function parseAmount(value: unknown): AmountParse {
  if (typeof value !== 'number' || !Number.isFinite(value)) return { ok: false, reason: 'not_number' };
  if (value <= 0) return { ok: false, reason: 'not_positive' };
  if (value > AMOUNT_UNITS_MAX) return { ok: false, reason: 'too_large' };
  // Whole amounts (token counts: the common case) are exact as they are (at most 10^12).
  if (Number.isInteger(value)) return { ok: true, micros: BigInt(value) * MICROS_PER_UNIT };
  const micros = value <= EXACT_UNITS_MAX ? microsWithoutDigits(value) : quantityToMicros(value);
  if (micros === null) return { ok: false, reason: 'too_many_decimals' };
  if (micros === 0n) return { ok: false, reason: 'too_many_decimals' };
  return { ok: true, micros };
}

/**
 * Below this many units, value × 10^6 stays under 2^43, where a double's spacing is
 * 2^-9: the rounding errors of the product (and of the double standing for the client's
 * decimal) are far below the 0.5 that rounding to the nearest micro-unit tolerates.
 */
export const EXACT_UNITS_MAX = 2 ** 43 / 1e6;

/**
 * The micro-units of `value` (0 < value <= EXACT_UNITS_MAX), or null beyond 6 decimals,
 * exactly as the digit path (`quantityToMicros`) finds them, without String(). Why:
 * String() routes every distinct number through V8's number-string cache, an
 * old-generation table that keeps each new string alive into the next scavenge; with
 * amounts that differ per request that promoted ~4 MB/s on the front end and brought
 * full collections (README, Performance; src/http/rate-limit-header.ts has the same
 * story for a header).
 * Correct because: if the client's decimal d has at most 6 decimals, d = k / 10^6 and
 * value is the double nearest d, so value × 10^6 rounds to k and k / 10^6 (correctly
 * rounded) is value again; if the check fails, no 6-decimal number has value as its
 * nearest double, so its shortest decimal has more than 6 decimals.
 * test/core-customer.test.ts checks it against `quantityToMicros` with fast-check.
 */
function microsWithoutDigits(value: number): Micros | null {
  const micros = Math.round(value * 1e6);
  return micros / 1e6 === value ? BigInt(micros) : null;
}

/**
 * Converts a non-negative number to the micro-units its shortest decimal string spells
 * (a configured quantity such as `included`, or an amount beyond EXACT_UNITS_MAX), or
 * null beyond 6 decimals.
 */
export function quantityToMicros(value: number): Micros | null {
  if (!Number.isFinite(value) || value < 0) return null;
  return decimalToMicros(String(value));
}

/** Parses "123", "0.25" or "1e-7"-style shortest double strings; null beyond 6 decimals. */
function decimalToMicros(text: string): Micros | null {
  const match = /^(\d+)(?:\.(\d+))?(?:e([+-]?\d+))?$/.exec(text);
  if (match === null) return null;
  const intPart = match[1] ?? '0';
  const fracPart = match[2] ?? '';
  const exponent = Number(match[3] ?? '0');
  // Shift the decimal point by the exponent, then require at most 6 fractional digits.
  const digits = intPart + fracPart;
  const pointAt = intPart.length + exponent;
  const fracDigits = digits.length - pointAt;
  if (fracDigits > DECIMALS_MAX) {
    const extra = digits.slice(digits.length - (fracDigits - DECIMALS_MAX));
    if (!/^0*$/.test(extra)) return null;
    return BigInt(digits.slice(0, digits.length - (fracDigits - DECIMALS_MAX)) || '0');
  }
  return BigInt(digits) * 10n ** BigInt(DECIMALS_MAX - fracDigits);
}

/** Renders micro-units as a JSON-ready number (exact for anything below 2^53 micros). */
export function formatMicros(micros: Micros): number {
  return Number(micros) / 1e6;
}

export function minMicros(a: Micros, b: Micros): Micros {
  return a < b ? a : b;
}
