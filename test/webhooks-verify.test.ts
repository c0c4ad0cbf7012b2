/**
 * The receiver helper `verifyWebhook` and the sender's signing, checked against an
 * independent implementation of the Standard Webhooks specification (test/support), and the
 * package export `tally/webhooks` imported by name from a separate Node process, as an
 * application would import it.
 */
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { newWebhookSecret, signedHeaders } from '../src/webhooks/sign.js';
import { verifyWebhook, WebhookVerificationError } from '../src/webhooks/verify.js';
import { specSignature, specVerifies } from './support/standard-webhooks.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const NOW_MS = 1_790_000_000_000;
const EVENT = {
  id: 'evt_01',
  type: 'customer.created',
  createdAt: new Date(NOW_MS).toISOString(),
  environment: 'test',
  data: { customer: { id: 'acme', name: 'Acme' } },
};
const BODY = JSON.stringify(EVENT);

function specHeaders(secret: string, timestampSeconds: number, body = BODY) {
  const timestamp = String(timestampSeconds);
  return {
    'webhook-id': EVENT.id,
    'webhook-timestamp': timestamp,
    'webhook-signature': specSignature(secret, EVENT.id, timestamp, body),
  };
}

function refusal(run: () => unknown): string {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(WebhookVerificationError);
    return (error as WebhookVerificationError).code;
  }
  throw new Error('expected verifyWebhook to refuse');
}

describe('signing', () => {
  it('makes whsec_ secrets of 24 random bytes, each different', () => {
    const a = newWebhookSecret();
    expect(a).toMatch(/^whsec_[A-Za-z0-9+/]{32}$/);
    expect(Buffer.from(a.slice(6), 'base64')).toHaveLength(24);
    expect(newWebhookSecret()).not.toBe(a);
  });

  it('signs as the specification does, once per secret during a rotation', () => {
    const current = newWebhookSecret();
    const previous = newWebhookSecret();
    const headers = signedHeaders(EVENT.id, NOW_MS + 999, BODY, [current, previous]);
    expect(headers['webhook-timestamp']).toBe(String(NOW_MS / 1000));
    const [first, second] = headers['webhook-signature'].split(' ');
    expect(first).toBe(specSignature(current, EVENT.id, headers['webhook-timestamp'], BODY));
    expect(second).toBe(specSignature(previous, EVENT.id, headers['webhook-timestamp'], BODY));
    const signed = {
      id: headers['webhook-id'],
      timestamp: headers['webhook-timestamp'],
      signature: headers['webhook-signature'],
    };
    expect(specVerifies(previous, signed, BODY)).toBe(true);
    expect(specVerifies(newWebhookSecret(), signed, BODY)).toBe(false);
  });
});

describe('verifyWebhook', () => {
  const secret = newWebhookSecret();
  const at = { nowMs: NOW_MS };

  it('returns the event of a delivery signed per the specification', () => {
    const headers = specHeaders(secret, NOW_MS / 1000);
    expect(verifyWebhook(BODY, headers, secret, at)).toEqual(EVENT);
    expect(verifyWebhook(Buffer.from(BODY), new Headers(headers), secret, at)).toEqual(EVENT);
    const upper = Object.fromEntries(
      Object.entries(headers).map(([name, value]) => [name.toUpperCase(), [value]]),
    );
    expect(verifyWebhook(BODY, upper, secret, at)).toEqual(EVENT);
  });

  it('accepts any one matching signature and any one of several secrets', () => {
    const other = newWebhookSecret();
    const headers = specHeaders(secret, NOW_MS / 1000);
    const both = {
      ...headers,
      'webhook-signature': `${specSignature(other, EVENT.id, headers['webhook-timestamp'], BODY)} ${
        headers['webhook-signature']
      }`,
    };
    expect(verifyWebhook(BODY, both, secret, at).id).toBe(EVENT.id);
    expect(verifyWebhook(BODY, headers, [other, secret], at).id).toBe(EVENT.id);
    expect(refusal(() => verifyWebhook(BODY, headers, other, at))).toBe('invalid_signature');
  });

  it('refuses a changed body, id or timestamp', () => {
    const headers = specHeaders(secret, NOW_MS / 1000);
    const changed = BODY.replace('Acme', 'Acne');
    expect(refusal(() => verifyWebhook(changed, headers, secret, at))).toBe('invalid_signature');
    const otherId = { ...headers, 'webhook-id': 'evt_02' };
    expect(refusal(() => verifyWebhook(BODY, otherId, secret, at))).toBe('invalid_signature');
    const later = { ...headers, 'webhook-timestamp': String(NOW_MS / 1000 + 1) };
    expect(refusal(() => verifyWebhook(BODY, later, secret, at))).toBe('invalid_signature');
  });

  it('holds the timestamp to 5 minutes either way', () => {
    const seconds = NOW_MS / 1000;
    const ok = (offset: number) =>
      verifyWebhook(BODY, specHeaders(secret, seconds + offset), secret, at).id;
    expect(ok(-300)).toBe(EVENT.id);
    expect(ok(300)).toBe(EVENT.id);
    expect(refusal(() => ok(-301))).toBe('timestamp_too_old');
    expect(refusal(() => ok(301))).toBe('timestamp_too_new');
    const bad = { ...specHeaders(secret, seconds), 'webhook-timestamp': '12e3' };
    expect(refusal(() => verifyWebhook(BODY, bad, secret, at))).toBe('invalid_timestamp');
  });

  it('names what is missing or malformed', () => {
    const headers = specHeaders(secret, NOW_MS / 1000);
    const { 'webhook-signature': _, ...unsigned } = headers;
    expect(refusal(() => verifyWebhook(BODY, unsigned, secret, at))).toBe('missing_headers');
    expect(refusal(() => verifyWebhook(BODY, headers, 'whsec_', at))).toBe('invalid_secret');
    expect(refusal(() => verifyWebhook(BODY, headers, 'not base64!', at))).toBe('invalid_secret');
    const notJson = 'plain text';
    const signedText = specHeaders(secret, NOW_MS / 1000, notJson);
    expect(refusal(() => verifyWebhook(notJson, signedText, secret, at))).toBe('invalid_payload');
  });
});

describe('the package export', () => {
  it("is importable as 'tally/webhooks' and verifies", () => {
    const secret = newWebhookSecret();
    const headers = specHeaders(secret, Math.floor(Date.now() / 1000));
    const script = [
      "import { verifyWebhook, EVENT_KINDS } from 'tally/webhooks';",
      'const [body, headers, secret] = JSON.parse(process.argv[1]);',
      'const event = verifyWebhook(body, headers, secret);',
      'console.log(JSON.stringify({ type: event.type, kinds: EVENT_KINDS.length }));',
    ].join('\n');
    const output = execFileSync(
      process.execPath,
      ['--input-type=module', '-e', script, JSON.stringify([BODY, headers, secret])],
      { cwd: ROOT, encoding: 'utf8' },
    );
    expect(JSON.parse(output)).toEqual({ type: 'customer.created', kinds: 10 });
  });
});
