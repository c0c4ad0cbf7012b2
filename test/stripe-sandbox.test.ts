/**
 * The Stripe sandbox as a Stripe peer: everything here goes through the real `stripe`
 * SDK (or plain HTTP where a browser or a webhook receiver would be), so the wire
 * format, the typed errors, idempotent replay, the hosted checkout page, webhook signing
 * and delivery, and test clock billing are checked the way Tally will use them.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import Stripe from 'stripe';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startStripeSandbox, type StripeSandbox } from '../src/commerce/stripe-sandbox/index.js';

interface Received {
  readonly body: string;
  readonly signature: string;
}

/** A webhook receiver on loopback; `answer` decides each status (default 200). */
async function startReceiver(
  answer: (count: number) => number = () => 200,
): Promise<{ url: string; received: Received[]; close(): Promise<void> }> {
  const received: Received[] = [];
  let count = 0;
  const server = http.createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      count += 1;
      const status = answer(count);
      if (status === 200)
        received.push({
          body: Buffer.concat(chunks).toString('utf8'),
          signature: String(request.headers['stripe-signature']),
        });
      response.writeHead(status).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/webhooks`,
    received,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

let sandbox: StripeSandbox;
let stripe: Stripe;

beforeAll(async () => {
  sandbox = await startStripeSandbox({ webhooks: { retryDelayMs: 20, maxAttempts: 3 } });
  stripe = sandbox.stripe();
});

afterAll(async () => {
  await sandbox.close();
});

async function catalog(
  name: string,
  unitAmount = 2000,
): Promise<{ product: Stripe.Product; monthly: Stripe.Price; oneTime: Stripe.Price }> {
  const product = await stripe.products.create({ name });
  const monthly = await stripe.prices.create({
    product: product.id,
    currency: 'usd',
    unit_amount: unitAmount,
    recurring: { interval: 'month' },
  });
  const oneTime = await stripe.prices.create({
    product: product.id,
    currency: 'usd',
    unit_amount: 500,
  });
  return { product, monthly, oneTime };
}

/** Pays a session on its hosted page as a browser would; returns the redirect target. */
async function pay(session: Stripe.Checkout.Session, email = 'buyer@example.com'): Promise<string> {
  const response = await fetch(`${session.url}/pay`, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ email }).toString(),
  });
  expect(response.status).toBe(303);
  return response.headers.get('location') ?? '';
}

describe('resources over the SDK', () => {
  it('creates, retrieves, updates and pages customers with starting_after', async () => {
    const created: Stripe.Customer[] = [];
    for (const n of [1, 2, 3, 4, 5])
      created.push(
        await stripe.customers.create({
          email: `paging-${n}@example.com`,
          metadata: { n: String(n) },
        }),
      );
    const first = created[0] as Stripe.Customer;
    expect(first.id).toMatch(/^cus_/);
    expect((await stripe.customers.retrieve(first.id)) as Stripe.Customer).toMatchObject({
      email: 'paging-1@example.com',
      metadata: { n: '1' },
    });
    const updated = await stripe.customers.update(first.id, {
      name: 'Ada',
      metadata: { n: '', plan: 'pro' },
    });
    expect(updated).toMatchObject({ name: 'Ada', metadata: { plan: 'pro' } });

    const page1 = await stripe.customers.list({ limit: 2 });
    expect(page1).toMatchObject({ object: 'list', has_more: true, url: '/v1/customers' });
    const page2 = await stripe.customers.list({
      limit: 2,
      starting_after: page1.data[1]?.id as string,
    });
    const page3 = await stripe.customers.list({
      limit: 2,
      starting_after: page2.data[1]?.id as string,
    });
    const seen = [...page1.data, ...page2.data, ...page3.data].map((c) => c.id);
    expect(seen.slice(0, 5)).toEqual(created.map((c) => c.id).reverse());

    const all: string[] = [];
    for await (const customer of stripe.customers.list({ limit: 2 })) all.push(customer.id);
    expect(new Set(all).size).toBe(all.length);
    expect(all).toEqual(expect.arrayContaining(created.map((c) => c.id)));
  });

  it(
    'finds prices by lookup key and keeps ' + 'prices immutable except active and metadata',
    async () => {
      const { product, monthly } = await catalog('Lookup plan');
      const keyed = await stripe.prices.create({
        product: product.id,
        currency: 'usd',
        unit_amount: 9900,
        recurring: { interval: 'year' },
        lookup_key: 'lookup_plan_yearly',
      });
      const found = await stripe.prices.list({ lookup_keys: ['lookup_plan_yearly'] });
      expect(found.data.map((p) => p.id)).toEqual([keyed.id]);
      expect(found.data[0]).toMatchObject({
        type: 'recurring',
        recurring: { interval: 'year', interval_count: 1 },
        unit_amount: 9900,
        currency: 'usd',
      });

      await expect(
        stripe.prices.create({
          product: product.id,
          currency: 'usd',
          unit_amount: 1,
          lookup_key: 'lookup_plan_yearly',
        }),
      ).rejects.toBeInstanceOf(Stripe.errors.StripeInvalidRequestError);
      const moved = await stripe.prices.create({
        product: product.id,
        currency: 'usd',
        unit_amount: 8900,
        recurring: { interval: 'year' },
        lookup_key: 'lookup_plan_yearly',
        transfer_lookup_key: true,
      });
      expect(
        (await stripe.prices.list({ lookup_keys: ['lookup_plan_yearly'] })).data.map((p) => p.id),
      ).toEqual([moved.id]);

      const retired = await stripe.prices.update(monthly.id, {
        active: false,
        metadata: { retired: 'yes' },
      });
      expect(retired).toMatchObject({ active: false, metadata: { retired: 'yes' } });
      const active = await stripe.prices.list({ product: product.id, active: true, limit: 100 });
      expect(active.data.map((p) => p.id)).not.toContain(monthly.id);
      const change = stripe.prices.update(monthly.id, {
        unit_amount: 1,
      } as Stripe.PriceUpdateParams);
      await expect(change).rejects.toMatchObject({
        type: 'StripeInvalidRequestError',
        code: 'parameter_unknown',
        param: 'unit_amount',
      });

      const archived = await stripe.products.update(product.id, { active: false });
      expect(archived.active).toBe(false);
      expect(
        (await stripe.products.list({ active: false, limit: 100 })).data.map((p) => p.id),
      ).toContain(product.id);
    },
  );

  it('expands related objects on retrieve and on lists', async () => {
    const customer = await stripe.customers.create({ email: 'expand@example.com' });
    const { monthly } = await catalog('Expand plan');
    const subscription = await stripe.subscriptions.create({
      customer: customer.id,
      items: [{ price: monthly.id }],
    });
    const expanded = await stripe.subscriptions.retrieve(subscription.id, {
      expand: ['customer', 'latest_invoice'],
    });
    expect((expanded.customer as Stripe.Customer).email).toBe('expand@example.com');
    expect((expanded.latest_invoice as Stripe.Invoice).status).toBe('paid');
    const listed = await stripe.subscriptions.list({
      customer: customer.id,
      expand: ['data.customer'],
    });
    expect((listed.data[0]?.customer as Stripe.Customer | undefined)?.id).toBe(customer.id);
    await expect(
      stripe.subscriptions.retrieve(subscription.id, { expand: ['status'] }),
    ).rejects.toBeInstanceOf(Stripe.errors.StripeInvalidRequestError);
  });
});

describe('wire protocol', () => {
  it('replays an idempotent request and refuses the key with other parameters', async () => {
    const first = await stripe.customers.create(
      { email: 'idem@example.com' },
      { idempotencyKey: 'idem-key-1' },
    );
    const again = await stripe.customers.create(
      { email: 'idem@example.com' },
      { idempotencyKey: 'idem-key-1' },
    );
    expect(again.id).toBe(first.id);
    expect(again.lastResponse.headers['idempotent-replayed']).toBe('true');
    const other = stripe.customers.create(
      { email: 'other@example.com' },
      { idempotencyKey: 'idem-key-1' },
    );
    await expect(other).rejects.toBeInstanceOf(Stripe.errors.StripeIdempotencyError);
    await expect(other).rejects.toMatchObject({ statusCode: 400, rawType: 'idempotency_error' });
  });

  it('answers byte-identical bodies on replay over plain HTTP', async () => {
    const post = () =>
      fetch(`${sandbox.url}/v1/products`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${sandbox.secretKey}`,
          'idempotency-key': 'raw-key',
          'content-type': 'application/x-www-form-urlencoded',
        },
        body: 'name=Raw&metadata[a]=1',
      });
    const [one, two] = [await post(), await post()];
    expect([one.status, two.status]).toEqual([200, 200]);
    expect(await two.text()).toBe(await one.text());
    expect(one.headers.get('idempotent-replayed')).toBeNull();
    expect(two.headers.get('idempotent-replayed')).toBe('true');
  });

  it('throws the SDK typed errors', async () => {
    const missing = stripe.customers.retrieve('cus_doesnotexist');
    await expect(missing).rejects.toBeInstanceOf(Stripe.errors.StripeInvalidRequestError);
    await expect(missing).rejects.toMatchObject({
      code: 'resource_missing',
      statusCode: 404,
      param: 'id',
    });

    const wrongKey = new Stripe('sk_test_wrong', {
      host: '127.0.0.1',
      port: sandbox.port,
      protocol: 'http',
      maxNetworkRetries: 0,
    });
    await expect(wrongKey.customers.list()).rejects.toBeInstanceOf(
      Stripe.errors.StripeAuthenticationError,
    );
    const noKey = await fetch(`${sandbox.url}/v1/customers`);
    expect(noKey.status).toBe(401);
    expect(await noKey.json()).toMatchObject({ error: { type: 'invalid_request_error' } });

    const unknown = stripe.customers.create({ colour: 'red' } as Stripe.CustomerCreateParams);
    await expect(unknown).rejects.toMatchObject({
      type: 'StripeInvalidRequestError',
      code: 'parameter_unknown',
      param: 'colour',
    });
    await expect(stripe.customers.list({}, { stripeAccount: 'acct_other' })).rejects.toMatchObject({
      param: 'Stripe-Account',
    });
    const route = await fetch(`${sandbox.url}/v1/coupons`, {
      headers: { authorization: `Bearer ${sandbox.secretKey}` },
    });
    expect(route.status).toBe(404);
  });
});

