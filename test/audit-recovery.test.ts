/**
 * An audited shard write and its audit entry cannot come apart in a crash: the shard
 * stores the entry in the change's own transaction, and the next start appends every
 * stored entry the chain lacks. The crash window (change durable, entry not yet in the
 * chain) is recreated exactly, on a stopped server's data dir, by moving the newest entry
 * from the chain back to the shard's store; and for real, by `kill -9` under concurrent
 * audited writes.
 */
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { decodeRecord, encodeRecord } from '../storage/codec.js';
import { openDurableEnv, SHARD_ENV_OPTIONS } from '../storage/lmdb-env.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const CONFIG = {
  entitlements: { seats: { type: 'limit' }, tokens: { type: 'meter' } },
  products: {
    free: { default: true, entitlements: { seats: { included: 1 }, tokens: { included: 10 } } },
  },
};
const ONE_WORKER = { TALLY_WORKERS: '1' };

let servers: ServerProcess[] = [];
afterEach(async () => {
  await Promise.all(servers.map((s) => s.stop()));
  servers = [];
});

async function start(
  options: Parameters<typeof startServerProcess>[0] = {},
): Promise<ServerProcess> {
  const server = await startServerProcess({ env: ONE_WORKER, ...options });
  servers.push(server);
  return server;
}

async function stop(server: ServerProcess): Promise<void> {
  servers = servers.filter((s) => s !== server);
  await server.stop();
}

interface StoredEntry {
  readonly id: string;
  readonly seq: number;
  readonly at: string;
  readonly action: string;
  readonly resourceType: string;
  readonly resourceId: string;
  readonly actor: string;
  readonly data: unknown;
}

/** The shard's stored (not yet forgotten) audit entries, read from its environment. */
async function pendingInShard(dataDir: string): Promise<unknown[]> {
  const shard = openDurableEnv(path.join(dataDir, 'shard-0'), ['audits'], SHARD_ENV_OPTIONS);
  try {
    return [...shard.dbs.audits.getRange({})].map(({ value }) => {
      const decoded = decodeRecord(value);
      return decoded.ok ? decoded.value : null;
    });
  } finally {
    await shard.root.close();
  }
}

/**
 * Recreates the state a crash leaves between a change and its entry: the newest entry of
 * `environment` leaves the chain (and its reference the index), and the shard holds it.
 */
async function undoNewestEntry(dataDir: string, environment: string): Promise<StoredEntry> {
  const control = openDurableEnv(path.join(dataDir, 'control'), ['audit', 'auditRefs']);
  const shard = openDurableEnv(path.join(dataDir, 'shard-0'), ['audits'], SHARD_ENV_OPTIONS);
  try {
    const [newest] = [
      ...control.dbs.audit.getRange({
        start: [environment, Number.MAX_SAFE_INTEGER],
        end: [environment, 0],
        reverse: true,
        limit: 1,
      }),
    ];
    const decoded = decodeRecord(newest?.value as Buffer);
    if (!decoded.ok) throw new Error('no newest entry');
    const entry = decoded.value as StoredEntry;
    const ref = [...control.dbs.auditRefs.getRange({})].find(({ value }) => {
      const at = decodeRecord(value);
      return at.ok && JSON.stringify(at.value) === JSON.stringify([environment, entry.seq]);
    })?.key as string | undefined;
    expect(ref, 'the entry of a shard write carries a reference').toBeDefined();
    await control.dbs.audit.remove([environment, entry.seq]);
    await control.dbs.auditRefs.remove(ref as string);
    const { action, resourceType, resourceId, actor, data } = entry;
    await shard.dbs.audits.put(
      ref as string,
      encodeRecord({
        ref,
        environment,
        action,
        resourceType,
        resourceId,
        actor,
        data,
        atMs: Date.parse(entry.at),
      }),
    );
    await shard.root.flushed;
    return entry;
  } finally {
    await control.root.close();
    await shard.root.close();
  }
}

const newestEntries = async (server: ServerProcess, n: number) =>
  (await call(server.base, 'GET', `/v1/audit?limit=${n}`, { key: server.keys.test.server })).body
    .data as StoredEntry[];

