/**
 * Per-environment quotas set by the operator (TALLY_QUOTA_*): customers, idempotency
 * keys and audit entries a day. Past a quota the environment refuses what would grow it
 * with 429 `quota_exceeded`, keeps serving everything else, and the other environment is
 * untouched. One shard worker, so a quota's share is the whole quota.
 */
import { spawnSync } from 'node:child_process';
import { afterAll, describe, expect, it } from 'vitest';
import { call, MAIN_JS, startServerProcess, type ServerProcess } from './support/server-process.js';

const CONFIG = {
  entitlements: { seats: { type: 'limit' }, api_calls: { type: 'meter' } },
  products: {
    free: {
      default: true,
      entitlements: {
        seats: { included: 2, expansion: { unitAmount: 1 } },
        api_calls: { included: 1000, overage: { unitAmount: 1 } },
      },
    },
  },
};

const started: ServerProcess[] = [];
afterAll(async () => {
  for (const server of started) await server.stop();
});

async function start(env: Record<string, string>): Promise<ServerProcess> {
  const server = await startServerProcess({ config: CONFIG, env: { TALLY_WORKERS: '1', ...env } });
  started.push(server);
  const live = await call(server.base, 'POST', '/v1/sync/push', {
    key: server.keys.live.server,
    body: CONFIG,
  });
  expect(live.status).toBe(200);
  return server;
}

const consume = (
  server: ServerProcess,
  environment: 'test' | 'live',
  customerId: string,
  idempotencyKey?: string,
) =>
  call(server.base, 'POST', '/v1/usage/api_calls/consume', {
    key: server.keys[environment].server,
    body: { customerId, amount: 1, ...(idempotencyKey === undefined ? {} : { idempotencyKey }) },
  });

