/**
 * Overage billed to the processor end to end: consumption past the included allowance with
 * overage on, a renewal (the sandbox drafts the ended period's invoice), and the renewal
 * invoice carrying that overage exactly once: with the event delivered twice, and with Tally
 * killed after adding the invoice item and before recording it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, buy, eventually, startHarness, type Harness } from './support/commerce-harness.js';

const CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'month' } },
  products: {
    free: { name: 'Free', default: true, entitlements: { api_calls: { included: 10 } } },
    pro: {
      name: 'Pro',
      price: { amount: 2000, currency: 'usd', interval: 'month' },
      entitlements: { api_calls: { included: 1000, overage: { unitAmount: 2 } } },
    },
  },
};

const at = (iso: string): number => Date.parse(`${iso}Z`);

describe('overage billed at the end of the period', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(CONFIG, at('2026-03-01T00:00:00'));
  }, 60_000);
  afterAll(async () => {
    await h?.close();
  });

  /** Moves the sandbox's clock and lets it bill what is due (any request does). */
  async function moveTo(iso: string): Promise<void> {
    h.now = at(iso);
    await h.sandbox.stripe().subscriptions.list({ limit: 1 });
    await h.sandbox.deliveries.idle();
  }

  async function subscribeAndUse(customerId: string, calls: number): Promise<string> {
    await buy(h, customerId, 'pro');
    const enabled = await api(h, 'POST', '/v1/usage/api_calls/settings', {
      customerId,
      overageEnabled: true,
    });
    expect(enabled.status).toBe(200);
    const used = await api(h, 'POST', '/v1/usage/api_calls/consume', { customerId, amount: calls });
    expect(used.body).toMatchObject({ consumed: calls, overage: calls - 1000 });
    const listed = await api(h, 'GET', `/v1/subscriptions?customerId=${customerId}`);
    return listed.body.data[0].processorSubscriptionId as string;
  }

  async function cycleInvoice(subscriptionId: string) {
    const invoices = await h.sandbox.stripe().invoices.list({ subscription: subscriptionId });
    const cycle = invoices.data.filter((i) => i.billing_reason === 'subscription_cycle');
    expect(cycle).toHaveLength(1);
    return cycle[0] as (typeof cycle)[number];
  }

  it('the renewal invoice carries the period’s overage once', async () => {
    await moveTo('2026-03-01T00:00:00');
    const subscription = await subscribeAndUse('oli', 1250);
    await moveTo('2026-04-01T00:00:01');
    const draft = await cycleInvoice(subscription);
    expect(draft.status).toBe('draft');
    const overage = draft.lines.data.filter((l) => l.metadata?.tally_overage_meter === 'api_calls');
    // 250 calls over the allowance at 2 cents each.
    expect(overage.map((l) => [l.amount, l.period.start, l.period.end])).toEqual([
      [500, at('2026-03-01T00:00:00') / 1000, at('2026-04-01T00:00:00') / 1000],
    ]);
    // The event again (a duplicate delivery): nothing is added twice.
    const created = await h.sandbox.stripe().events.list({ type: 'invoice.created', limit: 1 });
    h.sandbox.deliveries.redeliver(created.data[0]?.id ?? '');
    await h.sandbox.deliveries.idle();
    // And again after a restart.
    await h.server.stop();
    await h.restart();
    h.sandbox.deliveries.redeliver(created.data[0]?.id ?? '');
    await h.sandbox.deliveries.idle();
    await moveTo('2026-04-01T02:00:00');
    const paid = await cycleInvoice(subscription);
    expect([paid.status, paid.amount_paid]).toEqual(['paid', 2500]);
    expect(paid.lines.data.map((l) => l.amount).sort()).toEqual([2000, 500]);
    // The new period starts without overage.
    const balance = await api(h, 'GET', '/v1/usage/api_calls/balance?customerId=oli');
    expect(balance.body).toMatchObject({ overage: 0, consumed: 0 });
  }, 60_000);

  it('a crash after the invoice item is added, before it is recorded: billed once', async () => {
    await moveTo('2026-04-05T00:00:00');
    const subscription = await subscribeAndUse('pia', 1100);
    h.proxy.crashOn = (method, path) => method === 'POST' && path.startsWith('/v1/invoiceitems');
    h.now = at('2026-05-05T00:00:01');
    await h.sandbox.stripe().subscriptions.list({ limit: 1 });
    await eventually(async () => h.proxy.crashOn === null, 'the crash');
    await new Promise((resolve) => setTimeout(resolve, 200));
    await h.restart();
    await h.sandbox.deliveries.idle();
    await moveTo('2026-05-05T02:00:00');
    const paid = await cycleInvoice(subscription);
    expect([paid.status, paid.amount_paid]).toEqual(['paid', 2200]);
    const items = await h.sandbox.stripe().invoiceItems.list({ invoice: paid.id ?? '' });
    expect(items.data.map((i) => i.amount)).toEqual([200]);
  }, 60_000);
});
