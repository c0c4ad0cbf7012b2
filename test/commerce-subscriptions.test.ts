/**
 * Subscription refunds (row 16) and plan changes (row 15) end to end over HTTP, against the
 * Stripe sandbox in the test process with its clock pinned: amounts are computed here
 * from calendar dates, independently of the code under test.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, buy, startHarness, type Harness } from './support/commerce-harness.js';

const CONFIG = {
  entitlements: {
    reports: { type: 'feature' },
    exports: { type: 'feature' },
    seats: { type: 'limit' },
    api_calls: { type: 'meter', reset: 'month' },
  },
  products: {
    free: { name: 'Free', default: true, entitlements: { api_calls: { included: 10 } } },
    pro: {
      name: 'Pro',
      price: { amount: 2000, currency: 'usd', interval: 'month' },
      entitlements: {
        reports: true,
        seats: { included: 5, expansion: { unitAmount: 500 } },
        api_calls: { included: 1000 },
      },
    },
    team: {
      name: 'Team',
      price: { amount: 5000, currency: 'usd', interval: 'month' },
      entitlements: { reports: true, exports: true, api_calls: { included: 5000 } },
    },
    pro_annual: {
      name: 'Pro, yearly',
      price: { amount: 20000, currency: 'usd', interval: 'year' },
      entitlements: { reports: true },
    },
    credits: {
      name: 'Credits',
      price: { amount: 500, currency: 'usd' },
      grants: { api_calls: 100 },
    },
  },
};

const DAY_MS = 86_400_000;
/** Milliseconds of a UTC calendar date (and time). */
const at = (iso: string): number => Date.parse(`${iso}Z`);

