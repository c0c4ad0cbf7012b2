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
    api_calls: { type: 'meter', reset: 'month' },
  },
  products: {
    free: { name: 'Free', default: true, entitlements: { api_calls: { included: 10 } } },
    pro: {
      name: 'Pro',
      price: { amount: 2000, currency: 'usd', interval: 'month' },
      entitlements: { reports: true, api_calls: { included: 1000 } },
    },
    team: {
      name: 'Team',
      price: { amount: 5000, currency: 'usd', interval: 'month' },
      entitlements: { reports: true, exports: true, api_calls: { included: 5000 } },
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
