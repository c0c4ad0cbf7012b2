/**
 * A data dir written before idempotency keys had their own table is read, and its keys
 * move into the table (the automatic migration).
 *
 * The fixture (test/fixtures/data-dir-v1.tar.gz) was written by the release before the
 * key table: a server with two workers and TALLY_SNAPSHOT_EVERY_BATCHES=4, a pushed
 * configuration (meter `api_calls`, reset never), 26 consumes of `n + 1` units with key
 * `req-n` by customer `cust-(n % 6)`, then a refund of 1 unit by `cust-0` with key
 * `refund-0`; stopped cleanly. Each shard holds a format-1 snapshot whose customers carry
 * their keys and a journal tail with keyed events after it. Its API keys are not in it: the
 * test stores keys of its own in the control store.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import type { CustomerSnapshot, Event } from '../actors/customer.js';
import { isCustomerSnapshot, isEvent } from '../actors/core/shapes.js';
import { scopeDigest } from '../actors/idempotency-keys.js';
import { KeyMigration } from '../actors/idempotency-upkeep.js';
import { isPendingAudit } from '../actors/protocol.js';
import { issueKey } from '../src/auth/keys.js';
import { ControlStore } from '../storage/control-store.js';
import { encodeRecord } from '../storage/codec.js';
import { ShardStore } from '../storage/journal.js';
import { openDurableEnv } from '../storage/lmdb-env.js';
import { call, startServerProcess, tempDataDir, type Keys } from './support/server-process.js';

const FIXTURE = path.join(import.meta.dirname, 'fixtures', 'data-dir-v1.tar.gz');
const HOUR_MS = 3_600_000;

/** What the fixture's writer sent: customer, op, idempotency key, amount. */
const SENT: ReadonlyArray<readonly [string, 'consume' | 'refund', string, number]> = [
  ...Array.from({ length: 26 }, (_, n) => [`cust-${n % 6}`, 'consume', `req-${n}`, n + 1] as const),
  ['cust-0', 'refund', 'refund-0', 1],
];

/** Each customer's `consumed` as the fixture's writer last saw it. */
const CONSUMED: Readonly<Record<string, number>> = {
  'cust-0': 64,
  'cust-1': 70,
  'cust-2': 48,
  'cust-3': 52,
  'cust-4': 56,
  'cust-5': 60,
};

function unpackFixture(): string {
  const dir = tempDataDir('tally-migrate');
  execFileSync('tar', ['-xzf', FIXTURE, '-C', dir]);
  return dir;
}

const SHAPES = { isEvent, isSnapshotItem: isCustomerSnapshot, isAudit: isPendingAudit };

/**
 * Recovery's reading of one shard with the migration, as the worker does it, `afterMs`
 * after the shard's snapshot was taken.
 */
async function migrateShard(
  dir: string,
  afterMs: number,
): Promise<{ moved: number; store: ShardStore<Event, CustomerSnapshot, unknown> }> {
  const store = ShardStore.open(dir, SHAPES) as ShardStore<Event, CustomerSnapshot, unknown>;
  const createdAtMs = store.loadSnapshot()?.createdAtMs as number;
  const migration = new KeyMigration(store.idempotency, createdAtMs + afterMs);
  const snapshot = store.readSnapshot((items) => migration.snapshotItems(items));
  expect(snapshot?.formatVersion).toBe(1);
  store.replay(snapshot?.seq ?? 0, (_seq, events) => migration.events(events));
  await store.syncRecovered();
  return { moved: migration.moved, store };
}

/** Keys of our own in the fixture's control store (its own were never checked in). */
async function addKeys(dataDir: string): Promise<Keys> {
  const now = Date.now();
  const server = issueKey('server', 'test', now);
  const client = issueKey('client', 'test', now);
  const admin = issueKey('admin', null, now);
  const control = ControlStore.open(dataDir);
  try {
    for (const issued of [server, client, admin]) await control.putKey(issued.record);
  } finally {
    await control.close();
  }
  const pair = { server: server.secret, client: client.secret };
  return { test: pair, live: pair, admin: admin.secret };
}

