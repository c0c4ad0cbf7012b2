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
import { keysOfEvents, scopeDigest, type IdempotencyPut } from '../actors/idempotency-keys.js';
import { KeyMigration } from '../actors/idempotency-upkeep.js';
import { isPendingAudit } from '../actors/protocol.js';
import { issueKey } from '../src/auth/keys.js';
import { ControlStore } from '../storage/control-store.js';
import { decodeRecord, encodeRecord } from '../storage/codec.js';
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

  it('reads keys of a data dir whose runs hold a key per entry, then seals blocks', async () => {
    const dataDir = tempDataDir('tally-layout-2');
    const env = { TALLY_WORKERS: '1', TALLY_IDEMPOTENCY_RUN_KEYS: '4' };
    // The upkeep seals a run of four keys within a second or so.
    const keys = await eightKeyedConsumes(dataDir, env, 2500);
    // Rewrite its runs as the layout before blocks stored them: one entry per key, catalog
    // records without `blocks` (or `sections`), and the layout version 2.
    const shardDir = path.join(dataDir, 'shard-0');
    const raw = openDurableEnv(shardDir, ['idempotency-runs', 'idempotency-run-catalog']);
    const runs = raw.dbs['idempotency-runs'];
    const catalog = raw.dbs['idempotency-run-catalog'];
    let rewritten = 0;
    for (const { key, value } of [...runs.getRange({})]) {
      const [seq, environment] = key as [number, string];
      const block = (decodeRecord(value) as { ok: true; value: unknown[] }).value;
      // The block's own key is its first key's entry key: it goes first.
      await runs.remove(key);
      // A section per customer: its id, its count, then digest, fingerprint and time each.
      for (let at = 0; at < block.length; at += 2 + 3 * (block[at + 1] as number)) {
        const customerId = block[at] as string;
        for (let i = at + 2; i < at + 2 + 3 * (block[at + 1] as number); i += 3) {
          const entry = [seq, environment, customerId, block[i]] as [
            number,
            string,
            string,
            string,
          ];
          await runs.put(entry, encodeRecord([block[i + 1], block[i + 2]]));
          rewritten += 1;
        }
      }
    }
    for (const { key, value } of [...catalog.getRange({})]) {
      if (typeof key !== 'number') continue;
      const {
        blocks: _blocks,
        sections: _sections,
        ...counts
      } = (decodeRecord(value) as { ok: true; value: any }).value;
      await catalog.put(key, encodeRecord(counts));
    }
    await raw.root.close();
    expect(rewritten).toBeGreaterThanOrEqual(4);
    const store = ShardStore.open(shardDir);
    await store.putMeta('idempotency-layout', { version: 2 });
    expect(store.idempotency.runs.every((run) => !run.blocks)).toBe(true);
    await store.close();

    const second = await startServerProcess({ dataDir, env, keys });
    try {
      await expectOldKeysKnown(second.base, keys, 8);
      await new Promise((resolve) => setTimeout(resolve, 2500));
    } finally {
      await second.stop();
    }
    const after = ShardStore.open(shardDir);
    try {
      expect(after.getMeta('idempotency-layout')).toEqual({ version: 6 });
      const layouts = after.idempotency.runs.map((run) => run.blocks);
      expect(layouts).toContain(false);
      expect(layouts).toContain(true);
    } finally {
      await after.close();
    }
  });

  it('reads keys logged in tables (layout 4); new ones ride in records', async () => {
    const dataDir = tempDataDir('tally-layout-4');
    const env = { TALLY_WORKERS: '1' };
    const keys = await eightKeyedConsumes(dataDir, env, 0);
    // Rewrite it as layout 4 wrote it: the records' events without their keys' digests,
    // each record's keys in a log entry that names it, and no sealed record stored.
    const shardDir = path.join(dataDir, 'shard-0');
    const raw = openDurableEnv(shardDir, ['journal']);
    const logged: Array<[number, IdempotencyPut[]]> = [];
    for (const { key, value } of [...raw.dbs.journal.getRange({})]) {
      const events = (decodeRecord(value) as { ok: true; value: Event[] }).value;
      const puts = keysOfEvents(events);
      if (puts.length === 0) continue;
      logged.push([key as number, puts]);
      const stripped = events.map((event) =>
        event.type === 'consumed' && event.idempotency
          ? { ...event, idempotency: { fingerprint: event.idempotency.fingerprint } }
          : event,
      );
      await raw.dbs.journal.put(key, encodeRecord(stripped));
    }
    await raw.root.close();
    expect(logged.flatMap(([, puts]) => puts)).toHaveLength(8);
    const store = ShardStore.open(shardDir);
    expect(store.idempotency.sealedThrough).toBe(0);
    for (const [seq, puts] of logged) store.idempotency.log(seq, puts);
    await store.putMeta('idempotency-layout', { version: 4 });
    await store.close();

    const second = await startServerProcess({ dataDir, env, keys });
    try {
      await expectOldKeysKnown(second.base, keys, 4);
    } finally {
      await second.stop();
    }
    const after = ShardStore.open(shardDir);
    try {
      expect(after.getMeta('idempotency-layout')).toEqual({ version: 6 });
      const carried: IdempotencyPut[] = [];
      after.replay(0, (_seq, events) => carried.push(...keysOfEvents(events as Event[])));
      expect(carried).toHaveLength(4);
    } finally {
      await after.close();
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
    ).rejects.toThrow(/idempotency keys .* are of layout 99; this release reads layouts up to 6/);
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

/** The layout tests' meter: api_calls, 1,000 included, never reset. */
const API_CALLS_CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'never' } },
  products: { free: { default: true, entitlements: { api_calls: { included: 1000 } } } },
};