describe('hosted checkout and webhooks', () => {
  let receiver: Awaited<ReturnType<typeof startReceiver>>;
  let endpoint: Stripe.WebhookEndpoint;

  beforeAll(async () => {
    receiver = await startReceiver();
    endpoint = await stripe.webhookEndpoints.create({
      url: receiver.url,
      enabled_events: [
        'customer.created',
        'customer.subscription.created',
        'invoice.paid',
        'checkout.session.completed',
        'charge.succeeded',
        'payment_intent.succeeded',
      ],
    });
  });

  afterAll(async () => {
    await stripe.webhookEndpoints.del(endpoint.id);
    await receiver.close();
  });

  /** The events received since `from`, verified with the endpoint's secret. */
  function verified(from: number): Stripe.Event[] {
    return receiver.received
      .slice(from)
      .map(({ body, signature }) =>
        stripe.webhooks.constructEvent(body, signature, endpoint.secret as string),
      );
  }

  it(
    'sells a subscription: page, payment, redirect, subscription, paid invoice, signed ' +
      'events in order',
    async () => {
      expect(endpoint.secret).toMatch(/^whsec_/);
      const { product, monthly } = await catalog('Tally Pro', 2000);
      const before = receiver.received.length;
      const session = await stripe.checkout.sessions.create({
        mode: 'subscription',
        line_items: [{ price: monthly.id, quantity: 1 }],
        success_url: 'http://127.0.0.1:1/done?session={CHECKOUT_SESSION_ID}',
        cancel_url: 'http://127.0.0.1:1/cancel',
        client_reference_id: 'acct_42',
        metadata: { tally_account: '42' },
      });
      expect(session).toMatchObject({
        status: 'open',
        payment_status: 'unpaid',
        amount_total: 2000,
        currency: 'usd',
        url: `${sandbox.url}/checkout/${session.id}`,
      });
      expect(session.expires_at - session.created).toBe(24 * 60 * 60);

      const page = await fetch(session.url as string);
      const html = await page.text();
      expect(page.status).toBe(200);
      expect(html).toContain(product.name);
      expect(html).toContain('$20.00 / month');
      expect(html).toContain(`action="/checkout/${session.id}/pay"`);

      expect(await pay(session)).toBe(`http://127.0.0.1:1/done?session=${session.id}`);
      const done = await stripe.checkout.sessions.retrieve(session.id, {
        expand: ['subscription', 'customer'],
      });
      expect(done).toMatchObject({
        status: 'complete',
        payment_status: 'paid',
        client_reference_id: 'acct_42',
        metadata: { tally_account: '42' },
      });
      expect((done.customer as Stripe.Customer).email).toBe('buyer@example.com');
      const subscription = done.subscription as Stripe.Subscription;
      const item = subscription.items.data[0] as Stripe.SubscriptionItem;
      expect(subscription.status).toBe('active');
      expect(item.price.id).toBe(monthly.id);
      const start = new Date(item.current_period_start * 1000);
      const end = new Date(item.current_period_end * 1000);
      expect((end.getUTCMonth() - start.getUTCMonth() + 12) % 12).toBe(1);

      const invoice = await stripe.invoices.retrieve(subscription.latest_invoice as string);
      expect(invoice).toMatchObject({
        status: 'paid',
        amount_paid: 2000,
        billing_reason: 'subscription_create',
        customer: subscription.customer,
      });
      expect(invoice.parent?.subscription_details?.subscription).toBe(subscription.id);
      expect(invoice.lines.data[0]).toMatchObject({
        subscription: subscription.id,
        period: { start: item.current_period_start, end: item.current_period_end },
      });

      await sandbox.deliveries.idle();
      const events = verified(before);
      expect(events.map((e) => e.type)).toEqual([
        'customer.created',
        'customer.subscription.created',
        'invoice.paid',
        'checkout.session.completed',
      ]);
      const completed = events[3] as Stripe.CheckoutSessionCompletedEvent;
      expect(completed.data.object.id).toBe(session.id);
      expect(() =>
        stripe.webhooks.constructEvent(
          receiver.received[before]?.body ?? '',
          receiver.received[before]?.signature ?? '',
          'whsec_wrong',
        ),
      ).toThrow(Stripe.errors.StripeSignatureVerificationError);
      expect((await stripe.events.retrieve(completed.id)).pending_webhooks).toBe(0);
    },
  );

  it('sells a one-time credit pack through a payment intent and charge', async () => {
    const { product, oneTime } = await catalog('Credit pack');
    const customer = await stripe.customers.create({ email: 'credits@example.com' });
    await sandbox.deliveries.idle();
    const before = receiver.received.length;
    const session = await stripe.checkout.sessions.create({
      mode: 'payment',
      customer: customer.id,
      line_items: [{ price: oneTime.id, quantity: 2 }],
      success_url: 'http://127.0.0.1:1/ok',
    });
    const html = await (await fetch(session.url as string)).text();
    expect(html).toContain(product.name);
    expect(html).toContain('$10.00');
    await pay(session);
    const done = await stripe.checkout.sessions.retrieve(session.id);
    expect(done).toMatchObject({
      status: 'complete',
      payment_status: 'paid',
      customer: customer.id,
      subscription: null,
    });
    const intent = await stripe.paymentIntents.retrieve(done.payment_intent as string);
    expect(intent).toMatchObject({
      status: 'succeeded',
      amount: 1000,
      amount_received: 1000,
      currency: 'usd',
      customer: customer.id,
    });
    const charges = await stripe.charges.list({ payment_intent: intent.id });
    expect(charges.data.map((c) => c.id)).toEqual([intent.latest_charge]);
    expect(charges.data[0]).toMatchObject({
      paid: true,
      captured: true,
      status: 'succeeded',
      amount: 1000,
    });
    await sandbox.deliveries.idle();
    expect(verified(before).map((e) => e.type)).toEqual([
      'charge.succeeded',
      'payment_intent.succeeded',
      'checkout.session.completed',
    ]);
  });

  it(
    'escapes what it shows on the page and ' + 'reads invoice lines and subscription items',
    async () => {
      const { monthly } = await catalog('<b>Bold & Co</b>', 1234);
      const session = await stripe.checkout.sessions.create({
        mode: 'subscription',
        line_items: [{ price: monthly.id, quantity: 2 }],
        success_url: 'http://127.0.0.1:1/ok',
      });
      const html = await (await fetch(session.url as string)).text();
      expect(html).toContain('&lt;b&gt;Bold &amp; Co&lt;/b&gt; × 2');
      expect(html).not.toContain('<b>Bold');
      expect(html).toContain('$24.68');
      await pay(session);
      const subscription = (await stripe.checkout.sessions.retrieve(session.id))
        .subscription as string;
      const items = await stripe.subscriptionItems.list({ subscription });
      expect(items.data.map((i) => [i.price.id, i.quantity])).toEqual([[monthly.id, 2]]);
      const invoice = (await stripe.invoices.list({ subscription })).data[0] as Stripe.Invoice;
      const lines = await stripe.invoices.listLineItems(invoice.id);
      expect(lines.data.map((l) => l.amount)).toEqual([2468]);
      const lineItems = await stripe.checkout.sessions.listLineItems(session.id);
      expect(lineItems.data[0]).toMatchObject({ quantity: 2, amount_total: 2468 });
    },
  );

  it('shows an expired session as expired and refuses to take payment', async () => {
    const { oneTime } = await catalog('Expiring');
    const session = await stripe.checkout.sessions.create({
      mode: 'payment',
      line_items: [{ price: oneTime.id }],
      success_url: 'http://127.0.0.1:1/ok',
    });
    const expired = await stripe.checkout.sessions.expire(session.id);
    expect(expired.status).toBe('expired');
    const page = await fetch(`${sandbox.url}/checkout/${session.id}`);
    expect(page.status).toBe(410);
    const html = await page.text();
    expect(html).toContain('expired');
    expect(html).not.toContain('<form');
    const attempt = await fetch(`${sandbox.url}/checkout/${session.id}/pay`, {
      method: 'POST',
      redirect: 'manual',
    });
    expect(attempt.status).toBe(410);
    expect((await stripe.checkout.sessions.retrieve(session.id)).status).toBe('expired');
    await expect(stripe.checkout.sessions.expire(session.id)).rejects.toBeInstanceOf(
      Stripe.errors.StripeInvalidRequestError,
    );
  });

  it('can deliver duplicated, reversed and redelivered events', async () => {
    const { oneTime } = await catalog('Switches');
    const sell = async (): Promise<Stripe.Event[]> => {
      const before = receiver.received.length;
      const session = await stripe.checkout.sessions.create({
        mode: 'payment',
        line_items: [{ price: oneTime.id }],
        success_url: 'http://127.0.0.1:1/ok',
      });
      await pay(session);
      await sandbox.deliveries.idle();
      return verified(before);
    };
    sandbox.deliveries.mode = 'reverse';
    const reversed = await sell();
    expect(reversed.map((e) => e.type)).toEqual([
      'checkout.session.completed',
      'payment_intent.succeeded',
      'charge.succeeded',
      'customer.created',
    ]);
    sandbox.deliveries.mode = 'duplicate';
    const doubled = await sell();
    expect(doubled.map((e) => e.type)).toEqual([
      'customer.created',
      'customer.created',
      'charge.succeeded',
      'charge.succeeded',
      'payment_intent.succeeded',
      'payment_intent.succeeded',
      'checkout.session.completed',
      'checkout.session.completed',
    ]);
    expect(doubled[0]?.id).toBe(doubled[1]?.id);
    sandbox.deliveries.mode = 'normal';
    const before = receiver.received.length;
    sandbox.deliveries.redeliver(reversed[0]?.id as string);
    await sandbox.deliveries.idle();
    expect(verified(before).map((e) => e.id)).toEqual([reversed[0]?.id]);
  });
});