describe('a data dir of the layout before the key table', () => {
  it('moves every unexpired key of its snapshots and journals into the table', async () => {
    const dataDir = unpackFixture();
    const found = new Map<string, string>();
    let moved = 0;
    for (const shard of ['shard-0', 'shard-1']) {
      const { moved: n, store } = await migrateShard(path.join(dataDir, shard), HOUR_MS);
      moved += n;
      for (const [customerId, op, key, amount] of SENT) {
        const stored = store.idempotency.get({
          environment: 'test',
          customerId,
          scopeDigest: scopeDigest(`${op}\u0000api_calls\u0000${key}`),
        });
        if (stored !== undefined) {
          found.set(key, stored.fingerprint);
          expect(stored.fingerprint).toBe(String(BigInt(amount) * 1_000_000n));
        }
      }
      await store.close();
    }
    expect(moved).toBe(SENT.length);
    expect([...found.keys()].sort()).toEqual(SENT.map(([, , key]) => key).sort());
  });

  it('replaces a format-1 snapshot with a format-2 one, removing the old chunks', async () => {
    const dir = path.join(unpackFixture(), 'shard-1');
    const { store } = await migrateShard(dir, HOUR_MS);
    const items: CustomerSnapshot[] = [];
    store.readSnapshot((chunk) => items.push(...chunk));
    await store.append([]).durable;
    await store.writeSnapshot(store.lastSeq, items);
    const read = store.readSnapshot(() => undefined);
    expect(read).toMatchObject({ formatVersion: 2, itemCount: items.length });
    await store.close();
    const env = openDurableEnv(dir, ['snapshot']);
    const keys = Array.from(env.dbs.snapshot.getKeys({}));
    await env.root.close();
    // The header and the new generation's chunk; none of format 1's numbered chunks.
    expect(keys.filter((key) => typeof key === 'number')).toEqual([0]);
    expect(keys.length).toBe(2);
  });

  it('leaves keys behind that expired before the start', async () => {
    const dataDir = unpackFixture();
    for (const shard of ['shard-0', 'shard-1']) {
      const { moved, store } = await migrateShard(path.join(dataDir, shard), 25 * HOUR_MS);
      expect(moved).toBe(0);
      expect(store.idempotency.size).toBe(0);
      await store.close();
    }
  });

  it('serves it with every balance, migrates once, then starts without migrating', async () => {
    const dataDir = unpackFixture();
    const keys = await addKeys(dataDir);
    // The log line may arrive a moment after /healthz answers 200: wait for it.
    const readyLine = async (
      output: () => string,
    ): Promise<{ shards: Array<Record<string, unknown>> }> => {
      for (let i = 0; i < 200; i++) {
        const line = output()
          .split('\n')
          .find((l) => l.includes('"msg":"ready"'));
        if (line !== undefined) return JSON.parse(line);
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      throw new Error(`no ready log line in:\n${output()}`);
    };
    const balances = async (base: string): Promise<Record<string, number>> => {
      const seen: Record<string, number> = {};
      for (const customerId of Object.keys(CONSUMED)) {
        const res = await call(
          base,
          'GET',
          `/v1/usage/api_calls/balance?customerId=${customerId}`,
          {
            key: keys.test.server,
          },
        );
        seen[customerId] = res.body.consumed;
      }
      return seen;
    };
    const first = await startServerProcess({ dataDir, keys });
    try {
      expect(await balances(first.base)).toEqual(CONSUMED);
      for (const shard of (await readyLine(first.output)).shards)
        expect(shard['idempotencyKeysMigrated']).toEqual(expect.any(Number));
      const fresh = await call(first.base, 'POST', '/v1/usage/api_calls/consume', {
        key: keys.test.server,
        body: { customerId: 'cust-0', amount: 2, idempotencyKey: 'after-upgrade' },
      });
      expect(fresh).toMatchObject({ status: 200, body: { consumed: 66 } });
    } finally {
      await first.stop();
    }
    const second = await startServerProcess({ dataDir, keys });
    try {
      for (const shard of (await readyLine(second.output)).shards)
        expect(shard).not.toHaveProperty('idempotencyKeysMigrated');
      expect(await balances(second.base)).toEqual({ ...CONSUMED, 'cust-0': 66 });
      const replay = await call(second.base, 'POST', '/v1/usage/api_calls/consume', {
        key: keys.test.server,
        body: { customerId: 'cust-0', amount: 2, idempotencyKey: 'after-upgrade' },
      });
      expect(replay).toMatchObject({ status: 200, body: { consumed: 66 } });
      const reused = await call(second.base, 'POST', '/v1/usage/api_calls/consume', {
        key: keys.test.server,
        body: { customerId: 'cust-0', amount: 3, idempotencyKey: 'after-upgrade' },
      });
      expect(reused).toMatchObject({ status: 400, body: { code: 'idempotency_key_reused' } });
    } finally {
      await second.stop();
    }
  });

  it('refuses a data dir whose keys are of a newer layout, saying so', async () => {
    const dataDir = tempDataDir('tally-newer-keys');
    const first = await startServerProcess({ dataDir, env: { TALLY_WORKERS: '1' } });
    await first.stop();
    const store = ShardStore.open(path.join(dataDir, 'shard-0'));
    await store.putMeta('idempotency-layout', { version: 99 });
    await store.close();
    await expect(
      startServerProcess({ dataDir, env: { TALLY_WORKERS: '1' }, keys: first.keys }),
    ).rejects.toThrow(/idempotency keys .* are of layout 99; this release reads layouts up to 2/);
  });

  it('refuses a data dir whose snapshot is of a newer format, saying so', async () => {
    const dir = path.join(tempDataDir('tally-newer'), 'shard-0');
    fs.mkdirSync(dir);
    const env = openDurableEnv(dir, ['snapshot']);
    const header = { formatVersion: 3, seq: 0, chunkCount: 0, itemCount: 0, createdAtMs: 0 };
    await env.dbs.snapshot.put(0, encodeRecord(header));
    await env.root.close();
    expect(() => ShardStore.open(dir)).toThrow(
      /snapshot is of format 3, newer than this build of Tally reads \(1, 2\)/,
    );
  });
});
