/**
 * HTTP tests against a real server process: every status of the error catalog these
 * routes can produce, the 413/405/404 edges, hostile input, and the config routes. The
 * suite runs twice: on one front end and one shard worker, and on two front-end threads and
 * two shard workers with a connection per request (so requests land on both front ends, the
 * second serving the hot path itself and relaying the rest to the first).
 */
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePrometheusText, sampleValue } from './support/prometheus-text.js';
import {
  call,
  freshConnections,
  startServerProcess,
  type ServerProcess,
} from './support/server-process.js';

/**
 * A raw connection to `base`, for what fetch cannot show or does not survive: the bytes of
 * a reply head, or a reply sent while the client was still writing and then a close (a
 * writer gets EPIPE or a reset there, so write errors are ignored). `received` is
 * everything read so far; `closed` settles when the server closes the connection.
 */
function rawConnection(base: string): {
  readonly socket: net.Socket;
  readonly received: () => string;
  readonly clear: () => void;
  readonly closed: Promise<void>;
} {
  const { hostname, port } = new URL(base);
  const socket = net.connect(Number(port), hostname);
  let received = '';
  socket.setEncoding('latin1').on('data', (chunk: string) => (received += chunk));
  socket.on('error', () => undefined);
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  return { socket, received: () => received, clear: () => (received = ''), closed };
}

const CONFIG = {
  entitlements: {
    sso: { type: 'feature', name: 'Single sign-on' },
    seats: { type: 'limit', name: 'Seats' },
    projects: { type: 'limit' },
    api_calls: { type: 'meter', name: 'API calls', reset: 'month' },
    tokens: { type: 'meter', reset: 'never' },
  },
  products: {
    free: {
      name: 'Free',
      default: true,
      entitlements: {
        sso: true,
        seats: { included: 5, expansion: { unitAmount: 500 } },
        projects: { included: 1 },
        api_calls: { included: 100, overage: { unitAmount: 1 } },
        tokens: { included: 10 },
      },
    },
    pro: {
      name: 'Pro',
      price: { amount: 2000, currency: 'usd', interval: 'month' },
      entitlements: { sso: true },
    },
  },
};

const SETUPS = [
  { name: 'one front end, one shard worker', frontEnds: 1, workers: 1 },
  { name: 'two front ends, two shard workers', frontEnds: 2, workers: 2 },
];

