/**
 * The source text of one member of a JSON object, for the rare request whose numbers
 * JSON.parse cannot hold exactly (actors/fixed.ts, `mayRoundInJson`).
 *
 * It scans text that JSON.parse has already accepted, so it only has to be right on
 * valid JSON: it walks the top-level object's members, decodes each name as JSON.parse
 * would (escapes included), skips each value (strings, nesting, literals) and keeps the
 * text of the last member with the wanted name, because JSON.parse keeps the last one too.
 */

import { mayRoundInJson } from '../../actors/fixed.js';

/**
 * The dotted path (as `check` names fields: `entitlements.tokens.included`, `a.0`) of the
 * first number in the JSON `text` whose literal JSON.parse could not keep exactly, or null
 * when every number came through unchanged. Only literals of 16 or more digits can round
 * (`mayRoundInJson`); each is compared, as a decimal, with the double JSON.parse made of it.
 */
export function roundedNumberPath(text: string): string | null {
  return roundedIn(text, skipSpace(text, 0), '').path;
}

interface Walk {
  readonly end: number;
  readonly path: string | null;
}

function roundedIn(text: string, at: number, path: string): Walk {
  const first = text[at];
  const within = (name: string): string => (path === '' ? name : `${path}.${name}`);
  if (first === '{' || first === '[') {
    const close = first === '{' ? '}' : ']';
    let i = skipSpace(text, at + 1);
    for (let index = 0; text[i] !== close && i < text.length; index++) {
      let name = String(index);
      if (first === '{') {
        const nameEnd = stringEnd(text, i);
        name = JSON.parse(text.slice(i, nameEnd)) as string;
        i = skipSpace(text, skipSpace(text, nameEnd) + 1); // past the colon
      }
      const member = roundedIn(text, i, within(name));
      if (member.path !== null) return member;
      i = skipSpace(text, member.end);
      if (text[i] === ',') i = skipSpace(text, i + 1);
    }
    return { end: i + 1, path: null };
  }
  const end = valueEndAt(text, at);
  if (first !== '-' && (first === undefined || first < '0' || first > '9'))
    return { end, path: null };
  const literal = text.slice(at, end);
  const rounded =
    mayRoundInJson(literal) && decimalKey(literal) !== decimalKey(String(Number(literal)));
  return { end, path: rounded ? path : null };
}

/**
 * A number's text reduced to sign, significant digits and exponent, so equal values compare equal.
 */
function decimalKey(text: string): string {
  const match = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(text);
  if (match === null) return `not finite: ${text}`;
  const [, sign = '', whole = '', fraction = '', exponent = '0'] = match;
  const all = whole + fraction;
  const significant = all.replace(/^0+/, '');
  const digits = significant.replace(/0+$/, '');
  if (digits === '') return '0';
  return `${sign}${digits}e${whole.length + Number(exponent) - (all.length - significant.length)}`;
}

/** The raw text of top-level member `name` of the object `text` spells, or undefined. */
export function memberSource(text: string, name: string): string | undefined {
  let at = skipSpace(text, 0);
  if (text[at] !== '{') return undefined;
  at = skipSpace(text, at + 1);
  let found: string | undefined;
  while (text[at] === '"') {
    const nameEnd = stringEnd(text, at);
    const memberName = JSON.parse(text.slice(at, nameEnd)) as string;
    at = skipSpace(text, skipSpace(text, nameEnd) + 1); // past the colon
    const valueEnd = valueEndAt(text, at);
    if (memberName === name) found = text.slice(at, valueEnd);
    at = skipSpace(text, valueEnd);
    if (text[at] === ',') at = skipSpace(text, at + 1);
  }
  return found;
}

function skipSpace(text: string, at: number): number {
  while (at < text.length) {
    const c = text.charCodeAt(at);
    if (c !== 0x20 && c !== 0x09 && c !== 0x0a && c !== 0x0d) break;
    at++;
  }
  return at;
}

/** Index just past the string starting at `at` (its opening quote). */
function stringEnd(text: string, at: number): number {
  for (let i = at + 1; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x5c)
      i++; // a backslash: the next character is escaped
    else if (c === 0x22) return i + 1;
  }
  return text.length;
}

/** Index just past the value starting at `at`. */
function valueEndAt(text: string, at: number): number {
  const first = text[at];
  if (first === '"') return stringEnd(text, at);
  if (first === '{' || first === '[') {
    let depth = 0;
    for (let i = at; i < text.length; i++) {
      const c = text[i];
      if (c === '"') i = stringEnd(text, i) - 1;
      else if (c === '{' || c === '[') depth++;
      else if ((c === '}' || c === ']') && --depth === 0) return i + 1;
    }
    return text.length;
  }
  // A number or a literal: up to the next delimiter.
  let i = at;
  while (i < text.length && !',}] \t\n\r'.includes(text[i] as string)) i++;
  return i;
}
