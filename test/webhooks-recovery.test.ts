/**
 * Delivery across restarts and crashes, against real server processes and real receivers:
 * a receiver that is down across a restart still gets every event, in order per customer;
 * and after `kill -9` under concurrent writes, every change that is durable (found after the
 * restart) has its event delivered, while no event is delivered for a change that is not.
 */
import { describe, expect, it } from 'vitest';
import {
  call,
  startServerProcess,
  tempDataDir,
  type ServerProcess,
} from './support/server-process.js';
import { startReceiver, type Receiver } from './support/webhook-receiver.js';

const CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'month' } },
  products: { free: { default: true, entitlements: { api_calls: { included: 10 } } } },
};
/** Retries quick enough for a test, many enough that nothing is given up. */
const SCHEDULE = ['0', ...Array.from({ length: 30 }, () => '150')].join(',');

async function register(server: ServerProcess, url: string) {
  const answer = await call(server.base, 'POST', '/v1/webhooks', {
    key: server.keys.test.server,
    body: { url, key: 'recovery', events: ['customer.created', 'customer.updated'] },
  });
  expect(answer.status).toBe(201);
  return answer.body as { id: string; secret: string };
}

/** What a receiver got with a 2xx, one entry per event (a redelivery counted once). */
function delivered(receiver: Receiver) {
  const seen = new Map<string, Receiver['received'][number]>();
  for (const r of receiver.received) if (r.answered === 200 && !seen.has(r.id)) seen.set(r.id, r);
  return [...seen.values()];
}

describe('webhook delivery across restarts', () => {
  it('a receiver down across a restart still gets every event, in order per customer', async () => {
    const dataDir = tempDataDir('tally-wh-restart');
    const env = { TALLY_WEBHOOK_RETRY_SCHEDULE: SCHEDULE };
    // Take a port for the receiver, then close it: deliveries are refused until it is back.
    const probe = await startReceiver();
    const { port, url } = probe;
    await probe.close();
    const first = await startServerProcess({ dataDir, env, config: CONFIG });
    const endpoint = await register(first, url);
    const customers = ['a', 'b', 'c'];
    for (let version = 1; version <= 5; version++)
      for (const id of customers) {
        const answer = await call(first.base, 'POST', '/v1/customers', {
          key: first.keys.test.server,
          body: { id, name: `${id}-v${version}` },
        });
        expect(answer.status).toBe(version === 1 ? 201 : 200);
      }
    await new Promise((resolve) => setTimeout(resolve, 400)); // attempts fail meanwhile
    await first.stop();

    const second = await startServerProcess({ dataDir, env });
    const receiver = await startReceiver(port);
    try {
      await receiver.until((r) => delivered({ received: r } as Receiver).length >= 15);
      const got = delivered(receiver);
      expect(got).toHaveLength(15);
      expect(receiver.verified(endpoint.secret)).toHaveLength(receiver.received.length);
      for (const id of customers) {
        const mine = got.filter((r) => r.event.data.customer.id === id);
        expect(mine.map((r) => [r.event.type, r.event.data.customer.name])).toEqual([
          ['customer.created', `${id}-v1`],
          ['customer.updated', `${id}-v2`],
          ['customer.updated', `${id}-v3`],
          ['customer.updated', `${id}-v4`],
          ['customer.updated', `${id}-v5`],
        ]);
      }
      // Changes after the restart are numbered after the ones taken before it.
      await call(second.base, 'POST', '/v1/customers', {
        key: second.keys.test.server,
        body: { id: 'a', name: 'a-v6' },
      });
      await call(second.base, 'POST', '/v1/sync/push', {
        key: second.keys.test.server,
        body: CONFIG,
      });
      await receiver.until((r) => r.some((x) => x.event.data.customer?.name === 'a-v6'));
      const log = await call(second.base, 'GET', `/v1/webhooks/${endpoint.id}/deliveries`, {
        key: second.keys.test.server,
      });
      expect(log.body.data.some((d: { error: string | null }) => d.error !== null)).toBe(true);
    } finally {
      await receiver.close();
      await second.stop();
    }
  });

  it('kill -9 under load: every durable change has its event; no event without one', async () => {
    const dataDir = tempDataDir('tally-wh-crash');
    const receiver = await startReceiver();
    const env = { TALLY_WEBHOOK_RETRY_SCHEDULE: SCHEDULE };
    const first = await startServerProcess({ dataDir, env, config: CONFIG });
    await register(first, receiver.url);
    const acknowledged = new Set<string>();
    let next = 0;
    let stopped = false;
    const writer = async () => {
      while (!stopped) {
        const id = `k-${next++}`;
        try {
          const answer = await call(first.base, 'POST', '/v1/customers', {
            key: first.keys.test.server,
            body: { id, name: id },
          });
          if (answer.status === 201) acknowledged.add(id);
        } catch {
          return; // the server is gone
        }
      }
    };
    const writers = Array.from({ length: 24 }, writer);
    await new Promise((resolve) => setTimeout(resolve, 1200));
    await first.kill9();
    stopped = true;
    await Promise.all(writers);
    expect(acknowledged.size).toBeGreaterThan(50);

    const second = await startServerProcess({ dataDir, env });
    try {
      // Every customer that exists after the restart: the durable changes.
      const durable = new Set<string>();
      let cursor: string | null = null;
      do {
        const query: string = cursor === null ? '' : `&cursor=${encodeURIComponent(cursor)}`;
        const page = await call(second.base, 'GET', `/v1/customers?limit=100${query}`, {
          key: second.keys.test.server,
        });
        for (const customer of page.body.data) durable.add(customer.id);
        cursor = page.body.nextCursor;
      } while (cursor !== null);
      for (const id of acknowledged) expect(durable.has(id), `acknowledged ${id}`).toBe(true);
      const createdIds = () =>
        new Set(
          delivered(receiver)
            .filter((r) => r.event.type === 'customer.created')
            .map((r) => r.event.data.customer.id as string),
        );
      await receiver.until(() => createdIds().size >= durable.size, 30_000);
      const created = createdIds();
      expect([...created].sort()).toEqual([...durable].sort());
    } finally {
      await receiver.close();
      await second.stop();
    }
  });
});
