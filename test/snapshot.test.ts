/**
 * Online snapshot and offline restore (docs/operations.md). A snapshot taken under
 * concurrent consumes holds every consume acknowledged before the request and none sent
 * after its 202 — proven on the restored server through the idempotency keys: replaying
 * a key that is in the snapshot changes nothing, replaying one that is not consumes.
 * A corrupt, truncated or foreign file and a live or non-empty data dir are refused.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { issueKey } from '../src/auth/keys.js';
import {
  readSnapshotFile,
  SnapshotFileError,
  SnapshotNotAuthenticError,
  SnapshotWriter,
  verifySnapshotFile,
  type SnapshotFrame,
  type SnapshotHeader,
  type SnapshotTrailer,
} from '../storage/snapshot-file.js';
import { RestoreRefusedError, restoreSnapshot } from '../storage/snapshot-restore.js';
import { runProcess, type Ran } from './support/run-process.js';
import {
  call,
  MAIN_JS,
  startServerProcess,
  tempDataDir,
  type ServerProcess,
} from './support/server-process.js';

const BIN = path.join(path.dirname(path.dirname(MAIN_JS)), '..', 'bin', 'tally.js');

/** The source data dir's snapshot secret (hex), as `tally snapshot secret` printed it. */
let secretHex = '';

/**
 * Runs the real `tally` binary (with the source's snapshot secret in its environment); resolves
 * with its exit code and output.
 */
function tally(args: readonly string[], env: Record<string, string> = {}): Promise<Ran> {
  return runProcess(process.execPath, [BIN, ...args], {
    env: { ...process.env, TALLY_SNAPSHOT_SECRET: secretHex, ...env },
  });
}

const secretBytes = (): Buffer => Buffer.from(secretHex, 'hex');

const CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'month' }, seats: { type: 'limit' } },
  products: {
    free: {
      default: true,
      entitlements: { api_calls: { included: 1_000_000_000 }, seats: { included: 3 } },
    },
  },
};
const CUSTOMERS = 24;
const CLIENTS = 8;
const COLD_CUSTOMERS = 2000;

let source: ServerProcess;
let snapshotFile: string;
let restoredDir: string;
let restored: ServerProcess | null = null;

interface Sent {
  readonly customerId: string;
  readonly idempotencyKey: string;
  readonly sentAt: number;
  ackedAt: number | null;
}
const sent: Sent[] = [];
/** When the first consume of each `late-…` customer (the one that creates it) was sent. */
const firstSent = new Map<string, number>();
let postSentAt = 0;
let acceptedAt = 0;

/**
 * Starts `clients` loops of idempotent consumes on `server` (customer `cust-<n>`, one
 * key per request), logging each into `log` with when it was sent and acknowledged;
 * `after` runs after each acknowledged consume. Resolves `stop()` once every loop ended.
 */
function startConsumers(
  server: ServerProcess,
  options: {
    readonly clients: number;
    readonly stride: number;
    readonly keyPrefix: string;
    readonly log: Sent[];
    readonly after?: (client: number, n: number) => Promise<void>;
  },
): { stop(): Promise<void> } {
  const sk = server.keys.test.server;
  let stopped = false;
  const client = async (c: number): Promise<void> => {
    for (let n = 0; !stopped; n++) {
      const entry: Sent = {
        customerId: `cust-${(c * options.stride + n) % CUSTOMERS}`,
        idempotencyKey: `${options.keyPrefix}-${c}-${n}`,
        sentAt: performance.now(),
        ackedAt: null,
      };
      options.log.push(entry);
      const res = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
        key: sk,
        body: { customerId: entry.customerId, amount: 1, idempotencyKey: entry.idempotencyKey },
      });
      expect(res.status).toBe(200);
      entry.ackedAt = performance.now();
      await options.after?.(c, n);
    }
  };
  const loops = Array.from({ length: options.clients }, (_, c) => client(c));
  return {
    async stop() {
      stopped = true;
      await Promise.all(loops);
    },
  };
}

/** The sum over `server`'s shards of metric `name` (a gauge per shard). */
async function shardMetric(server: ServerProcess, name: string): Promise<number> {
  const res = await fetch(`${server.base}/v1/admin/metrics`, {
    headers: { authorization: `Bearer ${server.keys.admin}` },
  });
  let sum = 0;
  for (const line of (await res.text()).split('\n'))
    if (line.startsWith(`${name}{`)) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  return sum;
}