describe('audit entries of shard writes survive a crash between the change and the chain', () => {
  it('a shard holds an entry only until the chain has it', async () => {
    const server = await start({ config: CONFIG });
    const sk = server.keys.test.server;
    expect(
      (
        await call(server.base, 'PUT', '/v1/contracts/c1', {
          key: sk,
          body: { priceAmount: 5, priceInterval: 'month' },
        })
      ).status,
    ).toBe(200);
    await stop(server);
    expect(await pendingInShard(server.dataDir)).toEqual([]);
  });

  it(
    'a running shard drops its copy with its next journal write, which needs no sync of its ' +
      'own',
    async () => {
      const server = await start({ config: CONFIG });
      const sk = server.keys.test.server;
      expect(
        (
          await call(server.base, 'PUT', '/v1/contracts/c3', {
            key: sk,
            body: { priceAmount: 5, priceInterval: 'month' },
          })
        ).status,
      ).toBe(200);
      // The consume's record is durable before its reply, and the forget went in its transaction.
      expect(
        (
          await call(server.base, 'POST', '/v1/usage/tokens/consume', {
            key: sk,
            body: { customerId: 'c3', amount: 1 },
          })
        ).status,
      ).toBe(200);
      await server.kill9();
      servers = servers.filter((s) => s !== server);
      expect(await pendingInShard(server.dataDir)).toEqual([]);
    },
  );

  it('the next start appends an entry the chain lacks, as it was, once', async () => {
    let server = await start({ config: CONFIG });
    const sk = server.keys.test.server;
    expect(
      (
        await call(server.base, 'PUT', '/v1/contracts/c2', {
          key: sk,
          body: { priceAmount: 7, priceInterval: 'year' },
        })
      ).status,
    ).toBe(200);
    const before = await newestEntries(server, 1);
    await stop(server);
    const undone = await undoNewestEntry(server.dataDir, 'test');
    expect(undone).toMatchObject({ action: 'contract.put', resourceId: 'c2' });

    server = await start({ dataDir: server.dataDir, keys: server.keys });
    const after = await newestEntries(server, 1);
    const { action, resourceType, resourceId, actor, data, at, seq } = before[0] as StoredEntry;
    expect(after[0]).toMatchObject({ action, resourceType, resourceId, actor, data, at, seq });
    expect((await call(server.base, 'GET', '/v1/audit/verify', { key: sk })).body).toMatchObject({
      ok: true,
    });
    await stop(server);
    expect(await pendingInShard(server.dataDir)).toEqual([]);

    // A stored copy of an entry the chain already holds is only forgotten.
    server = await start({ dataDir: server.dataDir, keys: server.keys });
    expect(
      (await newestEntries(server, 100)).filter(
        (e) => e.resourceId === 'c2' && e.action === 'contract.put',
      ),
    ).toHaveLength(1);
  });

  it('after kill -9 under concurrent audited writes, every stored contract has its ' +
    'entry', async () => {
    let server = await start({ config: CONFIG });
    const sk = server.keys.test.server;
    let stop9 = false;
    const writers = Array.from({ length: 40 }, async (_, w) => {
      for (let i = 0; !stop9; i++) {
        await call(server.base, 'PUT', `/v1/contracts/k${w}-${i}`, {
          key: sk,
          body: { priceAmount: i, priceInterval: 'month' },
        }).catch(() => undefined);
      }
    });
    await new Promise((resolve) => setTimeout(resolve, 700));
    await server.kill9();
    stop9 = true;
    await Promise.all(writers);
    servers = servers.filter((s) => s !== server);

    server = await start({ dataDir: server.dataDir, keys: server.keys });
    const audited = new Set<string>();
    let cursor: string | null = null;
    do {
      const page: { body: { data: StoredEntry[]; nextCursor: string | null } } = await call(
        server.base,
        'GET',
        `/v1/audit?action=contract.put&limit=100${cursor === null ? '' : `&cursor=${cursor}`}`,
        { key: sk },
      );
      for (const entry of page.body.data) audited.add(entry.resourceId);
      cursor = page.body.nextCursor;
    } while (cursor !== null);
    let stored = 0;
    cursor = null;
    do {
      const page: { body: { data: Array<{ id: string }>; nextCursor: string | null } } = await call(
        server.base,
        'GET',
        `/v1/customers?limit=100${cursor === null ? '' : `&cursor=${cursor}`}`,
        { key: sk },
      );
      for (const customer of page.body.data) {
        if (
          (
            await call(server.base, 'GET', `/v1/contracts/${encodeURIComponent(customer.id)}`, {
              key: sk,
            })
          ).status === 200
        ) {
          stored++;
          expect(audited.has(customer.id), `contract of ${customer.id} has its audit entry`).toBe(
            true,
          );
        }
      }
      cursor = page.body.nextCursor;
    } while (cursor !== null);
    expect(stored).toBeGreaterThan(50);
    expect((await call(server.base, 'GET', '/v1/audit/verify', { key: sk })).body).toMatchObject({
      ok: true,
    });
  }, 60_000);
});
