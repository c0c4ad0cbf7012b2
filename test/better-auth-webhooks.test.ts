/**
 * The Better Auth plugin's webhook receiver against a running Tally: lazy registration
 * (racing status calls and racing instances make one endpoint), a real event delivered by
 * Tally and verified, forged, stale and duplicated deliveries, a registration reused by a
 * second instance on the same SQLite file, `autoRegister: false`, and the memory adapter.
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { betterAuth } from 'better-auth';
import { memoryAdapter } from 'better-auth/adapters/memory';
import Database from 'better-sqlite3';
import { tally, type TallyEvent } from 'tally/better-auth';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { signedHeaders } from '../src/webhooks/sign.js';
import { startAuthApp, tempDbFile } from './support/better-auth-app.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const TALLY_BIN = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'bin', 'tally.js');

const CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'month' } },
  products: { free: { default: true, entitlements: { api_calls: { included: 10 } } } },
};

let tallyServer: ServerProcess;

beforeAll(async () => {
  tallyServer = await startServerProcess({ config: CONFIG });
});

afterAll(async () => {
  await tallyServer?.stop();
});

function pluginOptions(webhook: Parameters<typeof tally>[0]['webhook'] = {}) {
  return { apiKey: tallyServer.keys.test.server, baseUrl: tallyServer.base, webhook };
}

/** The endpoints Tally has registered for `url`. */
async function tallyEndpoints(url: string): Promise<Array<{ id: string; url: string }>> {
  const listed = await call(tallyServer.base, 'GET', '/v1/webhooks', {
    key: tallyServer.keys.test.server,
  });
  expect(listed.status).toBe(200);
  return (listed.body.data as Array<{ id: string; url: string }>).filter((e) => e.url === url);
}

/** The rows of the plugin's endpoint table, read straight from the SQLite file. */
function storedEndpoints(dbFile: string): Array<{ endpointId: string; secret: string }> {
  const db = new Database(dbFile, { readonly: true });
  try {
    return db.prepare('SELECT * FROM tallyWebhookEndpoint').all() as Array<{
      endpointId: string;
      secret: string;
    }>;
  } finally {
    db.close();
  }
}

function event(id: string, type = 'customer.updated'): TallyEvent {
  return {
    id,
    type: type as TallyEvent['type'],
    createdAt: new Date().toISOString(),
    environment: 'test',
    data: { id: 'cus_1' },
  };
}

/** Posts `body` to the receiver with the given headers. */
function deliver(origin: string, body: string, headers: Record<string, string>) {
  return fetch(`${origin}/api/auth/tally`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body,
  });
}

/** The customer id of a `customer.*` event Tally sent. */
const customerOf = (e: TallyEvent): unknown =>
  (e.data['customer'] as { id?: unknown } | undefined)?.id;

