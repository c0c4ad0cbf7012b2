/**
 * The audit log: one hash-chained entry per administrative mutation, actor = the
 * key's id, newest first with filters and cursors, nothing for failed requests, durable
 * across restarts, and GET /v1/audit/verify catching an entry edited on disk.
 */
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeRecord, decodeRecord } from '../storage/codec.js';
import { envInfo, openDurableEnv } from '../storage/lmdb-env.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const CONFIG = {
  entitlements: { seats: { type: 'limit' }, api_calls: { type: 'meter' } },
  products: {
    free: {
      default: true,
      entitlements: {
        seats: { included: 1, expansion: { unitAmount: 1 } },
        api_calls: { included: 100, overage: { unitAmount: 1 } },
      },
    },
  },
};

let server: ServerProcess;
let sk: string;
let skId: string;

beforeAll(async () => {
  server = await startServerProcess();
  sk = server.keys.test.server;
  const store = openDurableEnv(path.join(server.dataDir, 'control'), ['keys']);
  // The key's id, as the audit log must name it (read from the key table by its prefix).
  for (const { value } of store.dbs.keys.getRange({})) {
    const record = decodeRecord(value);
    if (record.ok && (record.value as { prefix: string }).prefix === sk.slice(0, 12))
      skId = (record.value as { id: string }).id;
  }
  expect((await call(server.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG })).status).toBe(
    200,
  );
  const post = (p: string, body: unknown) => call(server.base, 'POST', p, { key: sk, body });
  expect((await post('/v1/customers', { id: 'aud-1', name: 'A' })).status).toBe(201);
  expect(
    (
      await call(server.base, 'PUT', '/v1/contracts/aud-1', {
        key: sk,
        body: { priceAmount: 100, priceInterval: 'month' },
      })
    ).status,
  ).toBe(200);
  expect(
    (await post('/v1/entitlements/seats/limit/settings', { customerId: 'aud-1', purchased: 2 }))
      .status,
  ).toBe(200);
  expect(
    (await post('/v1/usage/api_calls/settings', { customerId: 'aud-1', overageEnabled: true }))
      .status,
  ).toBe(200);
  expect(
    (await post('/v1/usage/api_calls/consume', { customerId: 'aud-1', amount: 5 })).status,
  ).toBe(200);
  expect(
    (
      await post('/v1/usage/api_calls/refund', {
        customerId: 'aud-1',
        amount: 2,
        idempotencyKey: 'r1',
      })
    ).status,
  ).toBe(200);
  expect((await call(server.base, 'DELETE', '/v1/contracts/aud-1', { key: sk })).status).toBe(204);
  // Failures record nothing.
  expect(
    (await post('/v1/usage/api_calls/refund', { customerId: 'aud-1', amount: 500 })).status,
  ).toBe(409);
  expect((await call(server.base, 'DELETE', '/v1/contracts/aud-1', { key: sk })).status).toBe(404);
});

afterAll(async () => {
  await server?.stop();
});

const list = (query = '', key = sk) => call(server.base, 'GET', `/v1/audit${query}`, { key });