describe('subscription refunds', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(CONFIG, at('2026-03-01T00:00:00'));
  }, 60_000);
  afterAll(async () => {
    await h?.close();
  });

  async function subscriptionOf(customerId: string) {
    const listed = await api(h, 'GET', `/v1/subscriptions?customerId=${customerId}`);
    return listed.body.data[0] as {
      id: string;
      status: string;
      productKey: string;
      processorSubscriptionId: string;
      currentPeriodStart: string;
      currentPeriodEnd: string;
    };
  }
  const refund = (id: string, body: unknown) =>
    api(h, 'POST', `/v1/subscriptions/${encodeURIComponent(id)}/refunds`, body);
  const has = async (key: string, customerId: string) =>
    (await api(h, 'GET', `/v1/entitlements/${key}/has?customerId=${customerId}`)).body;

  it('prorated refunds the unused days of a 31-day month and cancels at once', async () => {
    h.now = at('2026-03-01T00:00:00');
    await buy(h, 'ugo', 'pro');
    const subscription = await subscriptionOf('ugo');
    expect([subscription.currentPeriodStart, subscription.currentPeriodEnd]).toEqual([
      '2026-03-01T00:00:00.000Z',
      '2026-04-01T00:00:00.000Z',
    ]);
    expect(await has('reports', 'ugo')).toBe(true);
    h.now = at('2026-03-11T00:00:00');
    // 21 of March's 31 days are unused: 2000 × 21 / 31 = 1354.8…, rounded down.
    const expected = Math.floor((2000 * (at('2026-04-01T00:00:00') - h.now)) / (31 * DAY_MS));
    expect(expected).toBe(1354);
    const first = await refund(subscription.id, { mode: 'prorated', idempotencyKey: 's-1' });
    expect([first.status, first.body]).toEqual([
      200,
      {
        id: subscription.id,
        status: 'canceled',
        refund: { amount: expected, currency: 'usd', mode: 'prorated' },
      },
    ]);
    expect(await has('reports', 'ugo')).toBe(false);
    const stripe = h.sandbox.stripe();
    const atProcessor = await stripe.subscriptions.retrieve(subscription.processorSubscriptionId);
    expect(atProcessor.status).toBe('canceled');
    const invoice = await stripe.invoices.list({ subscription: atProcessor.id, limit: 1 });
    const payments = await stripe.invoicePayments.list({ invoice: invoice.data[0]?.id ?? '' });
    const paymentIntent = payments.data[0]?.payment.payment_intent as string;
    const refunds = await stripe.refunds.list({ payment_intent: paymentIntent });
    expect(refunds.data.map((r) => r.amount)).toEqual([expected]);

    const again = await refund(subscription.id, { mode: 'prorated', idempotencyKey: 's-1' });
    expect([again.status, again.body]).toEqual([200, first.body]);
    const reused = await refund(subscription.id, { mode: 'full', idempotencyKey: 's-1' });
    expect([reused.status, reused.body.code]).toEqual([400, 'idempotency_key_reused']);
    const second = await refund(subscription.id, { mode: 'full', idempotencyKey: 's-2' });
    expect([second.status, second.body.code]).toEqual([409, 'already_refunded']);
    expect((await stripe.refunds.list({ payment_intent: paymentIntent })).data).toHaveLength(1);
    await h.sandbox.deliveries.idle();
    expect((await subscriptionOf('ugo')).status).toBe('canceled');
    const audit = await api(h, 'GET', '/v1/audit?action=subscription.refund');
    expect(audit.body.data[0]).toMatchObject({
      resourceType: 'subscription',
      resourceId: 'ugo',
      data: { id: subscription.id, mode: 'prorated', amount: expected, idempotencyKey: 's-1' },
    });
    // A new plan can be bought after the refund.
    const checkout = await api(h, 'POST', '/v1/checkout', {
      customerId: 'ugo',
      productKey: 'pro',
      successUrl: 'https://a.example/ok',
      cancelUrl: 'https://a.example/no',
    });
    expect(checkout.status).toBe(200);
  });

  it('full refunds the whole invoice; without a key a second refund is 409', async () => {
    h.now = at('2026-03-12T00:00:00');
    await buy(h, 'val', 'pro');
    const subscription = await subscriptionOf('val');
    h.now = at('2026-03-20T00:00:00');
    const full = await refund(subscription.id, { mode: 'full' });
    expect(full.body).toEqual({
      id: subscription.id,
      status: 'canceled',
      refund: { amount: 2000, currency: 'usd', mode: 'full' },
    });
    const second = await refund(subscription.id, { mode: 'full' });
    expect([second.status, second.body.code]).toEqual([409, 'already_refunded']);
    expect(await has('reports', 'val')).toBe(false);
  });

  it('a crash between the processor refund and the answer: the retry refunds once', async () => {
    h.now = at('2026-03-21T00:00:00');
    await buy(h, 'wyn', 'pro');
    const subscription = await subscriptionOf('wyn');
    h.now = at('2026-03-25T00:00:00');
    h.proxy.crashOn = (method, path) => method === 'POST' && path.startsWith('/v1/refunds');
    const body = { mode: 'full', idempotencyKey: 'wyn-1' };
    const crashed = await refund(subscription.id, body).catch((error: unknown) => error);
    expect(crashed).toBeInstanceOf(Error);
    await h.restart();
    const retried = await refund(subscription.id, body);
    expect(retried.body).toEqual({
      id: subscription.id,
      status: 'canceled',
      refund: { amount: 2000, currency: 'usd', mode: 'full' },
    });
    await h.sandbox.deliveries.idle();
    const stripe = h.sandbox.stripe();
    const refunds = await stripe.refunds.list({ limit: 100 });
    const mine = refunds.data.filter((r) => r.metadata?.tally_refund_of === subscription.id);
    expect(mine.map((r) => r.amount)).toEqual([2000]);
    expect((await subscriptionOf('wyn')).status).toBe('canceled');
    const audit = await api(h, 'GET', '/v1/audit?action=subscription.refund&limit=100');
    const entries = audit.body.data.filter(
      (e: { data: { id: string } }) => e.data.id === subscription.id,
    );
    expect(entries).toHaveLength(1);
  }, 60_000);

  it('answers 404 for a subscription that is not this environment’s', async () => {
    for (const id of ['stripe:sub_nothing', 'sub_1', 'other:sub_1']) {
      const unknown = await refund(id, { mode: 'full' });
      expect([unknown.status, unknown.body.code]).toEqual([404, 'subscription_not_found']);
    }
    const bad = await refund('stripe:sub_1', { mode: 'all' });
    expect(bad.status).toBe(400);
  });
});

