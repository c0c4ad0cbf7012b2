/**
 * A clean stop stores the open era of idempotency filters: after the restart its groups
 * answer through its one filter, not each through its own for the rest of their day, and
 * the restart opens it again, so restarts add no era for new keys to probe.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { gaugeSum, samples } from '../bench/metrics-text.js';
import { ERA_ENV_DIR } from '../storage/journal.js';
import { openDurableEnv } from '../storage/lmdb-env.js';
import { call, startServerProcess, tempDataDir } from './support/server-process.js';

const CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'never' } },
  products: { free: { default: true, entitlements: { api_calls: { included: 1_000_000 } } } },
};

/** The era heads stored in `dataDir`'s shard 0 (their first run seqs). */
async function storedEraHeads(dataDir: string): Promise<number[]> {
  const eras = openDurableEnv(path.join(dataDir, 'shard-0', ERA_ENV_DIR), ['idempotency-run-eras']);
  try {
    const keys = [...eras.dbs['idempotency-run-eras'].getKeys({})] as Array<[number, number]>;
    return keys.filter(([, index]) => index === -1).map(([first]) => first);
  } finally {
    await eras.root.close();
  }
}

/** The sum over shards of gauge `name` in the metrics text `metrics`. */
function sumOf(metrics: string, name: string): number {
  return gaugeSum(samples(metrics), name);
}

async function gauge(base: string, adminKey: string, name: string): Promise<number> {
  const metrics = String((await call(base, 'GET', '/v1/admin/metrics', { key: adminKey })).body);
  return sumOf(metrics, name);
}

/**
 * Asserts that `base` holds each of keys k-0 … k-(sent-1) of cust-0, consumed once with
 * amount 1: the same amount is a replay, and the balance counts each once.
 */
async function expectEveryKeyHeld(
  base: string,
  key: string,
  consume: (base: string, idempotencyKey: string, amount: number) => Promise<{ status: number }>,
  sent: number,
): Promise<void> {
  for (let i = 0; i < sent; i++) expect((await consume(base, `k-${i}`, 1)).status).toBe(200);
  const balance = await call(base, 'GET', '/v1/usage/api_calls/balance?customerId=cust-0', {
    key,
  });
  expect(balance.body.consumed).toBe(sent);
}

describe('a clean stop and the open idempotency era', () => {
  it('stores it, and the restart opens it again and reads its groups through it', async () => {
    const dataDir = tempDataDir('tally-era-stop');
    // Runs of 4 keys: the upkeep seals every second or so while keys come in.
    const env = { TALLY_WORKERS: '1', TALLY_IDEMPOTENCY_RUN_KEYS: '4' };
    const first = await startServerProcess({ dataDir, env, config: CONFIG });
    const consume = (base: string, idempotencyKey: string, amount: number) =>
      call(base, 'POST', '/v1/usage/api_calls/consume', {
        key: first.keys.test.server,
        body: { customerId: 'cust-0', amount, idempotencyKey },
      });
    let sent = 0;
    let groups = 0;
    try {
      const deadline = Date.now() + 20_000;
      while ((await gauge(first.base, first.keys.admin, 'tally_shard_idempotency_runs')) < 3) {
        expect(Date.now()).toBeLessThan(deadline);
        for (let i = 0; i < 8; i++, sent++)
          expect((await consume(first.base, `k-${sent}`, 1)).status).toBe(200);
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      expect(await gauge(first.base, first.keys.admin, 'tally_shard_idempotency_eras')).toBe(1);
      // Open, sized by the keys' rate: 16 to 64 groups.
      groups = await gauge(first.base, first.keys.admin, 'tally_shard_idempotency_open_era_groups');
      expect(groups).toBeGreaterThanOrEqual(16);
      expect(groups).toBeLessThanOrEqual(64);
    } finally {
      expect(await first.stop()).toBe(0);
    }
    expect(await storedEraHeads(dataDir)).toEqual([1]);
    const second = await startServerProcess({ dataDir, env, keys: first.keys });
    try {
      // The stored era is open again, as large as it was: the keys still in memory at the
      // stop (logged, sealed again) and every new one join it, not a new era.
      const metrics = String(
        (await call(second.base, 'GET', '/v1/admin/metrics', { key: first.keys.admin })).body,
      );
      expect(sumOf(metrics, 'tally_shard_idempotency_eras')).toBe(1);
      expect(sumOf(metrics, 'tally_shard_idempotency_open_era_groups')).toBe(groups);
      // Every key is still held: the same amount is a replay, another one a 400.
      await expectEveryKeyHeld(second.base, first.keys.test.server, consume, sent);
      const reused = await consume(second.base, 'k-0', 2);
      expect(reused).toMatchObject({ status: 400, body: { code: 'idempotency_key_reused' } });
    } finally {
      expect(await second.stop()).toBe(0);
    }
    // Stored again under the same head; the next start opens it once more.
    expect(await storedEraHeads(dataDir)).toEqual([1]);
    const third = await startServerProcess({ dataDir, env, keys: first.keys });
    let killed = false;
    try {
      const gaugeOf = (name: string) => gauge(third.base, first.keys.admin, name);
      expect(await gaugeOf('tally_shard_idempotency_eras')).toBe(1);
      expect((await consume(third.base, 'k-0', 1)).status).toBe(200);
      expect((await consume(third.base, 'k-0', 2)).status).toBe(400);
      // Killed once new groups have joined the era opened again: the head on disk is still
      // the one the last stop stored, so the next start reads the groups it covers through
      // it and the new ones by their own filters; every acknowledged key is still held.
      const runsBefore = await gaugeOf('tally_shard_idempotency_runs');
      const deadline = Date.now() + 20_000;
      while ((await gaugeOf('tally_shard_idempotency_runs')) < runsBefore + 3) {
        expect(Date.now()).toBeLessThan(deadline);
        for (let i = 0; i < 8; i++, sent++)
          expect((await consume(third.base, `k-${sent}`, 1)).status).toBe(200);
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      expect(await gaugeOf('tally_shard_idempotency_eras')).toBe(1);
      await third.kill9();
      killed = true;
    } finally {
      if (!killed) await third.stop();
    }
    expect(await storedEraHeads(dataDir)).toEqual([1]);
    const fourth = await startServerProcess({ dataDir, env, keys: first.keys });
    try {
      const outside = await gauge(
        fourth.base,
        first.keys.admin,
        'tally_shard_idempotency_groups_outside_eras',
      );
      const eras = await gauge(fourth.base, first.keys.admin, 'tally_shard_idempotency_eras');
      // The new groups answer by their own filters until the worker has rebuilt an era over
      // them in the background, which then answers beside the stored one.
      if (outside > 0) expect(eras).toBe(1);
      else expect(eras).toBe(2);
      await expectEveryKeyHeld(fourth.base, first.keys.test.server, consume, sent);
      expect((await consume(fourth.base, `k-${sent - 1}`, 2)).status).toBe(400);
    } finally {
      await fourth.stop();
    }
  }, 90_000);
});