describe('audit log', () => {
  it('has one entry per successful mutation, newest first, with the key id as actor', async () => {
    const res = await list();
    expect(res.status).toBe(200);
    expect(res.body.data.map((e: { action: string }) => e.action)).toEqual([
      'contract.delete',
      'usage.refund',
      'usage.settings',
      'limit.settings',
      'contract.put',
      'customer.upsert',
      'config.push',
    ]);
    for (const entry of res.body.data) {
      expect(entry.actor).toBe(skId);
      expect(JSON.stringify(entry)).not.toContain(sk);
      expect(entry.hash).toMatch(/^[0-9a-f]{64}$/);
    }
    expect(res.body.data[1]).toMatchObject({
      resourceType: 'meter',
      resourceId: 'aud-1',
      data: { key: 'api_calls', amount: 2, idempotencyKey: 'r1' },
    });
    expect(res.body.data[6]).toMatchObject({
      resourceType: 'config',
      resourceId: 'v1',
      data: { version: 1 },
    });
    // Each entry links to the one before it.
    const chronological = [...res.body.data].reverse();
    for (let i = 1; i < chronological.length; i++)
      expect(chronological[i].prevHash).toBe(chronological[i - 1].hash);
  });

  it('filters by action and resource type, and pages with a cursor', async () => {
    expect(
      (await list('?action=contract.put')).body.data.map((e: { action: string }) => e.action),
    ).toEqual(['contract.put']);
    expect(
      (await list('?resourceType=meter')).body.data.map((e: { action: string }) => e.action),
    ).toEqual(['usage.refund', 'usage.settings']);
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const page: { body: any } = await list(
        `?limit=3${cursor === null ? '' : `&cursor=${cursor}`}`,
      );
      seen.push(...page.body.data.map((e: { id: string }) => e.id));
      cursor = page.body.nextCursor;
    } while (cursor !== null);
    expect(seen).toEqual((await list()).body.data.map((e: { id: string }) => e.id));
    expect((await list('?limit=0')).status).toBe(400);
    expect((await list('?cursor=zzz')).status).toBe(400);
    // A filter value the log cannot hold is a typo: 400 naming the allowed values, not an empty
    // page.
    expect(await list('?action=contract.update')).toMatchObject({
      status: 400,
      body: {
        error: expect.stringMatching(
          /^action must be one of config\.push, customer\.upsert, .*key\.revoke$/,
        ),
      },
    });
    expect(await list('?resourceType=Customer')).toMatchObject({
      status: 400,
      body: { error: expect.stringMatching(/^resourceType must be one of config, customer, /) },
    });
    expect(
      (await list('?action=key.create')).body.data.every(
        (e: { action: string }) => e.action === 'key.create',
      ),
    ).toBe(true);
    expect((await list('', server.keys.test.client)).status).toBe(403);
    expect((await list('', server.keys.live.server)).body).toEqual({ data: [], nextCursor: null });
  });

  it('verify reports an intact chain, and a tampered entry after a restart', async () => {
    expect((await call(server.base, 'GET', '/v1/audit/verify', { key: sk })).body).toMatchObject({
      ok: true,
      entries: 7,
    });
    // Each verify reads the chain as it is now, not as the pool thread first saw it.
    expect(
      (await call(server.base, 'POST', '/v1/customers', { key: sk, body: { id: 'aud-2' } })).status,
    ).toBe(201);
    const newest = (await list('?limit=1')).body.data[0];
    expect((await call(server.base, 'GET', '/v1/audit/verify', { key: sk })).body).toEqual({
      ok: true,
      entries: 8,
      lastHash: newest.hash,
    });
    await server.stop();
    const control = openDurableEnv(path.join(server.dataDir, 'control'), ['audit']);
    const key = ['test', 3];
    const stored = decodeRecord(control.dbs.audit.get(key) as Buffer);
    expect(stored.ok).toBe(true);
    const edited = {
      ...(stored.ok ? (stored.value as object) : {}),
      data: { priceAmount: 1, priceInterval: 'month', entitlements: {} },
    };
    await control.dbs.audit.put(key, encodeRecord(edited));
    await control.root.close();
    server = await startServerProcess({ dataDir: server.dataDir });
    const verdict = await call(server.base, 'GET', '/v1/audit/verify', { key: sk });
    expect(verdict.body).toEqual({
      ok: false,
      entries: 2,
      brokenAt: 'aud_test_3',
      reason: 'content does not match its hash',
    });
  });

  it('a config push stores the new version and its audit entry in one transaction', async () => {
    // Another reader of the same environment sees every commit: one push, one transaction.
    // The push's `config.pushed` event commits in it too, and the webhook delivery thread
    // later takes the event and prunes the rows before it from the outbox (the newest row
    // stays) in a transaction of its own, at a moment of its choosing: so count from an
    // outbox down to its newest row to the same again.
    const control = openDurableEnv(path.join(server.dataDir, 'control'), ['audit', 'outbox']);
    const outboxPruned = async (): Promise<void> => {
      for (let waited = 0; waited < 5000; waited += 10) {
        control.root.resetReadTxn();
        if (control.dbs.outbox.getKeysCount() === 1) return;
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      throw new Error('the delivery thread did not prune the control outbox within 5 s');
    };
    try {
      await outboxPruned();
      const before = envInfo(control.dbs.audit).lastTxnId;
      expect(
        (await call(server.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG })).status,
      ).toBe(200);
      await outboxPruned();
      // The push's transaction, then the delivery thread's prune of the row before its event.
      expect(envInfo(control.dbs.audit).lastTxnId - before).toBe(2);
      expect((await list('?action=config.push&limit=1')).body.data[0]).toMatchObject({
        resourceId: 'v2',
        actor: skId,
        data: { version: 2 },
      });
    } finally {
      await control.root.close();
    }
  });
});
