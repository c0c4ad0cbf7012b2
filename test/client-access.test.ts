/**
 * Client keys from web pages (docs/browser.md): CORS on the customer reads (preflight
 * without a key, allow headers on replies and errors, per-environment allowed origins
 * from the configuration, nothing for server routes or server keys), and customer-bound
 * tokens (minting, a wrong customer 403, expired and invalid 401, required mode,
 * rotation with the previous secret kept for one lifetime, surviving a restart).
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CUSTOMER_TOKEN_TTL_SEC_MAX, CustomerTokens } from '../src/auth/customer-token.js';
import { ControlStore } from '../storage/control-store.js';
import {
  call,
  startServerProcess,
  tempDataDir,
  type ServerProcess,
} from './support/server-process.js';

const CONFIG = {
  entitlements: { reports: { type: 'feature' }, api_calls: { type: 'meter' } },
  products: {
    free: { default: true, entitlements: { reports: true, api_calls: { included: 5 } } },
  },
};
const APP = 'https://app.example.com';
const OTHER = 'https://evil.example.net';
const HAS = '/v1/entitlements/reports/has';

let server: ServerProcess;

beforeAll(async () => {
  server = await startServerProcess({ config: CONFIG });
}, 60_000);
afterAll(async () => {
  await server?.stop();
});

const push = (key: string, config: unknown) =>
  call(server.base, 'POST', '/v1/sync/push', { key, body: config });

function corsHeaders(headers: Headers): Record<string, string> {
  const found: Record<string, string> = {};
  headers.forEach((value, name) => {
    if (name.startsWith('access-control-') || name === 'vary') found[name] = value;
  });
  return found;
}

describe('CORS', () => {
  it('answers the preflight of has, limit, balance: 204, allow headers, no key', async () => {
    for (const route of [HAS, '/v1/entitlements/seats/limit', '/v1/usage/api_calls/balance']) {
      const answer = await call(server.base, 'OPTIONS', `${route}?customerId=c`, {
        headers: {
          origin: APP,
          'access-control-request-method': 'GET',
          'access-control-request-headers': 'x-tally-key,x-tally-customer-token',
        },
      });
      expect(answer.status, route).toBe(204);
      expect(corsHeaders(answer.headers)).toMatchObject({
        'access-control-allow-origin': APP,
        'access-control-allow-methods': 'GET',
        'access-control-allow-headers': 'x-tally-key, x-tally-customer-token, content-type',
        'access-control-max-age': '7200',
        vary: 'Origin',
      });
    }
  });

  it('answers OPTIONS without Origin (not a preflight) with Allow only', async () => {
    const answer = await call(server.base, 'OPTIONS', `${HAS}?customerId=c`);
    expect(answer.status).toBe(204);
    expect(answer.headers.get('allow')).toBe('GET');
    expect(corsHeaders(answer.headers)).toEqual({});
  });

  it('never answers a server route preflight with allow headers', async () => {
    for (const [method, route] of [
      ['OPTIONS', '/v1/usage/api_calls/consume'],
      ['OPTIONS', '/v1/customers'],
      ['OPTIONS', '/v1/client-tokens'],
      ['OPTIONS', '/v1/docs/openapi.json'],
      ['OPTIONS', '/v1/admin/keys'],
    ] as const) {
      const answer = await call(server.base, method, route, {
        headers: { origin: APP, 'access-control-request-method': 'POST' },
      });
      expect(answer.status, route).toBe(401);
      expect(answer.headers.get('access-control-allow-methods'), route).toBeNull();
      expect(answer.headers.get('access-control-allow-headers'), route).toBeNull();
    }
  });

  it('puts allow-origin on client key replies, errors too; never for a server key', async () => {
    const ck = server.keys.test.client;
    const ok = await call(server.base, 'GET', `${HAS}?customerId=c`, {
      key: ck,
      headers: { origin: APP },
    });
    expect(ok.status).toBe(200);
    expect(ok.body).toBe(true);
    expect(corsHeaders(ok.headers)).toMatchObject({
      'access-control-allow-origin': APP,
      vary: 'Origin',
    });
    expect(ok.headers.get('access-control-expose-headers')).toContain('x-ratelimit-remaining');
    const errors = [
      await call(server.base, 'GET', '/v1/entitlements/nope/has?customerId=c', {
        key: ck,
        headers: { origin: APP },
      }),
      await call(server.base, 'GET', HAS, { key: ck, headers: { origin: APP } }),
      await call(server.base, 'GET', `${HAS}?customerId=c`, {
        key: 'ck_test_not-a-real-key-at-all-000000',
        headers: { origin: APP },
      }),
      await call(server.base, 'GET', `${HAS}?customerId=c`, { headers: { origin: APP } }),
    ];
    expect(errors.map((e) => e.status)).toEqual([404, 400, 401, 401]);
    for (const error of errors) expect(error.headers.get('access-control-allow-origin')).toBe(APP);
    const serverKey = await call(server.base, 'GET', `${HAS}?customerId=c`, {
      key: server.keys.test.server,
      headers: { origin: APP },
    });
    expect(serverKey.status).toBe(200);
    expect(corsHeaders(serverKey.headers)).toEqual({});
    // Not a browser's request: no CORS headers either.
    const plain = await call(server.base, 'GET', `${HAS}?customerId=c`, { key: ck });
    expect(corsHeaders(plain.headers)).toEqual({});
  });

  it('allows no origin in live until the configuration lists it, then only those', async () => {
    const live = server.keys.live;
    expect((await push(live.server, CONFIG)).status).toBe(200);
    const refused = await call(server.base, 'GET', `${HAS}?customerId=c`, {
      key: live.client,
      headers: { origin: APP },
    });
    expect(refused.status).toBe(403);
    expect(refused.body).toEqual({
      error: `origin ${APP} may not call the live environment: list it in client.allowedOrigins`,
      code: 'origin_not_allowed',
    });
    expect(corsHeaders(refused.headers)).toEqual({});
    // Without an Origin (a server, curl) the client key still works.
    expect(
      (await call(server.base, 'GET', `${HAS}?customerId=c`, { key: live.client })).status,
    ).toBe(200);

    const listed = { ...CONFIG, client: { allowedOrigins: [APP, 'http://localhost:3000'] } };
    expect((await push(live.server, listed)).status).toBe(200);
    const allowed = await call(server.base, 'GET', `${HAS}?customerId=c`, {
      key: live.client,
      headers: { origin: APP },
    });
    expect(allowed.status).toBe(200);
    expect(allowed.headers.get('access-control-allow-origin')).toBe(APP);
    const other = await call(server.base, 'GET', `${HAS}?customerId=c`, {
      key: live.client,
      headers: { origin: OTHER },
    });
    expect(other.status).toBe(403);
    expect(other.body.code).toBe('origin_not_allowed');
  });

  it('refuses a preflight from an origin no environment allows', async () => {
    const test = { ...CONFIG, client: { allowedOrigins: ['http://localhost:3000'] } };
    expect((await push(server.keys.test.server, test)).status).toBe(200);
    try {
      const preflight = (origin: string) =>
        call(server.base, 'OPTIONS', `${HAS}?customerId=c`, {
          headers: { origin, 'access-control-request-method': 'GET' },
        });
      const refused = await preflight(OTHER);
      expect(refused.status).toBe(403);
      expect(refused.body.code).toBe('origin_not_allowed');
      expect(corsHeaders(refused.headers)).toEqual({});
      expect((await preflight('http://localhost:3000')).status).toBe(204);
      // Allowed in live (the test above), so its preflight passes; test then refuses it.
      expect((await preflight(APP)).status).toBe(204);
      const testRead = await call(server.base, 'GET', `${HAS}?customerId=c`, {
        key: server.keys.test.client,
        headers: { origin: APP },
      });
      expect(testRead.status).toBe(403);
    } finally {
      expect((await push(server.keys.test.server, CONFIG)).status).toBe(200);
    }
  });

  it('validates client.allowedOrigins in the configuration', async () => {
    const cases: Array<[unknown, string]> = [
      [['https://app.example.com/'], 'client.allowedOrigins[0] must be "*" or an origin'],
      [['HTTPS://APP.EXAMPLE.COM'], 'client.allowedOrigins[0] must be "*" or an origin'],
      [['*', APP], 'client.allowedOrigins: "*" must stand alone'],
      [[APP, APP], 'client.allowedOrigins has duplicate items'],
      ['*', 'client.allowedOrigins must be'],
    ];
    for (const [origins, message] of cases) {
      const answer = await push(server.keys.test.server, {
        ...CONFIG,
        client: { allowedOrigins: origins },
      });
      expect(answer.status, JSON.stringify(origins)).toBe(400);
      expect(answer.body.code).toBe('invalid_config');
      expect(answer.body.error).toContain(message);
    }
    const unknown = await push(server.keys.test.server, { ...CONFIG, client: { origins: [] } });
    expect(unknown.body.error).toContain('client has unknown property "origins"');
  });
});

describe('customer tokens', () => {
  const mint = (body: unknown, key = server.keys.test.server) =>
    call(server.base, 'POST', '/v1/client-tokens', { key, body });
  const read = (route: string, token: string | null, key = server.keys.test.client) =>
    call(server.base, 'GET', route, {
      key,
      ...(token === null ? {} : { headers: { 'x-tally-customer-token': token } }),
    });

  it('mints a token with a server key only, and validates the request', async () => {
    const before = Date.now();
    const minted = await mint({ customerId: 'alice', ttlSeconds: 120 });
    expect(minted.status).toBe(200);
    expect(Object.keys(minted.body).sort()).toEqual([
      'customerId',
      'expiresAt',
      'token',
      'ttlSeconds',
    ]);
    expect(minted.body).toMatchObject({ customerId: 'alice', ttlSeconds: 120 });
    expect(minted.body.token).toMatch(/^ct_test_\d+\./);
    const expiresAtMs = Date.parse(minted.body.expiresAt);
    expect(expiresAtMs).toBeGreaterThanOrEqual(before + 120_000);
    expect(expiresAtMs).toBeLessThanOrEqual(Date.now() + 120_000);
    const defaulted = await mint({ customerId: 'alice' });
    expect(defaulted.body.ttlSeconds).toBe(900);

    expect((await mint({ customerId: 'alice' }, server.keys.test.client)).body.code).toBe(
      'server_key_required',
    );
    for (const [body, detail] of [
      [{}, 'customerId'],
      [{ customerId: 'a', ttlSeconds: 0 }, 'ttlSeconds'],
      [{ customerId: 'a', ttlSeconds: CUSTOMER_TOKEN_TTL_SEC_MAX + 1 }, 'ttlSeconds'],
      [{ customerId: 'a', ttlSeconds: 1.5 }, 'ttlSeconds'],
      [{ customerId: 'x'.repeat(256) }, 'customerId'],
      [{ customerId: 'a', scope: 'all' }, 'scope'],
    ] as const) {
      const answer = await mint(body);
      expect(answer.status, JSON.stringify(body)).toBe(400);
      expect(answer.body.error).toContain(detail);
    }
  });

  it("reads the token's customer, and refuses another customer with 403", async () => {
    const { token } = (await mint({ customerId: 'alice', ttlSeconds: 60 })).body;
    expect((await read(`${HAS}?customerId=alice`, token)).status).toBe(200);
    const balance = await read('/v1/usage/api_calls/balance?customerId=alice', token);
    expect(balance.status).toBe(200);
    expect(balance.body.balance).toBe(5);
    const other = await read(`${HAS}?customerId=bob`, token);
    expect(other.status).toBe(403);
    expect(other.body).toEqual({
      error: 'the customer token does not grant customer bob',
      code: 'customer_token_mismatch',
    });
    // A server key is not bound by a token.
    expect((await read(`${HAS}?customerId=bob`, token, server.keys.test.server)).status).toBe(200);
  });

  it('refuses a malformed, tampered or other-environment token with 401', async () => {
    const { token } = (await mint({ customerId: 'alice', ttlSeconds: 60 })).body as {
      token: string;
    };
    const [body, mac] = [token.slice(0, token.lastIndexOf('.')), token.slice(-43)];
    const otherCustomer = body.replace(/\.[^.]+$/, `.${Buffer.from('bob').toString('base64url')}`);
    const later = body.replace(/\.(\d+)\./, (_m, ms: string) => `.${Number(ms) + 1000}.`);
    const liveToken = (await mint({ customerId: 'alice', ttlSeconds: 60 }, server.keys.live.server))
      .body.token as string;
    for (const bad of [
      'nonsense',
      `${otherCustomer}.${mac}`,
      `${later}.${mac}`,
      `${body}.${'A'.repeat(43)}`,
      liveToken,
      token.replace('ct_test_', 'ct_test_9'),
      `${token}x`,
      'x'.repeat(5000),
    ]) {
      const answer = await read(`${HAS}?customerId=alice`, bad);
      expect(answer.status, bad.slice(0, 60)).toBe(401);
      expect(answer.body.code).toBe('customer_token_invalid');
    }
    expect((await read(`${HAS}?customerId=alice`, liveToken, server.keys.live.client)).status).toBe(
      200,
    );
  });

  it('refuses an expired token with 401', async () => {
    const { token } = (await mint({ customerId: 'alice', ttlSeconds: 1 })).body;
    expect((await read(`${HAS}?customerId=alice`, token)).status).toBe(200);
    await new Promise((resolve) => setTimeout(resolve, 1100));
    const expired = await read(`${HAS}?customerId=alice`, token);
    expect(expired.status).toBe(401);
    expect(expired.body.code).toBe('customer_token_expired');
  });

  it('is required for client-key reads when the configuration says so', async () => {
    const required = { ...CONFIG, client: { requireCustomerToken: true } };
    expect((await push(server.keys.test.server, required)).status).toBe(200);
    try {
      const without = await read(`${HAS}?customerId=alice`, null);
      expect(without.status).toBe(401);
      expect(without.body.code).toBe('customer_token_required');
      const { token } = (await mint({ customerId: 'alice', ttlSeconds: 60 })).body;
      expect((await read(`${HAS}?customerId=alice`, token)).status).toBe(200);
      expect((await read(`${HAS}?customerId=bob`, token)).status).toBe(403);
      expect((await read(`${HAS}?customerId=alice`, null, server.keys.test.server)).status).toBe(
        200,
      );
      // Not a customer read: the OpenAPI document needs no token.
      expect(
        (await call(server.base, 'GET', '/v1/docs/openapi.json', { key: server.keys.test.client }))
          .status,
      ).toBe(200);
      // The live environment is configured on its own.
      expect((await read(`${HAS}?customerId=alice`, null, server.keys.live.client)).status).toBe(
        200,
      );
    } finally {
      expect((await push(server.keys.test.server, CONFIG)).status).toBe(200);
    }
    expect((await read(`${HAS}?customerId=alice`, null)).status).toBe(200);
  });

  it('rotation keeps the previous secret, retires the one before, survives a restart', async () => {
    const rotate = (environment: string, key = server.keys.admin) =>
      call(server.base, 'POST', '/v1/admin/customer-token-secret/rotate', {
        key,
        body: { environment },
      });
    expect((await rotate('test', server.keys.test.server)).body.code).toBe('operator_key_required');
    expect((await rotate('staging')).status).toBe(400);
    const first = (await mint({ customerId: 'alice', ttlSeconds: 600 })).body.token as string;
    const generation = Number(/^ct_test_(\d+)\./.exec(first)?.[1]);
    const rotated = await rotate('test');
    expect(rotated.status).toBe(200);
    expect(rotated.body).toMatchObject({ environment: 'test', generation: generation + 1 });
    const until = Date.parse(rotated.body.previousValidUntil);
    expect(until - Date.now()).toBeGreaterThan(3_590_000);
    expect(until - Date.now()).toBeLessThanOrEqual(3_600_000);
    const second = (await mint({ customerId: 'alice', ttlSeconds: 600 })).body.token as string;
    expect(second.startsWith(`ct_test_${generation + 1}.`)).toBe(true);
    expect((await read(`${HAS}?customerId=alice`, first)).status).toBe(200);
    expect((await read(`${HAS}?customerId=alice`, second)).status).toBe(200);

    expect((await rotate('test')).body.generation).toBe(generation + 2);
    expect((await read(`${HAS}?customerId=alice`, first)).body.code).toBe('customer_token_invalid');
    expect((await read(`${HAS}?customerId=alice`, second)).status).toBe(200);
    // Live was not rotated.
    const live = await mint({ customerId: 'alice', ttlSeconds: 60 }, server.keys.live.server);
    expect(live.body.token).toMatch(/^ct_live_1\./);

    const audit = await call(server.base, 'GET', '/v1/audit?action=customer-token-secret.rotate', {
      key: server.keys.test.server,
    });
    expect(audit.body.data.map((e: { resourceId: string }) => e.resourceId)).toEqual([
      `test:${generation + 2}`,
      `test:${generation + 1}`,
    ]);

    await server.stop();
    server = await startServerProcess({ dataDir: server.dataDir, keys: server.keys });
    expect((await read(`${HAS}?customerId=alice`, second)).status).toBe(200);
    expect((await read(`${HAS}?customerId=alice`, first)).status).toBe(401);
  }, 60_000);
});

describe('CustomerTokens', () => {
  it('accepts the previous secret for exactly one maximum lifetime after a rotation', async () => {
    const dir = tempDataDir('tokens');
    const control = ControlStore.open(dir);
    try {
      const tokens = await CustomerTokens.open(control, ['test']);
      const t0 = 1_800_000_000_000;
      // The longest-lived token the old secret can sign, minted at the rotation's moment.
      const old = tokens.mint('test', 'alice', CUSTOMER_TOKEN_TTL_SEC_MAX, t0 + 1000).token;
      const rotation = tokens.rotate('test', t0 + 1000);
      await rotation.stored;
      const graceEndMs = t0 + 1000 + CUSTOMER_TOKEN_TTL_SEC_MAX * 1000;
      expect(tokens.verify('test', old, graceEndMs - 1)).toMatchObject({ customerId: 'alice' });
      expect(tokens.verify('test', old, graceEndMs)).toBe('customer_token_invalid');
      const fresh = tokens.mint('test', 'bob', 60, graceEndMs).token;
      expect(tokens.verify('test', fresh, graceEndMs)).toMatchObject({ customerId: 'bob' });
      expect(tokens.verify('test', fresh, graceEndMs + 60_000)).toBe('customer_token_expired');
      // Customer ids are any text, and survive the round trip exactly.
      const odd = 'org:ünïcødé/🙂.with.dots';
      expect(tokens.verify('test', tokens.mint('test', odd, 60, t0).token, t0)).toMatchObject({
        customerId: odd,
      });
    } finally {
      await control.close();
      fs.rmSync(path.resolve(dir), { recursive: true, force: true });
    }
  });
});
