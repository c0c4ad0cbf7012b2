/**
 * Hostile input, generated: random JSON documents, random bytes and deeply nested
 * bodies against every body-taking route, random query strings against the reads. The
 * server must answer each with a 4xx (or a 2xx where the input happens to be valid) —
 * never a 5xx, never a dropped connection — and stay healthy.
 */
import fc from 'fast-check';
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
      default: true,
      entitlements: {
        sso: true,
        seats: { included: 2, expansion: { unitAmount: 1 } },
        api_calls: { included: 50, overage: { unitAmount: 1 } },
      },
    },
  },
};

const BODY_ROUTES: ReadonlyArray<readonly [string, string]> = [
  ['POST', '/v1/usage/api_calls/consume'],
  ['POST', '/v1/usage/api_calls/refund'],
  ['POST', '/v1/usage/api_calls/settings'],
  ['POST', '/v1/entitlements/seats/limit/settings'],
  ['POST', '/v1/sync/push'],
  ['PUT', '/v1/contracts/fuzz'],
];
const GET_ROUTES = [
  '/v1/entitlements/sso/has',
  '/v1/entitlements/seats/limit',
  '/v1/usage/api_calls/balance',
];

let server: ServerProcess;
beforeAll(async () => {
  server = await startServerProcess();
  expect(
    (
      await call(server.base, 'POST', '/v1/sync/push', {
        key: server.keys.test.server,
        body: CONFIG,
      })
    ).status,
  ).toBe(200);
});
afterAll(async () => {
  await server?.stop();
});

function expectClientOutcome(status: number, what: string): void {
  expect(status, what).toBeGreaterThanOrEqual(200);
  expect(status, what).toBeLessThan(500);
}

/** Plausible bodies: the right field names with arbitrary values, plus arbitrary JSON. */
const bodies = fc.oneof(
  fc.jsonValue({ maxDepth: 4 }),
  fc.record(
    {
      customerId: fc.oneof(fc.string({ maxLength: 300 }), fc.jsonValue({ maxDepth: 2 })),
      amount: fc.oneof(fc.double(), fc.integer(), fc.string(), fc.constant(null)),
      idempotencyKey: fc.oneof(fc.string({ maxLength: 300 }), fc.integer()),
      purchased: fc.oneof(fc.integer({ min: -5, max: 2e9 }), fc.double()),
      autoExpansionEnabled: fc.jsonValue({ maxDepth: 1 }),
      overageEnabled: fc.jsonValue({ maxDepth: 1 }),
      priceAmount: fc.oneof(fc.integer(), fc.double(), fc.string()),
      priceInterval: fc.oneof(
        fc.constantFrom('month', 'year', 'week'),
        fc.jsonValue({ maxDepth: 1 }),
      ),
      entitlements: fc.oneof(
        fc.dictionary(
          fc.constantFrom('seats', 'sso', 'api_calls', 'nope'),
          fc.record({ included: fc.oneof(fc.double(), fc.integer(), fc.string()) }),
        ),
        fc.jsonValue({ maxDepth: 3 }),
      ),
    },
    { requiredKeys: [] },
  ),
);

describe('generated hostile input', () => {
  it('JSON bodies on every body route never produce a 5xx', async () => {
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...BODY_ROUTES), bodies, async ([method, route], body) => {
        const res = await call(server.base, method, route, {
          key: server.keys.test.server,
          rawBody: JSON.stringify(body) ?? 'null',
          headers: { 'content-type': 'application/json' },
        });
        expectClientOutcome(res.status, `${route} ${JSON.stringify(body)}`);
        if (res.status >= 400) expect(typeof res.body.error).toBe('string');
      }),
      { numRuns: 400 },
    );
  });

  it('raw bytes and pathological nesting are 400s', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...BODY_ROUTES),
        fc.uint8Array({ maxLength: 200 }),
        async ([method, route], bytes) => {
          const res = await call(server.base, method, route, {
            key: server.keys.test.server,
            rawBody: Buffer.from(bytes).toString('latin1'),
            headers: { 'content-type': 'application/json' },
          });
          expectClientOutcome(res.status, `${route} bytes`);
        },
      ),
      { numRuns: 200 },
    );
    const deep = `${'['.repeat(200_000)}${']'.repeat(200_000)}`;
    for (const [method, route] of BODY_ROUTES) {
      const res = await call(server.base, method, route, {
        key: server.keys.test.server,
        rawBody: deep,
        headers: { 'content-type': 'application/json' },
      });
      expect(res.status, route).toBe(400);
    }
    const deepObject =
      `{"customerId":"c","amount":1,"x":${'{"a":'.repeat(100_000)}1` + `${'}'.repeat(100_000)}}`;
    expect(
      (
        await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
          key: server.keys.test.server,
          rawBody: deepObject,
          headers: { 'content-type': 'application/json' },
        })
      ).status,
    ).toBe(400);
  });

  it('random query strings and path keys on the reads never produce a 5xx', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...GET_ROUTES),
        fc.string({ maxLength: 120 }),
        async (route, query) => {
          const res = await call(
            server.base,
            'GET',
            `${route}?${encodeURI(query).replace(/#/g, '%23')}`,
            { key: server.keys.test.client },
          );
          expectClientOutcome(res.status, `${route}?${query}`);
        },
      ),
      { numRuns: 300 },
    );
    await fc.assert(
      fc.asyncProperty(fc.string({ minLength: 1, maxLength: 300 }), async (key) => {
        const res = await call(
          server.base,
          'GET',
          `/v1/usage/${encodeURIComponent(key)}/balance?customerId=c`,
          { key: server.keys.test.client },
        );
        expectClientOutcome(res.status, key);
      }),
      { numRuns: 200 },
    );
  });

  it('the server is healthy afterwards', async () => {
    expect((await call(server.base, 'GET', '/healthz')).status).toBe(200);
  });
});
