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
/** Largest usage amount one request may carry; far above any real single consume. */
export const AMOUNT_UNITS_MAX = 1e12;

export type AmountParse =
  | { readonly ok: true; readonly micros: Micros }
  | { readonly ok: false; readonly reason: 'not_number' | 'not_positive' | 'too_many_decimals' | 'too_large' };

/**
 * Converts a JSON number into micro-units without floating-point arithmetic: the
 * shortest decimal string of the double is what the client wrote, so its digits are
 * taken literally. Fails (as a value) for non-finite, non-positive, over-precise or
 * over-large numbers.
 */
export function parseAmount(value: unknown): AmountParse {
  if (typeof value !== 'number' || !Number.isFinite(value)) return { ok: false, reason: 'not_number' };
  if (value <= 0) return { ok: false, reason: 'not_positive' };
  if (value > AMOUNT_UNITS_MAX) return { ok: false, reason: 'too_large' };
  const micros = decimalToMicros(String(value));
  if (micros === null) return { ok: false, reason: 'too_many_decimals' };
  if (micros === 0n) return { ok: false, reason: 'too_many_decimals' };
  return { ok: true, micros };
}

/** Converts a configured non-negative quantity (e.g. `included`) to micro-units, or null. */
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
