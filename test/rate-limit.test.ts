/**
 * Rate limits (docs/api.md, Rate limits): fixed one-minute windows per key, the three
 * X-RateLimit headers on every keyed response, 429 with Retry-After, 403s counted,
 * nothing tracked for unauthenticated requests.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimiter, WINDOW_MS } from '../src/auth/rate-limit.js';
import type { KeyRecord } from '../storage/control-store.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const text = (bytes: Uint8Array | undefined): string =>
  Buffer.from(bytes ?? new Uint8Array()).toString('latin1');

function key(id: string, keyClass: KeyRecord['keyClass']): KeyRecord {
  return {
    id,
    prefix: 'x',
    hashHex: '00',
    environment: keyClass === 'admin' ? null : 'test',
    keyClass,
    createdAtMs: 0,
    revokedAtMs: null,
  };
}

describe('RateLimiter', () => {
  const t0 = Date.UTC(2026, 10, 22, 12, 0, 0);

  it('counts per key in fixed windows aligned to the minute', () => {
    const limiter = new RateLimiter({ server: 3, client: 2 });
    const client = key('k1', 'client');
    const decisions = [0, 1000, 2000].map((dt) => limiter.take(client, t0 + 30_000 + dt));
    expect(decisions.map((d) => d?.allowed)).toEqual([true, true, false]);
    expect(decisions[0]).toMatchObject({ remaining: 1 });
    expect(text(decisions[0]?.lines)).toBe(
      `application/json\r\nx-ratelimit-limit: ` +
        `2\r\nx-ratelimit-reset: ${(t0 + WINDOW_MS) / 1000}\r\nx-ratelimit-remaining: `,
    );
    expect(decisions[2]).toMatchObject({ allowed: false, remaining: 0 });
    expect(decisions[2]?.retryAfterSec).toBe(28);
    // The next minute starts a fresh window; other keys never shared this one.
    expect(limiter.take(client, t0 + WINDOW_MS)?.allowed).toBe(true);
    expect(limiter.take(key('k2', 'client'), t0 + 30_000)?.allowed).toBe(true);
    expect(limiter.take(key('k3', 'server'), t0)?.limit).toBe(3);
    expect(limiter.take(key('k4', 'admin'), t0)?.limit).toBe(3);
  });

  it('Retry-After is whole seconds rounded up, at least 1', () => {
    const limiter = new RateLimiter({ server: 1, client: 1 });
    const k = key('k', 'server');
    limiter.take(k, t0 + 59_999);
    expect(limiter.take(k, t0 + 59_999)?.retryAfterSec).toBe(1);
    limiter.take(k, t0 + WINDOW_MS + 100);
    expect(limiter.take(k, t0 + WINDOW_MS + 100)?.retryAfterSec).toBe(60);
  });

  it('0 means unlimited: no accounting, no headers', () => {
    const limiter = new RateLimiter({ server: 0, client: 5 });
    expect(limiter.take(key('s', 'server'), t0)).toBeNull();
    expect(limiter.trackedKeys).toBe(0);
  });

  it('keeps its table bounded by sweeping past windows', () => {
    const limiter = new RateLimiter({ server: 10, client: 10 });
    for (let i = 0; i < 10_000; i++) limiter.take(key(`old${i}`, 'client'), t0);
    limiter.take(key('new', 'client'), t0 + WINDOW_MS);
    expect(limiter.trackedKeys).toBe(1);
  });
});

describe('rate limits over HTTP', () => {
  let server: ServerProcess;
  beforeAll(async () => {
    server = await startServerProcess({
      env: { TALLY_RATE_LIMIT_SERVER: '6', TALLY_RATE_LIMIT_CLIENT: '3' },
    });
  });
  afterAll(async () => {
    await server?.stop();
  });

  it('puts the headers on every keyed response and answers 429 past the limit', async () => {
    // Keep the four requests inside one window: never start in a minute's last 3 s.
    const intoMinuteMs = Date.now() % WINDOW_MS;
    if (intoMinuteMs > WINDOW_MS - 3000)
      await new Promise((r) => setTimeout(r, WINDOW_MS - intoMinuteMs + 100));
    const ck = server.keys.test.client;
    const path = '/v1/entitlements/sso/has?customerId=c';
    const first = await call(server.base, 'GET', path, { key: ck }); // 404: no config pushed
    expect(first.status).toBe(404);
    expect(first.headers.get('x-ratelimit-limit')).toBe('3');
    expect(first.headers.get('x-ratelimit-remaining')).toBe('2');
    const reset = Number(first.headers.get('x-ratelimit-reset'));
    expect(reset % 60).toBe(0);
    expect(reset * 1000).toBeGreaterThan(Date.now() - 1000);
    // A 403 counts too.
    const forbidden = await call(server.base, 'GET', '/v1/sync/pull', { key: ck });
    expect(forbidden.status).toBe(403);
    expect(forbidden.headers.get('x-ratelimit-remaining')).toBe('1');
    await call(server.base, 'GET', path, { key: ck });
    const limited = await call(server.base, 'GET', path, { key: ck });
    expect(limited.status).toBe(429);
    expect(limited.body).toEqual({
      error: 'rate limit exceeded: 3 requests per minute for this key',
      code: 'rate_limited',
    });
    expect(limited.headers.get('x-ratelimit-remaining')).toBe('0');
    const retryAfter = Number(limited.headers.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(60);
    // Another key has its own window.
    expect(
      (await call(server.base, 'GET', path, { key: server.keys.live.client })).headers.get(
        'x-ratelimit-remaining',
      ),
    ).toBe('2');
  });

  it('unauthenticated requests carry no headers', async () => {
    const res = await call(server.base, 'GET', '/v1/entitlements/sso/has?customerId=c', {
      key: 'sk_test_nope',
    });
    expect(res.status).toBe(401);
    expect(res.headers.get('x-ratelimit-limit')).toBeNull();
    expect(
      (await call(server.base, 'GET', '/healthz')).headers.get('x-ratelimit-limit'),
    ).toBeNull();
  });
});
