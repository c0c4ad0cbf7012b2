/**
 * The operator API (docs/api.md, Operator API): only the operator key reaches `/v1/admin/…`
 * (in x-tally-key or as a Bearer token), every environment key gets 403 there, keys are
 * created / listed / revoked / rotated online, and every operator action lands in the
 * operator audit stream (and key changes also in the environment's own log).
 */
import { availableParallelism } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultWorkers } from '../src/server.js';
import { envInfo, openDurableEnv } from '../storage/lmdb-env.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

let server: ServerProcess;

beforeAll(async () => {
  server = await startServerProcess({
    config: {
      entitlements: { sso: { type: 'feature' } },
      products: { free: { default: true, entitlements: { sso: true } } },
    },
  });
});

afterAll(async () => {
  await server?.stop();
});

const admin = (method: string, path: string, options: { body?: unknown; key?: string } = {}) =>
  call(server.base, method, path, {
    key: options.key ?? server.keys.admin,
    ...(options.body === undefined ? {} : { body: options.body }),
  });

const ADMIN_ROUTES: Array<[string, string]> = [
  ['GET', '/v1/admin/status'],
  ['GET', '/v1/admin/keys'],
  ['POST', '/v1/admin/keys'],
  ['POST', '/v1/admin/keys/rotate-admin'],
  ['DELETE', '/v1/admin/keys/key_x'],
  ['GET', '/v1/admin/audit'],
  ['GET', '/v1/admin/audit/verify'],
  ['GET', '/v1/admin/metrics'],
  ['POST', '/v1/admin/snapshots'],
  ['GET', '/v1/admin/snapshots'],
  ['GET', '/v1/admin/snapshots/snap_x'],
  ['GET', '/v1/admin/snapshots/snap_x/file'],
  ['GET', '/v1/admin/nonexistent'],
];

describe('operator routes', () => {
  it(
    'refuse every environment key with 403, even a live server key, and a missing key with ' +
      '401',
    async () => {
      const envKeys = [
        server.keys.test.server,
        server.keys.test.client,
        server.keys.live.server,
        server.keys.live.client,
      ];
      for (const [method, path] of ADMIN_ROUTES) {
        for (const key of envKeys) {
          const res = await call(server.base, method, path, {
            key,
            ...(method === 'POST' ? { body: { environment: 'test', class: 'server' } } : {}),
          });
          expect(res.status, `${method} ${path}`).toBe(403);
          expect(res.body.error).toBe('this endpoint requires the operator key');
        }
        expect((await call(server.base, method, path)).status).toBe(401);
      }
    },
  );

  it(
    'accept the operator key as a Bearer token (for Prometheus) and refuse it on ' +
      'environment routes',
    async () => {
      const res = await call(server.base, 'GET', '/v1/admin/status', {
        headers: { authorization: `Bearer ${server.keys.admin}` },
      });
      expect(res.status).toBe(200);
      const env = await call(server.base, 'GET', '/v1/entitlements/sso/has?customerId=c', {
        key: server.keys.admin,
      });
      expect(env.status).toBe(403);
    },
  );

  it('answer 404 for an unknown operator route and 405 for a wrong method', async () => {
    expect((await admin('GET', '/v1/admin/nonexistent')).status).toBe(404);
    const res = await admin('PUT', '/v1/admin/keys');
    expect(res.status).toBe(405);
    expect(res.headers.get('allow')).toBe('GET, POST');
  });

  it('the default worker count is cores − 1, at least one', () => {
    expect([1, 2, 3, 4, 8].map(defaultWorkers)).toEqual([1, 1, 2, 3, 7]);
  });

  it('status reports shards, customers, journal and uptime', async () => {
    expect(
      (
        await call(server.base, 'GET', '/v1/entitlements/sso/has?customerId=status-1', {
          key: server.keys.test.client,
        })
      ).status,
    ).toBe(200);
    await call(server.base, 'POST', '/v1/customers', {
      key: server.keys.test.server,
      body: { id: 'status-1' },
    });
    const res = await admin('GET', '/v1/admin/status');
    expect(res.status).toBe(200);
    expect(res.body.ok).toBe(true);
    expect(res.body.workers).toBe(res.body.shards.length);
    // No TALLY_WORKERS here: the default, cores − 1 but at least one.
    expect(res.body.workers).toBe(defaultWorkers(availableParallelism()));
    expect(res.body.customers).toBeGreaterThanOrEqual(1);
    expect(res.body.environments.test.configVersion).toBe(1);
    expect(res.body.environments.live.configVersion).toBe(0);
    const shard = res.body.shards[0];
    for (const field of [
      'customers',
      'queueDepth',
      'journalRecords',
      'journalBytes',
      'lastSeq',
      'snapshotSeq',
      'idempotencyEntries',
    ]) {
      expect(typeof shard[field], field).toBe('number');
    }
    expect(res.body.uptimeSec).toBeGreaterThanOrEqual(0);
  });
});

