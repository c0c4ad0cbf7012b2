/**
 * A restart keeps idempotency keys (also after kill -9), settings and configuration.
 * Durability under SIGKILL, repeated and under load, is test/crash-cycles.test.ts.
 */
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ERA_ENV_DIR } from '../storage/journal.js';
import { openDurableEnv } from '../storage/lmdb-env.js';
import {
  call,
  logLines,
  startServerProcess,
  tempDataDir,
  waitForLogLine,
  type Keys,
  type ServerProcess,
} from './support/server-process.js';

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
      // No seal ran (one comes every 30 s, or at a run's worth of keys): every key is held
      // in memory again from the journal record that applied its consume.
      const ready = await waitForLogLine(second, (line) => line['msg'] === 'ready');
      const shards = ready['shards'] as Array<{ idempotencyKeysReheld: number }>;
      expect(shards.reduce((sum, shard) => sum + shard.idempotencyKeysReheld, 0)).toBe(40);
      for (const [customerId, key] of acked)
        expect((await consume(second.base, customerId, key, 1)).body).toMatchObject({
          consumed: 10,
        });
      expect((await consume(second.base, 'k9-0', 'req-0', 2)).status).toBe(400);
    } finally {
      await second.stop();
    }
  });

  it('keys sealed into runs under load survive kill -9, twice: each retry a replay', async () => {
    // Runs of 40 keys: sealing (and grouping) goes on all through the load, so the kills
    // land between its steps as well as between appends.
    const env = { TALLY_WORKERS: '2', TALLY_IDEMPOTENCY_RUN_KEYS: '40' };
    const killAt = (cycle: number, gauges: RunGauges): boolean => gauges.runs >= 5 * (cycle + 1);
    await killUnderLoad('tally-kill9-runs', env, { cycles: 2, loops: 12, killAt });
  });

  // Eras this small stay in the worker's memory; the second case stores them as a busy
  // shard does, as images read back from the memory map (padded to 32 MiB).
  it.each([
    ['in memory', {}, false],
    ['on the memory map', { TALLY_TEST_MAP_ERAS_FROM: '0' }, true],
  ] as const)(
    'keys in runs behind an era (%s) survive kill -9 once the era closed',
    async (_, mapping, mapped) => {
      // Runs of 4 keys or more (whatever waits when a seal starts): sealing never stops, and
      // an era (16 groups of up to 16 runs, set: by the rate, these tiny groups would make
      // larger eras) closes when a run opens its 17th group, after 200–260 runs (~50 s here:
      // each seal waits for three syncs); the seal that closes it stores its filter. The
      // kill comes three runs later, among the slices of sealing.
      const env = {
        TALLY_WORKERS: '1',
        TALLY_IDEMPOTENCY_RUN_KEYS: '4',
        TALLY_IDEMPOTENCY_ERA_GROUPS: '16',
        ...mapping,
      };
      let closedAt = Number.POSITIVE_INFINITY;
      const killAt = (_: number, gauges: RunGauges): boolean => {
        if (gauges.eras >= 2) closedAt = Math.min(closedAt, gauges.runs);
        return gauges.runs >= closedAt + 3;
      };
      const { eras, mappedBytes, dataDir } = await killUnderLoad('tally-kill9-eras', env, {
        cycles: 1,
        loops: 12,
        killAt,
      });
      // The closed era was stored before the kill (the open one never is) and the restart
      // held it: every key answered above through it (a seal at the restart may have opened
      // a new era too, and an era may have been rebuilt over the open one's groups).
      expect(eras).toBeGreaterThanOrEqual(1);
      // Read back from the map at the restart, checksums verified: 32 MiB an image.
      if (mapped) expect(mappedBytes).toBeGreaterThanOrEqual(32 << 20);
      else expect(mappedBytes).toBe(0);
      const shard = openDurableEnv(join(dataDir, 'shard-0', ERA_ENV_DIR), ['idempotency-run-eras']);
      try {
        const keys = [...shard.dbs['idempotency-run-eras'].getKeys({})] as Array<[number, number]>;
        const heads = keys.filter(([, index]) => index === -1).map(([first]) => first);
        // Its head, and at most two more: the era rebuilt at the restart over the groups of
        // the one open at the kill (never stored; rebuilt where it held two groups or more),
        // which starts where the closed one ends, and the era a seal at the restart opened,
        // stored by the clean stop that ended it.
        expect(heads[0]).toBe(1);
        expect(heads.length).toBeLessThanOrEqual(3);
        if (heads.length === 3) expect(heads[1]).toBe(16 * 16 + 1);
      } finally {
        await shard.root.close();
      }
    },
    240_000,
  );

  it('rebuilds the era open at a kill -9 over its groups: one filter answers', async () => {
    // Runs of 4 keys or more, eras of 16 groups: killed once the open era (the first, none
    // closed yet) holds three groups. The restart rebuilds an era over them and stores it.
    const env = {
      TALLY_WORKERS: '1',
      TALLY_IDEMPOTENCY_RUN_KEYS: '4',
      TALLY_IDEMPOTENCY_ERA_GROUPS: '16',
    };
    const rebuilt = async (server: ServerProcess): Promise<void> => {
      const deadline = Date.now() + 30_000;
      while ((await runGauges(server.base, server.keys.admin)).outside > 0) {
        expect(Date.now()).toBeLessThan(deadline);
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      // The operator's log says so, once (its line is written asynchronously).
      const isRebuilt = (l: Record<string, unknown>) => l.msg === 'idempotency filters rebuilt';
      await waitForLogLine(server, isRebuilt);
      const lines = logLines(server.output()).filter(isRebuilt);
      // At least three groups: the kill came once the era held 34 runs (16 a group).
      expect(lines).toEqual([
        expect.objectContaining({ level: 'info', shard: 0, ms: expect.any(Number) }),
      ]);
      expect(lines[0]?.groups).toBeGreaterThanOrEqual(3);
    };
    const { eras, dataDir } = await killUnderLoad('tally-kill9-rebuild', env, {
      cycles: 1,
      loops: 12,
      killAt: (_, gauges) => gauges.runs >= 2 * 16 + 2,
      started: rebuilt,
    });
    // Every key answered above with the rebuilt era in place (and a new one a seal opened).
    expect(eras).toBeGreaterThanOrEqual(1);
    const shard = openDurableEnv(join(dataDir, 'shard-0', ERA_ENV_DIR), ['idempotency-run-eras']);
    try {
      const keys = [...shard.dbs['idempotency-run-eras'].getKeys({})] as Array<[number, number]>;
      // The rebuilt era, from the first run on (the era open at the kill was never stored).
      expect(keys.filter(([, index]) => index === -1)[0]?.[0]).toBe(1);
    } finally {
      await shard.root.close();
    }
  }, 120_000);
});

