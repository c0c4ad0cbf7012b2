/**
 * Fair budgets for public client keys (docs/api.md, Rate limits): per key, per key and
 * client address, per key and customer; a request is counted only when every budget it
 * belongs to admits it, so one address flooding leaves other addresses answered. The
 * address is the socket's peer, or the last entry a trusted proxy appended to the
 * configured header; an IPv6 client is one /64.
 */
import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimiter, WINDOW_MS } from '../src/auth/rate-limit.js';
import { addressKeyOfBytes, addressKeyOfText } from '../src/http/client-address.js';
import type { KeyRecord } from '../storage/control-store.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const CONFIG = {
  entitlements: { sso: { type: 'feature' } },
  products: { free: { default: true, entitlements: { sso: true } } },
};

const clientKey: KeyRecord = {
  id: 'ck1',
  prefix: 'ck_test_x',
  hashHex: '00',
  environment: 'test',
  keyClass: 'client',
  createdAtMs: 0,
  revokedAtMs: null,
};

/** Keeps a burst of requests inside one window: never starts in a minute's last 5 s. */
async function awayFromWindowEnd(): Promise<void> {
  const intoMinuteMs = Date.now() % WINDOW_MS;
  if (intoMinuteMs > WINDOW_MS - 5000)
    await new Promise((resolve) => setTimeout(resolve, WINDOW_MS - intoMinuteMs + 100));
}

describe('RateLimiter for client keys', () => {
  const t0 = Date.UTC(2026, 10, 22, 12, 0, 10);

  it('admits per address, counts only what it admits, and reports the tightest budget', () => {
    const limiter = new RateLimiter({ server: 5, client: 10, clientAddress: 3, clientCustomer: 0 });
    const a = 0x0a000001;
    const b = 0x0a000002;
    const fromA = Array.from({ length: 50 }, () => limiter.takeClient(clientKey, a, t0));
    expect(fromA.filter((d) => d?.allowed).length).toBe(3);
    expect(fromA[2]).toMatchObject({
      remaining: 0,
      limit: 3,
      scope: 'for this key from one address',
    });
    expect(fromA[3]).toMatchObject({ allowed: false, scope: 'for this key from one address' });
    // A's 47 refusals cost the key nothing: 7 of its 10 are left for everyone else.
    const fromB = limiter.takeClient(clientKey, b, t0);
    expect(fromB).toMatchObject({
      allowed: true,
      remaining: 2,
      scope: 'for this key from one address',
    });
    const others = Array.from({ length: 10 }, (_, i) => limiter.takeClient(clientKey, 100 + i, t0));
    expect(others.filter((d) => d?.allowed).length).toBe(6);
    expect(others[6]).toMatchObject({ allowed: false, scope: 'for this key', limit: 10 });
    // The next window starts afresh.
    expect(limiter.takeClient(clientKey, a, t0 + WINDOW_MS)?.allowed).toBe(true);
  });

  it('a customer budget refuses without counting against the key or the address', () => {
    const limiter = new RateLimiter({
      server: 5,
      client: 100,
      clientAddress: 50,
      clientCustomer: 2,
    });
    const take = (customerId: string) => {
      const admitted = limiter.takeClient(clientKey, 7, t0);
      if (admitted === null || !admitted.allowed) return admitted;
      return limiter.takeCustomer(clientKey, 7, customerId, admitted, t0);
    };
    expect(take('acme')).toMatchObject({
      allowed: true,
      remaining: 1,
      scope: 'for this key and customer',
    });
    expect(take('acme')?.allowed).toBe(true);
    for (let i = 0; i < 20; i++)
      expect(take('acme')).toMatchObject({ allowed: false, scope: 'for this key and customer' });
    // Only the 2 admitted requests (and this one) were counted against the address.
    expect(take('globex')).toMatchObject({ allowed: true, remaining: 1 });
    expect(limiter.takeClient(clientKey, 7, t0)).toMatchObject({ remaining: 46 });
  });

  it('keeps its address table bounded and does not lock out addresses it cannot track', () => {
    const limiter = new RateLimiter({ server: 5, client: 0, clientAddress: 1, clientCustomer: 0 });
    for (let i = 0; i < 100_000; i++) limiter.takeClient(clientKey, i, t0);
    // The table is full of current windows: a new address goes untracked, and is served.
    expect(limiter.takeClient(clientKey, 'new', t0)?.allowed).toBe(true);
    expect(limiter.takeClient(clientKey, 'new', t0)?.allowed).toBe(true);
    // Next window, the past ones are swept and the address is tracked again.
    expect(limiter.takeClient(clientKey, 'new', t0 + WINDOW_MS)?.allowed).toBe(true);
    expect(limiter.takeClient(clientKey, 'new', t0 + WINDOW_MS)?.allowed).toBe(false);
  });

  it('all client budgets 0: unlimited, no headers', () => {
    const limiter = new RateLimiter({ server: 5, client: 0, clientAddress: 0, clientCustomer: 0 });
    expect(limiter.takeClient(clientKey, 1, t0)).toBeNull();
  });
});

describe('client address keys', () => {
  it('IPv4, IPv4-mapped IPv6 and text agree; IPv6 is kept by its /64', () => {
    const v4 = addressKeyOfBytes(Uint8Array.of(10, 1, 2, 3));
    expect(v4).toBe(0x0a010203);
    expect(
      addressKeyOfBytes(Uint8Array.of(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 10, 1, 2, 3)),
    ).toBe(v4);
    expect(addressKeyOfText('10.1.2.3')).toBe(v4);
    expect(addressKeyOfText('::ffff:10.1.2.3')).toBe(v4);
    const prefix = addressKeyOfText('2001:db8:aa:bb::1');
    expect(prefix).toBe('20010db800aa00bb');
    expect(addressKeyOfText('2001:db8:aa:bb:ffff:1:2:3')).toBe(prefix);
    expect(addressKeyOfText('2001:db8:aa:bc::1')).not.toBe(prefix);
    expect(addressKeyOfText('::1')).toBe('0000000000000000');
    for (const bad of ['', 'unknown', '10.1.2', '1.2.3.4:80', '2001:db8::g'])
      expect(addressKeyOfText(bad), bad).toBeNull();
  });
});

