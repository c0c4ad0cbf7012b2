/**
 * Exact fixed-point usage amounts.
 *
 * Usage is metered in micro-units (10^-6) held as bigint so that sums never drift
 * (0.1 + 0.2 consumed is exactly 0.3) and so that a busy meter cannot overflow the
 * 2^53 range of a double within a period. Amounts cross the HTTP edge as JSON
 * numbers; `parseAmount` is the only way in and `formatMicros` (with `exactJson` on the
 * rendered reply) the only way out.
 *
 * Exact at both ends, beyond what a double holds: JSON.parse rounds a number literal of
 * more than 15 significant digits (123456789012.345678 became 123456789012.34566, and
 * 1.0000000000000000000001 became 1, passing the 6-decimal rule), so for such a body the
 * front end hands `parseAmount` the literal's own text (src/http/json-source.ts); and a
 * total of 10^9 units or more does not print exactly from a double, so `formatMicros`
 * gives those as marked decimal text that `exactJson` writes as a bare JSON number.
 */

export type Micros = bigint;

export const DECIMALS_MAX = 6;
const MICROS_PER_UNIT = 10n ** BigInt(DECIMALS_MAX);
/** Largest usage amount one request may carry; far above any real single consume. */
export const AMOUNT_UNITS_MAX = 1e12;

export type AmountParse =
  | { readonly ok: true; readonly micros: Micros }
  | {
      readonly ok: false;
      readonly reason: 'not_number' | 'not_positive' | 'too_many_decimals' | 'too_large';
    };

const AMOUNT_MICROS_MAX = BigInt(AMOUNT_UNITS_MAX) * MICROS_PER_UNIT;

/**
 * Converts a JSON number into micro-units exactly. `literal` is the number's text as the
 * client wrote it, required whenever that text has more than 15 significant digits
 * (a double does not hold it; `mayRoundInJson` tells). Without it, the shortest decimal
 * string of the double is what the client wrote, so its digits are what count; whole
 * amounts are exact as they are, and fractional ones up to EXACT_UNITS_MAX reach the same
 * answer without building that string (see `microsWithoutDigits`). Fails (as a value)
 * for non-finite, non-positive, over-precise or over-large numbers.
 */
export function parseAmount(value: unknown, literal?: string): AmountParse {
  if (typeof value !== 'number' || !Number.isFinite(value))
    return { ok: false, reason: 'not_number' };
  if (value <= 0) return { ok: false, reason: 'not_positive' };
  if (literal === undefined) {
    if (value > AMOUNT_UNITS_MAX) return { ok: false, reason: 'too_large' };
    // Whole amounts (token counts: the common case) are exact as they are (at most 10^12).
    if (Number.isInteger(value)) return { ok: true, micros: BigInt(value) * MICROS_PER_UNIT };
  }
  // A literal is judged on its exact value, so its size too (the double may have rounded below the
  // cap).
  const micros =
    literal !== undefined
      ? decimalToMicros(literal)
      : value <= EXACT_UNITS_MAX
        ? microsWithoutDigits(value)
        : quantityToMicros(value);
  if (micros === null || micros === 0n) return { ok: false, reason: 'too_many_decimals' };
  if (micros > AMOUNT_MICROS_MAX) return { ok: false, reason: 'too_large' };
  return { ok: true, micros };
}

/**
 * Whether JSON text may hold a number literal that JSON.parse rounds: one with more than
 * 15 significant digits, i.e. 16 digits in a row, a decimal point allowed among them. A
 * match elsewhere (a long digit run inside a string) only costs the exact path.
 */
export function mayRoundInJson(text: string): boolean {
  return SIXTEEN_DIGITS.test(text);
}
const SIXTEEN_DIGITS = /\d(?:\.?\d){15}/;

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
 * amounts that differ per request that promotes ~4 MB/s on the front end and brings
 * full collections (src/http/rate-limit-header.ts avoids the same for a header).
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

/**
 * Parses a non-negative decimal such as "123", "0.25", "1e-7" or "1.5E+3" (a shortest
 * double string or a JSON number literal); null beyond 6 decimals or if not such text.
 */
function decimalToMicros(text: string): Micros | null {
  const match = /^(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(text);
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

/**
 * Below this many micro-units (10^9 units) an amount has at most 15 significant digits,
 * so the double nearest it prints as exactly its decimal.
 */
const EXACT_NUMBER_MICROS = 10n ** 15n;

/**
 * Marks decimal text that `exactJson` must write as a bare number. A lone surrogate: no
 * string a client sends can hold one (src/http/body.ts refuses them), and JSON.stringify
 * escapes it as `\udfff`, so the mark cannot be forged or survive unnoticed.
 */
const LARGE_MARK = '\udfff';
const LARGE_MARKED = /"\\udfff(-?\d+(?:\.\d+)?)"/g;

/** An amount ready for JSON.stringify: a number, or decimal text marked for `exactJson`. */
export type AmountJson = number | (string & { readonly __largeAmount: true });

/** Renders micro-units for a reply: exact at any size once the reply passes `exactJson`. */
export function formatMicros(micros: Micros): AmountJson {
  const value = exactAmountValue(micros);
  return typeof value === 'number' ? value : ((LARGE_MARK + value) as AmountJson);
}

/** Exact decimal text of micro-units: "12", "0.5", "-3.000001". */
export function microsToDecimal(micros: Micros): string {
  const sign = micros < 0n ? '-' : '';
  const magnitude = micros < 0n ? -micros : micros;
  const whole = magnitude / MICROS_PER_UNIT;
  const fraction = (magnitude % MICROS_PER_UNIT)
    .toString()
    .padStart(DECIMALS_MAX, '0')
    .replace(/0+$/, '');
  return `${sign}${whole}${fraction === '' ? '' : `.${fraction}`}`;
}

/**
 * Whole units below this (10^15) are integers a double holds exactly, and JSON.stringify
 * prints them digit for digit (it switches to exponents only from 10^21).
 */
const EXACT_WHOLE_MICROS = 10n ** 21n;

/**
 * An amount as a plain JSON value (replies, the audit log): a number while a double
 * spells it exactly (below 10^9 units, or a whole number of units below 10^15), else its
 * exact decimal text. The whole-number case keeps large allowances such as 10^9 included
 * API calls off the slower text path.
 */
export function exactAmountValue(micros: Micros): number | string {
  if (micros < EXACT_NUMBER_MICROS && micros > -EXACT_NUMBER_MICROS) return Number(micros) / 1e6;
  if (
    micros < EXACT_WHOLE_MICROS &&
    micros > -EXACT_WHOLE_MICROS &&
    micros % MICROS_PER_UNIT === 0n
  )
    return Number(micros / MICROS_PER_UNIT);
  return microsToDecimal(micros);
}

/**
 * Writes every marked amount in JSON text (made by JSON.stringify) as the bare number it
 * spells. A mark is written as an escape, so text without a backslash has none: the
 * one-character search (memchr) settles most replies, which hold no escape at all, at a
 * fraction of the cost of searching for the mark itself.
 */
export function exactJson(json: string): string {
  return json.includes('\\') && json.includes('"\\udfff') ? json.replace(LARGE_MARKED, '$1') : json;
}

export function minMicros(a: Micros, b: Micros): Micros {
  return a < b ? a : b;
}