/** The shard gauges a kill waits for, summed over shards. */
interface RunGauges {
  readonly runs: number;
  readonly eras: number;
  /** Groups outside any era, each probed by its own filter. */
  readonly outside: number;
  /** Bytes of closed eras' images read from the memory map. */
  readonly mappedBytes: number;
}

async function runGauges(base: string, adminKey: string): Promise<RunGauges> {
  const metrics = String((await call(base, 'GET', '/v1/admin/metrics', { key: adminKey })).body);
  const sum = (name: string): number =>
    [...metrics.matchAll(new RegExp(`^${name}\\{[^}]*\\} (\\d+)`, 'gm'))]
      .map((m) => Number(m[1]))
      .reduce((total, n) => total + n, 0);
  return {
    runs: sum('tally_shard_idempotency_runs'),
    eras: sum('tally_shard_idempotency_eras'),
    outside: sum('tally_shard_idempotency_groups_outside_eras'),
    mappedBytes: sum('tally_shard_idempotency_filter_mapped_bytes'),
  };
}

/**
 * Keyed consumes from `loops` loops, killed with SIGKILL `cycles` times (each once `killAt`
 * holds), then a restart: every acknowledged consume is applied, each retry is a replay
 * that applies nothing, and a retry with another amount is a 400. Returns the eras the
 * last start held, the bytes of their images it read from the memory map and the data dir
 * (stopped).
 */