describe('plan changes', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(CONFIG, at('2026-03-01T00:00:00'));
  }, 60_000);
  afterAll(async () => {
    await h?.close();
  });

  const change = (customerId: string, planKey: string) =>
    api(h, 'POST', '/v1/subscriptions/change', { customerId, planKey });
  const has = async (key: string, customerId: string) =>
    (await api(h, 'GET', `/v1/entitlements/${key}/has?customerId=${customerId}`)).body;
  const subscriptions = async (customerId: string) =>
    (await api(h, 'GET', `/v1/subscriptions?customerId=${customerId}`)).body.data;

  it('subscribe, change plan, then a prorated refund uses the proration invoice', async () => {
    h.now = at('2026-03-01T00:00:00');
    await buy(h, 'ada', 'pro');
    const [subscription] = await subscriptions('ada');
    expect(await has('exports', 'ada')).toBe(false);

    h.now = at('2026-03-11T00:00:00');
    // Hold the processor's events back to see that the answer comes before the switch.
    await h.sandbox.stripe().webhookEndpoints.update(h.webhookEndpointId, { disabled: true });
    const changed = await change('ada', 'team');
    expect([changed.status, changed.body]).toEqual([
      200,
      {
        id: subscription.id,
        customerId: 'ada',
        productKey: 'team',
        status: 'active',
        currentPeriodStart: '2026-03-01T00:00:00.000Z',
        currentPeriodEnd: '2026-04-01T00:00:00.000Z',
        cancelAtPeriodEnd: false,
        processor: 'stripe',
        processorSubscriptionId: subscription.processorSubscriptionId,
      },
    ]);
    expect(await has('exports', 'ada')).toBe(false);
    const events = await h.sandbox
      .stripe()
      .events.list({ types: ['customer.subscription.updated', 'invoice.paid'], limit: 2 });
    await h.sandbox.stripe().webhookEndpoints.update(h.webhookEndpointId, { disabled: false });
    for (const event of [...events.data].reverse()) h.sandbox.deliveries.redeliver(event.id);
    await h.sandbox.deliveries.idle();
    expect(await has('exports', 'ada')).toBe(true);
    expect((await subscriptions('ada'))[0].productKey).toBe('team');
    const balance = await api(h, 'GET', '/v1/usage/api_calls/balance?customerId=ada');
    expect(balance.body.included).toBe(5000);

    // The proration invoice: 21 of March's 31 days are left at the change.
    const rest = (at('2026-04-01T00:00:00') - at('2026-03-11T00:00:00')) / (31 * DAY_MS);
    const paid = Math.round(5000 * rest) - Math.round(2000 * rest);
    expect(paid).toBe(2032);
    const stripe = h.sandbox.stripe();
    const latest = await stripe.subscriptions.retrieve(subscription.processorSubscriptionId);
    const invoice = await stripe.invoices.retrieve(String(latest.latest_invoice));
    expect([invoice.billing_reason, invoice.amount_paid]).toEqual(['subscription_update', paid]);
    const audit = await api(h, 'GET', '/v1/audit?action=subscription.change');
    expect(audit.body.data[0]).toMatchObject({
      resourceType: 'subscription',
      resourceId: 'ada',
      data: { id: subscription.id, from: 'pro', to: 'team', prorationInvoiceId: invoice.id },
    });

    // Refunded on 21 March: 11 of the invoice's 21 days (11 March – 1 April) are unused.
    h.now = at('2026-03-21T00:00:00');
    const unused =
      (at('2026-04-01T00:00:00') - h.now) / (at('2026-04-01T00:00:00') - at('2026-03-11T00:00:00'));
    const expected = Math.floor(paid * unused);
    expect(expected).toBe(1064);
    const refunded = await api(
      h,
      'POST',
      `/v1/subscriptions/${encodeURIComponent(subscription.id)}/refunds`,
      { mode: 'prorated', idempotencyKey: 'chg-1' },
    );
    expect(refunded.body).toEqual({
      id: subscription.id,
      status: 'canceled',
      refund: { amount: expected, currency: 'usd', mode: 'prorated' },
    });
    expect(await has('exports', 'ada')).toBe(false);
  });

  it(
    'answers 404 without an active subscription, 400 for a product that is no plan, 409 ' +
      'for the same plan',
    async () => {
      h.now = at('2026-03-12T00:00:00');
      const none = await change('bea', 'team');
      expect([none.status, none.body.code]).toEqual([404, 'no_active_subscription']);
      await buy(h, 'bea', 'pro');
      for (const planKey of ['credits', 'free', 'nope']) {
        const refused = await change('bea', planKey);
        expect([refused.status, refused.body.code]).toEqual([400, 'plan_not_recurring']);
      }
      const same = await change('bea', 'pro');
      expect([same.status, same.body.code]).toEqual([409, 'already_on_plan']);
      const missing = await api(h, 'POST', '/v1/subscriptions/change', { customerId: 'bea' });
      expect([missing.status, missing.body.error]).toEqual([400, expect.stringMatching(/planKey/)]);
      // Down again: a downgrade's proration is a credit, nothing is charged.
      expect((await change('bea', 'team')).status).toBe(200);
      h.now = at('2026-03-13T00:00:00');
      expect((await change('bea', 'pro')).status).toBe(200);
      await h.sandbox.deliveries.idle();
      expect((await subscriptions('bea'))[0].productKey).toBe('pro');
      expect(await has('exports', 'bea')).toBe(false);
    },
  );
});

