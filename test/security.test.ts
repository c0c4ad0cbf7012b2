/**
 * Attacks a holder of a test key (or nobody at all) can mount over HTTP: a body nested
 * deep enough to exhaust the stack of a recursive walk, and requests whose framing a
 * proxy in front of Tally could read differently (request smuggling). Each case must be
 * refused with a clear answer, leave no state behind, and leave the server serving.
 */
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const CONFIG = {
  entitlements: { seats: { type: 'limit' }, api_calls: { type: 'meter' } },
  products: {
    free: {
      default: true,
      entitlements: {
        seats: { included: 2, expansion: { unitAmount: 1 } },
        api_calls: { included: 50 },
      },
    },
  },
};

let server: ServerProcess;
beforeAll(async () => {
  server = await startServerProcess({ config: CONFIG });
});
afterAll(async () => {
  await server?.stop();
});

/** Every route that takes a JSON body, with the key class it needs. */
const BODY_ROUTES: ReadonlyArray<readonly [string, string, 'server' | 'admin']> = [
  ['POST', '/v1/usage/api_calls/consume', 'server'],
  ['POST', '/v1/usage/api_calls/refund', 'server'],
  ['POST', '/v1/usage/api_calls/settings', 'server'],
  ['POST', '/v1/entitlements/seats/limit/settings', 'server'],
  ['POST', '/v1/sync/push', 'server'],
  ['POST', '/v1/context', 'server'],
  ['POST', '/v1/customers', 'server'],
  ['PUT', '/v1/contracts/deep', 'server'],
  ['POST', '/v1/admin/keys', 'admin'],
];

/**
 * `{"customerId":<escape?>,"amount":[[…]]}` with `depth` arrays, the shape that crashed a recursive
 * walk.
 */
function deepBody(depth: number, withEscape: boolean): string {
  const id = withEscape ? '"\\u0041"' : '"A"';
  return `{"customerId":${id},"id":${id},"amount":${'['.repeat(depth)}${']'.repeat(depth)}}`;
}

/**
 * Sends raw bytes on a new connection; resolves with everything read once the server closes it (or
 * after `waitMs`).
 */
function rawExchange(
  text: string,
  waitMs = 1500,
): Promise<{ received: string; closedByServer: boolean }> {
  const { hostname, port } = new URL(server.base);
  return new Promise((resolve) => {
    const socket = net.connect(Number(port), hostname);
    let received = '';
    let closedByServer = false;
    socket.setEncoding('latin1').on('data', (chunk: string) => (received += chunk));
    socket.on('error', () => undefined);
    socket.on('end', () => (closedByServer = true));
    const timer = setTimeout(() => socket.destroy(), waitMs);
    socket.on('close', () => {
      clearTimeout(timer);
      resolve({ received, closedByServer });
    });
    socket.write(text);
  });
}

const balanceOf = async (customerId: string): Promise<number> => {
  const res = await call(
    server.base,
    'GET',
    `/v1/usage/api_calls/balance?customerId=${customerId}`,
    { key: server.keys.test.server },
  );
  expect(res.status).toBe(200);
  return res.body.consumed as number;
};

describe('deeply nested bodies', () => {
  it(
    'are a 400 naming the nesting limit on every body route, with or without escapes, and ' +
      'the server keeps serving',
    async () => {
      for (const [method, path, keyClass] of BODY_ROUTES) {
        const key = keyClass === 'admin' ? server.keys.admin : server.keys.test.server;
        for (const depth of [33, 1_000, 12_000, 200_000]) {
          for (const withEscape of [false, true]) {
            const res = await call(server.base, method, path, {
              key,
              rawBody: deepBody(depth, withEscape),
              headers: { 'content-type': 'application/json' },
            });
            expect(res, `${method} ${path} depth ${depth} escape ${withEscape}`).toMatchObject({
              status: 400,
              body: { error: 'request body nests arrays and objects deeper than 32 levels' },
            });
          }
        }
      }
      expect((await call(server.base, 'GET', '/healthz')).status).toBe(200);
      expect(await balanceOf('A')).toBe(0);
    },
  );

  it(
    'nesting up to the limit is judged by the schema as usual, and brackets inside strings ' +
      'do not count',
    async () => {
      const atLimit = `{"customerId":"n1","amount":${'['.repeat(31)}${']'.repeat(31)}}`;
      const res = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
        key: server.keys.test.server,
        rawBody: atLimit,
        headers: { 'content-type': 'application/json' },
      });
      expect(res).toMatchObject({ status: 400, body: { error: expect.stringMatching(/^amount/) } });
      const bracketsInText = {
        id: 'n2',
        name: '['.repeat(100),
        metadata: { note: '{'.repeat(100) },
      };
      expect(
        (
          await call(server.base, 'POST', '/v1/customers', {
            key: server.keys.test.server,
            body: bracketsInText,
          })
        ).status,
      ).toBe(201);
    },
  );
});