describe('webhook delivery rules', () => {
  it('retries a failing endpoint with backoff and records the attempts', async () => {
    const flaky = await startReceiver((count) => (count === 1 ? 500 : 200));
    const endpoint = await stripe.webhookEndpoints.create({
      url: flaky.url,
      enabled_events: ['product.created'],
    });
    const product = await stripe.products.create({ name: 'Retried' });
    await sandbox.deliveries.idle();
    const events = flaky.received.map(({ body, signature }) =>
      stripe.webhooks.constructEvent(body, signature, endpoint.secret as string),
    );
    expect(events.map((e) => (e.data.object as Stripe.Product).id)).toEqual([product.id]);
    const attempts = sandbox.deliveries.attempts.filter((a) => a.endpointId === endpoint.id);
    expect(attempts.map((a) => [a.attempt, a.status])).toEqual([
      [1, 500],
      [2, 200],
    ]);
    await stripe.webhookEndpoints.del(endpoint.id);
    await flaky.close();
  });

  it('gives up after the last attempt and only accepts loopback URLs', async () => {
    const down = await startReceiver(() => 503);
    const endpoint = await stripe.webhookEndpoints.create({
      url: down.url,
      enabled_events: ['product.created'],
    });
    await stripe.products.create({ name: 'Never delivered' });
    await sandbox.deliveries.idle();
    expect(
      sandbox.deliveries.attempts.filter((a) => a.endpointId === endpoint.id).map((a) => a.attempt),
    ).toEqual([1, 2, 3]);
    await stripe.webhookEndpoints.del(endpoint.id);
    await down.close();

    const remote = stripe.webhookEndpoints.create({
      url: 'https://example.com/hook',
      enabled_events: ['*'],
    });
    await expect(remote).rejects.toMatchObject({ type: 'StripeInvalidRequestError', param: 'url' });
    expect(sandbox.webhookSecret(endpoint.id)).toBeUndefined();
  });
});

