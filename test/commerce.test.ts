/**
 * Commerce end to end over HTTP, against a real server process: catalog sync on push,
 * checkout, the hosted checkout page and its Pay button, the webhook receiver, and what
 * a payment changes (plan, billing period, credit lots), with duplicated, reordered,
 * forged and late events and a restart between payment and delivery.
 *
 * The first part runs Tally as `npm start` does without STRIPE_SECRET_KEY (the embedded
 * sandbox). The rest runs the sandbox in this process and points Tally at it as it would
 * at Stripe (STRIPE_SECRET_KEY, STRIPE_WEBHOOK_SECRET, STRIPE_API_URL), so the test can
 * move the sandbox's clock, switch its delivery order and keep it across Tally restarts.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startStripeSandbox, type StripeSandbox } from '../src/commerce/stripe-sandbox/index.js';
import {
  call,
  MAIN_JS,
  startServerProcess,
  tempDataDir,
  waitForLogLine,
  type ServerProcess,
} from './support/server-process.js';

const CONFIG = {
  entitlements: {
    reports: { type: 'feature' },
    api_calls: { type: 'meter', reset: 'month' },
  },
  products: {
    free: { name: 'Free', default: true, entitlements: { api_calls: { included: 10 } } },
    pro: {
      name: 'Pro',
      price: { amount: 2000, currency: 'usd', interval: 'month' },
      entitlements: { reports: true, api_calls: { included: 1000 } },
    },
    credits: {
      name: 'Credits',
      price: { amount: 500, currency: 'usd' },
      grants: { api_calls: 100 },
    },
  },
};

const URLS = {
  successUrl: 'https://app.example.com/done',
  cancelUrl: 'https://app.example.com/cancel',
};

async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** Polls `probe` until it returns true (events are delivered asynchronously). */
async function eventually(probe: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 15_000;
  while (Date.now() < deadline) {
    if (await probe()) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/**
 * Opens a checkout for `productKey` and pays it on the hosted page; answers the page as it was
 * before paying.
 */
async function buy(server: ServerProcess, customerId: string, productKey: string): Promise<string> {
  const checkout = await call(server.base, 'POST', '/v1/checkout', {
    key: server.keys.test.server,
    body: { customerId, productKey, ...URLS },
  });
  expect(checkout.status, JSON.stringify(checkout.body)).toBe(200);
  const url = checkout.body.url as string;
  const page = await fetch(url);
  expect(page.status).toBe(200);
  const html = await page.text();
  const paid = await fetch(`${url}/pay`, { method: 'POST', redirect: 'manual' });
  expect(paid.status).toBe(303);
  expect(paid.headers.get('location')).toBe(URLS.successUrl);
  return html;
}

function get(server: ServerProcess, path: string) {
  return call(server.base, 'GET', path, { key: server.keys.test.server });
}

async function has(server: ServerProcess, key: string, customerId: string): Promise<boolean> {
  return (await get(server, `/v1/entitlements/${key}/has?customerId=${customerId}`)).body === true;
}

describe('commerce with the embedded sandbox (no STRIPE_SECRET_KEY)', () => {
  let server: ServerProcess;
  beforeAll(async () => {
    server = await startServerProcess();
  }, 60_000);
  afterAll(async () => {
    await server?.stop();
  });

  it('starts the sandbox on its own loopback port and logs its address', async () => {
    const line = await waitForLogLine(
      server,
      (l) => typeof l.msg === 'string' && l.msg.startsWith('stripe sandbox'),
    );
    expect(line.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(line.url).not.toBe(server.base);
  });

  it('syncs the catalog on push and reports what it did', async () => {
    const first = await call(server.base, 'POST', '/v1/sync/push', {
      key: server.keys.test.server,
      body: CONFIG,
    });
    expect(first.status).toBe(200);
    expect(
      first.body.catalog.map((a: { productKey: string; product: string; price: string }) => [
        a.productKey,
        a.product,
        a.price,
      ]),
    ).toEqual([
      ['pro', 'created', 'created'],
      ['credits', 'created', 'created'],
    ]);
    expect(first.body.catalog[0].lookupKey).toBe('test:pro:2000-usd-month');
    const again = await call(server.base, 'POST', '/v1/sync/push', {
      key: server.keys.test.server,
      body: CONFIG,
    });
    expect(
      again.body.catalog.map((a: { product: string; price: string }) => [a.product, a.price]),
    ).toEqual([
      ['unchanged', 'unchanged'],
      ['unchanged', 'unchanged'],
    ]);
    // A changed price is a new price; the old one is archived, never changed.
    const repriced = structuredClone(CONFIG);
    repriced.products.pro.price.amount = 2500;
    const third = await call(server.base, 'POST', '/v1/sync/push', {
      key: server.keys.test.server,
      body: repriced,
    });
    const pro = third.body.catalog[0];
    expect([pro.product, pro.price, pro.lookupKey]).toEqual([
      'unchanged',
      'created',
      'test:pro:2500-usd-month',
    ]);
    expect(pro.archivedPrices).toEqual([first.body.catalog[0].processorPriceId]);
    const back = await call(server.base, 'POST', '/v1/sync/push', {
      key: server.keys.test.server,
      body: CONFIG,
    });
    expect(back.body.catalog[0].price).toBe('created');
    expect(back.body.catalog[0].archivedPrices).toEqual([pro.processorPriceId]);
  });

  it(
    'checkout → hosted page → Pay → the plan flips; ' + 'a second subscription is refused',
    async () => {
      expect(await has(server, 'reports', 'ada')).toBe(false);
      const page = await buy(server, 'ada', 'pro');
      expect(page).toContain('Pro');
      expect(page).toContain('$20.00');
      await eventually(() => has(server, 'reports', 'ada'), 'the plan to flip');
      const subscriptions = await get(server, '/v1/subscriptions?customerId=ada');
      expect(subscriptions.body.data).toHaveLength(1);
      expect(subscriptions.body.data[0]).toMatchObject({
        customerId: 'ada',
        productKey: 'pro',
        status: 'active',
        processor: 'stripe',
      });
      const context = await call(server.base, 'POST', '/v1/context', {
        key: server.keys.test.server,
        body: { customer: { id: 'ada' }, features: ['reports'], includeSubscription: true },
      });
      expect(context.body).toMatchObject({
        features: { reports: true },
        subscription: subscriptions.body.data[0],
      });
      const balance = await get(server, '/v1/usage/api_calls/balance?customerId=ada');
      expect(balance.body).toMatchObject({
        included: 1000,
        resets: subscriptions.body.data[0].currentPeriodEnd,
      });
      const again = await call(server.base, 'POST', '/v1/checkout', {
        key: server.keys.test.server,
        body: { customerId: 'ada', productKey: 'pro', ...URLS },
      });
      expect(again.status).toBe(409);
      expect(again.body.code).toBe('subscription_exists');
      expect(again.body.error).toContain('POST /v1/subscriptions/change');
      const audit = await get(server, '/v1/audit?action=checkout.create');
      expect(audit.body.data[0]).toMatchObject({
        action: 'checkout.create',
        resourceId: 'ada',
        data: { productKey: 'pro', mode: 'subscription' },
      });
      // The customer was created implicitly.
      expect((await get(server, '/v1/customers/ada')).status).toBe(200);
    },
  );

  it('validates checkout requests', async () => {
    const post = (body: unknown) =>
      call(server.base, 'POST', '/v1/checkout', { key: server.keys.test.server, body });
    expect(
      (
        await post({
          customerId: 'x',
          productKey: 'pro',
          successUrl: '/relative',
          cancelUrl: URLS.cancelUrl,
        })
      ).body.code,
    ).toBe('invalid_request');
    expect(
      (
        await post({
          customerId: 'x',
          productKey: 'pro',
          successUrl: URLS.successUrl,
          cancelUrl: 'ftp://example.com/',
        })
      ).body.code,
    ).toBe('invalid_request');
    expect((await post({ customerId: 'x', productKey: 'nope', ...URLS })).status).toBe(404);
    expect((await post({ customerId: 'x', productKey: 'free', ...URLS })).body.code).toBe(
      'product_not_purchasable',
    );
    const client = await call(server.base, 'POST', '/v1/checkout', {
      key: server.keys.test.client,
      body: { customerId: 'x', productKey: 'pro', ...URLS },
    });
    expect(client.status).toBe(403);
  });

  it('after a restart the new embedded sandbox gets the catalog again, and a forgotten ' +
    'processor customer is replaced', async () => {
    await buy(server, 'zed', 'credits');
    await eventually(
      async () => (await get(server, '/v1/purchases?customerId=zed')).body.data.length === 1,
      'the purchase',
    );
    await server.stop();
    server = await startServerProcess({ dataDir: server.dataDir, keys: server.keys });
    await buy(server, 'zed', 'credits');
    await eventually(
      async () => (await get(server, '/v1/purchases?customerId=zed')).body.data.length === 2,
      'the second purchase',
    );
    expect((await get(server, '/v1/usage/api_calls/balance?customerId=zed')).body.balance).toBe(
      210,
    );
  }, 60_000);

  it('refuses STRIPE_SECRET_KEY without STRIPE_WEBHOOK_SECRET before creating anything', () => {
    const dataDir = path.join(tempDataDir('commerce-settings'), 'data');
    const started = spawnSync(process.execPath, [MAIN_JS], {
      env: { ...process.env, PORT: '0', TALLY_DATA_DIR: dataDir, STRIPE_SECRET_KEY: 'sk_test_x' },
      encoding: 'utf8',
      timeout: 20_000,
    });
    expect(started.status).toBe(1);
    expect(started.stderr).toContain('STRIPE_WEBHOOK_SECRET');
    expect(fs.existsSync(dataDir)).toBe(false);
  });

  it('shows each product with its price and interval in GET /v1/plans', async () => {
    const plans = await get(server, '/v1/plans');
    const pro = plans.body.data.find((p: { key: string }) => p.key === 'pro');
    expect(pro).toMatchObject({
      type: 'recurring',
      price: { amount: 2000, currency: 'usd', interval: 'month' },
    });
  });
});

describe('commerce against a Stripe-compatible server (the sandbox, driven by the test)', () => {
  let now = Date.now();
  let sandbox: StripeSandbox;
  let server: ServerProcess;
  let port: number;
  let env: Record<string, string>;
  const dataDir = tempDataDir('commerce');

  beforeAll(async () => {
    sandbox = await startStripeSandbox({
      now: () => now,
      webhooks: { maxAttempts: 30, retryDelayMs: 100, timeoutMs: 5000 },
    });
    port = await freePort();
    const endpoint = await sandbox.stripe().webhookEndpoints.create({
      url: `http://127.0.0.1:${port}/v1/processor/stripe/webhook`,
      enabled_events: ['*'],
    });
    env = {
      PORT: String(port),
      STRIPE_SECRET_KEY: sandbox.secretKey,
      STRIPE_WEBHOOK_SECRET: endpoint.secret ?? '',
      STRIPE_API_URL: sandbox.url,
    };
    server = await startServerProcess({ dataDir, env, config: CONFIG });
  }, 60_000);
  afterAll(async () => {
    await server?.stop();
    await sandbox?.close();
  });

  it('does not start the sandbox when STRIPE_SECRET_KEY is set', async () => {
    const line = await waitForLogLine(server, (l) => l.msg === 'stripe');
    expect(line.apiUrl).toBe(sandbox.url);
    expect(server.output()).not.toContain('stripe sandbox');
  });

  it(
    'renewal starts the next period and resets the meters; cancellation returns to the ' +
      'default product',
    async () => {
      await buy(server, 'bob', 'pro');
      await sandbox.deliveries.idle();
      expect(await has(server, 'reports', 'bob')).toBe(true);
      const consumed = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
        key: server.keys.test.server,
        body: { customerId: 'bob', amount: 7 },
      });
      expect(consumed.body).toMatchObject({ consumed: 7, balance: 993 });
      const before = (await get(server, '/v1/subscriptions?customerId=bob')).body.data[0];
      now += 31 * 86_400_000;
      await sandbox
        .stripe()
        .subscriptions.list({ customer: 'none' })
        .catch(() => undefined); // any request renews what is due
      await sandbox.deliveries.idle();
      const after = (await get(server, '/v1/subscriptions?customerId=bob')).body.data[0];
      expect(after.currentPeriodStart).toBe(before.currentPeriodEnd);
      const balance = await get(server, '/v1/usage/api_calls/balance?customerId=bob');
      expect(balance.body).toMatchObject({
        consumed: 0,
        balance: 1000,
        resets: after.currentPeriodEnd,
      });
      const audits = await get(server, '/v1/audit?action=subscription.sync');
      expect(audits.body.data[0]).toMatchObject({ actor: 'processor:stripe', resourceId: 'bob' });

      await sandbox.stripe().subscriptions.cancel(after.processorSubscriptionId);
      await sandbox.deliveries.idle();
      expect(await has(server, 'reports', 'bob')).toBe(false);
      const ended = (await get(server, '/v1/subscriptions?customerId=bob')).body.data[0];
      expect(ended.status).toBe('canceled');
      expect((await get(server, '/v1/usage/api_calls/balance?customerId=bob')).body.included).toBe(
        10,
      );
    },
  );

  it(
    'a credit pack grants a lot with the purchase id, ' + 'amount and currency; consume draws it',
    async () => {
      await buy(server, 'cy', 'credits');
      await sandbox.deliveries.idle();
      const purchases = await get(server, '/v1/purchases?customerId=cy');
      expect(purchases.body.data).toHaveLength(1);
      expect(purchases.body.data[0]).toMatchObject({
        customerId: 'cy',
        productKey: 'credits',
        status: 'paid',
        amount: 500,
        currency: 'usd',
        refundedAmount: 0,
        grant: { api_calls: 100 },
      });
      expect(purchases.body.data[0].id).toMatch(/^stripe:pi_/);
      expect((await get(server, '/v1/usage/api_calls/balance?customerId=cy')).body.balance).toBe(
        110,
      );
      const consumed = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
        key: server.keys.test.server,
        body: { customerId: 'cy', amount: 60 },
      });
      expect(consumed.status).toBe(200);
      expect(consumed.body).toMatchObject({ consumed: 60, balance: 50 });
      // A second pack is a second lot.
      await buy(server, 'cy', 'credits');
      await sandbox.deliveries.idle();
      expect(
        (await get(server, '/v1/purchases?customerId=cy&limit=1')).body.nextCursor,
      ).not.toBeNull();
      expect((await get(server, '/v1/usage/api_calls/balance?customerId=cy')).body.balance).toBe(
        150,
      );
    },
  );

  it('duplicated and reordered events leave the same state as in-order delivery', async () => {
    const stateOf = async (customerId: string) => {
      const subs = (await get(server, `/v1/subscriptions?customerId=${customerId}`)).body.data.map(
        (s: Record<string, unknown>) => [s.productKey, s.status],
      );
      const purchases = (await get(server, `/v1/purchases?customerId=${customerId}`)).body.data.map(
        (p: Record<string, unknown>) => [p.productKey, p.amount],
      );
      const balance = (await get(server, `/v1/usage/api_calls/balance?customerId=${customerId}`))
        .body;
      return {
        subs,
        purchases,
        reports: await has(server, 'reports', customerId),
        balance: [balance.balance, balance.included],
      };
    };
    const states = [];
    for (const [mode, customerId] of [
      ['normal', 'd-normal'],
      ['duplicate', 'd-dup'],
      ['reverse', 'd-rev'],
    ] as const) {
      sandbox.deliveries.mode = mode;
      await buy(server, customerId, 'pro');
      await buy(server, customerId, 'credits');
      await sandbox.deliveries.idle();
      states.push(await stateOf(customerId));
    }
    sandbox.deliveries.mode = 'normal';
    expect(states[1]).toEqual(states[0]);
    expect(states[2]).toEqual(states[0]);
    expect(states[0]).toEqual({
      subs: [['pro', 'active']],
      purchases: [['credits', 500]],
      reports: true,
      balance: [1100, 1000],
    });
    // Redelivering an event already applied changes nothing and is acknowledged.
    const events = await sandbox
      .stripe()
      .events.list({ type: 'checkout.session.completed', limit: 1 });
    const event = events.data[0];
    if (event === undefined) throw new Error('no checkout event');
    sandbox.deliveries.redeliver(event.id);
    await sandbox.deliveries.idle();
    expect(await stateOf('d-rev')).toEqual(states[0]);
  });

  it('a forged or stale signature is refused with 400 and changes nothing', async () => {
    const events = await sandbox
      .stripe()
      .events.list({ type: 'checkout.session.completed', limit: 1 });
    const payload = JSON.stringify(events.data[0]);
    const post = (signature: string) =>
      call(server.base, 'POST', '/v1/processor/stripe/webhook', {
        rawBody: payload,
        headers: { 'content-type': 'application/json', 'stripe-signature': signature },
      });
    const forged = sandbox
      .stripe()
      .webhooks.generateTestHeaderString({ payload, secret: 'whsec_forged' });
    const auditBefore = (await get(server, '/v1/audit?limit=1')).body.data[0].seq;
    const refused = await post(forged);
    expect(refused.status).toBe(400);
    expect(refused.body.code).toBe('invalid_signature');
    const stale = sandbox.stripe().webhooks.generateTestHeaderString({
      payload,
      secret: env.STRIPE_WEBHOOK_SECRET ?? '',
      timestamp: Math.floor(Date.now() / 1000) - 3600,
    });
    expect((await post(stale)).status).toBe(400);
    expect((await post('')).status).toBe(400);
    expect((await get(server, '/v1/audit?limit=1')).body.data[0].seq).toBe(auditBefore);
    // Signed, but about an object the processor does not have: acknowledged, nothing to reconcile.
    const unknown = JSON.stringify({
      ...events.data[0],
      id: 'evt_unknown',
      type: 'customer.subscription.updated',
      data: { object: { id: 'sub_unknown', object: 'subscription' } },
    });
    const signed = sandbox.stripe().webhooks.generateTestHeaderString({
      payload: unknown,
      secret: env.STRIPE_WEBHOOK_SECRET ?? '',
    });
    const ignored = await call(server.base, 'POST', '/v1/processor/stripe/webhook', {
      rawBody: unknown,
      headers: { 'content-type': 'application/json', 'stripe-signature': signed },
    });
    expect([ignored.status, ignored.body]).toEqual([200, { received: true }]);
    expect((await get(server, '/v1/audit?limit=1')).body.data[0].seq).toBe(auditBefore);
  });

  it('loses nothing when Tally restarts between the payment and the event delivery', async () => {
    const checkout = await call(server.base, 'POST', '/v1/checkout', {
      key: server.keys.test.server,
      body: { customerId: 'eve', productKey: 'pro', ...URLS },
    });
    await server.kill9();
    // Paid while Tally is down: the deliveries fail and are retried.
    const paid = await fetch(`${checkout.body.url as string}/pay`, {
      method: 'POST',
      redirect: 'manual',
    });
    expect(paid.status).toBe(303);
    await new Promise((resolve) => setTimeout(resolve, 300));
    server = await startServerProcess({ dataDir, env, keys: server.keys });
    await sandbox.deliveries.idle();
    expect(await has(server, 'reports', 'eve')).toBe(true);
    // And what was applied before the restart is still there.
    expect(await has(server, 'reports', 'd-normal')).toBe(true);
    expect((await get(server, '/v1/purchases?customerId=cy')).body.data).toHaveLength(2);
  });

  it('cancellation at period end keeps the plan until the period is over', async () => {
    await buy(server, 'fay', 'pro');
    await sandbox.deliveries.idle();
    const [subscription] = (await get(server, '/v1/subscriptions?customerId=fay')).body.data;
    await sandbox
      .stripe()
      .subscriptions.update(subscription.processorSubscriptionId, { cancel_at_period_end: true });
    await sandbox.deliveries.idle();
    expect((await get(server, '/v1/subscriptions?customerId=fay')).body.data[0]).toMatchObject({
      status: 'active',
      cancelAtPeriodEnd: true,
    });
    expect(await has(server, 'reports', 'fay')).toBe(true);
    now += 31 * 86_400_000;
    await sandbox
      .stripe()
      .subscriptions.list({ customer: 'none' })
      .catch(() => undefined);
    await sandbox.deliveries.idle();
    expect((await get(server, '/v1/subscriptions?customerId=fay')).body.data[0].status).toBe(
      'canceled',
    );
    expect(await has(server, 'reports', 'fay')).toBe(false);
  });

  it('a processor failure fails the push with 502 and changes nothing', async () => {
    const deadPort = await freePort();
    const broken = await startServerProcess({
      env: {
        STRIPE_SECRET_KEY: 'sk_test_x',
        STRIPE_WEBHOOK_SECRET: 'whsec_x',
        STRIPE_API_URL: `http://127.0.0.1:${deadPort}`,
      },
    });
    try {
      const pushed = await call(broken.base, 'POST', '/v1/sync/push', {
        key: broken.keys.test.server,
        body: CONFIG,
      });
      expect(pushed.status).toBe(502);
      expect(pushed.body.code).toBe('processor_error');
      expect(
        (await call(broken.base, 'GET', '/v1/sync/pull', { key: broken.keys.test.server })).status,
      ).toBe(404);
      // An event that cannot be reconciled (the processor is unreachable) is answered 500:
      // delivered again later.
      const payload = JSON.stringify({
        id: 'evt_1',
        object: 'event',
        type: 'checkout.session.completed',
        data: { object: { id: 'cs_1', object: 'checkout.session' } },
      });
      const signature = sandbox
        .stripe()
        .webhooks.generateTestHeaderString({ payload, secret: 'whsec_x' });
      const failed = await call(broken.base, 'POST', '/v1/processor/stripe/webhook', {
        rawBody: payload,
        headers: { 'content-type': 'application/json', 'stripe-signature': signature },
      });
      expect([failed.status, failed.body.code]).toEqual([500, 'processor_event_failed']);
    } finally {
      await broken.stop();
    }
  }, 60_000);
});
