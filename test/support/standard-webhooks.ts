/**
 * An independent implementation of the Standard Webhooks signature, for tests: HMAC-SHA256
 * with the base64-decoded part of the `whsec_` secret over `${id}.${timestamp}.${body}`,
 * base64-encoded and prefixed `v1,`. Written from the specification with `node:crypto`
 * alone, so a test checks Tally's signing (the `standardwebhooks` package) and Tally's
 * verifier against something that shares no code with either.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';

export function specSignature(secret: string, id: string, timestamp: string, body: string) {
  const key = Buffer.from(secret.replace(/^whsec_/, ''), 'base64');
  const mac = createHmac('sha256', key).update(`${id}.${timestamp}.${body}`).digest('base64');
  return `v1,${mac}`;
}

/** True when one of the space-separated signatures in `header` is the spec's for `secret`. */
export function specVerifies(
  secret: string,
  headers: { id: string; timestamp: string; signature: string },
  body: string,
): boolean {
  const expected = Buffer.from(specSignature(secret, headers.id, headers.timestamp, body));
  return headers.signature.split(' ').some((given) => {
    const candidate = Buffer.from(given);
    return candidate.length === expected.length && timingSafeEqual(candidate, expected);
  });
}