describe('billing time', () => {
  it(
    'renews subscriptions on a test clock: ' + 'a second paid invoice for the next period',
    async () => {
      const frozen = Date.UTC(2026, 0, 31, 12) / 1000;
      const clock = await stripe.testHelpers.testClocks.create({
        frozen_time: frozen,
        name: 'renewal',
      });
      const customer = await stripe.customers.create({
        email: 'clock@example.com',
        test_clock: clock.id,
      });
      const { monthly } = await catalog('Clocked plan', 1500);
      const session = await stripe.checkout.sessions.create({
        mode: 'subscription',
        customer: customer.id,
        line_items: [{ price: monthly.id }],
        success_url: 'http://127.0.0.1:1/ok',
      });
      await pay(session);
      const subscriptionId = (await stripe.checkout.sessions.retrieve(session.id))
        .subscription as string;
      const first = (await stripe.subscriptions.retrieve(subscriptionId)).items
        .data[0] as Stripe.SubscriptionItem;
      expect([first.current_period_start, first.current_period_end]).toEqual([
        frozen,
        Date.UTC(2026, 1, 28, 12) / 1000,
      ]);

      const advancing = await stripe.testHelpers.testClocks.advance(clock.id, {
        frozen_time: Date.UTC(2026, 2, 1) / 1000,
      });
      expect(advancing.status).toBe('advancing');
      let ready = advancing;
      for (let i = 0; i < 100 && ready.status !== 'ready'; i++)
        ready = await stripe.testHelpers.testClocks.retrieve(clock.id);
      expect(ready).toMatchObject({ status: 'ready', frozen_time: Date.UTC(2026, 2, 1) / 1000 });

      const invoices = await stripe.invoices.list({ subscription: subscriptionId });
      expect(invoices.data).toHaveLength(2);
      const renewal = invoices.data[0] as Stripe.Invoice;
      expect(renewal).toMatchObject({
        status: 'paid',
        amount_paid: 1500,
        billing_reason: 'subscription_cycle',
        test_clock: clock.id,
      });
      expect(renewal.lines.data[0]?.period).toEqual({
        start: Date.UTC(2026, 1, 28, 12) / 1000,
        end: Date.UTC(2026, 2, 31, 12) / 1000,
      });
      const renewed = await stripe.subscriptions.retrieve(subscriptionId);
      expect(renewed.latest_invoice).toBe(renewal.id);
      expect(renewed.items.data[0]?.current_period_end).toBe(Date.UTC(2026, 2, 31, 12) / 1000);

      const paid = await stripe.events.list({ type: 'invoice.paid', limit: 100 });
      expect(paid.data.some((e) => (e.data.object as Stripe.Invoice).id === renewal.id)).toBe(true);
      const updates = await stripe.events.list({
        type: 'customer.subscription.updated',
        limit: 100,
      });
      expect(
        updates.data.some((e) => (e.data.object as Stripe.Subscription).id === subscriptionId),
      ).toBe(true);
      await expect(
        stripe.testHelpers.testClocks.advance(clock.id, { frozen_time: frozen }),
      ).rejects.toBeInstanceOf(Stripe.errors.StripeInvalidRequestError);
    },
  );

  it('expires open checkout sessions when their time is up', async () => {
    let now = Date.UTC(2026, 3, 1);
    const timed = await startStripeSandbox({ now: () => now });
    try {
      const client = timed.stripe();
      const product = await client.products.create({ name: 'Late' });
      const price = await client.prices.create({
        product: product.id,
        currency: 'jpy',
        unit_amount: 500,
      });
      const session = await client.checkout.sessions.create({
        mode: 'payment',
        line_items: [{ price: price.id }],
        success_url: 'http://127.0.0.1:1/ok',
        expires_at: now / 1000 + 3600,
      });
      expect(await (await fetch(session.url as string)).text()).toContain('¥500');
      await expect(
        client.checkout.sessions.create({
          mode: 'payment',
          line_items: [{ price: price.id }],
          success_url: 'http://127.0.0.1:1/ok',
          expires_at: now / 1000 + 60,
        }),
      ).rejects.toMatchObject({ param: 'expires_at' });
      now += 3600 * 1000;
      expect((await client.checkout.sessions.retrieve(session.id)).status).toBe('expired');
      expect(
        (await client.events.list({ type: 'checkout.session.*' })).data.map((e) => e.type),
      ).toEqual(['checkout.session.expired']);
      expect(
        (
          await fetch(`${timed.url}/checkout/${session.id}/pay`, {
            method: 'POST',
            redirect: 'manual',
          })
        ).status,
      ).toBe(410);
    } finally {
      await timed.close();
    }
  });

  it('swaps a price, cancels at period end and cancels at once', async () => {
    let now = Date.UTC(2026, 5, 1);
    const timed = await startStripeSandbox({ now: () => now });
    try {
      const client = timed.stripe();
      const customer = await client.customers.create({ email: 'swap@example.com' });
      const product = await client.products.create({ name: 'Swap' });
      const basic = await client.prices.create({
        product: product.id,
        currency: 'eur',
        unit_amount: 1000,
        recurring: { interval: 'month' },
      });
      const pro = await client.prices.create({
        product: product.id,
        currency: 'eur',
        unit_amount: 3000,
        recurring: { interval: 'month' },
      });
      const subscription = await client.subscriptions.create({
        customer: customer.id,
        items: [{ price: basic.id }],
      });
      const itemId = subscription.items.data[0]?.id as string;
      await expect(
        client.subscriptions.update(subscription.id, {
          items: [{ id: itemId, price: pro.id }],
          proration_behavior: 'create_prorations',
        }),
      ).rejects.toMatchObject({ param: 'proration_behavior' });
      const swapped = await client.subscriptions.update(subscription.id, {
        items: [{ id: itemId, price: pro.id }],
        proration_behavior: 'none',
        cancel_at_period_end: true,
      });
      expect(swapped.items.data.map((i) => i.price.id)).toEqual([pro.id]);
      expect(swapped.cancel_at_period_end).toBe(true);

      now += 31 * 86_400_000;
      const ended = await client.subscriptions.retrieve(subscription.id);
      expect(ended).toMatchObject({ status: 'canceled', ended_at: Date.UTC(2026, 6, 1) / 1000 });
      expect((await client.subscriptions.list({ customer: customer.id })).data).toEqual([]);

      const other = await client.subscriptions.create({
        customer: customer.id,
        items: [{ price: basic.id }],
      });
      now += 31 * 86_400_000;
      const invoices = await client.invoices.list({ subscription: other.id });
      expect(invoices.data.map((i) => i.billing_reason)).toEqual([
        'subscription_cycle',
        'subscription_create',
      ]);
      const canceled = await client.subscriptions.cancel(other.id);
      expect(canceled).toMatchObject({ status: 'canceled', canceled_at: Math.floor(now / 1000) });
    } finally {
      await timed.close();
    }
  });
});

