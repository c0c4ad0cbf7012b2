/**
 * The sender's half of webhook signing: endpoint secrets and the three Standard Webhooks
 * headers of a delivery, signed with the `standardwebhooks` package.
 *
 * A secret is `whsec_` and the base64 of 24 random bytes. While a rotated secret's previous
 * one is still honoured, a delivery carries one `v1,…` signature per secret, separated by a
 * space, newest first; a receiver holding either secret verifies it.
 */
import { randomBytes } from 'node:crypto';
import { Webhook } from 'standardwebhooks';

const SECRET_BYTES = 24;

/** Signers by secret: decoding a secret once per endpoint, not once per delivery. */
const signers = new Map<string, Webhook>();
/** Bound on the signers kept; past it the map starts over (secrets are few: one or two each). */
const SIGNERS_MAX = 1000;

function signer(secret: string): Webhook {
  let found = signers.get(secret);
  if (found === undefined) {
    if (signers.size >= SIGNERS_MAX) signers.clear();
    found = new Webhook(secret);
    signers.set(secret, found);
  }
  return found;
}

/** A new endpoint secret, `whsec_…`. */
export function newWebhookSecret(): string {
  return `whsec_${randomBytes(SECRET_BYTES).toString('base64')}`;
}

export interface SignedHeaders {
  'webhook-id': string;
  'webhook-timestamp': string;
  'webhook-signature': string;
}

/**
 * The headers of one delivery attempt: `messageId` is the event id (the same on every
 * retry), `timestampMs` the attempt's time, `secrets` the endpoint's current secret first,
 * then any previous one still honoured. Throws when a secret is not a `whsec_` secret
 * (a programmer error: every stored secret was made by `newWebhookSecret`).
 */
export function signedHeaders(
  messageId: string,
  timestampMs: number,
  body: string,
  secrets: readonly string[],
): SignedHeaders {
  const at = new Date(timestampMs);
  const signatures = secrets.map((secret) => signer(secret).sign(messageId, at, body));
  return {
    'webhook-id': messageId,
    'webhook-timestamp': String(Math.floor(timestampMs / 1000)),
    'webhook-signature': signatures.join(' '),
  };
}