/**
 * Prorated refunds across calendar lengths, driven by the sandbox's test clock: each row
 * starts a subscription on a clock frozen at `start`, advances the clock to `refundAt`
 * (renewing on the way where a period ends), and refunds. The expected amount is computed
 * here from the dates alone: price × (period end − refundAt) ÷ (period end − period start),
 * rounded down.
 */
describe('prorated refunds on a test clock', () => {
  const ROWS = [
    {
      name: 'February, 28 days',
      plan: 'pro',
      start: '2026-02-01',
      at: '2026-02-15',
      period: ['2026-02-01', '2026-03-01'],
      amount: 1000,
    },
    {
      name: 'February, 29 days (leap year)',
      plan: 'pro',
      start: '2028-02-01',
      at: '2028-02-15',
      period: ['2028-02-01', '2028-03-01'],
      amount: 1034,
    },
    {
      name: 'a 30-day month',
      plan: 'pro',
      start: '2026-04-01',
      at: '2026-04-11',
      period: ['2026-04-01', '2026-05-01'],
      amount: 1333,
    },
    {
      name: 'a 31-day month, at noon',
      plan: 'pro',
      start: '2026-07-01',
      at: '2026-07-11T12:00:00',
      period: ['2026-07-01', '2026-08-01'],
      amount: 1322,
    },
    {
      name: 'across the year boundary',
      plan: 'pro',
      start: '2026-12-15',
      at: '2027-01-01',
      period: ['2026-12-15', '2027-01-15'],
      amount: 903,
    },
    {
      name: 'started on the 31st: the period ends on 28 February',
      plan: 'pro',
      start: '2027-01-31',
      at: '2027-02-14',
      period: ['2027-01-31', '2027-02-28'],
      amount: 1000,
    },
    {
      name: 'after a renewal into a leap February',
      plan: 'pro',
      start: '2028-01-29',
      at: '2028-03-10',
      period: ['2028-02-29', '2028-03-29'],
      amount: 1310,
    },
    {
      name: 'a year holding 29 February',
      plan: 'pro_annual',
      start: '2027-06-01',
      at: '2028-03-01',
      period: ['2027-06-01', '2028-06-01'],
      amount: 5027,
    },
  ] as const;
  const PRICES: Record<string, number> = { pro: 2000, pro_annual: 20000 };
  const utc = (date: string): number =>
    Date.parse(date.includes('T') ? `${date}Z` : `${date}T00:00:00Z`);

  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(CONFIG, at('2026-01-01T00:00:00'));
  }, 60_000);
  afterAll(async () => {
    await h?.close();
  });

  async function advance(clock: string, toMs: number): Promise<void> {
    const stripe = h.sandbox.stripe();
    await stripe.testHelpers.testClocks.advance(clock, { frozen_time: toMs / 1000 });
    for (let i = 0; i < 500; i++) {
      if ((await stripe.testHelpers.testClocks.retrieve(clock)).status === 'ready') return;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    throw new Error('the test clock did not finish advancing');
  }

  it.each(ROWS.map((row, index) => ({ ...row, index })))('$name', async (row) => {
    const price = PRICES[row.plan] ?? 0;
    const [periodStart, periodEnd] = row.period.map(utc) as [number, number];
    const expected = Math.floor((price * (periodEnd - utc(row.at))) / (periodEnd - periodStart));
    expect(expected).toBe(row.amount);

    const stripe = h.sandbox.stripe();
    const interval = row.plan === 'pro' ? 'month' : 'year';
    const lookupKey = `test:${row.plan}:${price}-usd-${interval}`;
    const [stored] = (await stripe.prices.list({ lookup_keys: [lookupKey] })).data;
    const clock = await stripe.testHelpers.testClocks.create({
      frozen_time: utc(row.start) / 1000,
    });
    const customer = await stripe.customers.create({ test_clock: clock.id });
    const customerId = `clock-${row.index}`;
    const subscription = await stripe.subscriptions.create({
      customer: customer.id,
      items: [{ price: stored?.id ?? '' }],
      metadata: {
        tally_environment: 'test',
        tally_customer_id: customerId,
        tally_product_key: row.plan,
      },
    });
    await advance(clock.id, utc(row.at));
    await h.sandbox.deliveries.idle();
    const listed = await api(h, 'GET', `/v1/subscriptions?customerId=${customerId}`);
    expect(listed.body.data[0]).toMatchObject({
      currentPeriodStart: new Date(periodStart).toISOString(),
      currentPeriodEnd: new Date(periodEnd).toISOString(),
      status: 'active',
    });
    const refunded = await api(h, 'POST', `/v1/subscriptions/stripe:${subscription.id}/refunds`, {
      mode: 'prorated',
      idempotencyKey: `row-${row.index}`,
    });
    expect(refunded.body).toEqual({
      id: `stripe:${subscription.id}`,
      status: 'canceled',
      refund: { amount: expected, currency: 'usd', mode: 'prorated' },
    });
    const ended = await stripe.subscriptions.retrieve(subscription.id);
    expect(ended.ended_at).toBe(utc(row.at) / 1000);
  });
});

