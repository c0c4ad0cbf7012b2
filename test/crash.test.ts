/**
 * Durability under SIGKILL: a real server process takes concurrent consumes, is killed
 * with no chance to flush anything, and restarts on the same data dir. Every consume it
 * acknowledged must be there; nothing beyond the requests still in flight may appear.
 * Also: idempotency keys and settings survive a clean restart.
 */
import { describe, expect, it } from 'vitest';
import { call, startServerProcess, tempDataDir } from './support/server-process.js';

const CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'never' } },
  products: { free: { default: true, entitlements: { api_calls: { included: 1_000_000_000 } } } },
};

const LOOPS = 40;
const CUSTOMERS_PER_LOOP = 5;

describe('crash safety', () => {
  it.each([
    ['journal only', {}],
    ['snapshots every 20 batches', { TALLY_SNAPSHOT_EVERY_BATCHES: '20' }],
    // One customer per slice: every snapshot is copied over many turns while consumes land.
    ['sliced snapshots every 5 batches', { TALLY_SNAPSHOT_EVERY_BATCHES: '5', TALLY_SNAPSHOT_SLICE: '1' }],
  ])('keeps every acknowledged consume across kill -9 (%s)', async (_label, env: Record<string, string>) => {
    const dataDir = tempDataDir('tally-crash');
    const first = await startServerProcess({ dataDir, env });
    const sk = first.keys.test.server;
    expect((await call(first.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG })).status).toBe(200);

    // Each loop owns its customers and has at most one request in flight, so after the
    // crash a customer's count is either what was acknowledged or one more.
    const acked = new Map<string, number>();
    const inFlight = new Map<number, string>();
    let stop = false;
    const loop = async (loopIndex: number): Promise<void> => {
      for (let n = 0; !stop; n++) {
        const customerId = `crash-${loopIndex}-${n % CUSTOMERS_PER_LOOP}`;
        inFlight.set(loopIndex, customerId);
        const res = await call(first.base, 'POST', '/v1/usage/api_calls/consume', {
          key: sk,
          body: { customerId, amount: 1, idempotencyKey: `${loopIndex}-${n}` },
        }).catch(() => null);
        if (res === null) return; // the process died under us
        expect(res.status).toBe(200);
        if (stop) return; // answered after the kill was decided: count it as in flight
        acked.set(customerId, (acked.get(customerId) ?? 0) + 1);
        inFlight.delete(loopIndex);
      }
    };
    const loops = Array.from({ length: LOOPS }, (_, i) => loop(i));
    await new Promise((resolve) => setTimeout(resolve, 1500));
    stop = true;
    await first.kill9();
    await Promise.all(loops);
    const totalAcked = [...acked.values()].reduce((a, b) => a + b, 0);
    expect(totalAcked).toBeGreaterThan(200);

    const second = await startServerProcess({ dataDir, env });
    try {
      const maybe = new Set(inFlight.values());
      for (let loopIndex = 0; loopIndex < LOOPS; loopIndex++) {
        for (let c = 0; c < CUSTOMERS_PER_LOOP; c++) {
          const customerId = `crash-${loopIndex}-${c}`;
          const res = await call(second.base, 'GET', `/v1/usage/api_calls/balance?customerId=${customerId}`, { key: sk });
          expect(res.status).toBe(200);
          const expected = acked.get(customerId) ?? 0;
          const consumed = res.body.consumed as number;
          if (maybe.has(customerId)) expect([expected, expected + 1]).toContain(consumed);
          else expect(consumed).toBe(expected);
        }
      }
    } finally {
      await second.stop();
    }
  });

  it('idempotency keys, settings and config survive a restart', async () => {
    const dataDir = tempDataDir('tally-restart');
    const first = await startServerProcess({ dataDir });
    const sk = first.keys.test.server;
    await call(first.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG });
    const body = { customerId: 'r1', amount: 7, idempotencyKey: 'once' };
    expect((await call(first.base, 'POST', '/v1/usage/api_calls/consume', { key: sk, body })).body).toMatchObject({ consumed: 7 });
    await first.stop();

    const second = await startServerProcess({ dataDir });
    try {
      expect(second.keys).toEqual(first.keys);
      const replay = await call(second.base, 'POST', '/v1/usage/api_calls/consume', { key: sk, body });
      expect(replay).toMatchObject({ status: 200, body: { consumed: 7 } });
      const reused = await call(second.base, 'POST', '/v1/usage/api_calls/consume', { key: sk, body: { ...body, amount: 8 } });
      expect(reused.status).toBe(400);
      expect((await call(second.base, 'GET', '/v1/sync/pull', { key: sk })).body).toMatchObject({ config: CONFIG, version: 1 });
    } finally {
      await second.stop();
    }
  });
});
