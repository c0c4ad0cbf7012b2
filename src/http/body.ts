/**
 * Collects a request body under the 1 MiB cap and parses it as JSON.
 *
 * The 413 goes out as soon as the declared `content-length` or the bytes received pass
 * the cap (and the connection is closed, so the rest is never read). uWS hands out
 * chunks whose memory is reused after the callback returns, so each is copied or
 * decoded before returning. Everything here runs inside the exchange's guard: a throw
 * on any input is answered 500 for that request, never raised into uWS.
 */
import type { Exchange } from './exchange.js';
import { BODY_BYTES_MAX, BODY_NESTING_MAX } from './limits.js';

/** Checks the content type and length headers; answers and returns false on failure. */
export function checkBodyHeaders(
  ex: Exchange,
  contentType: string,
  contentLength: string,
): boolean {
  // The error precedence (docs/api.md, Errors): content type (400), then declared length (413).
  const mediaType = contentType.split(';', 1)[0]?.trim().toLowerCase();
  if (mediaType !== 'application/json') {
    ex.fail('content_type');
    return false;
  }
  if (contentLength !== '' && Number(contentLength) > BODY_BYTES_MAX) {
    ex.fail('body_too_large', {}, [], true);
    return false;
  }
  return true;
}

/**
 * Reads the body, then calls `onJson` with the parsed value and its text; answers 400/413 itself.
 */
export function readJsonBody(ex: Exchange, onJson: (value: unknown, text: string) => void): void {
  const chunks: Buffer[] = [];
  let size = 0;
  ex.res.onData((chunk, isLast) => {
    if (ex.done || ex.aborted) return;
    ex.guard(() => {
      size += chunk.byteLength;
      if (size > BODY_BYTES_MAX) {
        ex.fail('body_too_large', {}, [], true);
        return;
      }
      if (isLast && chunks.length === 0) {
        parseAndDeliver(ex, Buffer.from(chunk).toString('utf8'), onJson);
        return;
      }
      chunks.push(Buffer.from(chunk.slice(0)));
      if (isLast) parseAndDeliver(ex, Buffer.concat(chunks).toString('utf8'), onJson);
    });
  });
}

function parseAndDeliver(
  ex: Exchange,
  text: string,
  onJson: (value: unknown, text: string) => void,
): void {
  // Before parsing: every later walk over the value (here, in validation, in the shard's
  // encoder) recurses, so no deeper value may exist past this point.
  if (nestsDeeperThan(text, BODY_NESTING_MAX)) {
    ex.fail('body_too_deep', { max: BODY_NESTING_MAX });
    return;
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    ex.fail('invalid_json');
    return;
  }
  // Only a `\u` escape can spell a lone surrogate: decoding the bytes as UTF-8 already
  // turned any invalid sequence into U+FFFD. So bodies without one skip the walk.
  const broken = text.includes('\\u') ? loneSurrogateAt(value, '') : null;
  if (broken !== null) {
    ex.fail('invalid_request', {
      detail:
        `${broken === '' ? 'request body' : broken} holds a lone surrogate ` +
        `(\\uD800-\\uDFFF without its pair): strings must be valid Unicode`,
    });
    return;
  }
  onJson(value, text);
}

/**
 * Whether `text` opens more than `max` arrays or objects inside one another (brackets
 * inside strings do not count). A body with no more than `max` opening brackets in all
 * cannot, so most bodies are settled by a few native searches; the rest are scanned.
 * Only needs to be right on text that may be valid JSON: invalid text fails parsing later.
 */
export function nestsDeeperThan(text: string, max: number): boolean {
  let openings = 0;
  for (const bracket of ['{', '[']) {
    for (let at = text.indexOf(bracket); at !== -1; at = text.indexOf(bracket, at + 1)) {
      if (++openings > max) return scanDepth(text) > max;
    }
  }
  return false;
}

function scanDepth(text: string): number {
  let depth = 0;
  let deepest = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      // A string: skip to its closing quote, stepping over escaped characters.
      for (i++; i < text.length && text.charCodeAt(i) !== 0x22; i++) {
        if (text.charCodeAt(i) === 0x5c) i++;
      }
    } else if (c === 0x7b || c === 0x5b) {
      if (++depth > deepest) deepest = depth;
    } else if (c === 0x7d || c === 0x5d) {
      depth--;
    }
  }
  return deepest;
}

/**
 * The dotted path of the first string or object key in `value` holding a lone surrogate
 * ('' for `value` itself), or null if every string is well formed.
 *
 * Why bodies with one are refused: stored state goes through MessagePack, which writes
 * strings as UTF-8, where a lone surrogate cannot exist; it would be stored as U+FFFD, so
 * an id, an idempotency key or a name would come back from the journal as a different string
 * (usage moved to another customer, a retried consume applied twice, two customers with
 * one id in a snapshot). JSON has the same rule in I-JSON (RFC 7493 §2.1).
 */
function loneSurrogateAt(value: unknown, path: string): string | null {
  if (typeof value === 'string') return value.isWellFormed() ? null : path;
  if (typeof value !== 'object' || value === null) return null;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = loneSurrogateAt(value[i], path === '' ? String(i) : `${path}.${i}`);
      if (found !== null) return found;
    }
    return null;
  }
  for (const [key, item] of Object.entries(value)) {
    const at = path === '' ? key : `${path}.${key}`;
    if (!key.isWellFormed()) return path === '' ? 'a field name' : `a field name in ${path}`;
    const found = loneSurrogateAt(item, at);
    if (found !== null) return found;
  }
  return null;
}