describe.each(SETUPS)('$name', ({ frontEnds, workers }) => {
  let server: ServerProcess;
  let sk: string;
  let ck: string;

  beforeAll(async () => {
    server = await startServerProcess({
      env: { TALLY_FRONTENDS: String(frontEnds), TALLY_WORKERS: String(workers) },
    });
    if (frontEnds > 1) freshConnections(server.base);
    sk = server.keys.test.server;
    ck = server.keys.test.client;
    const pushed = await call(server.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG });
    expect(pushed.status).toBe(200);
  });

  afterAll(async () => {
    await server?.stop();
  });

  const get = (path: string, key = ck) => call(server.base, 'GET', path, { key });
  const post = (path: string, body: unknown, key = sk) =>
    call(server.base, 'POST', path, { key, body });

  describe('public and health routes', () => {
    it('GET /healthz answers ok without a key', async () => {
      expect(await call(server.base, 'GET', '/healthz')).toMatchObject({
        status: 200,
        body: { ok: true },
      });
    });
    it('GET /v1/schema/billing is public and is a JSON Schema', async () => {
      const res = await call(server.base, 'GET', '/v1/schema/billing');
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject({ type: 'object' });
      expect(JSON.stringify(res.body)).toContain('entitlements');
    });
  });

  describe('authentication (401/403)', () => {
    it.each([
      ['missing key', undefined, 401, 'x-tally-key header is required'],
      ['malformed key', 'nope', 401, 'API key is invalid or revoked'],
      [
        'unknown well-formed key',
        'sk_test_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA',
        401,
        'API key is invalid or revoked',
      ],
    ])('%s → %s', async (_label, key, status, error) => {
      const res = await call(
        server.base,
        'GET',
        '/v1/entitlements/sso/has?customerId=c',
        key === undefined ? {} : { key },
      );
      expect(res).toMatchObject({ status, body: { error } });
    });

    it('accepts the key as a Bearer token too, the scheme in any case', async () => {
      for (const scheme of ['Bearer', 'bearer', 'BEARER']) {
        const res = await call(server.base, 'GET', '/v1/entitlements/sso/has?customerId=c', {
          headers: { authorization: `${scheme} ${ck}` },
        });
        expect(res, scheme).toMatchObject({ status: 200, body: true });
      }
    });

    it.each([
      ['POST', '/v1/usage/api_calls/consume'],
      ['POST', '/v1/usage/api_calls/refund'],
      ['POST', '/v1/usage/api_calls/settings'],
      ['POST', '/v1/entitlements/seats/limit/settings'],
      ['POST', '/v1/sync/push'],
      ['GET', '/v1/sync/pull'],
    ])('client key on %s %s → 403', async (method, path) => {
      const res = await call(server.base, method, path, {
        key: ck,
        ...(method === 'GET' ? {} : { body: { customerId: 'c', amount: 1 } }),
      });
      expect(res).toMatchObject({
        status: 403,
        body: { error: 'this endpoint requires a server key' },
      });
    });

    it('the operator key is refused on environment routes', async () => {
      const res = await get('/v1/entitlements/sso/has?customerId=c', server.keys.admin);
      expect(res.status).toBe(403);
    });

    it.each([
      ['/v1/entitlements/sso/has?customerId=c', true],
      ['/v1/entitlements/seats/limit?customerId=c', { limit: 5 }],
      ['/v1/usage/tokens/balance?customerId=c', { balance: 10 }],
    ])('server keys may read too: %s', async (path, body) => {
      const res = await get(path, sk);
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject(body as object);
    });
  });

  describe('routing (404/405)', () => {
    it('unknown route → 404 after the key is checked', async () => {
      expect((await get('/v1/nope')).status).toBe(404);
      expect((await call(server.base, 'GET', '/v1/nope')).status).toBe(401);
      expect((await call(server.base, 'GET', '/elsewhere')).status).toBe(404);
    });
    it('wrong method → 405 with Allow', async () => {
      const res = await call(server.base, 'PUT', '/v1/usage/api_calls/consume', {
        key: sk,
        body: {},
      });
      expect(res.status).toBe(405);
      expect(res.headers.get('allow')).toBe('POST');
    });
    it('unknown entitlement → 404 naming it', async () => {
      expect(await get('/v1/entitlements/nope/has?customerId=c')).toMatchObject({
        status: 404,
        body: { error: 'entitlement nope not found' },
      });
      expect((await post('/v1/usage/nope/consume', { customerId: 'c', amount: 1 })).status).toBe(
        404,
      );
    });
    it('wrong entitlement type → 400', async () => {
      expect(await get('/v1/entitlements/sso/limit?customerId=c')).toMatchObject({
        status: 400,
        body: { error: 'sso is a feature, not a limit' },
      });
      expect((await get('/v1/usage/seats/balance?customerId=c')).status).toBe(400);
      expect((await post('/v1/usage/sso/consume', { customerId: 'c', amount: 1 })).status).toBe(
        400,
      );
    });
  });

  describe('metering over HTTP', () => {
    it('consume draws, answers the balance, and 429 carries the balance fields', async () => {
      const c = 'http-consume';
      const first = await post('/v1/usage/api_calls/consume', { customerId: c, amount: 60 });
      expect(first).toMatchObject({
        status: 200,
        body: { balance: 40, consumed: 60, included: 100, overage: 0 },
      });
      expect(first.body.resets).toMatch(/^\d{4}-\d{2}-01T00:00:00\.000Z$/);
      const short = await post('/v1/usage/api_calls/consume', { customerId: c, amount: 41 });
      expect(short.status).toBe(429);
      expect(short.body).toMatchObject({
        error: 'insufficient balance for api_calls',
        balance: 40,
        consumed: 60,
      });
      expect((await get(`/v1/usage/api_calls/balance?customerId=${c}`)).body).toMatchObject({
        balance: 40,
      });
    });

    it('0.1 + 0.2 = 0.3 exactly', async () => {
      await post('/v1/usage/api_calls/consume', { customerId: 'exact', amount: 0.1 });
      const res = await post('/v1/usage/api_calls/consume', { customerId: 'exact', amount: 0.2 });
      expect(res.body).toMatchObject({ consumed: 0.3, balance: 99.7 });
    });

    it('overage settings: allowed meter accepts, then consume runs into overage', async () => {
      const c = 'http-overage';
      const set = await post('/v1/usage/api_calls/settings', {
        customerId: c,
        overageEnabled: true,
      });
      expect(set).toMatchObject({
        status: 200,
        body: { overageEnabled: true, overageAllowed: true },
      });
      expect(
        (await post('/v1/usage/api_calls/consume', { customerId: c, amount: 150 })).body,
      ).toMatchObject({ overage: 50, balance: 0 });
      expect(
        await post('/v1/usage/tokens/settings', { customerId: c, overageEnabled: true }),
      ).toMatchObject({
        status: 400,
        body: { error: "overageEnabled: overage is not allowed for tokens on the customer's plan" },
      });
    });

    it('refund unwinds, and beyond refundable is 409 with the balance fields', async () => {
      const c = 'http-refund';
      await post('/v1/usage/api_calls/consume', { customerId: c, amount: 10 });
      expect(
        (await post('/v1/usage/api_calls/refund', { customerId: c, amount: 4 })).body,
      ).toMatchObject({ consumed: 6, balance: 94 });
      const over = await post('/v1/usage/api_calls/refund', { customerId: c, amount: 7 });
      expect(over.status).toBe(409);
      expect(over.body).toMatchObject({ consumed: 6, balance: 94 });
      expect(over.body.error).toContain('refundable');
    });

    it('idempotent consume applies once; different parameters → 400', async () => {
      const c = 'http-idem';
      const body = { customerId: c, amount: 5, idempotencyKey: 'order-1' };
      await post('/v1/usage/api_calls/consume', body);
      const again = await post('/v1/usage/api_calls/consume', body);
      expect(again).toMatchObject({ status: 200, body: { consumed: 5 } });
      expect(await post('/v1/usage/api_calls/consume', { ...body, amount: 6 })).toMatchObject({
        status: 400,
        body: { error: 'idempotencyKey was reused with different parameters' },
      });
    });

    it('limit settings', async () => {
      const c = 'http-limit';
      expect(
        await post('/v1/entitlements/seats/limit/settings', {
          customerId: c,
          purchased: 3,
          autoExpansionEnabled: true,
        }),
      ).toMatchObject({
        status: 200,
        body: {
          limit: 8,
          included: 5,
          purchased: 3,
          expansionAllowed: true,
          autoExpansionEnabled: true,
        },
      });
      expect((await get(`/v1/entitlements/seats/limit?customerId=${c}`)).body).toMatchObject({
        limit: 8,
      });
      expect(
        (await post('/v1/entitlements/projects/limit/settings', { customerId: c, purchased: 1 }))
          .status,
      ).toBe(400);
      expect((await post('/v1/entitlements/seats/limit/settings', { customerId: c })).body).toEqual(
        {
          error: 'purchased or autoExpansionEnabled is required',
          code: 'invalid_request',
        },
      );
      expect(
        (await post('/v1/entitlements/seats/limit/settings', { customerId: c, purchased: 1.5 }))
          .body,
      ).toEqual({
        error: 'purchased must be a whole number',
        code: 'invalid_request',
      });
    });

    it('environments never see each other', async () => {
      const live = server.keys.live;
      expect((await call(server.base, 'GET', '/v1/sync/pull', { key: live.server })).status).toBe(
        404,
      );
      expect((await get('/v1/entitlements/sso/has?customerId=c', live.client)).status).toBe(404);
    });
  });

  describe('contracts', () => {
    const contract = {
      priceAmount: 9900,
      priceInterval: 'year',
      entitlements: { seats: { included: 40 }, tokens: { included: 0.5 }, sso: { included: 0 } },
    };

    it(
      'PUT stores (creating the customer), GET reads, the overrides apply, DELETE restores ' +
        'the plan',
      async () => {
        const c = 'contract-customer';
        const put = await call(server.base, 'PUT', `/v1/contracts/${c}`, {
          key: sk,
          body: contract,
        });
        expect(put).toMatchObject({ status: 200, body: { customerId: c, ...contract } });
        expect(put.body.updatedAt).toMatch(/Z$/);
        expect(await get(`/v1/contracts/${c}`, sk)).toMatchObject({
          status: 200,
          body: { customerId: c, priceAmount: 9900 },
        });
        expect((await get(`/v1/entitlements/seats/limit?customerId=${c}`)).body).toMatchObject({
          limit: 40,
          included: 40,
        });
        expect((await get(`/v1/usage/tokens/balance?customerId=${c}`)).body).toMatchObject({
          included: 0.5,
          balance: 0.5,
        });
        expect((await get(`/v1/entitlements/sso/has?customerId=${c}`)).body).toBe(false);
        const removed = await call(server.base, 'DELETE', `/v1/contracts/${c}`, { key: sk });
        expect(removed.status).toBe(204);
        expect((await get(`/v1/entitlements/seats/limit?customerId=${c}`)).body).toMatchObject({
          limit: 5,
        });
        expect(await get(`/v1/contracts/${c}`, sk)).toMatchObject({
          status: 404,
          body: { error: `customer ${c} has no contract` },
        });
        expect((await call(server.base, 'DELETE', `/v1/contracts/${c}`, { key: sk })).status).toBe(
          404,
        );
      },
    );

    it(
      'answers DELETE with a bare 204: no Content-Length, no content type, and the connection ' +
        'stays usable',
      async () => {
        const c = 'contract-204';
        expect(
          (await call(server.base, 'PUT', `/v1/contracts/${c}`, { key: sk, body: contract }))
            .status,
        ).toBe(200);
        const { socket, received, clear } = rawConnection(server.base);
        const until = async (done: () => boolean): Promise<void> => {
          while (!done()) await new Promise((resolve) => setTimeout(resolve, 5));
        };
        socket.write(`DELETE /v1/contracts/${c} HTTP/1.1\r\nHost: x\r\nx-tally-key: ${sk}\r\n\r\n`);
        await until(() => received().includes('\r\n\r\n'));
        const [head] = received().split('\r\n\r\n');
        expect(head).toMatch(/^HTTP\/1\.1 204 No Content\r\n/);
        expect(head?.toLowerCase()).not.toMatch(
          /\r\n(content-length|content-type|transfer-encoding):/,
        );
        expect(head?.toLowerCase()).toContain('\r\nx-ratelimit-remaining: ');
        // Nothing follows the head, and the same connection answers the next request.
        clear();
        socket.write(`GET /v1/contracts/${c} HTTP/1.1\r\nHost: x\r\nx-tally-key: ${sk}\r\n\r\n`);
        await until(() => received().includes('has no contract'));
        expect(received()).toMatch(/^HTTP\/1\.1 404 Not Found\r\n/);
        socket.destroy();
      },
    );

    it.each([
      [{ ...contract, priceInterval: 'week' }, 'priceInterval must be one of month, year'],
      [{ ...contract, priceAmount: 1.5 }, 'priceAmount must be a whole number'],
      [{ ...contract, priceAmount: -1 }, 'priceAmount must be >= 0'],
      [{ priceInterval: 'month' }, 'priceAmount is required'],
      [
        { ...contract, entitlements: { seats: { included: 'x' } } },
        'entitlements.seats.included must be a number',
      ],
      [{ ...contract, entitlements: { seats: {} } }, 'entitlements.seats.included is required'],
      [
        { ...contract, entitlements: { seats: { included: 1, extra: 2 } } },
        'entitlements.seats.extra is not a known field',
      ],
      [
        { ...contract, entitlements: { nope: { included: 1 } } },
        'entitlements.nope is not an entitlement of the billing configuration',
      ],
      [
        { ...contract, entitlements: { seats: { included: 2.5 } } },
        'entitlements.seats.included must be a whole number for a limit',
      ],
    ])('PUT %j → 400 %s', async (body, error) => {
      expect(await call(server.base, 'PUT', '/v1/contracts/bad', { key: sk, body })).toMatchObject({
        status: 400,
        body: { error },
      });
    });

    it('needs a server key, and a customerId path segment', async () => {
      expect((await get('/v1/contracts/x', ck)).status).toBe(403);
      expect(
        (await call(server.base, 'PUT', '/v1/contracts/x', { key: ck, body: contract })).status,
      ).toBe(403);
      expect((await get('/v1/contracts/', sk)).status).toBe(404);
      expect(
        (
          await call(server.base, 'POST', '/v1/contracts/x', { key: sk, body: contract })
        ).headers.get('allow'),
      ).toBe('GET, PUT, DELETE');
    });
  });

  describe('hostile input (400, never 500)', () => {
    const consume = '/v1/usage/api_calls/consume';
    it.each([
      [{ amount: 1 }, 'customerId is required'],
      [{ customerId: 'c' }, 'amount is required'],
      [{ customerId: 7, amount: 1 }, 'customerId must be a string'],
      [{ customerId: '', amount: 1 }, 'customerId must be 1 to 255 characters'],
      [{ customerId: 'x'.repeat(256), amount: 1 }, 'customerId must be 1 to 255 characters'],
      [{ customerId: 'c', amount: '1' }, 'amount must be a number'],
      [{ customerId: 'c', amount: 0 }, 'amount must be greater than 0'],
      [{ customerId: 'c', amount: -5 }, 'amount must be greater than 0'],
      [{ customerId: 'c', amount: 0.0000001 }, 'amount must have at most 6 decimal places'],
      [{ customerId: 'c', amount: 1e300 }, 'amount must be at most 1000000000000'],
      [{ customerId: 'c', amount: 1, extra: true }, 'extra is not a known field'],
      [
        { customerId: 'c', amount: 1, idempotencyKey: '' },
        'idempotencyKey must be 1 to 255 characters',
      ],
      [[1, 2], 'request body must be a JSON object'],
      ['text', 'request body must be a JSON object'],
      [null, 'request body must be a JSON object'],
    ])('body %j → %s', async (body, error) => {
      expect(await post(consume, body)).toMatchObject({ status: 400, body: { error } });
    });

    it('1e309 (Infinity after parsing) is a 400', async () => {
      const res = await call(server.base, 'POST', consume, {
        key: sk,
        rawBody: '{"customerId":"c","amount":1e309}',
        headers: { 'content-type': 'application/json' },
      });
      expect(res).toMatchObject({ status: 400, body: { error: 'amount must be a number' } });
    });

    it('malformed JSON and wrong content type', async () => {
      expect(
        await call(server.base, 'POST', consume, {
          key: sk,
          rawBody: '{"customerId":',
          headers: { 'content-type': 'application/json' },
        }),
      ).toMatchObject({
        status: 400,
        body: { error: 'request body is not valid JSON' },
      });
      expect(
        await call(server.base, 'POST', consume, {
          key: sk,
          rawBody: '{}',
          headers: { 'content-type': 'text/plain' },
        }),
      ).toMatchObject({
        status: 400,
        body: { error: 'content-type must be application/json' },
      });
      expect(
        (
          await call(server.base, 'POST', consume, {
            key: sk,
            rawBody: '',
            headers: { 'content-type': 'application/json' },
          })
        ).status,
      ).toBe(400);
    });

    it('query strings: missing, duplicated, unknown and badly encoded parameters', async () => {
      expect(await get('/v1/entitlements/sso/has')).toMatchObject({
        status: 400,
        body: { error: 'customerId is required' },
      });
      expect(await get('/v1/entitlements/sso/has?customerId=')).toMatchObject({ status: 400 });
      expect(await get('/v1/entitlements/sso/has?customerId=a&customerId=b')).toMatchObject({
        status: 400,
        body: { error: 'customerId is given more than once' },
      });
      expect(await get('/v1/entitlements/sso/has?customerId=a&foo=1')).toMatchObject({
        status: 400,
        body: { error: 'foo is not a known field' },
      });
      expect(await get('/v1/entitlements/sso/has?customerId=%E0%A4%A')).toMatchObject({
        status: 400,
        body: { error: 'customerId has invalid percent-encoding' },
      });
      expect(await get('/v1/entitlements/s%ZZo/has?customerId=a')).toMatchObject({
        status: 400,
        body: { error: 'key has invalid percent-encoding' },
      });
      expect(await get('/v1/entitlements/sso/has?customerId=caf%C3%A9+x')).toMatchObject({
        status: 200,
        body: true,
      });
    });

    it(
      'routes that read no query refuse any parameter, ' +
        'naming it (nothing is silently ignored)',
      async () => {
        const cases: Array<[string, string, unknown]> = [
          ['POST', '/v1/usage/api_calls/consume?foo=1', { customerId: 'q1', amount: 1 }],
          ['POST', '/v1/usage/api_calls/consume?customerId=other', { customerId: 'q1', amount: 1 }],
          [
            'POST',
            '/v1/entitlements/seats/limit/settings?dryRun=true',
            { customerId: 'q1', purchased: 1 },
          ],
          ['POST', '/v1/sync/push?dryRun=1', CONFIG],
          ['GET', '/v1/sync/pull?foo=1', undefined],
          ['GET', '/v1/plans?x=', undefined],
        ];
        const before = await call(server.base, 'GET', '/v1/sync/pull', { key: sk });
        for (const [method, path, body] of cases) {
          const name = path.slice(path.indexOf('?') + 1).split('=')[0];
          const res = await call(server.base, method, path, {
            key: sk,
            ...(body === undefined ? {} : { body }),
          });
          expect(res, `${method} ${path}`).toMatchObject({
            status: 400,
            body: { error: `${name} is not a known field` },
          });
        }
        // Nothing was applied: no usage for q1, no new configuration version.
        expect((await get('/v1/usage/api_calls/balance?customerId=q1', sk)).body).toMatchObject({
          consumed: 0,
        });
        expect((await call(server.base, 'GET', '/v1/sync/pull', { key: sk })).body.version).toBe(
          before.body.version,
        );
      },
    );

    it('content type is judged before the declared length (400 before 413)', async () => {
      const res = await call(server.base, 'POST', consume, {
        key: sk,
        rawBody: `{"customerId":"${'x'.repeat(1024 * 1024)}","amount":1}`,
        headers: { 'content-type': 'text/plain' },
      });
      expect(res).toMatchObject({
        status: 400,
        body: { error: 'content-type must be application/json' },
      });
    });

    it(
      'refuses a body string holding a lone surrogate, naming the field; well-formed non-BMP ' +
        'text passes',
      async () => {
        const raw = (json: string) =>
          call(server.base, 'POST', consume, {
            key: sk,
            rawBody: json,
            headers: { 'content-type': 'application/json' },
          });
        expect(await raw('{"customerId":"\\ud800","amount":1}')).toMatchObject({
          status: 400,
          body: { error: expect.stringMatching(/^customerId holds a lone surrogate/) },
        });
        expect(
          await raw('{"customerId":"ok","amount":1,"idempotencyKey":"a\\udc00b"}'),
        ).toMatchObject({
          status: 400,
          body: { error: expect.stringMatching(/^idempotencyKey holds a lone surrogate/) },
        });
        const upsert = await call(server.base, 'POST', '/v1/customers', {
          key: sk,
          rawBody: '{"id":"m1","metadata":{"k":"\\udbff"}}',
          headers: { 'content-type': 'application/json' },
        });
        expect(upsert).toMatchObject({
          status: 400,
          body: { error: expect.stringMatching(/^metadata\.k holds a lone surrogate/) },
        });
        const pair = await raw('{"customerId":"\\ud83d\\ude00-emoji","amount":1}');
        expect(pair).toMatchObject({ status: 200, body: { consumed: 1 } });
        expect(
          (
            await get(
              `/v1/usage/api_calls/balance?customerId=${encodeURIComponent('\u{1F600}-emoji')}`,
            )
          ).body,
        ).toMatchObject({ consumed: 1 });
      },
    );

    it(
      'a path id is measured in characters as the ' + 'body schemas measure it (an emoji is one)',
      async () => {
        const id = '\u{1F600}'.repeat(200); // 200 characters, 400 UTF-16 units
        expect((await post('/v1/customers', { id })).status).toBe(201);
        expect(
          await call(server.base, 'GET', `/v1/customers/${encodeURIComponent(id)}`, { key: sk }),
        ).toMatchObject({ status: 200, body: { id } });
        expect(
          (
            await call(
              server.base,
              'GET',
              `/v1/customers/${encodeURIComponent('\u{1F600}'.repeat(256))}`,
              { key: sk },
            )
          ).status,
        ).toBe(400);
      },
    );

    it(
      'a declared body over 1 MiB → 413 at once, before any of it is sent, and the connection ' +
        'is closed',
      async () => {
        // Only the head is sent: the answer must not wait for the body.
        const { socket, received, closed } = rawConnection(server.base);
        socket.write(
          `POST ${consume} HTTP/1.1\r\nHost: x\r\nx-tally-key: ${sk}\r\ncontent-type: ` +
            `application/json\r\ncontent-length: ${1024 * 1024 + 1}\r\n\r\n`,
        );
        await closed;
        expect(received()).toMatch(/^HTTP\/1\.1 413 Payload Too Large\r\n/);
        expect(received()).toContain(
          '{"error":"request body exceeds 1048576 bytes","code":"body_too_large"}',
        );
      },
    );

    it(
      'a chunked body (here one that would grow past 1 MiB) is refused and the connection is ' +
        'closed',
      async () => {
        // Chunked framing is refused outright (src/http/framing.ts): a 411 when the head arrives
        // alone, else a close before the body is read.
        const { socket, received, closed } = rawConnection(server.base);
        const chunk = (text: string): string =>
          `${Buffer.byteLength(text).toString(16)}\r\n${text}\r\n`;
        socket.write(
          `POST ${consume} HTTP/1.1\r\nHost: x\r\nx-tally-key: ${sk}\r\ncontent-type: ` +
            `application/json\r\ntransfer-encoding: chunked\r\n\r\n`,
        );
        socket.write(chunk('{"customerId":"'));
        const piece = chunk('x'.repeat(64 * 1024));
        for (let i = 0; i < 20 && !socket.destroyed; i++) socket.write(piece);
        if (!socket.destroyed) socket.write(`${chunk('"}')}0\r\n\r\n`);
        await closed;
        expect(received()).toMatch(/^(HTTP\/1\.1 411 Length Required\r\n|$)/);
        expect((await get('/v1/usage/api_calls/balance?customerId=x')).status).toBe(200);
      },
    );

    it('the server is still healthy after all of the above', async () => {
      expect((await call(server.base, 'GET', '/healthz')).status).toBe(200);
    });
  });

  describe('configuration sync', () => {
    it('push validates and lists every violation in one 400', async () => {
      const bad = {
        entitlements: { a: { type: 'meter' }, b: { type: 'bogus' } },
        products: {
          p: { default: true, entitlements: { missing: true, a: true } },
          q: { default: true },
        },
      };
      const res = await post('/v1/sync/push', bad);
      expect(res.status).toBe(400);
      expect(res.body.error).toMatch(/^invalid billing configuration: /);
      expect(res.body.error).not.toMatch(
        /invalid billing configuration: invalid billing configuration/,
      );
      expect(res.body.error).toContain('entitlements.b.type');
    });

    it('semantic violations are listed together', async () => {
      const bad = {
        entitlements: { a: { type: 'meter' } },
        products: {
          p: { default: true, entitlements: { missing: true, a: true } },
          q: { default: true },
        },
      };
      const res = await post('/v1/sync/push', bad);
      expect(res.status).toBe(400);
      expect(res.body.error).toContain('missing');
      expect(res.body.error).toContain('default');
    });

    it('pull returns exactly the last pushed document with its version', async () => {
      const before = await call(server.base, 'GET', '/v1/sync/pull', { key: sk });
      expect(before.status).toBe(200);
      expect(before.body.config).toEqual(CONFIG);
      const pushed = await post('/v1/sync/push', CONFIG);
      expect(pushed.body.version).toBe(before.body.version + 1);
      const after = await call(server.base, 'GET', '/v1/sync/pull', { key: sk });
      expect(after.body).toMatchObject({ config: CONFIG, version: before.body.version + 1 });
      expect(after.body.pushedAt).toMatch(/Z$/);
    });

    it('GET /v1/plans lists the products with their keys (server key only)', async () => {
      const res = await get('/v1/plans', sk);
      expect(res.status).toBe(200);
      expect(res.body.data.map((p: { key: string }) => p.key)).toEqual(['free', 'pro']);
      expect(res.body.data[0]).toMatchObject({
        key: 'free',
        name: 'Free',
        default: true,
        type: 'free',
        price: null,
      });
      expect(res.body.data[1]).toMatchObject({
        key: 'pro',
        type: 'recurring',
        price: { amount: 2000, currency: 'usd', interval: 'month' },
        entitlements: { sso: true },
      });
      expect((await get('/v1/plans', ck)).status).toBe(403);
      expect(await get('/v1/plans', server.keys.live.server)).toMatchObject({
        status: 200,
        body: { data: [] },
      });
    });

    it('shards see a new configuration without restart', async () => {
      const more = {
        ...CONFIG,
        entitlements: { ...CONFIG.entitlements, beta: { type: 'feature' } },
        products: {
          ...CONFIG.products,
          free: {
            ...CONFIG.products.free,
            entitlements: { ...CONFIG.products.free.entitlements, beta: true },
          },
        },
      };
      expect((await get('/v1/entitlements/beta/has?customerId=cfg')).status).toBe(404);
      expect((await post('/v1/sync/push', more)).status).toBe(200);
      expect(await get('/v1/entitlements/beta/has?customerId=cfg')).toMatchObject({
        status: 200,
        body: true,
      });
      expect((await post('/v1/sync/push', CONFIG)).status).toBe(200);
    });
  });

  describe('front ends', () => {
    it('every front end answered part of this suite', async () => {
      const metrics = await call(server.base, 'GET', '/v1/admin/metrics', {
        key: server.keys.admin,
      });
      const families = parsePrometheusText(metrics.body as string);
      for (let frontEnd = 0; frontEnd < frontEnds; frontEnd++)
        expect(
          sampleValue(families, 'tally_front_end_requests_total', { front_end: String(frontEnd) }),
        ).toBeGreaterThan(0);
    });
  });
});