async function killUnderLoad(
  prefix: string,
  env: Record<string, string>,
  load: {
    readonly cycles: number;
    readonly loops: number;
    readonly killAt: (cycle: number, gauges: RunGauges) => boolean;
    /** Awaited after the last start, before the gauges are read and the keys retried. */
    readonly started?: (server: ServerProcess) => Promise<void>;
  },
): Promise<{ eras: number; mappedBytes: number; dataDir: string }> {
  const dataDir = tempDataDir(prefix);
  const acked = new Map<string, number>(); // key → amount, acknowledged
  const customerOf = (key: string): string => `kr-${Number(key.split('-')[2]) % 12}`;
  let keys: Keys | undefined;
  for (let cycle = 0; cycle < load.cycles; cycle++) {
    const server = await startServerProcess({ dataDir, env, ...(keys ? { keys } : {}) });
    keys = server.keys;
    const sk = server.keys.test.server;
    if (cycle === 0) await call(server.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG });
    let killing = false;
    const loop = async (l: number): Promise<void> => {
      for (let n = 0; !killing; n++) {
        const key = `c${cycle}-${l}-${n}`;
        const res = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
          key: sk,
          body: { customerId: customerOf(key), amount: 1 + (n % 3), idempotencyKey: key },
        }).catch(() => null);
        if (res === null) return; // in flight at the kill
        expect(res.status).toBe(200);
        acked.set(key, 1 + (n % 3));
      }
    };
    const loops = Array.from({ length: load.loops }, (_, l) => loop(l));
    while (!load.killAt(cycle, await runGauges(server.base, server.keys.admin)))
      await new Promise((resolve) => setTimeout(resolve, 100));
    killing = true;
    await server.kill9();
    await Promise.all(loops);
  }
  const server = await startServerProcess({ dataDir, env, ...(keys ? { keys } : {}) });
  try {
    await load.started?.(server);
    const { eras, mappedBytes } = await runGauges(server.base, server.keys.admin);
    const sk = server.keys.test.server;
    /** Each customer's consumed total, as the server answers it now. */
    const consumed = async (): Promise<number[]> => {
      const totals: number[] = [];
      for (let c = 0; c < 12; c++) {
        const path = `/v1/usage/api_calls/balance?customerId=kr-${c}`;
        totals.push((await call(server.base, 'GET', path, { key: sk })).body.consumed as number);
      }
      return totals;
    };
    const before = await consumed();
    expect(acked.size).toBeGreaterThan(200);
    const total = before.reduce((sum, value) => sum + value, 0);
    const ackedTotal = [...acked.values()].reduce((sum, amount) => sum + amount, 0);
    // Every acknowledged consume is applied (some in flight at a kill may be too).
    expect(total).toBeGreaterThanOrEqual(ackedTotal);
    // Retried from 12 clients at once, each key once; every 25th also with another amount.
    const retries = [...acked];
    const retrier = async (from: number): Promise<void> => {
      for (let n = from; n < retries.length; n += 12) {
        const [key, amount] = retries[n] as [string, number];
        const retry = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
          key: sk,
          body: { customerId: customerOf(key), amount, idempotencyKey: key },
        });
        expect(retry.status).toBe(200);
        if (n % 25 !== 0) continue;
        const reused = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
          key: sk,
          body: { customerId: customerOf(key), amount: amount + 1, idempotencyKey: key },
        });
        expect(reused.status).toBe(400);
      }
    };
    await Promise.all(Array.from({ length: 12 }, (_, from) => retrier(from)));
    // No retry applied anything: every acknowledged key was found.
    expect(await consumed()).toEqual(before);
    return { eras, mappedBytes, dataDir };
  } finally {
    await server.stop();
  }
}