describe('contracts price the subscription', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(CONFIG, at('2026-05-01T00:00:00'));
  }, 60_000);
  afterAll(async () => {
    await h?.close();
  });

  it('checkout, plan change and renewal charge the contract price', async () => {
    const contract = await api(h, 'PUT', '/v1/contracts/cora', {
      priceAmount: 1500,
      priceInterval: 'month',
      entitlements: { api_calls: { included: 3000 } },
    });
    expect(contract.status).toBe(200);
    await buy(h, 'cora', 'pro');
    const stripe = h.sandbox.stripe();
    const [subscription] = (await api(h, 'GET', '/v1/subscriptions?customerId=cora')).body.data;
    const first = await stripe.invoices.list({
      subscription: subscription.processorSubscriptionId,
    });
    expect(first.data.map((i) => i.amount_paid)).toEqual([1500]);
    const balance = await api(h, 'GET', '/v1/usage/api_calls/balance?customerId=cora');
    expect(balance.body.included).toBe(3000);

    // A plan change keeps the contract price: the proration nets to nothing.
    h.now = at('2026-05-11T00:00:00');
    const changed = await api(h, 'POST', '/v1/subscriptions/change', {
      customerId: 'cora',
      planKey: 'team',
    });
    expect(changed.body.productKey).toBe('team');
    await h.sandbox.deliveries.idle();
    const after = await stripe.subscriptions.retrieve(subscription.processorSubscriptionId);
    expect(after.items.data[0]?.price.unit_amount).toBe(1500);
    const proration = await stripe.invoices.retrieve(String(after.latest_invoice));
    expect([proration.billing_reason, proration.amount_paid]).toEqual(['subscription_update', 0]);
    expect(await api(h, 'GET', '/v1/entitlements/exports/has?customerId=cora')).toMatchObject({
      body: true,
    });

    // A push leaves the contract price active; the renewal charges it.
    const pushed = await api(h, 'POST', '/v1/sync/push', CONFIG);
    expect(pushed.status).toBe(200);
    expect((await stripe.prices.retrieve(after.items.data[0]?.price.id ?? '')).active).toBe(true);
    h.now = at('2026-06-01T00:00:01');
    await stripe.subscriptions.list({ limit: 1 });
    await h.sandbox.deliveries.idle();
    h.now = at('2026-06-01T02:00:00');
    await stripe.subscriptions.list({ limit: 1 });
    const invoices = await stripe.invoices.list({
      subscription: subscription.processorSubscriptionId,
    });
    const renewal = invoices.data.find((i) => i.billing_reason === 'subscription_cycle');
    expect([renewal?.status, renewal?.amount_paid]).toEqual(['paid', 1500]);
  });
});

