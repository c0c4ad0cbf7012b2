/**
 * Several front-end threads on one port (TALLY_FRONTENDS): what must hold whichever thread a
 * connection lands on. Every call here opens a connection of its own, so the kernel spreads
 * them over both front ends; each test repeats its probe enough times that both are reached.
 * (The whole HTTP suite also runs on two front ends: http-api.test.ts.)
 */
import crypto from 'node:crypto';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { SharedBudgets } from '../src/auth/shared-budgets.js';
import { parsePrometheusText, sampleValue } from './support/prometheus-text.js';
import {
  call,
  freshConnections,
  startServerProcess,
  tempDataDir,
  type ServerProcess,
} from './support/server-process.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

const CONFIG = {
  entitlements: {
    sso: { type: 'feature' },
    tokens: { type: 'meter', reset: 'never' },
  },
  products: {
    free: { default: true, entitlements: { sso: true, tokens: { included: 3 } } },
  },
};

/** Large enough for every operator call of this file too (they count against it). */
const SERVER_LIMIT = 60;

let server: ServerProcess;

beforeAll(async () => {
  server = await startServerProcess({
    config: CONFIG,
    env: {
      TALLY_FRONTENDS: '2',
      TALLY_WORKERS: '2',
      TALLY_RATE_LIMIT_SERVER: String(SERVER_LIMIT),
    },
  });
  freshConnections(server.base);
});

afterAll(async () => {
  await server?.stop();
});

/** Requests each front end answered so far (its own, and for the first what it was relayed). */
async function answeredPerFrontEnd(): Promise<[number, number]> {
  const metrics = await call(server.base, 'GET', '/v1/admin/metrics', { key: server.keys.admin });
  const families = parsePrometheusText(metrics.body as string);
  const of = (frontEnd: string) =>
    sampleValue(families, 'tally_front_end_requests_total', { front_end: frontEnd }) ?? 0;
  return [of('0'), of('1')];
}

/** A fresh server key of the test environment (its own rate budget). */
async function newServerKey(): Promise<{ id: string; key: string }> {
  const created = await call(server.base, 'POST', '/v1/admin/keys', {
    key: server.keys.admin,
    body: { environment: 'test', class: 'server' },
  });
  expect(created.status).toBe(201);
  return { id: created.body.id as string, key: created.body.key as string };
}