/** Sealed runs of idempotency keys on `server`'s shards. */
const idempotencyRuns = (server: ServerProcess): Promise<number> =>
  shardMetric(server, 'tally_shard_idempotency_runs');

/** Sends each consume of `entries` to `server` again, with its key: each answers 200. */
async function sendAgain(server: ServerProcess, entries: readonly Sent[]): Promise<void> {
  for (const s of entries)
    expect(
      (
        await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
          key: server.keys.test.server,
          body: { customerId: s.customerId, amount: 1, idempotencyKey: s.idempotencyKey },
        })
      ).status,
    ).toBe(200);
}

async function waitComplete(server: ServerProcess, id: string): Promise<Record<string, any>> {
  for (let i = 0; i < 400; i++) {
    const res = await call(server.base, 'GET', `/v1/admin/snapshots/${id}`, {
      key: server.keys.admin,
    });
    if (res.body.status !== 'running') return res.body;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error('snapshot did not finish');
}

async function download(server: ServerProcess, id: string, file: string): Promise<Response> {
  const res = await fetch(`${server.base}/v1/admin/snapshots/${id}/file`, {
    headers: { authorization: `Bearer ${server.keys.admin}` },
  });
  fs.writeFileSync(file, Buffer.from(await res.arrayBuffer()));
  return res;
}

beforeAll(async () => {
  // One customer per slice: batches interleave with the copy, so pre-images are exercised.
  // Runs of 64 keys: most keys at the cut are in sealed runs, the newest in memory.
  source = await startServerProcess({
    config: CONFIG,
    env: { TALLY_SNAPSHOT_SLICE: '1', TALLY_IDEMPOTENCY_RUN_KEYS: '64' },
  });
  const sk = source.keys.test.server;
  await call(source.base, 'POST', '/v1/customers', {
    key: sk,
    body: { id: 'named', name: 'Named Co', metadata: { tier: 'gold' } },
  });
  await call(source.base, 'POST', '/v1/entitlements/seats/limit/settings', {
    key: sk,
    body: { customerId: 'named', purchased: 0 },
  }).catch(() => null);
  // Cold customers first: the copy goes in creation order, so the busy customers below are
  // copied last, long after the 202, while their writes keep arriving (pre-images at work).
  for (let batch = 0; batch < COLD_CUSTOMERS; batch += 100) {
    await Promise.all(
      Array.from({ length: 100 }, (_, i) =>
        call(source.base, 'POST', '/v1/usage/api_calls/consume', {
          key: sk,
          body: { customerId: `cold-${batch + i}`, amount: 1 },
        }),
      ),
    );
  }
  const consumers = startConsumers(source, {
    clients: CLIENTS,
    stride: 7,
    keyPrefix: 'k',
    log: sent,
    // New customers keep appearing too, each written several times (so a write to one
    // created after the cut reaches the snapshot's pre-image path).
    async after(c, n) {
      const late = `late-${c}-${Math.floor(n / 3)}`;
      if (!firstSent.has(late)) firstSent.set(late, performance.now());
      expect(
        (
          await call(source.base, 'POST', '/v1/usage/api_calls/consume', {
            key: sk,
            body: { customerId: late, amount: 1 },
          })
        ).status,
      ).toBe(200);
    },
  });
  await new Promise((resolve) => setTimeout(resolve, 300));
  // Keys sealed into runs before the cut, not only keys in memory.
  for (let i = 0; i < 100 && (await idempotencyRuns(source)) < 4; i++)
    await new Promise((resolve) => setTimeout(resolve, 50));
  expect(await idempotencyRuns(source)).toBeGreaterThanOrEqual(4);
  postSentAt = performance.now();
  const created = await call(source.base, 'POST', '/v1/admin/snapshots', {
    key: source.keys.admin,
  });
  acceptedAt = performance.now();
  expect(created.status).toBe(202);
  await new Promise((resolve) => setTimeout(resolve, 300));
  await consumers.stop();

  const info = await waitComplete(source, created.body.id);
  expect(info.status).toBe('complete');
  snapshotFile = path.join(tempDataDir('snapfile'), 'snap.tsnap');
  const res = await download(source, created.body.id, snapshotFile);
  expect(res.status).toBe(200);
  expect(res.headers.get('x-tally-snapshot-sha256')).toBe(info.sha256);
  const printed = await tally(['snapshot', 'secret'], {
    TALLY_URL: source.base,
    TALLY_API_KEY: source.keys.admin,
  });
  expect(printed.code).toBe(0);
  secretHex = printed.stdout.trim();
  expect(secretHex).toMatch(/^[0-9a-f]{64}$/);
  restoredDir = path.join(tempDataDir('restored'), 'data');
  const restore = await tally(['snapshot', 'restore', snapshotFile, '--data-dir', restoredDir]);
  expect(restore.stderr).toBe('');
  expect(restore.code).toBe(0);
  expect(restore.stdout).toContain(`Restored snapshot ${created.body.id}`);
  // The keys live at the cut, in frames of their own: every keyed consume's at least.
  const restoredKeys = Number(/ (\d+) idempotency keys/.exec(restore.stdout)?.[1]);
  expect(restoredKeys).toBeGreaterThanOrEqual(
    sent.filter((s) => s.ackedAt !== null && s.ackedAt < postSentAt).length,
  );
  restored = await startServerProcess({ dataDir: restoredDir, keys: source.keys });
  // The restore sealed the keys into runs: the first start has none to hold in memory.
  expect(await idempotencyRuns(restored)).toBeGreaterThanOrEqual(1);
  expect(await shardMetric(restored, 'tally_shard_idempotency_keys_in_memory')).toBe(0);
}, 60_000);

afterAll(async () => {
  await restored?.stop();
  await source?.stop();
});

const consumed = async (server: ServerProcess, customerId: string): Promise<number> => {
  const res = await call(
    server.base,
    'GET',
    `/v1/usage/api_calls/balance?customerId=${customerId}`,
    { key: server.keys.test.server },
  );
  return res.status === 404 ? 0 : (res.body.consumed as number);
};

describe('online snapshot → offline restore', () => {
  it(
    'is a cut: each customer holds every consume acknowledged before the request and none ' +
      'sent after its 202',
    async () => {
      const server = restored as ServerProcess;
      const before = sent.filter((s) => s.ackedAt !== null && s.ackedAt < postSentAt);
      const after = sent.filter((s) => s.sentAt > acceptedAt);
      expect(before.length).toBeGreaterThan(20);
      expect(after.length).toBeGreaterThan(20);
      const start = new Map<string, number>();
      for (let c = 0; c < CUSTOMERS; c++)
        start.set(`cust-${c}`, await consumed(server, `cust-${c}`));
      for (const [customerId, value] of start) {
        const lower = before.filter((s) => s.customerId === customerId).length;
        const upper = sent.filter(
          (s) => s.customerId === customerId && s.sentAt < acceptedAt,
        ).length;
        expect(value, customerId).toBeGreaterThanOrEqual(lower);
        expect(value, customerId).toBeLessThanOrEqual(upper);
      }
      // Customers created after the 202 are not in it, however often they were written.
      const lateAfter = [...firstSent].filter(([, at]) => at > acceptedAt).map(([id]) => id);
      expect(lateAfter.length).toBeGreaterThan(5);
      for (const id of lateAfter) expect(await consumed(server, id), id).toBe(0);
      // Replaying an acknowledged-before key is a replay: it is in the snapshot, idempotency cache
      // included.
      const sk = server.keys.test.server;
      const replay = (s: Sent) =>
        call(server.base, 'POST', '/v1/usage/api_calls/consume', {
          key: sk,
          body: { customerId: s.customerId, amount: 1, idempotencyKey: s.idempotencyKey },
        });
      for (const s of before) expect((await replay(s)).status).toBe(200);
      for (const [customerId, value] of start)
        expect(await consumed(server, customerId), customerId).toBe(value);
      // A key sent after the 202 is not in it: replaying it consumes once more.
      for (const s of after) await replay(s);
      for (const [customerId, value] of start) {
        expect(await consumed(server, customerId), customerId).toBe(
          value + after.filter((s) => s.customerId === customerId).length,
        );
      }
    },
  );

  it(
    'answers with the same keys, configuration, ' + 'customers and verifiable audit chains',
    async () => {
      const server = restored as ServerProcess;
      // bootstrap-keys.json is not restored (secrets stay where they were); the same keys work.
      expect(fs.existsSync(path.join(restoredDir, 'bootstrap-keys.json'))).toBe(false);
      expect(
        (await call(server.base, 'GET', '/v1/admin/status', { key: source.keys.admin })).status,
      ).toBe(200);
      const pulled = await call(server.base, 'GET', '/v1/sync/pull', {
        key: source.keys.test.server,
      });
      expect(pulled.status).toBe(200);
      expect(pulled.body.config).toEqual(
        (await call(source.base, 'GET', '/v1/sync/pull', { key: source.keys.test.server })).body
          .config,
      );
      const named = await call(server.base, 'GET', '/v1/customers/named', {
        key: source.keys.test.server,
      });
      expect(named.body).toMatchObject({
        id: 'named',
        name: 'Named Co',
        metadata: { tier: 'gold' },
      });
      expect(
        (await call(server.base, 'GET', '/v1/audit/verify', { key: source.keys.test.server })).body
          .ok,
      ).toBe(true);
      const operator = await call(server.base, 'GET', '/v1/admin/audit', {
        key: source.keys.admin,
      });
      expect(operator.body.data[0]).toMatchObject({
        action: 'snapshot.restore',
        resourceType: 'snapshot',
      });
      expect(
        (await call(server.base, 'GET', '/v1/admin/audit/verify', { key: source.keys.admin })).body
          .ok,
      ).toBe(true);
    },
  );
});

describe('a file of the previous format', () => {
  it('restores idempotency keys its customers carry (format 2: no frames of keys)', async () => {
    // The file rewritten as a release before wrote it: each customer's keys in its item.
    const frames: SnapshotFrame[] = [];
    const { header } = readSnapshotFile(snapshotFile, (frame) => frames.push(frame));
    const keysOf = new Map<string, unknown[]>();
    for (const frame of frames)
      if (frame.k === 'idempotency')
        for (const [environment, id, keys] of frame.items as Array<[string, string, unknown[]]>)
          keysOf.set(`${environment}\u0000${id}`, [
            ...(keysOf.get(`${environment}\u0000${id}`) ?? []),
            ...keys,
          ]);
    expect(keysOf.size).toBeGreaterThanOrEqual(CUSTOMERS);
    const file = path.join(tempDataDir('format2'), 'format2.tsnap');
    const fd = fs.openSync(file, 'w');
    const writer = new SnapshotWriter(fd, randomBytes(32));
    writer.frame({ ...header, formatVersion: 2 });
    for (const frame of frames) {
      if (frame.k === 'idempotency') continue;
      if (frame.k !== 'customers') {
        writer.frame(frame as Exclude<SnapshotFrame, SnapshotHeader | SnapshotTrailer>);
        continue;
      }
      const items = (frame.items as Array<{ environment: string; id: string }>).map((item) => {
        const keys = keysOf.get(`${item.environment}\u0000${item.id}`);
        return keys === undefined ? item : { ...item, keys };
      });
      writer.frame({ k: 'customers', items });
    }
    writer.finish();
    fs.closeSync(fd);
    const target = path.join(tempDataDir('format2-data'), 'data');
    const result = await restoreSnapshot(file, target, { unauthenticated: true });
    expect(result.idempotencyKeys).toBe(0); // none in frames of their own
    const server = await startServerProcess({ dataDir: target, keys: source.keys });
    try {
      const before = sent.filter((s) => s.ackedAt !== null && s.ackedAt < postSentAt);
      const start = new Map<string, number>();
      for (const s of before)
        if (!start.has(s.customerId)) start.set(s.customerId, await consumed(server, s.customerId));
      await sendAgain(server, before);
      // Every one a replay: nothing consumed.
      for (const [customerId, value] of start)
        expect(await consumed(server, customerId), customerId).toBe(value);
    } finally {
      await server.stop();
    }
  });
});

describe('restore refuses', () => {
  const corrupt = (mutate: (bytes: Buffer) => Buffer): string => {
    const file = path.join(tempDataDir('badsnap'), 'bad.tsnap');
    fs.writeFileSync(file, mutate(fs.readFileSync(snapshotFile)));
    return file;
  };

  it.each([
    // Where the middle byte lands depends on the file's content: in a frame's payload its
    // checksum fails (corrupt); in a length prefix the frame overruns the file (truncated).
    [
      'a flipped byte',
      (b: Buffer) => {
        const c = Buffer.from(b);
        const i = Math.floor(c.length / 2);
        c[i] = (c[i] ?? 0) ^ 0xff;
        return c;
      },
      /corrupt|truncated/,
    ],
    ['a truncated file', (b: Buffer) => b.subarray(0, b.length - 10), /truncated|corrupt/],
    ['a file cut in half', (b: Buffer) => b.subarray(0, Math.floor(b.length / 2)), /truncated/],
    ['something else', () => Buffer.from('{"not":"a snapshot"}'), /not a Tally snapshot/],
  ])('%s, writing nothing', async (_name, mutate, message) => {
    const target = path.join(tempDataDir('target'), 'data');
    await expect(
      restoreSnapshot(corrupt(mutate), target, { secret: secretBytes() }),
    ).rejects.toThrow(SnapshotFileError);
    await expect(
      restoreSnapshot(corrupt(mutate), target, { secret: secretBytes() }),
    ).rejects.toThrow(message);
    expect(fs.existsSync(target)).toBe(false);
  });

  it('a data dir a running server holds, and a non-empty one', async () => {
    await expect(
      restoreSnapshot(snapshotFile, source.dataDir, { secret: secretBytes() }),
    ).rejects.toThrow(RestoreRefusedError);
    await expect(
      restoreSnapshot(snapshotFile, source.dataDir, { secret: secretBytes() }),
    ).rejects.toThrow(/running Tally server \(pid \d+\)/);
    const nonEmpty = tempDataDir('nonempty');
    fs.writeFileSync(path.join(nonEmpty, 'something'), 'x');
    await expect(
      restoreSnapshot(snapshotFile, nonEmpty, { secret: secretBytes() }),
    ).rejects.toThrow(/not empty/);
  });

  it('and a second server will not start on a data dir in use', () => {
    const result = spawnSync(process.execPath, [MAIN_JS], {
      env: { ...process.env, PORT: '0', TALLY_DATA_DIR: source.dataDir },
      encoding: 'utf8',
      timeout: 20_000,
    });
    expect(result.status).toBe(1);
    expect(result.stderr).toMatch(/in use by a running Tally server \(pid \d+\)/);
  });
});

describe('snapshot management', () => {
  it('lists, refuses unknown ids, and deletes', async () => {
    const admin = source.keys.admin;
    const list = await call(source.base, 'GET', '/v1/admin/snapshots', { key: admin });
    expect(list.body.data.length).toBeGreaterThanOrEqual(1);
    const [latest] = list.body.data;
    expect(latest).toMatchObject({
      status: 'complete',
      customers: expect.any(Number),
      bytes: expect.any(Number),
      journalPositions: expect.any(Array),
    });
    expect(
      (await call(source.base, 'GET', '/v1/admin/snapshots/snap_nope', { key: admin })).status,
    ).toBe(404);
    expect(
      (await call(source.base, 'GET', '/v1/admin/snapshots/snap_nope/file', { key: admin })).status,
    ).toBe(404);
    expect(
      (await call(source.base, 'GET', '/v1/admin/snapshots/..%2Fcontrol', { key: admin })).status,
    ).toBe(400);
    expect(
      (await call(source.base, 'DELETE', `/v1/admin/snapshots/${latest.id}`, { key: admin }))
        .status,
    ).toBe(204);
    expect(
      (await call(source.base, 'GET', `/v1/admin/snapshots/${latest.id}`, { key: admin })).status,
    ).toBe(404);
    expect(fs.existsSync(path.join(source.dataDir, 'snapshots', `${latest.id}.tsnap`))).toBe(false);
    const audit = await call(source.base, 'GET', '/v1/admin/audit?resourceType=snapshot', {
      key: admin,
    });
    expect(audit.body.data.map((e: { action: string }) => e.action)).toEqual([
      'snapshot.delete',
      'snapshot.create',
    ]);
  });
});

describe('tally snapshot (the CLI)', () => {
  it(
    'creates and downloads online, lists, and restores offline into a server that answers ' +
      'the same',
    async () => {
      const env = { TALLY_URL: source.base, TALLY_API_KEY: source.keys.admin };
      const dir = tempDataDir('cli-snap');
      const out = path.join(dir, 'cli.tsnap');
      const created = await tally(['snapshot', 'create', '--out', out, '--json'], env);
      expect(created.stderr).toBe('');
      expect(created.code).toBe(0);
      const info = JSON.parse(created.stdout) as { id: string; sha256: string; customers: number };
      expect(fs.existsSync(`${out}.partial`)).toBe(false);
      const { createHash } = await import('node:crypto');
      expect(createHash('sha256').update(fs.readFileSync(out)).digest('hex')).toBe(info.sha256);
      const listed = await tally(['snapshot', 'list'], env);
      expect(listed.code).toBe(0);
      expect(listed.stdout).toContain(info.id);
      expect(listed.stdout).toContain('complete');

      // An existing --out is refused before the service is asked for anything; --force replaces it.
      const snapshotsBefore = (
        await call(source.base, 'GET', '/v1/admin/snapshots', { key: source.keys.admin })
      ).body.data.length as number;
      const kept = fs.readFileSync(out);
      const again = await tally(['snapshot', 'create', '--out', out], env);
      expect(again.code).toBe(1);
      expect(again.stderr).toBe(
        `error: ${out} already exists; pass --force to replace it (nothing was done)\n`,
      );
      expect(fs.readFileSync(out).equals(kept)).toBe(true);
      expect(
        (await call(source.base, 'GET', '/v1/admin/snapshots', { key: source.keys.admin })).body
          .data.length,
      ).toBe(snapshotsBefore);
      const download = await tally(['snapshot', 'download', info.id, '--out', out], env);
      expect(download.code).toBe(1);
      expect(download.stderr).toContain('already exists; pass --force');
      const forced = await tally(['snapshot', 'create', '--out', out, '--force', '--json'], env);
      expect(forced.code, forced.stderr).toBe(0);
      // Piped, it shows no progress: stderr stays empty.
      expect(forced.stderr).toBe('');
      const replaced = JSON.parse(forced.stdout) as { id: string; sha256: string };
      expect(replaced.id).not.toBe(info.id);
      expect(createHash('sha256').update(fs.readFileSync(out)).digest('hex')).toBe(replaced.sha256);
      expect(
        (await tally(['snapshot', 'download', info.id, '--out', out, '--force'], env)).code,
      ).toBe(0);
      expect(createHash('sha256').update(fs.readFileSync(out)).digest('hex')).toBe(info.sha256);

      const target = path.join(dir, 'data');
      const restore = await tally([
        'snapshot',
        'restore',
        out,
        '--data-dir',
        target,
        '--workers',
        '2',
      ]);
      expect(restore.code).toBe(0);
      const copy = await startServerProcess({ dataDir: target, keys: source.keys });
      try {
        // Nothing wrote to the source since the snapshot: every balance is exactly the same,
        // although the customers are now dealt over two workers.
        expect(
          (await call(copy.base, 'GET', '/v1/admin/status', { key: source.keys.admin })).body
            .workers,
        ).toBe(2);
        for (const customerId of [
          ...Array.from({ length: CUSTOMERS }, (_, c) => `cust-${c}`),
          'cold-0',
          'cold-1999',
          'named',
        ]) {
          const a = await call(
            source.base,
            'GET',
            `/v1/usage/api_calls/balance?customerId=${customerId}`,
            { key: source.keys.test.server },
          );
          const b = await call(
            copy.base,
            'GET',
            `/v1/usage/api_calls/balance?customerId=${customerId}`,
            { key: source.keys.test.server },
          );
          expect(b.body, customerId).toEqual(a.body);
        }
        // The keys went with their customers to their new workers: a retry is a replay.
        const retried = sent.filter((s) => s.ackedAt !== null).slice(-60);
        await sendAgain(copy, retried);
        for (const customerId of new Set(retried.map((s) => s.customerId)))
          expect(await consumed(copy, customerId), customerId).toBe(
            await consumed(source, customerId),
          );
        expect(
          (await call(copy.base, 'GET', '/v1/admin/status', { key: source.keys.admin })).body
            .customers,
        ).toBe(info.customers);
      } finally {
        await copy.stop();
      }
    },
  );

  it(
    'takes a cut under concurrent consumes: restored, it holds every consume acknowledged ' +
      'before the command and none sent after it exited',
    async () => {
      const sk = source.keys.test.server;
      const env = { TALLY_URL: source.base, TALLY_API_KEY: source.keys.admin };
      const dir = tempDataDir('cli-cut');
      const out = path.join(dir, 'cut.tsnap');
      const log: Sent[] = [];
      const consumers = startConsumers(source, { clients: 4, stride: 5, keyPrefix: 'cli', log });
      await new Promise((resolve) => setTimeout(resolve, 200));
      const spawnedAt = performance.now();
      const created = await tally(['snapshot', 'create', '--out', out], env);
      const exitedAt = performance.now();
      await new Promise((resolve) => setTimeout(resolve, 200));
      await consumers.stop();
      expect(created.code).toBe(0);
      const target = path.join(dir, 'data');
      expect((await tally(['snapshot', 'restore', out, '--data-dir', target])).code).toBe(0);
      const copy = await startServerProcess({ dataDir: target, keys: source.keys });
      try {
        const replay = (s: Sent) =>
          call(copy.base, 'POST', '/v1/usage/api_calls/consume', {
            key: sk,
            body: { customerId: s.customerId, amount: 1, idempotencyKey: s.idempotencyKey },
          });
        const before = log.filter((s) => s.ackedAt !== null && s.ackedAt < spawnedAt);
        const after = log.filter((s) => s.sentAt > exitedAt);
        expect(before.length).toBeGreaterThan(10);
        expect(after.length).toBeGreaterThan(10);
        const start = new Map<string, number>();
        for (let c = 0; c < CUSTOMERS; c++)
          start.set(`cust-${c}`, await consumed(copy, `cust-${c}`));
        for (const s of before) await replay(s);
        for (const [id, value] of start)
          expect(
            await consumed(copy, id),
            `${id}: a key acknowledged before the command was not in the snapshot`,
          ).toBe(value);
        for (const s of after) await replay(s);
        for (const [id, value] of start)
          expect(await consumed(copy, id), id).toBe(
            value + after.filter((s) => s.customerId === id).length,
          );
      } finally {
        await copy.stop();
      }
    },
  );

  it('refuses a corrupt file and a live data dir with exit 1 and a clear message', async () => {
    const dir = tempDataDir('cli-bad');
    const bad = path.join(dir, 'bad.tsnap');
    const bytes = Buffer.from(fs.readFileSync(snapshotFile));
    bytes[100] = (bytes[100] ?? 0) ^ 0x55;
    fs.writeFileSync(bad, bytes);
    const corrupt = await tally(['snapshot', 'restore', bad, '--data-dir', path.join(dir, 'data')]);
    expect(corrupt.code).toBe(1);
    expect(corrupt.stderr).toMatch(/^error: snapshot file is corrupt/);
    expect(fs.existsSync(path.join(dir, 'data'))).toBe(false);
    const live = await tally(['snapshot', 'restore', snapshotFile, '--data-dir', source.dataDir]);
    expect(live.code).toBe(1);
    expect(live.stderr).toMatch(/held by a running Tally server/);
    const usage = await tally(['snapshot', 'restore', snapshotFile]);
    expect(usage.code).toBe(2);
    const envKey = await tally(['snapshot', 'create', '--out', path.join(dir, 'x.tsnap')], {
      TALLY_URL: source.base,
      TALLY_API_KEY: source.keys.live.server,
    });
    expect(envKey.code).toBe(1);
    expect(envKey.stderr).toContain('this endpoint requires the operator key');
  });
});

describe('snapshot authenticity', () => {
  /**
   * Rewrites `snapshotFile` as someone without the secret would: every frame through
   * `edit`, then fresh CRCs, a fresh SHA-256 and a MAC under a secret of their own.
   */
  function edited(edit: (frame: SnapshotFrame) => SnapshotFrame): string {
    const frames: SnapshotFrame[] = [];
    const { header } = readSnapshotFile(snapshotFile, (frame) => frames.push(frame));
    const file = path.join(tempDataDir('edited'), 'edited.tsnap');
    const fd = fs.openSync(file, 'w');
    const writer = new SnapshotWriter(fd, randomBytes(32));
    writer.frame(header);
    for (const frame of frames)
      writer.frame(edit(frame) as Exclude<SnapshotFrame, SnapshotHeader | SnapshotTrailer>);
    writer.finish();
    fs.closeSync(fd);
    return file;
  }
  /** An operator key whose secret the editor knows. */
  const planted = issueKey('admin', null, Date.now());
  const withPlantedKey = (frame: SnapshotFrame): SnapshotFrame =>
    frame.k === 'keys' ? { ...frame, items: [...frame.items, planted.record] } : frame;

  it(
    'an edited file whose checksums were all recomputed is refused with the true secret, ' +
      'and nothing is written',
    async () => {
      const file = edited(withPlantedKey);
      expect(() => verifySnapshotFile(file)).not.toThrow(); // intact as far as checksums can tell
      const target = path.join(tempDataDir('auth'), 'data');
      await expect(restoreSnapshot(file, target, { secret: secretBytes() })).rejects.toThrow(
        SnapshotNotAuthenticError,
      );
      expect(fs.existsSync(target)).toBe(false);
      const cli = await tally(['snapshot', 'restore', file, '--data-dir', target]);
      expect(cli.code).toBe(1);
      expect(cli.stderr).toMatch(/^error: snapshot file is not authentic: its MAC does not verify/);
      expect(fs.existsSync(target)).toBe(false);
    },
  );

  it(
    'without the secret a restore is refused ' + 'unless the operator says --unauthenticated',
    async () => {
      const target = path.join(tempDataDir('nosecret'), 'data');
      const refused = await tally(['snapshot', 'restore', snapshotFile, '--data-dir', target], {
        TALLY_SNAPSHOT_SECRET: '',
      });
      expect(refused.code).toBe(1);
      expect(refused.stderr).toMatch(/restore needs the snapshot secret/);
      expect(fs.existsSync(target)).toBe(false);
      const wrong = await tally(['snapshot', 'restore', snapshotFile, '--data-dir', target], {
        TALLY_SNAPSHOT_SECRET: 'f'.repeat(64),
      });
      expect(wrong.stderr).toMatch(/not authentic/);
      const accepted = await tally(
        ['snapshot', 'restore', snapshotFile, '--data-dir', target, '--unauthenticated'],
        { TALLY_SNAPSHOT_SECRET: '' },
      );
      expect(accepted.code, accepted.stderr).toBe(0);
    },
  );

  it(
    'restored with the secret, ' + 'the new data dir keeps that secret for its own snapshots',
    async () => {
      // beforeAll's restored server runs on the data dir restored with the source's secret.
      const secret = await call(
        (restored as ServerProcess).base,
        'GET',
        '/v1/admin/snapshot-secret',
        { key: source.keys.admin },
      );
      expect(secret).toMatchObject({ status: 200, body: { secret: secretHex } });
      expect(
        (
          await call((restored as ServerProcess).base, 'GET', '/v1/admin/snapshot-secret', {
            key: source.keys.test.server,
          })
        ).status,
      ).toBe(403);
    },
  );

  it(
    'an unauthenticated file is still validated: a malformed key, configuration or customer ' +
      'is refused, nothing written',
    async () => {
      const cases: ReadonlyArray<
        readonly [string, (frame: SnapshotFrame) => SnapshotFrame, RegExp]
      > = [
        [
          'key',
          (f) =>
            f.k === 'keys'
              ? { ...f, items: [...f.items, { ...planted.record, hashHex: 'not-a-digest' }] }
              : f,
          /invalid API key record/,
        ],
        [
          'config',
          (f) =>
            f.k === 'configs'
              ? {
                  ...f,
                  entries: f.entries.map((e) => ({
                    ...(e as object),
                    config: { entitlements: 'nope' },
                  })),
                }
              : f,
          /invalid configuration \(version \d+\): invalid billing configuration/,
        ],
        [
          'idempotency key',
          (f) =>
            f.k === 'idempotency'
              ? { ...f, items: [...f.items, ['live', 'c-1', [['digest', '1', 'yesterday']]]] }
              : f,
          /invalid idempotency key item/,
        ],
        [
          'customer',
          (f) =>
            f.k === 'customers'
              ? {
                  ...f,
                  items: f.items.map((c, i) =>
                    i === 0
                      ? {
                          ...(c as { profile: object }),
                          profile: { ...(c as { profile: object }).profile, email: 'not an email' },
                        }
                      : c,
                  ),
                }
              : f,
          /invalid customer .*email/,
        ],
      ];
      for (const [what, edit, message] of cases) {
        const target = path.join(tempDataDir(`invalid-${what}`), 'data');
        const res = await tally(
          ['snapshot', 'restore', edited(edit), '--data-dir', target, '--unauthenticated'],
          { TALLY_SNAPSHOT_SECRET: '' },
        );
        expect(res.code, what).toBe(1);
        expect(res.stderr, what).toMatch(message);
        expect(fs.existsSync(target), what).toBe(false);
      }
    },
  );
});
