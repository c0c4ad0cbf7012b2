/**
 * What a new user meets first, over HTTP against a real server: an environment nobody has
 * configured yet (404 `not_configured`, telling them to push), settings calls repeated
 * with the values already set (nothing written, nothing audited), and a wrong method on
 * the public paths (405 with `Allow`, no key asked for).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const CONFIG = {
  entitlements: {
    sso: { type: 'feature' },
    seats: { type: 'limit' },
    api_calls: { type: 'meter' },
  },
  products: {
    free: {
      name: 'Free',
      default: true,
      entitlements: {
        sso: true,
        seats: { included: 5, expansion: { unitAmount: 500 } },
        api_calls: { included: 100, overage: { unitAmount: 1 } },
      },
    },
  },
};

let server: ServerProcess;

beforeAll(async () => {
  // The test environment gets the configuration; live stays unconfigured.
  server = await startServerProcess({ config: CONFIG });
});

afterAll(async () => {
  await server?.stop();
});

describe('an environment nobody configured', () => {
  const notConfigured = {
    code: 'not_configured',
    error:
      'no billing configuration has been pushed to the live environment: push one with ' +
      'POST /v1/sync/push',
  };

  it(
    'has, limit and balance answer 404 not_configured, ' + 'saying to push a configuration',
    async () => {
      for (const read of [
        '/v1/entitlements/sso/has',
        '/v1/entitlements/seats/limit',
        '/v1/usage/api_calls/balance',
      ]) {
        for (const key of [server.keys.live.client, server.keys.live.server]) {
          const answer = await call(server.base, 'GET', `${read}?customerId=acme`, { key });
          expect(answer.status, read).toBe(404);
          expect(answer.body, read).toEqual(notConfigured);
        }
      }
    },
  );

  it('writes and context answer the same, and create nothing', async () => {
    const key = server.keys.live.server;
    const consume = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
      key,
      body: { customerId: 'acme', amount: 1 },
    });
    expect(consume).toMatchObject({ status: 404, body: notConfigured });
    const context = await call(server.base, 'POST', '/v1/context', {
      key,
      body: { customer: { id: 'acme' }, features: ['sso'] },
    });
    expect(context).toMatchObject({ status: 404, body: notConfigured });
    expect((await call(server.base, 'GET', '/v1/customers/acme', { key })).status).toBe(404);
  });

  it('once configured, an unknown key is entitlement_not_found', async () => {
    const answer = await call(server.base, 'GET', '/v1/entitlements/nope/has?customerId=acme', {
      key: server.keys.test.client,
    });
    expect(answer).toMatchObject({
      status: 404,
      body: { code: 'entitlement_not_found', error: 'entitlement nope not found' },
    });
  });
});

describe('settings that change nothing', () => {
  const sk = (): string => server.keys.test.server;
  const auditCount = async (action: string): Promise<number> => {
    const page = await call(server.base, 'GET', `/v1/audit?action=${action}&limit=100`, {
      key: sk(),
    });
    expect(page.status).toBe(200);
    return (page.body.data as unknown[]).length;
  };

  it(
    'a repeated limit settings call writes no ' + 'audit entry and answers the current limit',
    async () => {
      const body = { customerId: 'repeat-limit', purchased: 3, autoExpansionEnabled: true };
      const first = await call(server.base, 'POST', '/v1/entitlements/seats/limit/settings', {
        key: sk(),
        body,
      });
      expect(first).toMatchObject({
        status: 200,
        body: { limit: 8, purchased: 3, autoExpansionEnabled: true },
      });
      const before = await auditCount('limit.settings');
      for (const repeat of [
        body,
        { customerId: 'repeat-limit', purchased: 3 },
        { customerId: 'repeat-limit', autoExpansionEnabled: true },
      ]) {
        const again = await call(server.base, 'POST', '/v1/entitlements/seats/limit/settings', {
          key: sk(),
          body: repeat,
        });
        expect(again.status).toBe(200);
        expect(again.body).toEqual(first.body);
      }
      expect(await auditCount('limit.settings')).toBe(before);
      // A real change is still recorded.
      const changed = await call(server.base, 'POST', '/v1/entitlements/seats/limit/settings', {
        key: sk(),
        body: { customerId: 'repeat-limit', purchased: 4 },
      });
      expect(changed.body).toMatchObject({ limit: 9, purchased: 4 });
      expect(await auditCount('limit.settings')).toBe(before + 1);
    },
  );

  it(
    'a repeated usage settings call writes no ' + 'audit entry and answers the current balance',
    async () => {
      const body = { customerId: 'repeat-usage', overageEnabled: true };
      const first = await call(server.base, 'POST', '/v1/usage/api_calls/settings', {
        key: sk(),
        body,
      });
      expect(first).toMatchObject({ status: 200, body: { overageEnabled: true } });
      const before = await auditCount('usage.settings');
      const again = await call(server.base, 'POST', '/v1/usage/api_calls/settings', {
        key: sk(),
        body,
      });
      expect(again.status).toBe(200);
      expect(again.body).toEqual(first.body);
      expect(await auditCount('usage.settings')).toBe(before);
    },
  );

  it('settings that repeat the defaults of an unknown customer create nothing', async () => {
    const before = await auditCount('limit.settings');
    const limit = await call(server.base, 'POST', '/v1/entitlements/seats/limit/settings', {
      key: sk(),
      body: { customerId: 'ghost', purchased: 0 },
    });
    expect(limit).toMatchObject({
      status: 200,
      body: { limit: 5, purchased: 0, autoExpansionEnabled: false },
    });
    const usage = await call(server.base, 'POST', '/v1/usage/api_calls/settings', {
      key: sk(),
      body: { customerId: 'ghost', overageEnabled: false },
    });
    expect(usage).toMatchObject({ status: 200, body: { overageEnabled: false } });
    expect(await auditCount('limit.settings')).toBe(before);
    expect((await call(server.base, 'GET', '/v1/customers/ghost', { key: sk() })).status).toBe(404);
  });
});

describe('methods on the public paths', () => {
  const answers = 'GET answers, another method is 405 with Allow: GET and asks for no key';
  for (const path of ['/healthz', '/v1/schema/billing']) {
    it(`${path}: ${answers}`, async () => {
      expect((await call(server.base, 'GET', path)).status).toBe(200);
      for (const method of ['POST', 'PUT', 'DELETE']) {
        const answer = await call(server.base, method, path);
        expect(answer.status, method).toBe(405);
        expect(answer.headers.get('allow')).toBe('GET');
        expect(answer.body).toEqual({
          code: 'method_not_allowed',
          error: `${method} is not allowed on ${path}`,
        });
      }
    });
  }

  it('a keyed path answers a wrong method with 405 and Allow once the key is checked', async () => {
    const answer = await call(server.base, 'DELETE', '/v1/sync/push', {
      key: server.keys.test.server,
    });
    expect(answer.status).toBe(405);
    expect(answer.headers.get('allow')).toBe('POST');
    expect(answer.body.code).toBe('method_not_allowed');
  });
});