describe('request smuggling', () => {
  const key = (): string => server.keys.test.server;
  /** A complete consume request for `customerId`, to be hidden in another request's body. */
  const consumeRequest = (customerId: string): string => {
    const body = `{"customerId":"${customerId}","amount":1}`;
    return (
      `POST /v1/usage/api_calls/consume HTTP/1.1\r\nHost: ` +
      `x\r\nx-tally-key: ${key()}\r\ncontent-type: ` +
      `application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`
    );
  };

  it(
    'two Content-Length headers: 400 and close; ' + 'a request hidden behind them never runs',
    async () => {
      const alone = await rawExchange(
        'GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n',
      );
      expect(alone.received).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
      expect(alone.received).toContain(
        'ambiguous message framing: more than one Content-Length header',
      );
      expect(alone.closedByServer).toBe(true);

      const hidden = consumeRequest('smuggled-1');
      const smuggled = await rawExchange(
        `GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: ` +
          `0\r\nContent-Length: ${hidden.length}\r\n\r\n${hidden}`,
      );
      expect(smuggled.closedByServer).toBe(true);
      expect(smuggled.received).not.toMatch(/200 OK/);
      // An empty first Content-Length, which uWS reads as 0, is refused the same way.
      const hidden2 = consumeRequest('smuggled-2');
      const empty = await rawExchange(
        `GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: ` +
          `\r\nContent-Length: ${hidden2.length}\r\n\r\n${hidden2}`,
      );
      expect(empty.closedByServer).toBe(true);
      expect(empty.received).not.toMatch(/200 OK/);
      expect(await balanceOf('smuggled-1')).toBe(0);
      expect(await balanceOf('smuggled-2')).toBe(0);
    },
  );

  it(
    'Transfer-Encoding in any form (chunked, a list, bare-LF chunk lines) is refused and ' +
      'closed; nothing is applied',
    async () => {
      const body = '{"customerId":"te-1","amount":1}';
      const head = (encoding: string): string =>
        `POST /v1/usage/api_calls/consume HTTP/1.1\r\nHost: ` +
        `x\r\nx-tally-key: ${key()}\r\ncontent-type: ` +
        `application/json\r\nTransfer-Encoding: ${encoding}\r\n\r\n`;
      const crlf = `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
      const bareLf = `${body.length.toString(16)}\n${body}\n0\n\n`;
      for (const [encoding, chunks] of [
        ['chunked, identity', crlf],
        ['chunked', bareLf],
        ['chunked', crlf],
        ['identity', ''],
      ] as const) {
        const res = await rawExchange(head(encoding) + chunks);
        expect(res.received, `${encoding} ${JSON.stringify(chunks)}`).toMatch(
          /^HTTP\/1\.1 411 Length Required\r\n/,
        );
        expect(res.received).toContain('a request body must be sent with Content-Length');
        expect(res.closedByServer).toBe(true);
      }
      // With bytes after the head that are no request, uWS itself closes before any answer.
      const identity = await rawExchange(head('identity') + body);
      expect(identity.received).not.toMatch(/200 OK/);
      expect(identity.closedByServer).toBe(true);
      const both = await rawExchange(
        `POST /v1/usage/api_calls/consume HTTP/1.1\r\nHost: ` +
          `x\r\nx-tally-key: ${key()}\r\ncontent-type: ` +
          `application/json\r\nContent-Length: ${crlf.length}\r\nTransfer-Encoding: ` +
          `chunked\r\n\r\n${crlf}`,
      );
      expect(both.received).not.toMatch(/200 OK/);
      expect(both.closedByServer).toBe(true);
      expect(await balanceOf('te-1')).toBe(0);
    },
  );

  it('a Content-Length that is not a number is refused', async () => {
    const res = await rawExchange('GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: \r\n\r\n');
    expect(res.received).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
    expect(res.received).toContain('Content-Length is not a decimal number');
  });

  it('one well-formed Content-Length still works, pipelined or not', async () => {
    const ok = await rawExchange(`${consumeRequest('plain-1')}`, 500);
    expect(ok.received).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    expect(await balanceOf('plain-1')).toBe(1);
    expect((await call(server.base, 'GET', '/healthz')).status).toBe(200);
  });
});