/** A keyed consume of `amount` api_calls by cust-0, with the test server key of `keys`. */
function keyedConsume(base: string, keys: Keys, idempotencyKey: string, amount: number) {
  return call(base, 'POST', '/v1/usage/api_calls/consume', {
    key: keys.test.server,
    body: { customerId: 'cust-0', amount, idempotencyKey },
  });
}

/**
 * A new server on `dataDir` applies eight keyed consumes of 1 (keys old-0 … old-7), runs
 * `settleMs` more and stops: its keys.
 */
async function eightKeyedConsumes(
  dataDir: string,
  env: Record<string, string>,
  settleMs: number,
): Promise<Keys> {
  const server = await startServerProcess({ dataDir, env, config: API_CALLS_CONFIG });
  try {
    for (let i = 0; i < 8; i++)
      expect((await keyedConsume(server.base, server.keys, `old-${i}`, 1)).status).toBe(200);
    if (settleMs > 0) await new Promise((resolve) => setTimeout(resolve, settleMs));
    return server.keys;
  } finally {
    await server.stop();
  }
}

/**
 * The eight keys of `eightKeyedConsumes` are all still known to the server at `base`: a
 * retry replays (nothing is applied again), another amount is refused. Then `fresh` new
 * keyed consumes apply.
 */
async function expectOldKeysKnown(base: string, keys: Keys, fresh: number): Promise<void> {
  for (let i = 0; i < 8; i++)
    expect((await keyedConsume(base, keys, `old-${i}`, 1)).status).toBe(200);
  const balance = await call(base, 'GET', '/v1/usage/api_calls/balance?customerId=cust-0', {
    key: keys.test.server,
  });
  expect(balance.body.consumed).toBe(8);
  expect(await keyedConsume(base, keys, 'old-0', 2)).toMatchObject({
    status: 400,
    body: { code: 'idempotency_key_reused' },
  });
  for (let i = 0; i < fresh; i++)
    expect((await keyedConsume(base, keys, `new-${i}`, 1)).status).toBe(200);
}