describe('prorations and refunds', () => {
  it('invoices a prorated change at once, on a test clock, and pays it', async () => {
    const product = await stripe.products.create({ name: 'Prorated' });
    const [basic, plus, yearly] = await Promise.all(
      [
        { unit_amount: 2000, recurring: { interval: 'month' as const } },
        { unit_amount: 5000, recurring: { interval: 'month' as const } },
        { unit_amount: 20000, recurring: { interval: 'year' as const } },
      ].map((p) => stripe.prices.create({ product: product.id, currency: 'usd', ...p })),
    );
    if (basic === undefined || plus === undefined || yearly === undefined) throw new Error();
    const start = Date.UTC(2028, 1, 1) / 1000;
    const clock = await stripe.testHelpers.testClocks.create({ frozen_time: start });
    const customer = await stripe.customers.create({ test_clock: clock.id });
    const subscription = await stripe.subscriptions.create({
      customer: customer.id,
      items: [{ price: basic.id }],
    });
    const item = subscription.items.data[0]?.id ?? '';
    const change = Date.UTC(2028, 1, 15) / 1000;
    await stripe.testHelpers.testClocks.advance(clock.id, { frozen_time: change });
    for (let i = 0; i < 100; i++) {
      if ((await stripe.testHelpers.testClocks.retrieve(clock.id)).status === 'ready') break;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    const changed = await stripe.subscriptions.update(subscription.id, {
      items: [{ id: item, price: plus.id }],
      proration_behavior: 'always_invoice',
    });
    const invoice = await stripe.invoices.retrieve(String(changed.latest_invoice));
    // February 2028 has 29 days; 15 remain after the 15th.
    const end = Date.UTC(2028, 2, 1) / 1000;
    const credit = -Math.round((2000 * 15) / 29);
    const charge = Math.round((5000 * 15) / 29);
    expect(invoice).toMatchObject({
      billing_reason: 'subscription_update',
      status: 'paid',
      amount_paid: credit + charge,
      created: change,
    });
    expect(invoice.lines.data.map((l) => [l.amount, l.period.start, l.period.end])).toEqual([
      [credit, change, end],
      [charge, change, end],
    ]);
    expect(invoice.lines.data.every((l) => l.parent?.subscription_item_details?.proration)).toBe(
      true,
    );
    const payments = await stripe.invoicePayments.list({ invoice: invoice.id ?? '' });
    expect(payments.data[0]).toMatchObject({ amount_paid: credit + charge, status: 'paid' });
    expect(changed.items.data[0]).toMatchObject({ current_period_end: end });

    // Refunds through the invoice's payment: partial, then beyond what is left, then the rest.
    const paymentIntent = String(payments.data[0]?.payment.payment_intent);
    const partial = await stripe.refunds.create({ payment_intent: paymentIntent, amount: 1000 });
    expect(partial).toMatchObject({ amount: 1000, status: 'succeeded', currency: 'usd' });
    const left = credit + charge - 1000;
    await expect(
      stripe.refunds.create({ payment_intent: paymentIntent, amount: left + 1 }),
    ).rejects.toMatchObject({
      type: 'StripeInvalidRequestError',
      code: 'amount_too_large',
      param: 'amount',
    });
    const rest = await stripe.refunds.create({ charge: String(partial.charge) });
    expect(rest.amount).toBe(left);
    const refunded = await stripe.charges.retrieve(String(partial.charge));
    expect(refunded).toMatchObject({ amount_refunded: credit + charge, refunded: true });
    await expect(stripe.refunds.create({ charge: refunded.id })).rejects.toMatchObject({
      code: 'charge_already_refunded',
    });
    const events = await stripe.events.list({ types: ['refund.created', 'charge.refunded'] });
    expect(events.data.map((e) => e.type)).toEqual([
      'charge.refunded',
      'refund.created',
      'charge.refunded',
      'refund.created',
    ]);

    // A downgrade leaves credit on the customer's balance, used by the next invoice.
    const down = await stripe.subscriptions.update(subscription.id, {
      items: [{ id: item, price: basic.id }],
      proration_behavior: 'always_invoice',
    });
    const credited = await stripe.invoices.retrieve(String(down.latest_invoice));
    expect(credited.amount_paid).toBe(0);
    expect(credited.total).toBe(-charge + Math.round((2000 * 15) / 29));
    expect((await stripe.customers.retrieve(customer.id)) as Stripe.Customer).toMatchObject({
      balance: credited.total,
    });
    // Another interval restarts the billing cycle now and charges a full year.
    const annual = await stripe.subscriptions.update(subscription.id, {
      items: [{ id: item, price: yearly.id }],
      proration_behavior: 'always_invoice',
    });
    expect(annual.billing_cycle_anchor).toBe(change);
    expect(annual.items.data[0]?.current_period_end).toBe(Date.UTC(2029, 1, 15) / 1000);
  });
});
