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

/** The endpoint as `GET /v1/webhooks/{id}` answers it once `status` is reached (10 s at most). */
async function endpointWithStatus(id: string, status: string) {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const answer = await call(server.base, 'GET', `/v1/webhooks/${id}`, {
      key: server.keys.test.server,
    });
    if (answer.body.status === status) return answer.body;
    if (Date.now() > deadline) throw new Error(`endpoint ${id} stayed ${answer.body.status}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

const upsert = (id: string, name: string) =>
  call(server.base, 'POST', '/v1/customers', {
    key: server.keys.test.server,
    body: { id, name },
  });

const ofCustomer = (receiver: Receiver, id: string) =>
  receiver.received.filter(
    (r) => (r.event.data.customer?.id ?? r.event.data.customerId) === id && r.answered === 200,
  );

describe('endpoint status', () => {
  it('410 Gone disables the endpoint at once; nothing more is sent to it', async () => {
    const receiver = await startReceiver();
    try {
      receiver.answer = () => 410;
      const endpoint = (await register(receiver, 'gone')).body;
      await upsert('gone-1', 'First');
      const disabled = await endpointWithStatus(endpoint.id, 'disabled');
      expect(disabled.statusReason).toContain('410');
      expect(receiver.received).toHaveLength(1);
      await upsert('gone-2', 'Second');
      await new Promise((resolve) => setTimeout(resolve, 600));
      expect(receiver.received).toHaveLength(1);
      const audit = await call(server.base, 'GET', '/v1/audit?action=webhook.disable', {
        key: server.keys.test.server,
      });
      expect(audit.body.data[0]).toMatchObject({
        resourceId: endpoint.id,
        actor: 'system:webhooks',
      });
    } finally {
      await receiver.close();
    }
  });

  it('after the last attempt it is failing, holding events; enabling replays them', async () => {
    const receiver = await startReceiver();
    try {
      receiver.answer = () => 500;
      const endpoint = (await register(receiver, 'failing')).body;
      await upsert('fail-1', 'One');
      const failing = await endpointWithStatus(endpoint.id, 'failing');
      expect(failing.statusReason).toContain('500');
      // The schedule under test has three attempts.
      expect(receiver.received.map((r) => r.answered)).toEqual([500, 500, 500]);
      await upsert('fail-1', 'One again');
      await upsert('fail-2', 'Two');
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect(receiver.received).toHaveLength(3);
      const held = await attemptLog(endpoint.id, 3);
      expect(held.body.pending).toBe(3);
      receiver.answer = () => 200;
      const enabled = await call(server.base, 'POST', `/v1/admin/webhooks/${endpoint.id}/enable`, {
        key: server.keys.admin,
      });
      expect(enabled.status).toBe(200);
      expect(enabled.body.status).toBe('active');
      expect(enabled.body.secret).toBeUndefined();
      await receiver.until((r) => r.filter((x) => x.answered === 200).length === 3);
      expect(ofCustomer(receiver, 'fail-1').map((r) => r.event.type)).toEqual([
        'customer.created',
        'customer.updated',
      ]);
      expect(ofCustomer(receiver, 'fail-2').map((r) => r.event.type)).toEqual(['customer.created']);
      // The replayed delivery is the one that failed: same webhook-id.
      expect(ofCustomer(receiver, 'fail-1')[0]?.id).toBe(receiver.received[0]?.id);
      const again = await call(server.base, 'POST', `/v1/admin/webhooks/${endpoint.id}/enable`, {
        key: server.keys.admin,
      });
      expect(again.status).toBe(409);
      expect(again.body.code).toBe('webhook_status_conflict');
      const audit = await call(server.base, 'GET', '/v1/audit?resourceType=webhook', {
        key: server.keys.test.server,
      });
      const mine = audit.body.data.filter((e: any) => e.resourceId === endpoint.id);
      expect(mine.map((e: any) => e.action)).toEqual([
        'webhook.enable',
        'webhook.failing',
        'webhook.register',
      ]);
      await call(server.base, 'DELETE', `/v1/webhooks/${endpoint.id}`, {
        key: server.keys.test.server,
      });
    } finally {
      await receiver.close();
    }
  });
});

describe('rotation', () => {
  it('signs with the new and the previous secret for 24 hours', async () => {
    const receiver = await startReceiver();
    try {
      const endpoint = (await register(receiver, 'rotate', ['customer.created'])).body;
      const rotated = await call(server.base, 'POST', `/v1/webhooks/${endpoint.id}/rotate`, {
        key: server.keys.test.server,
      });
      expect(rotated.status).toBe(200);
      expect(rotated.body.secret).toMatch(/^whsec_/);
      expect(rotated.body.secret).not.toBe(endpoint.secret);
      const expires = Date.parse(rotated.body.previousSecretExpiresAt);
      expect(Math.abs(expires - Date.now() - 24 * 3_600_000)).toBeLessThan(60_000);
      await upsert('rotate-1', 'R');
      await receiver.until((r) => r.length === 1);
      const [delivery] = receiver.received;
      expect(delivery?.signature.split(' ')).toHaveLength(2);
      const signed = {
        id: delivery?.id ?? '',
        timestamp: delivery?.timestamp ?? '',
        signature: delivery?.signature ?? '',
      };
      expect(specVerifies(rotated.body.secret, signed, delivery?.body ?? '')).toBe(true);
      expect(specVerifies(endpoint.secret, signed, delivery?.body ?? '')).toBe(true);
      const [newOnly, oldOnly] = signed.signature.split(' ');
      expect(
        specVerifies(
          rotated.body.secret,
          { ...signed, signature: newOnly ?? '' },
          delivery?.body ?? '',
        ),
      ).toBe(true);
      expect(
        specVerifies(
          endpoint.secret,
          { ...signed, signature: oldOnly ?? '' },
          delivery?.body ?? '',
        ),
      ).toBe(true);
      await call(server.base, 'DELETE', `/v1/webhooks/${endpoint.id}`, {
        key: server.keys.test.server,
      });
    } finally {
      await receiver.close();
    }
  });
});

describe('events', () => {
  it('usage.exhausted fires once, when the balance reaches zero, not when refused', async () => {
    const receiver = await startReceiver();
    try {
      const endpoint = (await register(receiver, 'usage', 'usage.exhausted,customer.created')).body;
      const consume = (amount: number) =>
        call(server.base, 'POST', '/v1/usage/api_calls/consume', {
          key: server.keys.test.server,
          body: { customerId: 'usage-1', amount },
        });
      expect((await consume(4)).status).toBe(200);
      expect((await consume(6)).status).toBe(200);
      expect((await consume(1)).status).toBe(429);
      expect((await consume(1)).status).toBe(429);
      await receiver.until((r) => r.some((x) => x.event.type === 'usage.exhausted'));
      await new Promise((resolve) => setTimeout(resolve, 400));
      const mine = ofCustomer(receiver, 'usage-1');
      expect(mine.map((r) => r.event.type)).toEqual(['customer.created', 'usage.exhausted']);
      expect(mine[1]?.event.data).toMatchObject({
        customerId: 'usage-1',
        key: 'api_calls',
        balance: { balance: 0, included: 10, consumed: 10 },
      });
      await call(server.base, 'DELETE', `/v1/webhooks/${endpoint.id}`, {
        key: server.keys.test.server,
      });
    } finally {
      await receiver.close();
    }
  });

  it('config.pushed carries the version; a refused push sends nothing', async () => {
    const receiver = await startReceiver();
    try {
      const endpoint = (await register(receiver, 'config', ['config.pushed'])).body;
      const refused = await call(server.base, 'POST', '/v1/sync/push', {
        key: server.keys.test.server,
        body: { entitlements: {}, products: { a: { default: true }, b: { default: true } } },
      });
      expect(refused.status).toBe(400);
      const pushed = await call(server.base, 'POST', '/v1/sync/push', {
        key: server.keys.test.server,
        body: CONFIG,
      });
      expect(pushed.status).toBe(200);
      await receiver.until((r) => r.length === 1);
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(receiver.received.map((r) => r.event.type)).toEqual(['config.pushed']);
      expect(receiver.received[0]?.event.data).toEqual({
        version: pushed.body.version,
        pushedAt: pushed.body.pushedAt,
      });
      await call(server.base, 'DELETE', `/v1/webhooks/${endpoint.id}`, {
        key: server.keys.test.server,
      });
    } finally {
      await receiver.close();
    }
  });
});

describe('isolation', () => {
  it('a slow receiver does not slow another: it holds only its own attempts', async () => {
    const slow = await startReceiver();
    const fast = await startReceiver();
    try {
      let open = 0;
      let mostOpen = 0;
      slow.answer = () => {
        mostOpen = Math.max(mostOpen, ++open);
        return new Promise((resolve) =>
          setTimeout(() => {
            open--;
            resolve(200);
          }, 3000),
        );
      };
      const slowEndpoint = (await register(slow, 'slow', ['customer.created'])).body;
      const fastEndpoint = (await register(fast, 'fast', ['customer.created'])).body;
      const started = Date.now();
      await Promise.all(Array.from({ length: 8 }, (_, i) => upsert(`iso-${i}`, `Iso ${i}`)));
      await fast.until((r) => r.length === 8);
      expect(Date.now() - started).toBeLessThan(2500);
      // Meanwhile the slow one holds its attempts, at most 4 at once, none answered yet.
      expect(slow.received).toHaveLength(0);
      await slow.until((r) => r.length === 8, 15_000);
      expect(mostOpen).toBe(4);
      for (const endpoint of [slowEndpoint, fastEndpoint])
        await call(server.base, 'DELETE', `/v1/webhooks/${endpoint.id}`, {
          key: server.keys.test.server,
        });
    } finally {
      await slow.close();
      await fast.close();
    }
  });
});