/** Waits until `probe` answers true (deliveries are asynchronous). */
async function until(probe: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 15_000;
  while (!probe()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

describe('registration', () => {
  it('racing status calls register one endpoint, stored once', async () => {
    const app = await startAuthApp({ plugins: [tally(pluginOptions())] });
    try {
      const url = `${app.origin}/api/auth/tally`;
      const answers = await Promise.all(
        Array.from({ length: 8 }, () =>
          fetch(url).then(async (r) => [r.status, (await r.json()) as any] as const),
        ),
      );
      const ids = new Set(answers.map(([, body]) => body.endpointId));
      expect(answers.every(([status]) => status === 200)).toBe(true);
      expect(ids.size).toBe(1);
      expect(answers[0]?.[1]).toMatchObject({
        registered: true,
        url,
        events: '*',
        status: 'active',
        persistent: true,
      });
      expect(answers[0]?.[1]).not.toHaveProperty('secret');
      expect(await tallyEndpoints(url)).toHaveLength(1);
      expect(storedEndpoints(app.dbFile)).toHaveLength(1);
    } finally {
      await app.close();
    }
  });

  it('two instances racing on one database file make one endpoint, stored once', async () => {
    const dbFile = tempDbFile();
    const first = await startAuthApp({ plugins: [tally(pluginOptions())] }, dbFile);
    // Behind one public address: both instances register the same receiver URL.
    const second = await startAuthApp({ plugins: [tally(pluginOptions())] }, dbFile, first.origin);
    try {
      const url = `${first.origin}/api/auth/tally`;
      const [a, b] = await Promise.all([
        fetch(`${first.origin}/api/auth/tally`).then((r) => r.json() as Promise<any>),
        fetch(`${second.origin}/api/auth/tally`).then((r) => r.json() as Promise<any>),
      ]);
      expect(a.endpointId).toBe(b.endpointId);
      expect(await tallyEndpoints(url)).toHaveLength(1);
      expect(storedEndpoints(dbFile)).toHaveLength(1);
    } finally {
      await first.close();
      await second.close();
    }
  });

  it('a second instance on the same file verifies with the stored registration', async () => {
    const dbFile = tempDbFile();
    const first = await startAuthApp({ plugins: [tally(pluginOptions())] }, dbFile);
    const status = (await fetch(`${first.origin}/api/auth/tally`).then((r) => r.json())) as any;
    await first.close();
    // The second instance cannot reach Tally at all: only the stored endpoint can verify.
    const received: TallyEvent[] = [];
    const second = await startAuthApp(
      {
        plugins: [
          tally({
            apiKey: 'sk_test_unused',
            baseUrl: 'http://127.0.0.1:9',
            webhook: { onEvent: (e) => void received.push(e) },
          }),
        ],
      },
      dbFile,
      first.origin,
    );
    try {
      const [stored] = storedEndpoints(dbFile);
      expect(stored?.endpointId).toBe(status.endpointId);
      const body = JSON.stringify(event('evt_reuse_1'));
      const headers = signedHeaders('evt_reuse_1', Date.now(), body, [stored?.secret as string]);
      const answer = await deliver(second.origin, body, { ...headers });
      expect(answer.status).toBe(200);
      expect(received.map((e) => e.id)).toEqual(['evt_reuse_1']);
    } finally {
      await second.close();
    }
  });
});

/** The status endpoint asks Tally at most every 3 s per process; waits that long. */
const statusRefreshInterval = () => new Promise((resolve) => setTimeout(resolve, 3_100));

describe('a stale registration', () => {
  it('a status call picks up a rotated secret and replaces a deleted endpoint', async () => {
    const app = await startAuthApp({ plugins: [tally(pluginOptions())] });
    const key = tallyServer.keys.test.server;
    try {
      const url = `${app.origin}/api/auth/tally`;
      const first = (await (await fetch(url)).json()) as any;
      const rotated = await call(
        tallyServer.base,
        'POST',
        `/v1/webhooks/${first.endpointId}/rotate`,
        {
          key,
        },
      );
      expect(rotated.status).toBe(200);
      expect(storedEndpoints(app.dbFile)[0]?.secret).not.toBe(rotated.body.secret);
      await statusRefreshInterval();
      expect((await fetch(url)).status).toBe(200);
      expect(storedEndpoints(app.dbFile)[0]?.secret).toBe(rotated.body.secret);

      const deleted = await call(tallyServer.base, 'DELETE', `/v1/webhooks/${first.endpointId}`, {
        key,
      });
      expect(deleted.status).toBe(204);
      await statusRefreshInterval();
      const again = (await (await fetch(url)).json()) as any;
      expect(again.endpointId).not.toBe(first.endpointId);
      expect(storedEndpoints(app.dbFile)).toMatchObject([{ endpointId: again.endpointId }]);
      expect((await tallyEndpoints(url)).map((e) => e.id)).toEqual([again.endpointId]);
    } finally {
      await app.close();
    }
  });
});

describe('deliveries', () => {
  const received: TallyEvent[] = [];
  let app: { origin: string; dbFile: string; close(): Promise<void> };
  beforeAll(async () => {
    app = await startAuthApp({
      plugins: [
        tally(
          pluginOptions({
            onEvent: (e) => {
              if (e.data['id'] === 'cus_fails') throw new Error('handler failed');
              received.push(e);
            },
          }),
        ),
      ],
    });
  });
  afterAll(async () => {
    await app?.close();
  });

  it('a real event from Tally is delivered, verified and handed to onEvent', async () => {
    // The first delivery finds no endpoint stored: the receiver cannot have registered
    // yet, so register through the status endpoint as a deploy would.
    expect((await fetch(`${app.origin}/api/auth/tally`)).status).toBe(200);
    const created = await call(tallyServer.base, 'POST', '/v1/customers', {
      key: tallyServer.keys.test.server,
      body: { id: 'cus_webhook_1', name: 'Webhook Customer' },
    });
    expect(created.status).toBe(201);
    await until(
      () =>
        received.some((e) => e.type === 'customer.created' && customerOf(e) === 'cus_webhook_1'),
      'customer.created for cus_webhook_1',
    );
    const delivered = received.find((e) => customerOf(e) === 'cus_webhook_1');
    expect(delivered).toMatchObject({ type: 'customer.created', environment: 'test' });
    expect(delivered?.id).toMatch(/^evt_/);
  });

  it('refuses forged, unsigned and stale deliveries with 400 and runs nothing', async () => {
    const before = received.length;
    const [stored] = storedEndpoints(app.dbFile);
    const body = JSON.stringify(event('evt_forged'));
    const forged = signedHeaders('evt_forged', Date.now(), body, [
      `whsec_${Buffer.from('not the endpoint secret!').toString('base64')}`,
    ]);
    const answers = [
      await deliver(app.origin, body, { ...forged }),
      await deliver(app.origin, body, {}),
      await deliver(app.origin, body, {
        ...signedHeaders('evt_forged', Date.now() - 10 * 60_000, body, [stored?.secret as string]),
      }),
      // A genuine signature over another body.
      await deliver(app.origin, body.replace('cus_1', 'cus_2'), {
        ...signedHeaders('evt_forged', Date.now(), body, [stored?.secret as string]),
      }),
    ];
    const bodies = await Promise.all(answers.map((a) => a.json() as Promise<any>));
    expect(answers.map((a) => a.status)).toEqual([400, 400, 400, 400]);
    expect(bodies.map((b) => b.code)).toEqual([
      'INVALID_SIGNATURE',
      'MISSING_HEADERS',
      'TIMESTAMP_TOO_OLD',
      'INVALID_SIGNATURE',
    ]);
    expect(received.length).toBe(before);
  });

  it('handles a webhook-id once; a failing onEvent leaves it to the retry', async () => {
    const [stored] = storedEndpoints(app.dbFile);
    const secret = stored?.secret as string;
    const body = JSON.stringify(event('evt_dupe_1'));
    const first = await deliver(app.origin, body, {
      ...signedHeaders('evt_dupe_1', Date.now(), body, [secret]),
    });
    // A retry is signed again with a new timestamp, under the same webhook-id.
    const retry = await deliver(app.origin, body, {
      ...signedHeaders('evt_dupe_1', Date.now() + 1000, body, [secret]),
    });
    expect([first.status, retry.status]).toEqual([200, 200]);
    expect(await retry.json()).toEqual({ received: true, duplicate: true });
    expect(received.filter((e) => e.id === 'evt_dupe_1')).toHaveLength(1);

    const failing = JSON.stringify({ ...event('evt_fail_1'), data: { id: 'cus_fails' } });
    const headers = signedHeaders('evt_fail_1', Date.now(), failing, [secret]);
    const failed = await deliver(app.origin, failing, { ...headers });
    expect(failed.status).toBe(500);
    expect(await failed.json()).toMatchObject({ code: 'EVENT_HANDLER_FAILED' });
    // Not recorded as handled: the retry runs onEvent again (and fails again here).
    expect((await deliver(app.origin, failing, { ...headers })).status).toBe(500);
  });
});

describe('autoRegister: false', () => {
  it('a delivery before any registration is 503; one status call registers', async () => {
    const received: TallyEvent[] = [];
    const app = await startAuthApp({
      plugins: [
        tally(pluginOptions({ autoRegister: false, onEvent: (e) => void received.push(e) })),
      ],
    });
    try {
      const url = `${app.origin}/api/auth/tally`;
      const body = JSON.stringify(event('evt_early'));
      const early = await deliver(app.origin, body, { 'webhook-id': 'evt_early' });
      expect(early.status).toBe(503);
      expect(await early.json()).toMatchObject({ code: 'WEBHOOK_NOT_REGISTERED' });
      expect(await tallyEndpoints(url)).toHaveLength(0);

      expect((await fetch(url)).status).toBe(200);
      expect(await tallyEndpoints(url)).toHaveLength(1);
      await call(tallyServer.base, 'POST', '/v1/customers', {
        key: tallyServer.keys.test.server,
        body: { id: 'cus_manual_1' },
      });
      await until(
        () => received.some((e) => customerOf(e) === 'cus_manual_1'),
        'an event for cus_manual_1',
      );
    } finally {
      await app.close();
    }
  });

  it('with autoRegister (the default), the first delivery registers the receiver', async () => {
    const app = await startAuthApp({ plugins: [tally(pluginOptions())] });
    try {
      const url = `${app.origin}/api/auth/tally`;
      const body = JSON.stringify(event('evt_first'));
      // Unsigned, so refused: but only after the receiver registered to learn its secret.
      const answer = await deliver(app.origin, body, { 'webhook-id': 'evt_first' });
      expect(answer.status).toBe(400);
      expect(await tallyEndpoints(url)).toHaveLength(1);
      expect(storedEndpoints(app.dbFile)).toHaveLength(1);
    } finally {
      await app.close();
    }
  });
});

describe('registration through the configuration', () => {
  it("a forwarding entry for the receiver's path gives key, events and autoRegister", async () => {
    // Its own receiver path, so the entry concerns this test's receiver only.
    const pushed = await call(tallyServer.base, 'POST', '/v1/sync/push', {
      key: tallyServer.keys.test.server,
      body: {
        ...CONFIG,
        webhooks: {
          forwarding: [
            {
              key: 'app',
              path: '/api/auth/billing-events',
              events: ['customer.created'],
              integration: 'better-auth',
              autoRegister: true,
            },
          ],
        },
      },
    });
    expect(pushed.status).toBe(200);
    const app = await startAuthApp({
      plugins: [tally(pluginOptions({ path: '/billing-events', autoRegister: false }))],
    });
    try {
      const url = `${app.origin}/api/auth/billing-events`;
      // The plugin says autoRegister: false, the configuration says true: a delivery registers.
      const body = JSON.stringify(event('evt_configured'));
      const answer = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'webhook-id': 'evt_configured' },
        body,
      });
      expect(answer.status).toBe(400);
      const listed = await call(tallyServer.base, 'GET', '/v1/webhooks', {
        key: tallyServer.keys.test.server,
      });
      const endpoints = (listed.body.data as Array<Record<string, unknown>>).filter(
        (e) => e['url'] === url,
      );
      expect(endpoints).toHaveLength(1);
      expect(endpoints[0]).toMatchObject({ key: 'app', events: ['customer.created'] });
      expect(await (await fetch(url)).json()).toMatchObject({
        endpointId: endpoints[0]?.['id'],
        events: 'customer.created',
      });
    } finally {
      await app.close();
    }
  });
});