describe('two front ends, two shard workers', () => {
  it('a key has one rate budget, whichever front end counts its requests', async () => {
    const { key } = await newServerKey();
    // The probe takes well under a second: start it where it cannot straddle a minute.
    const seconds = new Date().getUTCSeconds();
    if (seconds >= 55) await new Promise((resolve) => setTimeout(resolve, (61 - seconds) * 1000));
    const before = await answeredPerFrontEnd();
    const statuses: number[] = [];
    for (let i = 0; i < SERVER_LIMIT + 15; i++)
      statuses.push(
        (await call(server.base, 'GET', `/v1/entitlements/sso/has?customerId=rl${i % 5}`, { key }))
          .status,
      );
    const after = await answeredPerFrontEnd();
    // Both front ends took part (the second serves `has` of a server key itself).
    expect(after[1] - before[1]).toBeGreaterThan(0);
    expect(after[0] - before[0]).toBeGreaterThan(1);
    expect(statuses.slice(0, SERVER_LIMIT).every((status) => status === 200)).toBe(true);
    expect(statuses.slice(SERVER_LIMIT).every((status) => status === 429)).toBe(true);
  });

  it('a revoked key is refused by every front end once the revocation is answered', async () => {
    for (let round = 0; round < 3; round++) {
      const { id, key } = await newServerKey();
      const probe = () =>
        call(server.base, 'GET', `/v1/entitlements/sso/has?customerId=rev${round}`, { key });
      for (let i = 0; i < 6; i++) expect((await probe()).status).toBe(200);
      const revoked = await call(server.base, 'DELETE', `/v1/admin/keys/${id}`, {
        key: server.keys.admin,
      });
      expect(revoked.status).toBe(200);
      for (let i = 0; i < 8; i++) expect((await probe()).status).toBe(401);
    }
  });

  it('a has after a consume sees it, whichever front ends answered either', async () => {
    for (let c = 0; c < 10; c++) {
      const customerId = `ryw${c}`;
      const { key } = await newServerKey();
      const has = async () =>
        (
          await call(server.base, 'GET', `/v1/entitlements/tokens/has?customerId=${customerId}`, {
            key,
          })
        ).body as boolean;
      // Answered from the first front end's view after the first time.
      for (let i = 0; i < 3; i++) expect(await has()).toBe(true);
      const consumed = await call(server.base, 'POST', '/v1/usage/tokens/consume', {
        key,
        body: { customerId, amount: 3 },
      });
      expect(consumed.status).toBe(200);
      for (let i = 0; i < 4; i++) expect(await has()).toBe(false);
    }
  });

  it('relays the dev relay WebSocket: every listener is greeted and gets the events', async () => {
    const url = `${server.base.replace('http', 'ws')}/v1/listen`;
    const sockets = Array.from(
      { length: 6 },
      () => new WebSocket(url, { headers: { 'x-tally-key': server.keys.test.server } }),
    );
    const messages = sockets.map(() => [] as Array<{ type: string; eventType?: string }>);
    sockets.forEach((socket, i) =>
      socket.on('message', (data) => messages[i]?.push(JSON.parse(String(data)))),
    );
    try {
      await until(() => messages.every((received) => received.some((m) => m.type === 'ready')));
      const pushed = await call(server.base, 'POST', '/v1/sync/push', {
        key: server.keys.test.server,
        body: CONFIG,
      });
      expect(pushed.status).toBe(200);
      await until(() =>
        messages.every((received) => received.some((m) => m.eventType === 'config.pushed')),
      );
    } finally {
      for (const socket of sockets) socket.close();
    }
  });

  it('streams a snapshot download relayed from either front end, byte for byte', async () => {
    const created = await call(server.base, 'POST', '/v1/admin/snapshots', {
      key: server.keys.admin,
    });
    expect(created.status).toBe(202);
    let info: Record<string, unknown> = {};
    await until(async () => {
      info = (
        await call(server.base, 'GET', `/v1/admin/snapshots/${created.body.id}`, {
          key: server.keys.admin,
        })
      ).body;
      return info['status'] !== 'running';
    });
    expect(info['status']).toBe('complete');
    for (let i = 0; i < 6; i++) {
      const file = await call(server.base, 'GET', `/v1/admin/snapshots/${created.body.id}/file`, {
        key: server.keys.admin,
        binary: true,
      });
      expect(file.status).toBe(200);
      const digest = crypto
        .createHash('sha256')
        .update(file.body as Buffer)
        .digest('hex');
      expect(digest).toBe(file.headers.get('x-tally-snapshot-sha256'));
    }
  });

  it('every consume acknowledged through either front end survives kill -9', async () => {
    const config = {
      entitlements: { tokens: { type: 'meter', reset: 'never' } },
      products: { free: { default: true, entitlements: { tokens: { included: 1_000_000 } } } },
    };
    const dataDir = tempDataDir('tally-front-ends-crash');
    const first = await startServerProcess({
      dataDir,
      config,
      env: { TALLY_FRONTENDS: '2', TALLY_WORKERS: '2' },
    });
    freshConnections(first.base);
    const customers = ['k0', 'k1', 'k2', 'k3', 'k4', 'k5'];
    const acknowledged = new Map(customers.map((customerId) => [customerId, 0]));
    let killed = false;
    const loops = customers.map(async (customerId) => {
      while (!killed) {
        const reply = await call(first.base, 'POST', '/v1/usage/tokens/consume', {
          key: first.keys.test.server,
          body: { customerId, amount: 1 },
        }).catch(() => null);
        if (reply?.status === 200)
          acknowledged.set(customerId, (acknowledged.get(customerId) ?? 0) + 1);
      }
    });
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    await first.kill9();
    killed = true;
    await Promise.all(loops);
    const second = await startServerProcess({ dataDir, keys: first.keys });
    try {
      for (const customerId of customers) {
        const balance = await call(
          second.base,
          'GET',
          `/v1/usage/tokens/balance?customerId=${customerId}`,
          { key: second.keys.test.server },
        );
        const used = 1_000_000 - (balance.body.balance as number);
        const acked = acknowledged.get(customerId) ?? 0;
        expect(acked).toBeGreaterThan(10);
        // Each loop had at most one request in flight at the kill: durable, maybe unanswered.
        expect(used).toBeGreaterThanOrEqual(acked);
        expect(used).toBeLessThanOrEqual(acked + 1);
      }
    } finally {
      await second.stop();
    }
  });

  it('metrics carry GC pauses of every thread: both front ends, workers, webhooks', async () => {
    const threads = async (): Promise<string[]> => {
      const metrics = await call(server.base, 'GET', '/v1/admin/metrics', {
        key: server.keys.admin,
      });
      const families = parsePrometheusText(metrics.body as string);
      const samples = families.get('tally_gc_pause_max_seconds')?.samples ?? [];
      return samples.map((s) => s.labels['thread'] ?? '').sort();
    };
    // The delivery thread sends its pauses once it has started.
    await until(async () => (await threads()).includes('webhooks'));
    expect(await threads()).toEqual(['front-1', 'main', 'shard-0', 'shard-1', 'webhooks']);
  });

  it('stops cleanly (exit code 0) with both front ends serving', async () => {
    const other = await startServerProcess({
      config: CONFIG,
      env: { TALLY_FRONTENDS: '2', TALLY_WORKERS: '2' },
    });
    freshConnections(other.base);
    for (let i = 0; i < 6; i++)
      expect(
        (
          await call(other.base, 'POST', '/v1/usage/tokens/consume', {
            key: other.keys.test.server,
            body: { customerId: `stop${i}`, amount: 1 },
          })
        ).status,
      ).toBe(200);
    expect(await other.stop()).toBe(0);
  });
});

describe('shared rate windows', () => {
  it('threads counting one key at once lose no count', async () => {
    const budgets = new SharedBudgets();
    const slot = budgets.assign('key_a');
    const minute = 29_000_000;
    const perThread = 20_000;
    // Each worker counts through the same class, on the same shared memory.
    const code = `
      const { workerData, parentPort } = require('node:worker_threads');
      import(workerData.module).then(({ SharedBudgets }) => {
        const budgets = new SharedBudgets(workerData.buffer);
        const { slot, minute, count } = workerData;
        for (let i = 0; i < count; i++) budgets.count(slot, minute);
        parentPort.postMessage('done');
      });
    `;
    const module = pathToFileURL(path.join(ROOT, 'dist', 'src', 'auth', 'shared-budgets.js')).href;
    const workers = [0, 1].map(
      () =>
        new Worker(code, {
          eval: true,
          workerData: { module, buffer: budgets.buffer, slot, minute, count: perThread },
        }),
    );
    // This thread counts too, through the class, while the two workers run.
    for (let i = 0; i < perThread; i++) budgets.count(slot, minute);
    await Promise.all(workers.map((w) => new Promise((resolve) => w.once('message', resolve))));
    expect(budgets.count(slot, minute)).toBe(3 * perThread + 1);
    // A new minute starts the window again.
    expect(budgets.count(slot, minute + 1)).toBe(1);
  });
});

async function until(probe: () => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await probe())) {
    if (Date.now() > deadline) throw new Error('timed out waiting');
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