describe('limit expansion billed as a prorated quantity change', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(CONFIG, at('2026-03-01T00:00:00'));
  }, 60_000);
  afterAll(async () => {
    await h?.close();
  });

  it('raising purchased adds the expansion to the subscription, prorated and paid', async () => {
    await buy(h, 'sam', 'pro');
    const [subscription] = (await api(h, 'GET', '/v1/subscriptions?customerId=sam')).body.data;
    const stripe = h.sandbox.stripe();
    h.now = at('2026-03-11T00:00:00');
    const settings = { customerId: 'sam', purchased: 3 };
    const raised = await api(h, 'POST', '/v1/entitlements/seats/limit/settings', settings);
    expect(raised.body).toMatchObject({ limit: 8, purchased: 3 });
    const after = await stripe.subscriptions.retrieve(subscription.processorSubscriptionId);
    expect(after.items.data.map((i) => [i.price.unit_amount, i.quantity])).toEqual([
      [2000, 1],
      [500, 3],
    ]);
    // Three seats for 21 of March's 31 days.
    const prorated = Math.round((3 * 500 * 21) / 31);
    const invoice = await stripe.invoices.retrieve(String(after.latest_invoice));
    expect([invoice.billing_reason, invoice.amount_paid]).toEqual([
      'subscription_update',
      prorated,
    ]);
    // The same request again bills nothing more.
    expect((await api(h, 'POST', '/v1/entitlements/seats/limit/settings', settings)).status).toBe(
      200,
    );
    const again = await stripe.subscriptions.retrieve(subscription.processorSubscriptionId);
    expect(again.latest_invoice).toBe(after.latest_invoice);
    await h.sandbox.deliveries.idle();
    expect((await api(h, 'GET', '/v1/subscriptions?customerId=sam')).body.data[0].productKey).toBe(
      'pro',
    );
    // The renewal charges the plan and the three seats.
    h.now = at('2026-04-01T00:00:01');
    await stripe.subscriptions.list({ limit: 1 });
    await h.sandbox.deliveries.idle();
    h.now = at('2026-04-01T02:00:00');
    await stripe.subscriptions.list({ limit: 1 });
    const invoices = await stripe.invoices.list({
      subscription: subscription.processorSubscriptionId,
    });
    const renewal = invoices.data.find((i) => i.billing_reason === 'subscription_cycle');
    expect([renewal?.status, renewal?.amount_paid]).toEqual(['paid', 3500]);
  });
});
