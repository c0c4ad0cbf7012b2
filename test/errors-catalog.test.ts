/**
 * The error table of docs/api.md and the error catalog (src/errors.ts) must say the same thing:
 * every catalog entry has a row with its status and message, and every row is an entry.
 * Real answers of a running server, from the front end and from the shard workers alike,
 * carry the entry's key as `code` beside `error`, with the entry's status; the two 429s
 * (a refused consume, a rate limit) are told apart by `code` and `Retry-After`.
 */
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ERRORS, errorBody, errorMessage, type ErrorCode } from '../src/errors.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const apiDoc = fs.readFileSync(new URL('../docs/api.md', import.meta.url), 'utf8');
const rows = new Map<string, { status: number; message: string }>();
for (const line of apiDoc.split('\n')) {
  const match = /^\| `([a-z_]+)` \| (\d{3}) \| (.*?) \| .* \|$/.exec(line);
  if (match)
    rows.set(match[1] as string, { status: Number(match[2]), message: match[3] as string });
}

describe('error catalog', () => {
  it('the docs/api.md table lists exactly the catalog', () => {
    expect([...rows.keys()].sort()).toEqual(Object.keys(ERRORS).sort());
    for (const [code, entry] of Object.entries(ERRORS)) {
      expect(rows.get(code), code).toEqual({ status: entry.status, message: entry.message });
    }
  });

  it('fills placeholders and keeps unknown ones visible', () => {
    expect(errorMessage('entitlement_not_found', { key: 'sso' })).toBe('entitlement sso not found');
    expect(errorMessage('entitlement_not_found')).toBe('entitlement {key} not found');
  });

  it('bodies are {"error", "code"} plus optional extra fields', () => {
    expect(JSON.parse(errorBody('insufficient_balance', { key: 'm' }, { balance: 1 }))).toEqual({
      error: 'insufficient balance for m',
      code: 'insufficient_balance',
      balance: 1,
    });
  });

  it(
    'server errors are a bug, the payment processor failing, or an event it must deliver ' +
      'again; nothing a client sends maps to them',
    () => {
      const serverErrors = Object.entries(ERRORS).filter(
        ([, e]) => e.status >= 500 && e.status !== 503,
      );
      expect(serverErrors.map(([code]) => code)).toEqual([
        'processor_event_failed',
        'processor_error',
        'internal',
      ]);
    },
  );
});

const CONFIG = {
  entitlements: { sso: { type: 'feature' }, api_calls: { type: 'meter' } },
  products: {
    free: { name: 'Free', default: true, entitlements: { sso: true, api_calls: { included: 10 } } },
  },
};

describe('error bodies over HTTP', () => {
  let server: ServerProcess;
  beforeAll(async () => {
    // Client keys may make 3 requests a minute here: enough to reach the limit quickly.
    server = await startServerProcess({ env: { TALLY_RATE_LIMIT_CLIENT: '3' } });
  });
  afterAll(async () => {
    await server?.stop();
  });

  /** The answer is the catalog entry `code`: its status, its key as `code`, a message. */
  function expectCode(answer: { status: number; body: any }, code: ErrorCode): void {
    expect(answer.body, JSON.stringify(answer.body)).toMatchObject({
      code,
      error: expect.any(String),
    });
    expect(answer.status).toBe(ERRORS[code].status);
  }

  it('front-end errors carry their code', async () => {
    const sk = server.keys.test.server;
    expectCode(await call(server.base, 'GET', '/v1/customers'), 'key_missing');
    expectCode(
      await call(server.base, 'GET', '/v1/customers', { key: 'sk_test_nope' }),
      'key_invalid',
    );
    expectCode(await call(server.base, 'GET', '/v1/nope', { key: sk }), 'route_not_found');
    expectCode(await call(server.base, 'GET', '/elsewhere'), 'route_not_found');
    expectCode(
      await call(server.base, 'PUT', '/v1/sync/push', { key: sk, body: {} }),
      'method_not_allowed',
    );
    expectCode(
      await call(server.base, 'POST', '/v1/customers', {
        key: sk,
        rawBody: '{',
        headers: { 'content-type': 'application/json' },
      }),
      'invalid_json',
    );
    expectCode(
      await call(server.base, 'POST', '/v1/customers', {
        key: sk,
        rawBody: '{}',
        headers: { 'content-type': 'text/plain' },
      }),
      'content_type',
    );
    expectCode(
      await call(server.base, 'POST', '/v1/customers', { key: sk, body: { id: 'c', extra: 1 } }),
      'invalid_request',
    );
    expectCode(
      await call(server.base, 'POST', '/v1/customers', {
        key: sk,
        body: { id: 'x'.repeat(1_100_000) },
      }),
      'body_too_large',
    );
    expectCode(await call(server.base, 'GET', '/v1/sync/pull', { key: sk }), 'config_not_found');
    expectCode(
      await call(server.base, 'GET', '/v1/admin/status', { key: sk }),
      'operator_key_required',
    );
    expectCode(
      await call(server.base, 'GET', '/v1/customers', { key: server.keys.admin }),
      'environment_key_required',
    );
    expectCode(
      await call(server.base, 'GET', '/v1/customers', { key: server.keys.live.client }),
      'server_key_required',
    );
    expectCode(
      await call(server.base, 'GET', '/v1/admin/keys/key_0000', { key: server.keys.admin }),
      'method_not_allowed',
    );
    expectCode(
      await call(server.base, 'DELETE', '/v1/admin/keys/key_0000', { key: server.keys.admin }),
      'key_not_found',
    );
  });

  it('errors the shard workers render carry their code too', async () => {
    const sk = server.keys.test.server;
    expectCode(
      await call(server.base, 'GET', '/v1/entitlements/sso/has?customerId=c', { key: sk }),
      'not_configured',
    );
    expect(
      (await call(server.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG })).status,
    ).toBe(200);
    expectCode(
      await call(server.base, 'GET', '/v1/entitlements/nope/has?customerId=c', { key: sk }),
      'entitlement_not_found',
    );
    expectCode(
      await call(server.base, 'GET', '/v1/entitlements/sso/limit?customerId=c', { key: sk }),
      'wrong_entitlement_type',
    );
    expectCode(
      await call(server.base, 'POST', '/v1/usage/api_calls/refund', {
        key: sk,
        body: { customerId: 'c', amount: 1 },
      }),
      'refund_exceeds_usage',
    );
    expectCode(
      await call(server.base, 'GET', '/v1/contracts/c', { key: sk }),
      'contract_not_found',
    );
  });

  it(
    'a refused consume and a rate limit are both 429, ' + 'told apart by code and Retry-After',
    async () => {
      const sk = server.keys.test.server;
      expect(
        (await call(server.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG })).status,
      ).toBe(200);
      const refused = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
        key: sk,
        body: { customerId: 'short', amount: 11 },
      });
      expectCode(refused, 'insufficient_balance');
      expect(refused.body).toMatchObject({ balance: 10, consumed: 0 });
      expect(refused.headers.get('retry-after')).toBeNull();

      // Three requests a minute for the client key; a window boundary may reset it once.
      const ck = server.keys.test.client;
      let limited: Awaited<ReturnType<typeof call>> | null = null;
      for (let i = 0; i < 10 && limited === null; i++) {
        const answer = await call(server.base, 'GET', '/v1/entitlements/sso/has?customerId=c', {
          key: ck,
        });
        if (answer.status === 429) limited = answer;
      }
      expect(limited).not.toBeNull();
      expectCode(limited as { status: number; body: any }, 'rate_limited');
      expect(Number(limited?.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    },
  );
});
