/**
 * Purchase refunds end to end over HTTP (row 18): both modes with their amounts, the
 * grant revoked, idempotent replays, a reused key, the 400/404/409 cases, the refund at
 * the processor through the payment's charge, and a crash (`kill -9`) between the
 * processor's refund and Tally's answer, repaired by the retry or by `charge.refunded`.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, buy, eventually, startHarness, type Harness } from './support/commerce-harness.js';

const CONFIG = {
  entitlements: {
    reports: { type: 'feature' },
    api_calls: { type: 'meter', reset: 'month' },
  },
  products: {
    free: { name: 'Free', default: true, entitlements: {} },
    credits_5k: {
      name: '5k API credits',
      price: { amount: 1000, currency: 'usd' },
      grants: { api_calls: 5000 },
    },
    reports_pack: {
      name: 'Reports and credits',
      price: { amount: 700, currency: 'usd' },
      entitlements: { reports: true },
      grants: { api_calls: 100 },
    },
  },
};

describe('purchase refunds', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(CONFIG, Date.now());
  }, 60_000);
  afterAll(async () => {
    await h?.close();
  });

  async function purchaseOf(customerId: string) {
    const listed = await api(h, 'GET', `/v1/purchases?customerId=${customerId}`);
    return listed.body.data[0] as { id: string; status: string; refundedAmount: number };
  }
  const balance = async (customerId: string) =>
    (await api(h, 'GET', `/v1/usage/api_calls/balance?customerId=${customerId}`)).body.balance;
  const refund = (id: string, body: unknown) =>
    api(h, 'POST', `/v1/purchases/${encodeURIComponent(id)}/refunds`, body);
  async function chargeOf(purchaseId: string) {
    const paymentIntent = await h.sandbox
      .stripe()
      .paymentIntents.retrieve(purchaseId.slice('stripe:'.length), { expand: ['latest_charge'] });
    return paymentIntent.latest_charge as {
      amount_refunded: number;
      refunded: boolean;
      id: string;
    };
  }

  it('5,000 credits for 1,000: use 1,000, prorated returns 800 and revokes 4,000', async () => {
    await buy(h, 'pam', 'credits_5k');
    const purchase = await purchaseOf('pam');
    const used = await api(h, 'POST', '/v1/usage/api_calls/consume', {
      customerId: 'pam',
      amount: 1000,
    });
    expect(used.body).toMatchObject({ balance: 4000, consumed: 1000 });

    const missingKey = await refund(purchase.id, { mode: 'prorated' });
    expect([missingKey.status, missingKey.body.error]).toEqual([
      400,
      expect.stringMatching(/idempotencyKey/),
    ]);
    const badMode = await refund(purchase.id, { mode: 'half', idempotencyKey: 'k' });
    expect([badMode.status, badMode.body.error]).toEqual([400, expect.stringMatching(/mode/)]);

    const first = await refund(purchase.id, { mode: 'prorated', idempotencyKey: 'r-1' });
    expect([first.status, first.body]).toEqual([
      200,
      {
        id: purchase.id,
        status: 'partially_refunded',
        refund: { amount: 800, currency: 'usd', mode: 'prorated' },
      },
    ]);
    expect(await balance('pam')).toBe(0);
    expect(await chargeOf(purchase.id)).toMatchObject({ amount_refunded: 800, refunded: false });
    expect(await purchaseOf('pam')).toMatchObject({
      status: 'partially_refunded',
      refundedAmount: 800,
    });

    // The same key and body: the same answer, no second refund.
    const again = await refund(purchase.id, { mode: 'prorated', idempotencyKey: 'r-1' });
    expect([again.status, again.body]).toEqual([200, first.body]);
    expect((await chargeOf(purchase.id)).amount_refunded).toBe(800);
    // The same key with another body: 400, nothing refunded.
    const reused = await refund(purchase.id, { mode: 'full', idempotencyKey: 'r-1' });
    expect([reused.status, reused.body.code]).toEqual([400, 'idempotency_key_reused']);
    // Nothing unused is left for a second prorated refund.
    const none = await refund(purchase.id, { mode: 'prorated', idempotencyKey: 'r-2' });
    expect([none.status, none.body.code]).toEqual([409, 'already_refunded']);

    // Full returns what is left of the money.
    const rest = await refund(purchase.id, { mode: 'full', idempotencyKey: 'r-3' });
    expect(rest.body).toEqual({
      id: purchase.id,
      status: 'refunded',
      refund: { amount: 200, currency: 'usd', mode: 'full' },
    });
    expect(await chargeOf(purchase.id)).toMatchObject({ amount_refunded: 1000, refunded: true });
    const twice = await refund(purchase.id, { mode: 'full', idempotencyKey: 'r-4' });
    expect([twice.status, twice.body.code]).toEqual([409, 'already_refunded']);
    await h.sandbox.deliveries.idle();
    expect(await purchaseOf('pam')).toMatchObject({ status: 'refunded', refundedAmount: 1000 });

    const audit = await api(h, 'GET', '/v1/audit?action=purchase.refund');
    expect(audit.body.data.map((e: { data: { amount: number; mode: string } }) => e.data)).toEqual([
      expect.objectContaining({ amount: 200, mode: 'full', idempotencyKey: 'r-3' }),
      expect.objectContaining({ amount: 800, mode: 'prorated', idempotencyKey: 'r-1' }),
    ]);
    expect(audit.body.data[0]).toMatchObject({ resourceType: 'purchase', resourceId: 'pam' });
  });

  it('a usage refund after a purchase refund gives nothing back to the revoked lot', async () => {
    await buy(h, 'quinn', 'credits_5k');
    const purchase = await purchaseOf('quinn');
    await api(h, 'POST', '/v1/usage/api_calls/consume', { customerId: 'quinn', amount: 300 });
    const full = await refund(purchase.id, { mode: 'full', idempotencyKey: 'q' });
    expect(full.body.refund.amount).toBe(1000);
    expect(await balance('quinn')).toBe(0);
    const back = await api(h, 'POST', '/v1/usage/api_calls/refund', {
      customerId: 'quinn',
      amount: 300,
    });
    expect(back.body).toMatchObject({ consumed: 0, balance: 0 });
  });

  it('prorated only for a single credit lot; unknown purchases are 404', async () => {
    await buy(h, 'rae', 'reports_pack');
    const purchase = await purchaseOf('rae');
    const refused = await refund(purchase.id, { mode: 'prorated', idempotencyKey: 'p' });
    expect([refused.status, refused.body.code]).toEqual([400, 'refund_mode_not_allowed']);
    expect(refused.body.error).toContain('features or limits');
    const has = async () =>
      (await api(h, 'GET', '/v1/entitlements/reports/has?customerId=rae')).body;
    expect(await has()).toBe(true);
    // The failed attempt recorded nothing: its key can be used again.
    const full = await refund(purchase.id, { mode: 'full', idempotencyKey: 'p' });
    expect(full.body).toMatchObject({ status: 'refunded', refund: { amount: 700 } });
    expect(await has()).toBe(false);
    expect(await balance('rae')).toBe(0);

    for (const id of ['stripe:pi_nothing', 'other:pi_1', 'pi_1']) {
      const unknown = await refund(id, { mode: 'full', idempotencyKey: 'x' });
      expect([unknown.status, unknown.body.code]).toEqual([404, 'purchase_not_found']);
    }
    // Another environment's key does not find it.
    const live = await fetch(
      `${h.server.base}/v1/purchases/${encodeURIComponent(purchase.id)}/refunds`,
      {
        method: 'POST',
        headers: { 'x-tally-key': h.server.keys.live.server, 'content-type': 'application/json' },
        body: JSON.stringify({ mode: 'full', idempotencyKey: 'x' }),
      },
    );
    expect(live.status).toBe(404);
  });

  it('a crash between the processor refund and the answer: the retry refunds once', async () => {
    await buy(h, 'sal', 'credits_5k');
    const purchase = await purchaseOf('sal');
    await api(h, 'POST', '/v1/usage/api_calls/consume', { customerId: 'sal', amount: 2500 });
    // The refund's events would repair the record too; this case is about the retry.
    await h.sandbox.stripe().webhookEndpoints.update(h.webhookEndpointId, { disabled: true });
    h.proxy.crashOn = (method, path) => method === 'POST' && path.startsWith('/v1/refunds');
    const body = { mode: 'prorated', idempotencyKey: 'crash-1' };
    const crashed = await refund(purchase.id, body).catch((error: unknown) => error);
    expect(crashed).toBeInstanceOf(Error);
    expect((await chargeOf(purchase.id)).amount_refunded).toBe(500);
    await h.restart();
    await h.sandbox.stripe().webhookEndpoints.update(h.webhookEndpointId, { disabled: false });
    const retried = await refund(purchase.id, body);
    expect(retried.body).toEqual({
      id: purchase.id,
      status: 'partially_refunded',
      refund: { amount: 500, currency: 'usd', mode: 'prorated' },
    });
    expect((await chargeOf(purchase.id)).amount_refunded).toBe(500);
    const refunds = await h.sandbox.stripe().refunds.list({ payment_intent: purchase.id.slice(7) });
    expect(refunds.data).toHaveLength(1);
    expect(await balance('sal')).toBe(0);
    expect(await purchaseOf('sal')).toMatchObject({ refundedAmount: 500 });
  }, 60_000);

  it('a crash after the processor refund, no retry: charge.refunded records it', async () => {
    await buy(h, 'tod', 'credits_5k');
    const purchase = await purchaseOf('tod');
    h.proxy.crashOn = (method, path) => method === 'POST' && path.startsWith('/v1/refunds');
    const crashed = await refund(purchase.id, { mode: 'full', idempotencyKey: 'crash-2' }).catch(
      (error: unknown) => error,
    );
    expect(crashed).toBeInstanceOf(Error);
    await h.restart();
    await h.sandbox.deliveries.idle();
    await eventually(async () => (await purchaseOf('tod')).status === 'refunded', 'the record');
    expect(await purchaseOf('tod')).toMatchObject({ refundedAmount: 1000 });
    expect(await balance('tod')).toBe(0);
    // The retry now answers what was recorded, and the processor refunded once.
    const retried = await refund(purchase.id, { mode: 'full', idempotencyKey: 'crash-2' });
    expect(retried.body).toMatchObject({ status: 'refunded', refund: { amount: 1000 } });
    expect((await chargeOf(purchase.id)).amount_refunded).toBe(1000);
    const audit = await api(h, 'GET', '/v1/audit?action=purchase.refund');
    expect(audit.body.data[0]).toMatchObject({ actor: 'processor:stripe', resourceId: 'tod' });
  }, 60_000);
});