describe('the dev relay', () => {
  it('tally listen forwards events the plugin verifies with the secret it stored', async () => {
    const pushed = await call(tallyServer.base, 'POST', '/v1/sync/push', {
      key: tallyServer.keys.test.server,
      body: {
        ...CONFIG,
        webhooks: {
          devTunnel: true,
          forwarding: [
            { key: 'relayed', path: '/api/auth/relayed', events: '*', integration: 'better-auth' },
          ],
        },
      },
    });
    expect(pushed.status).toBe(200);
    const received: TallyEvent[] = [];
    const app = await startAuthApp({
      plugins: [tally(pluginOptions({ path: '/relayed', onEvent: (e) => void received.push(e) }))],
    });
    const relay = spawn(process.execPath, [TALLY_BIN, 'listen', '--forward-to', app.origin], {
      env: {
        ...process.env,
        TALLY_URL: tallyServer.base,
        TALLY_API_KEY: tallyServer.keys.test.server,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    relay.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    relay.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    try {
      // Registered under the entry's key: the relay signs with that endpoint's secret.
      const status = (await (await fetch(`${app.origin}/api/auth/relayed`)).json()) as any;
      expect(status).toMatchObject({ registered: true, status: 'active' });
      await until(() => output.includes('Ready:'), `the relay to start:\n${output}`);
      await call(tallyServer.base, 'POST', '/v1/customers', {
        key: tallyServer.keys.test.server,
        body: { id: 'cus_relay_1' },
      });
      await until(() => received.some((e) => customerOf(e) === 'cus_relay_1'), 'the event');
      const eventId = received.find((e) => customerOf(e) === 'cus_relay_1')?.id as string;
      // The relayed copy passed verification (200; a copy Tally delivered directly as well
      // is answered as a duplicate), and onEvent ran once.
      await until(() => output.includes(eventId), `the relay's line for ${eventId}`);
      const line = output.split('\n').find((l) => l.includes(eventId));
      expect(line).toMatch(/customer\.created .*→ \/api\/auth\/relayed 200$/);
      expect(received.filter((e) => e.id === eventId)).toHaveLength(1);
    } finally {
      relay.kill('SIGTERM');
      await app.close();
    }
  });
});

describe("Better Auth's rate limiter", () => {
  it('lets a burst of deliveries from one address through to the receiver', async () => {
    const app = await startAuthApp({
      rateLimit: { enabled: true },
      plugins: [tally(pluginOptions())],
    });
    try {
      // Registered first, so the burst below exercises only verification.
      expect((await fetch(`${app.origin}/api/auth/tally`)).status).toBe(200);
      const body = JSON.stringify(event('evt_burst'));
      const statuses: number[] = [];
      for (let i = 0; i < 150; i++) {
        statuses.push((await deliver(app.origin, body, { 'webhook-id': `evt_burst_${i}` })).status);
      }
      // Every one reached the receiver (and was refused for its missing signature).
      expect(new Set(statuses)).toEqual(new Set([400]));
      // Another path keeps Better Auth's default limit of 100 per 10 s.
      const other: number[] = [];
      for (let i = 0; i < 110; i++) other.push((await fetch(`${app.origin}/api/auth/ok`)).status);
      expect(other).toContain(429);
    } finally {
      await app.close();
    }
  });
});

describe('the memory adapter', () => {
  it('warns at start-up and in the status endpoint', async () => {
    const warnings: string[] = [];
    const auth = betterAuth({
      baseURL: 'http://127.0.0.1:3999',
      secret: 'tally-plugin-tests-secret-0123456789abcdef',
      database: memoryAdapter({
        user: [],
        session: [],
        account: [],
        verification: [],
        tallyWebhookEndpoint: [],
        tallyWebhookDelivery: [],
      }),
      logger: {
        log: (level, message) => {
          if (level === 'warn') warnings.push(message);
        },
      },
      plugins: [tally(pluginOptions())],
    });
    await auth.$context;
    expect(warnings.some((w) => w.includes('memory adapter'))).toBe(true);
    const status = await auth.api.tallyWebhookStatus();
    expect(status).toMatchObject({ registered: true, persistent: false });
    expect(status.warning).toContain('Use a persistent database adapter');
  });
});