describe('quotas', () => {
  it(
    'customers: past the quota a new customer is refused, existing ones and the other ' +
      'environment are served',
    async () => {
      const server = await start({ TALLY_QUOTA_CUSTOMERS: 'test:5' });
      for (let i = 0; i < 5; i++) expect((await consume(server, 'test', `c${i}`)).status).toBe(200);
      const refused = await consume(server, 'test', 'c5');
      expect(refused).toMatchObject({
        status: 429,
        body: {
          code: 'quota_exceeded',
          error: expect.stringContaining('the test environment holds its quota of 5 customers'),
        },
      });
      expect(refused.headers.get('retry-after')).toBeNull();
      expect(
        (
          await call(server.base, 'POST', '/v1/customers', {
            key: server.keys.test.server,
            body: { id: 'c6' },
          })
        ).status,
      ).toBe(429);
      // Nothing was created by the refusals; reads of unknown customers still answer.
      expect(
        (await call(server.base, 'GET', '/v1/customers/c5', { key: server.keys.test.server }))
          .status,
      ).toBe(404);
      expect(
        (
          await call(server.base, 'GET', '/v1/usage/api_calls/balance?customerId=c5', {
            key: server.keys.test.client,
          })
        ).status,
      ).toBe(200);
      expect((await consume(server, 'test', 'c0')).status).toBe(200);
      for (let i = 0; i < 8; i++) expect((await consume(server, 'live', `l${i}`)).status).toBe(200);
    },
  );

  it(
    'idempotency keys: past the quota a new key is refused; ' + 'replays and unkeyed writes pass',
    async () => {
      const server = await start({ TALLY_QUOTA_IDEMPOTENCY_KEYS: '3' });
      for (let i = 0; i < 3; i++)
        expect((await consume(server, 'test', 'k', `key-${i}`)).status).toBe(200);
      expect(await consume(server, 'test', 'k', 'key-3')).toMatchObject({
        status: 429,
        body: { code: 'quota_exceeded', error: expect.stringContaining('3 idempotency keys') },
      });
      const replay = await consume(server, 'test', 'k', 'key-1');
      expect(replay.status).toBe(200);
      expect((await consume(server, 'test', 'k')).status).toBe(200);
      const balance = await call(server.base, 'GET', '/v1/usage/api_calls/balance?customerId=k', {
        key: server.keys.test.server,
      });
      // three keys and one unkeyed; the refusal and the replay drew nothing
      expect(balance.body.consumed).toBe(4);
      // A number applies to both environments.
      for (let i = 0; i < 3; i++)
        expect((await consume(server, 'live', 'k', `key-${i}`)).status).toBe(200);
      expect((await consume(server, 'live', 'k', 'key-3')).status).toBe(429);
    },
  );

  it(
    'audit entries a day: past the quota audited changes are refused, unaudited traffic and ' +
      'no-op calls pass',
    async () => {
      // The config push at start is the first entry of the day.
      const server = await start({ TALLY_QUOTA_AUDIT_ENTRIES_PER_DAY: 'test:3' });
      const sk = server.keys.test.server;
      expect(
        (
          await call(server.base, 'POST', '/v1/customers', {
            key: sk,
            body: { id: 'a1', name: 'A' },
          })
        ).status,
      ).toBe(201);
      expect(
        (
          await call(server.base, 'POST', '/v1/usage/api_calls/settings', {
            key: sk,
            body: { customerId: 'a1', overageEnabled: true },
          })
        ).status,
      ).toBe(200);
      const refused = await call(server.base, 'POST', '/v1/entitlements/seats/limit/settings', {
        key: sk,
        body: { customerId: 'a1', purchased: 3 },
      });
      expect(refused).toMatchObject({
        status: 429,
        body: { code: 'quota_exceeded', error: expect.stringContaining('3 audit entries today') },
      });
      expect(
        (await call(server.base, 'GET', '/v1/entitlements/seats/limit?customerId=a1', { key: sk }))
          .body,
      ).toMatchObject({ purchased: 0 });
      expect(
        (await call(server.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG })).status,
      ).toBe(429);
      // A context that changes nothing, a consume, a repeated setting: not audited, still served.
      expect(
        (
          await call(server.base, 'POST', '/v1/context', {
            key: sk,
            body: { customer: { id: 'a1', name: 'A' } },
          })
        ).status,
      ).toBe(200);
      expect((await consume(server, 'test', 'a1')).status).toBe(200);
      expect(
        (
          await call(server.base, 'POST', '/v1/usage/api_calls/settings', {
            key: sk,
            body: { customerId: 'a1', overageEnabled: true },
          })
        ).status,
      ).toBe(200);
      expect((await call(server.base, 'GET', '/v1/audit', { key: sk })).body.data).toHaveLength(3);
      // The live environment has its own (unlimited) budget.
      expect(
        (
          await call(server.base, 'POST', '/v1/customers', {
            key: server.keys.live.server,
            body: { id: 'a1', name: 'A' },
          })
        ).status,
      ).toBe(201);
    },
  );

  it('a malformed quota setting stops the start with a message naming it', () => {
    const ran = spawnSync(process.execPath, [MAIN_JS], {
      env: { ...process.env, PORT: '0', TALLY_QUOTA_CUSTOMERS: 'test=5' },
      encoding: 'utf8',
      timeout: 20_000,
    });
    expect(ran.status).toBe(2);
    expect(ran.stderr).toContain('TALLY_QUOTA_CUSTOMERS: expected a whole number or test:N,live:M');
  });
});

describe('quota shares', () => {
  it(
    'each worker enforces the quota times the logical shards it owns, rounded up; settings ' +
      'parse',
    async () => {
      const { parsePerEnvironment, workerQuotas } = await import('../shared/quotas.js');
      const quotas = {
        customers: { test: 1000, live: 0 },
        idempotencyKeys: { test: 7, live: 7 },
        auditEntriesPerDay: { test: 0, live: 0 },
      };
      expect(workerQuotas(quotas, 0, 1).customers.test).toEqual({ limit: 1000, share: 1000 });
      // 256 logical shards over 3 workers: 86, 85, 85.
      expect([0, 1, 2].map((i) => workerQuotas(quotas, i, 3).customers.test.share)).toEqual([
        336, 333, 333,
      ]);
      expect([0, 1, 2].map((i) => workerQuotas(quotas, i, 3).idempotencyKeys.live.share)).toEqual([
        3, 3, 3,
      ]);
      expect(workerQuotas(quotas, 1, 3).customers.live).toEqual({ limit: 0, share: 0 });
      expect(parsePerEnvironment('12')).toEqual({ test: 12, live: 12 });
      expect(parsePerEnvironment('live:3')).toEqual({ test: 0, live: 3 });
      expect(parsePerEnvironment('test: 1, live :2')).toEqual({ test: 1, live: 2 });
      expect(() => parsePerEnvironment('prod:1')).toThrow(/test:N,live:M/);
    },
  );
});
