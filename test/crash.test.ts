/**
 * A restart keeps idempotency keys (also after kill -9), settings and configuration.
 * Durability under SIGKILL, repeated and under load, is test/crash-cycles.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { call, startServerProcess, tempDataDir } from './support/server-process.js';

const CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'never' } },
  products: { free: { default: true, entitlements: { api_calls: { included: 1_000_000_000 } } } },
};

describe('crash safety', () => {
  it('idempotency keys, settings and config survive a restart', async () => {
    const dataDir = tempDataDir('tally-restart');
    const first = await startServerProcess({ dataDir });
    const sk = first.keys.test.server;
    await call(first.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG });
    const body = { customerId: 'r1', amount: 7, idempotencyKey: 'once' };
    expect(
      (await call(first.base, 'POST', '/v1/usage/api_calls/consume', { key: sk, body })).body,
    ).toMatchObject({ consumed: 7 });
    await first.stop();

    const second = await startServerProcess({ dataDir });
    try {
      expect(second.keys).toEqual(first.keys);
      const replay = await call(second.base, 'POST', '/v1/usage/api_calls/consume', {
        key: sk,
        body,
      });
      expect(replay).toMatchObject({ status: 200, body: { consumed: 7 } });
      const reused = await call(second.base, 'POST', '/v1/usage/api_calls/consume', {
        key: sk,
        body: { ...body, amount: 8 },
      });
      expect(reused.status).toBe(400);
      expect((await call(second.base, 'GET', '/v1/sync/pull', { key: sk })).body).toMatchObject({
        config: CONFIG,
        version: 1,
      });
    } finally {
      await second.stop();
    }
  });

  it('idempotency keys survive kill -9: a retry is a replay, another amount a 400', async () => {
    const dataDir = tempDataDir('tally-kill9-keys');
    const first = await startServerProcess({ dataDir });
    const sk = first.keys.test.server;
    await call(first.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG });
    const consume = (base: string, customerId: string, key: string, amount: number) =>
      call(base, 'POST', '/v1/usage/api_calls/consume', {
        key: sk,
        body: { customerId, amount, idempotencyKey: key },
      });
    const acked: Array<[string, string]> = [];
    for (let i = 0; i < 40; i++) {
      const res = await consume(first.base, `k9-${i % 4}`, `req-${i}`, 1);
      expect(res.status).toBe(200);
      acked.push([`k9-${i % 4}`, `req-${i}`]);
    }
    await first.kill9();

    const second = await startServerProcess({ dataDir, keys: first.keys });
    try {
      // The restarted worker's window is empty: every retry is answered from the key table.
      for (const [customerId, key] of acked)
        expect((await consume(second.base, customerId, key, 1)).body).toMatchObject({
          consumed: 10,
        });
      expect((await consume(second.base, 'k9-0', 'req-0', 2)).status).toBe(400);
    } finally {
      await second.stop();
    }
  });
});
