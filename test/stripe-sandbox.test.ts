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
async function startReceiver(answer: (count: number) => number = () => 200): Promise<{ url: string; received: Received[]; close(): Promise<void> }> {
  const received: Received[] = [];
  let count = 0;
  const server = http.createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      count += 1;
      const status = answer(count);
      if (status === 200) received.push({ body: Buffer.concat(chunks).toString('utf8'), signature: String(request.headers['stripe-signature']) });
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

async function catalog(name: string, unitAmount = 2000): Promise<{ product: Stripe.Product; monthly: Stripe.Price; oneTime: Stripe.Price }> {
  const product = await stripe.products.create({ name });
  const monthly = await stripe.prices.create({ product: product.id, currency: 'usd', unit_amount: unitAmount, recurring: { interval: 'month' } });
  const oneTime = await stripe.prices.create({ product: product.id, currency: 'usd', unit_amount: 500 });
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
    for (const n of [1, 2, 3, 4, 5]) created.push(await stripe.customers.create({ email: `paging-${n}@example.com`, metadata: { n: String(n) } }));
    const first = created[0] as Stripe.Customer;
    expect(first.id).toMatch(/^cus_/);
    expect((await stripe.customers.retrieve(first.id)) as Stripe.Customer).toMatchObject({ email: 'paging-1@example.com', metadata: { n: '1' } });
    const updated = await stripe.customers.update(first.id, { name: 'Ada', metadata: { n: '', plan: 'pro' } });
    expect(updated).toMatchObject({ name: 'Ada', metadata: { plan: 'pro' } });

    const page1 = await stripe.customers.list({ limit: 2 });
    expect(page1).toMatchObject({ object: 'list', has_more: true, url: '/v1/customers' });
    const page2 = await stripe.customers.list({ limit: 2, starting_after: page1.data[1]?.id as string });
    const page3 = await stripe.customers.list({ limit: 2, starting_after: page2.data[1]?.id as string });
    const seen = [...page1.data, ...page2.data, ...page3.data].map((c) => c.id);
    expect(seen.slice(0, 5)).toEqual(created.map((c) => c.id).reverse());

    const all: string[] = [];
    for await (const customer of stripe.customers.list({ limit: 2 })) all.push(customer.id);
    expect(new Set(all).size).toBe(all.length);
    expect(all).toEqual(expect.arrayContaining(created.map((c) => c.id)));
  });

  it('finds prices by lookup key and keeps prices immutable except active and metadata', async () => {
    const { product, monthly } = await catalog('Lookup plan');
    const keyed = await stripe.prices.create({ product: product.id, currency: 'usd', unit_amount: 9900, recurring: { interval: 'year' }, lookup_key: 'lookup_plan_yearly' });
    const found = await stripe.prices.list({ lookup_keys: ['lookup_plan_yearly'] });
    expect(found.data.map((p) => p.id)).toEqual([keyed.id]);
    expect(found.data[0]).toMatchObject({ type: 'recurring', recurring: { interval: 'year', interval_count: 1 }, unit_amount: 9900, currency: 'usd' });

    await expect(stripe.prices.create({ product: product.id, currency: 'usd', unit_amount: 1, lookup_key: 'lookup_plan_yearly' })).rejects.toBeInstanceOf(Stripe.errors.StripeInvalidRequestError);
    const moved = await stripe.prices.create({ product: product.id, currency: 'usd', unit_amount: 8900, recurring: { interval: 'year' }, lookup_key: 'lookup_plan_yearly', transfer_lookup_key: true });
    expect((await stripe.prices.list({ lookup_keys: ['lookup_plan_yearly'] })).data.map((p) => p.id)).toEqual([moved.id]);

    const retired = await stripe.prices.update(monthly.id, { active: false, metadata: { retired: 'yes' } });
    expect(retired).toMatchObject({ active: false, metadata: { retired: 'yes' } });
    const active = await stripe.prices.list({ product: product.id, active: true, limit: 100 });
    expect(active.data.map((p) => p.id)).not.toContain(monthly.id);
    const change = stripe.prices.update(monthly.id, { unit_amount: 1 } as Stripe.PriceUpdateParams);
    await expect(change).rejects.toMatchObject({ type: 'StripeInvalidRequestError', code: 'parameter_unknown', param: 'unit_amount' });

    const archived = await stripe.products.update(product.id, { active: false });
    expect(archived.active).toBe(false);
    expect((await stripe.products.list({ active: false, limit: 100 })).data.map((p) => p.id)).toContain(product.id);
  });

  it('expands related objects on retrieve and on lists', async () => {
    const customer = await stripe.customers.create({ email: 'expand@example.com' });
    const { monthly } = await catalog('Expand plan');
    const subscription = await stripe.subscriptions.create({ customer: customer.id, items: [{ price: monthly.id }] });
    const expanded = await stripe.subscriptions.retrieve(subscription.id, { expand: ['customer', 'latest_invoice'] });
    expect((expanded.customer as Stripe.Customer).email).toBe('expand@example.com');
    expect((expanded.latest_invoice as Stripe.Invoice).status).toBe('paid');
    const listed = await stripe.subscriptions.list({ customer: customer.id, expand: ['data.customer'] });
    expect((listed.data[0]?.customer as Stripe.Customer).id).toBe(customer.id);
    await expect(stripe.subscriptions.retrieve(subscription.id, { expand: ['status'] })).rejects.toBeInstanceOf(Stripe.errors.StripeInvalidRequestError);
  });
});

describe('wire protocol', () => {
  it('replays an idempotent request and refuses the key with other parameters', async () => {
    const first = await stripe.customers.create({ email: 'idem@example.com' }, { idempotencyKey: 'idem-key-1' });
    const again = await stripe.customers.create({ email: 'idem@example.com' }, { idempotencyKey: 'idem-key-1' });
    expect(again.id).toBe(first.id);
    expect(again.lastResponse.headers['idempotent-replayed']).toBe('true');
    const other = stripe.customers.create({ email: 'other@example.com' }, { idempotencyKey: 'idem-key-1' });
    await expect(other).rejects.toBeInstanceOf(Stripe.errors.StripeIdempotencyError);
    await expect(other).rejects.toMatchObject({ statusCode: 400, rawType: 'idempotency_error' });
  });

  it('answers byte-identical bodies on replay over plain HTTP', async () => {
    const post = () =>
      fetch(`${sandbox.url}/v1/products`, {
        method: 'POST',
        headers: { authorization: `Bearer ${sandbox.secretKey}`, 'idempotency-key': 'raw-key', 'content-type': 'application/x-www-form-urlencoded' },
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
    await expect(missing).rejects.toMatchObject({ code: 'resource_missing', statusCode: 404, param: 'id' });

    const wrongKey = new Stripe('sk_test_wrong', { host: '127.0.0.1', port: sandbox.port, protocol: 'http', maxNetworkRetries: 0 });
    await expect(wrongKey.customers.list()).rejects.toBeInstanceOf(Stripe.errors.StripeAuthenticationError);
    const noKey = await fetch(`${sandbox.url}/v1/customers`);
    expect(noKey.status).toBe(401);
    expect(await noKey.json()).toMatchObject({ error: { type: 'invalid_request_error' } });

    const unknown = stripe.customers.create({ colour: 'red' } as Stripe.CustomerCreateParams);
    await expect(unknown).rejects.toMatchObject({ type: 'StripeInvalidRequestError', code: 'parameter_unknown', param: 'colour' });
    const route = await fetch(`${sandbox.url}/v1/coupons`, { headers: { authorization: `Bearer ${sandbox.secretKey}` } });
    expect(route.status).toBe(404);
  });
});