/** A GET from a chosen local address (Linux routes all of 127.0.0.0/8 to loopback). */
function getFrom(
  base: string,
  path: string,
  localAddress: string,
  headers: Record<string, string>,
): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    const request = http.get(`${base}${path}`, { localAddress, headers, agent: false }, (res) => {
      let body = '';
      res.on('data', (chunk: Buffer) => (body += chunk.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    request.on('error', reject);
  });
}

describe('over HTTP, addresses from the socket', () => {
  let server: ServerProcess;
  beforeAll(async () => {
    server = await startServerProcess({
      config: CONFIG,
      env: {
        TALLY_RATE_LIMIT_CLIENT: '1000',
        TALLY_RATE_LIMIT_CLIENT_ADDRESS: '5',
        TALLY_RATE_LIMIT_CLIENT_CUSTOMER: '1000',
      },
    });
  }, 60_000);
  afterAll(async () => {
    await server?.stop();
  });

  it('one address flooding leaves another address answered', async () => {
    await awayFromWindowEnd();
    const key = { 'x-tally-key': server.keys.test.client };
    const path = '/v1/entitlements/sso/has?customerId=c';
    const flood = await Promise.all(
      Array.from({ length: 30 }, () => getFrom(server.base, path, '127.0.0.2', key)),
    );
    expect(flood.filter((r) => r.status === 200).length).toBe(5);
    const refused = flood.find((r) => r.status === 429);
    expect(JSON.parse(refused?.body ?? '{}')).toEqual({
      error: 'rate limit exceeded: 5 requests per minute for this key from one address',
      code: 'rate_limited',
    });
    expect(Number(refused?.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    const other = await getFrom(server.base, path, '127.0.0.3', key);
    expect(other.status).toBe(200);
    expect(other.headers['x-ratelimit-remaining']).toBe('4');
    // A server key is not limited per address.
    for (let i = 0; i < 8; i++)
      expect(
        (await getFrom(server.base, path, '127.0.0.2', { 'x-tally-key': server.keys.test.server }))
          .status,
      ).toBe(200);
  });
});

describe('over HTTP, addresses from a trusted proxy header', () => {
  let server: ServerProcess;
  beforeAll(async () => {
    server = await startServerProcess({
      config: CONFIG,
      env: {
        TALLY_RATE_LIMIT_CLIENT: '1000',
        TALLY_RATE_LIMIT_CLIENT_ADDRESS: '3',
        TALLY_RATE_LIMIT_CLIENT_CUSTOMER: '4',
        TALLY_CLIENT_ADDRESS_HEADER: 'X-Forwarded-For',
      },
    });
  }, 60_000);
  afterAll(async () => {
    await server?.stop();
  });

  let unique = 0;
  // A customer of its own per request unless named: only the address budget applies.
  const has = (
    forwardedFor: string | null,
    customerId = `u${unique++}`,
    extra: Record<string, string> = {},
  ) =>
    call(server.base, 'GET', `/v1/entitlements/sso/has?customerId=${customerId}`, {
      key: server.keys.test.client,
      headers: { ...(forwardedFor === null ? {} : { 'x-forwarded-for': forwardedFor }), ...extra },
    });

  it("keys each client by the proxy's last entry, whatever the client put before it", async () => {
    await awayFromWindowEnd();
    const statuses: number[] = [];
    // The client forges a different first entry each time; the proxy's own entry is the same.
    for (let i = 0; i < 6; i++) statuses.push((await has(`192.0.2.${i}, 203.0.113.7`)).status);
    expect(statuses).toEqual([200, 200, 200, 429, 429, 429]);
    expect((await has('203.0.113.7, 203.0.113.8')).status).toBe(200);
    // Same /64: the same client.
    for (let i = 0; i < 3; i++) expect((await has(`2001:db8:1:2::${i + 1}`)).status).toBe(200);
    expect((await has('2001:db8:1:2:ffff::9')).status).toBe(429);
    expect((await has('2001:db8:1:3::1')).status).toBe(200);
  });

  it('a customer budget spans addresses; refused or bad-token requests count nowhere', async () => {
    await awayFromWindowEnd();
    const answers: number[] = [];
    for (let i = 0; i < 6; i++) answers.push((await has(`198.51.100.${i}`, 'acme')).status);
    expect(answers).toEqual([200, 200, 200, 200, 429, 429]);
    const refused = await has('198.51.100.50', 'acme');
    expect(refused.body.error).toBe(
      'rate limit exceeded: 4 requests per minute for this key and customer',
    );
    // The address of the refused customer reads still has its whole budget for another customer.
    const fresh = await has('198.51.100.4', 'globex');
    expect(fresh.status).toBe(200);
    expect(fresh.headers.get('x-ratelimit-remaining')).toBe('2');
    // Bad tokens are refused uncounted, without rate headers.
    for (let i = 0; i < 5; i++) {
      const bad = await has('198.51.100.60', 'globex', { 'x-tally-customer-token': 'ct_bad' });
      expect(bad.status).toBe(401);
      expect(bad.headers.get('x-ratelimit-remaining')).toBeNull();
    }
    expect((await has('198.51.100.60', 'globex')).headers.get('x-ratelimit-remaining')).toBe('2');
  });
});
