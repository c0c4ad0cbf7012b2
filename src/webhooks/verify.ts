/**
 * The receiver's half of webhook signing: `verifyWebhook(rawBody, headers, secret)` checks a
 * delivery from Tally per the Standard Webhooks specification and returns its event.
 *
 * Exported by the package as `tally/webhooks` for applications (and the Better Auth plugin)
 * that receive Tally's events. It imports nothing but `node:crypto` and the leaf's types, so
 * a receiver pulls in none of the server. The signature is HMAC-SHA256, keyed with the
 * base64-decoded part of the `whsec_` secret, over `${webhook-id}.${webhook-timestamp}.${body}`;
 * `webhook-signature` lists one or more `v1,<base64>` signatures separated by spaces (two
 * while a secret is being rotated), and one matching signature is enough. Comparison is in
 * constant time; the timestamp must be within 5 minutes of the receiver's clock, so a
 * captured delivery cannot be replayed later.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { TallyEvent } from '../../shared/event-kinds.js';

export type { EventKind, TallyEvent } from '../../shared/event-kinds.js';
export { EVENT_KINDS } from '../../shared/event-kinds.js';

/** How far the `webhook-timestamp` may be from the receiver's clock, either way: 5 minutes. */
export const WEBHOOK_TOLERANCE_SECONDS = 5 * 60;

const SECRET_PREFIX = 'whsec_';

/** Why a delivery was refused; stable strings a receiver may branch on. */
export type WebhookVerificationErrorCode =
  | 'invalid_secret'
  | 'missing_headers'
  | 'invalid_timestamp'
  | 'timestamp_too_old'
  | 'timestamp_too_new'
  | 'invalid_signature'
  | 'invalid_payload';

/** The one error `verifyWebhook` throws: `code` says why, `message` says it in words. */
export class WebhookVerificationError extends Error {
  override name = 'WebhookVerificationError';
  constructor(
    readonly code: WebhookVerificationErrorCode,
    message: string,
  ) {
    super(message);
  }
}

/**
 * Request headers in any of the usual forms: a fetch `Headers`, Node's `IncomingHttpHeaders`
 * (values may be arrays) or a plain record. Names are matched case-insensitively.
 */
export type WebhookHeaders =
  | { get(name: string): string | null }
  | Readonly<Record<string, string | readonly string[] | undefined>>;

export interface VerifyOptions {
  /** The receiver's clock, in ms since the epoch (tests); default `Date.now()`. */
  nowMs?: number;
  /** Timestamp tolerance in seconds; default 300. */
  toleranceSeconds?: number;
}

function header(headers: WebhookHeaders, name: string): string | undefined {
  if (typeof (headers as { get?: unknown }).get === 'function') {
    return (headers as { get(name: string): string | null }).get(name) ?? undefined;
  }
  const record = headers as Readonly<Record<string, string | readonly string[] | undefined>>;
  for (const key of Object.keys(record)) {
    if (key.toLowerCase() !== name) continue;
    const value = record[key];
    return typeof value === 'string' ? value : value?.[0];
  }
  return undefined;
}

/** The HMAC key of a `whsec_…` secret. Throws `invalid_secret` when it is not one. */
function secretKey(secret: string): Buffer {
  const encoded = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret;
  const key = Buffer.from(encoded, 'base64');
  if (key.length === 0 || !/^[A-Za-z0-9+/]+={0,2}$/.test(encoded)) {
    throw new WebhookVerificationError('invalid_secret', 'the secret is not a whsec_ secret');
  }
  return key;
}

function checkTimestamp(value: string, options: VerifyOptions): void {
  if (!/^\d{1,12}$/.test(value)) {
    throw new WebhookVerificationError(
      'invalid_timestamp',
      'webhook-timestamp is not a whole number of seconds',
    );
  }
  const nowSeconds = Math.floor((options.nowMs ?? Date.now()) / 1000);
  const tolerance = options.toleranceSeconds ?? WEBHOOK_TOLERANCE_SECONDS;
  const timestamp = Number(value);
  if (nowSeconds - timestamp > tolerance) {
    throw new WebhookVerificationError('timestamp_too_old', 'webhook-timestamp is too old');
  }
  if (timestamp - nowSeconds > tolerance) {
    throw new WebhookVerificationError('timestamp_too_new', 'webhook-timestamp is in the future');
  }
}

/** True when one of the space-separated `v1,<base64>` signatures matches, in constant time. */
function anySignatureMatches(signatures: string, expected: readonly Buffer[]): boolean {
  let matched = false;
  for (const entry of signatures.split(' ')) {
    const comma = entry.indexOf(',');
    if (comma < 0 || entry.slice(0, comma) !== 'v1') continue;
    const given = Buffer.from(entry.slice(comma + 1), 'base64');
    for (const digest of expected) {
      // Lengths are public (every HMAC-SHA256 is 32 bytes); only the bytes are compared.
      if (given.length === digest.length && timingSafeEqual(given, digest)) matched = true;
    }
  }
  return matched;
}

function parseEvent(body: string): TallyEvent {
  let event: unknown;
  try {
    event = JSON.parse(body);
  } catch {
    throw new WebhookVerificationError('invalid_payload', 'the body is not JSON');
  }
  const candidate = event as Partial<TallyEvent> | null;
  if (
    typeof candidate !== 'object' ||
    candidate === null ||
    typeof candidate.id !== 'string' ||
    typeof candidate.type !== 'string' ||
    typeof candidate.data !== 'object'
  ) {
    throw new WebhookVerificationError('invalid_payload', 'the body is not a Tally event');
  }
  return candidate as TallyEvent;
}

/**
 * Verifies one delivery and returns its event. `rawBody` must be the body exactly as received
 * (not re-serialized JSON); `secret` is the endpoint's `whsec_…` secret, or several (an old
 * and a new one while you roll a rotated secret out). Throws `WebhookVerificationError` when
 * a header is missing, the timestamp is outside the tolerance, no signature matches or the
 * signed body is not an event; never returns an unverified event.
 */
export function verifyWebhook(
  rawBody: string | Uint8Array,
  headers: WebhookHeaders,
  secret: string | readonly string[],
  options: VerifyOptions = {},
): TallyEvent {
  const keys = (typeof secret === 'string' ? [secret] : secret).map(secretKey);
  if (keys.length === 0) throw new WebhookVerificationError('invalid_secret', 'no secret given');
  const id = header(headers, 'webhook-id');
  const timestamp = header(headers, 'webhook-timestamp');
  const signature = header(headers, 'webhook-signature');
  if (!id || !timestamp || !signature) {
    throw new WebhookVerificationError(
      'missing_headers',
      'webhook-id, webhook-timestamp and webhook-signature are required',
    );
  }
  checkTimestamp(timestamp, options);
  const bytes = typeof rawBody === 'string' ? Buffer.from(rawBody, 'utf8') : rawBody;
  const expected = keys.map((key) =>
    createHmac('sha256', key).update(`${id}.${timestamp}.`).update(bytes).digest(),
  );
  if (!anySignatureMatches(signature, expected)) {
    throw new WebhookVerificationError('invalid_signature', 'no signature matches the secret');
  }
  return parseEvent(Buffer.from(bytes).toString('utf8'));
}