describe('key management', () => {
  it(
    'creates a key shown once, lists it by id and prefix only, ' + 'and revokes it (401 at once)',
    async () => {
      const created = await admin('POST', '/v1/admin/keys', {
        body: { environment: 'live', class: 'client' },
      });
      expect(created.status).toBe(201);
      const { id, key, prefix } = created.body;
      expect(key).toMatch(/^ck_live_[A-Za-z0-9_-]{32}$/);
      expect(key.startsWith(prefix)).toBe(true);
      expect(created.body).toMatchObject({ environment: 'live', class: 'client', revokedAt: null });

      const listed = await admin('GET', '/v1/admin/keys');
      expect(listed.status).toBe(200);
      const row = listed.body.data.find((k: { id: string }) => k.id === id);
      expect(row).toMatchObject({
        id,
        prefix,
        environment: 'live',
        class: 'client',
        revokedAt: null,
      });
      expect(JSON.stringify(listed.body)).not.toContain(key);
      expect(JSON.stringify(listed.body)).not.toContain(server.keys.admin);

      const before = await call(server.base, 'GET', '/v1/docs/openapi.json', { key });
      expect(before.status).toBe(200);
      const revoked = await admin('DELETE', `/v1/admin/keys/${id}`);
      expect(revoked.status).toBe(200);
      expect(typeof revoked.body.revokedAt).toBe('string');
      const after = await call(server.base, 'GET', '/v1/docs/openapi.json', { key });
      expect(after.status).toBe(401);
      // Revoking again changes nothing and says so.
      const again = await admin('DELETE', `/v1/admin/keys/${id}`);
      expect(again.status).toBe(409);
      expect(again.body).toEqual({
        code: 'key_already_revoked',
        error: `key ${id} was already revoked at ${revoked.body.revokedAt}`,
      });
    },
  );

  it('validates key creation and revocation', async () => {
    const bad = await admin('POST', '/v1/admin/keys', {
      body: { environment: 'prod', class: 'server' },
    });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toContain('environment');
    expect(
      (await admin('POST', '/v1/admin/keys', { body: { environment: 'test' } })).body.error,
    ).toBe('class is required');
    expect((await admin('DELETE', '/v1/admin/keys/key_nope')).status).toBe(404);
    const operator = (await admin('GET', '/v1/admin/keys')).body.data.find(
      (k: { class: string; revokedAt: null }) => k.class === 'operator' && k.revokedAt === null,
    );
    expect((await admin('DELETE', `/v1/admin/keys/${operator.id}`)).status).toBe(409);
  });

  it('rotates the operator key online: the new key works, the old one answers 401', async () => {
    const other = await startServerProcess();
    try {
      const rotated = await call(other.base, 'POST', '/v1/admin/keys/rotate-admin', {
        key: other.keys.admin,
      });
      expect(rotated.status).toBe(201);
      expect(rotated.body.key).toMatch(/^ak_/);
      expect(
        (await call(other.base, 'GET', '/v1/admin/status', { key: other.keys.admin })).status,
      ).toBe(401);
      expect(
        (await call(other.base, 'GET', '/v1/admin/status', { key: rotated.body.key })).status,
      ).toBe(200);
      const audit = await call(other.base, 'GET', '/v1/admin/audit', { key: rotated.body.key });
      expect(audit.body.data[0]).toMatchObject({
        action: 'key.rotate',
        resourceType: 'key',
        resourceId: rotated.body.id,
        actor: rotated.body.revoked,
      });
      // The rotation survives a restart.
      await other.stop();
      const again = await startServerProcess({ dataDir: other.dataDir });
      try {
        expect(
          (await call(again.base, 'GET', '/v1/admin/status', { key: rotated.body.key })).status,
        ).toBe(200);
        expect(
          (await call(again.base, 'GET', '/v1/admin/status', { key: other.keys.admin })).status,
        ).toBe(401);
      } finally {
        await again.stop();
      }
    } finally {
      await other.stop();
    }
  });

  it(
    'writes key actions to the operator stream and to the environment log, with a ' +
      'verifiable chain',
    async () => {
      const created = await admin('POST', '/v1/admin/keys', {
        body: { environment: 'test', class: 'server' },
      });
      await admin('DELETE', `/v1/admin/keys/${created.body.id}`);
      const stream = await admin('GET', '/v1/admin/audit?resourceType=key&limit=2');
      expect(stream.status).toBe(200);
      expect(stream.body.data.map((e: { action: string }) => e.action)).toEqual([
        'key.revoke',
        'key.create',
      ]);
      expect(stream.body.data[0].resourceId).toBe(created.body.id);
      const envLog = await call(server.base, 'GET', '/v1/audit?resourceType=key&limit=2', {
        key: server.keys.test.server,
      });
      expect(envLog.body.data.map((e: { action: string }) => e.action)).toEqual([
        'key.revoke',
        'key.create',
      ]);
      // The live environment saw only its own key's actions.
      const liveLog = await call(server.base, 'GET', '/v1/audit?resourceType=key', {
        key: server.keys.live.server,
      });
      expect(
        liveLog.body.data.every(
          (e: { data: { environment: string } }) => e.data.environment === 'live',
        ),
      ).toBe(true);
      const verify = await admin('GET', '/v1/admin/audit/verify');
      expect(verify.body).toMatchObject({ ok: true });
      expect(verify.body.entries).toBeGreaterThanOrEqual(2);
    },
  );

  it(
    'commits each key change together with its audit entries: ' + 'one transaction per change',
    async () => {
      // Another reader of the control store sees every commit; a crash can only keep both or
      // neither.
      const control = openDurableEnv(path.join(server.dataDir, 'control'), ['keys']);
      const txnId = () => envInfo(control.dbs.keys).lastTxnId;
      try {
        let before = txnId();
        const created = await admin('POST', '/v1/admin/keys', {
          body: { environment: 'live', class: 'client' },
        });
        expect(created.status).toBe(201);
        expect(txnId() - before).toBe(1);
        before = txnId();
        expect((await admin('DELETE', `/v1/admin/keys/${created.body.id}`)).status).toBe(200);
        expect(txnId() - before).toBe(1);
        const other = await startServerProcess();
        const otherControl = openDurableEnv(path.join(other.dataDir, 'control'), ['keys']);
        try {
          const otherBefore = envInfo(otherControl.dbs.keys).lastTxnId;
          expect(
            (
              await call(other.base, 'POST', '/v1/admin/keys/rotate-admin', {
                key: other.keys.admin,
              })
            ).status,
          ).toBe(201);
          expect(envInfo(otherControl.dbs.keys).lastTxnId - otherBefore).toBe(1);
        } finally {
          await otherControl.root.close();
          await other.stop();
        }
      } finally {
        await control.root.close();
      }
    },
  );
});
