/**
 * The commerce ops of the pure core: a live subscription makes its product the plan and
 * gives meters that reset at its interval its billing period; a processor event applies
 * once; a purchase grants its credit lots once; the processor customer is set once; and
 * all of it survives replay and the snapshot form.
 */
import { describe, expect, it } from 'vitest';
import {
  fromSnapshot,
  toSnapshot,
  type Command,
  type CustomerState,
  type SubscriptionInput,
} from '../actors/customer.js';
import { compileConfig } from '../actors/billing-config.js';
import { CONFIG, Driver, T0, throughCodec } from './support/core-fixtures.js';

const at = { environment: 'test', customerId: 'ada', key: '' } as const;
const DAY = 86_400_000;

function subscription(status: string, startMs: number, productKey = 'pro'): SubscriptionInput {
  return {
    productKey,
    status,
    currentPeriodStartMs: startMs,
    currentPeriodEndMs: startMs + 30 * DAY,
    cancelAtPeriodEnd: false,
    processor: 'stripe',
    processorSubscriptionId: 'sub_1',
  };
}

function sync(eventId: string | null, input: SubscriptionInput): Command {
  return { op: 'syncSubscription', ...at, eventId, subscription: input };
}

const has = (d: Driver, key: string, now: number) => d.run({ op: 'has', ...at, key }, now);
const balance = (d: Driver, key: string, now: number) => d.run({ op: 'balance', ...at, key }, now);

describe('commerce in the customer actor', () => {
  it('a live subscription is the plan; canceled, the default product is again', () => {
    const d = new Driver();
    expect(has(d, 'audit', T0)).toMatchObject({ kind: 'has', value: false });
    expect(d.run(sync('evt_1', subscription('active', T0)), T0).kind).toBe('commerce');
    expect(has(d, 'audit', T0)).toMatchObject({ kind: 'has', value: true });
    // The plan's grants replace the default product's: pro grants no sso and no api_calls.
    expect(has(d, 'sso', T0)).toMatchObject({ kind: 'has', value: false });
    d.run(sync('evt_2', subscription('canceled', T0)), T0 + 1);
    expect(has(d, 'audit', T0 + 1)).toMatchObject({ kind: 'has', value: false });
    expect(has(d, 'sso', T0 + 1)).toMatchObject({ kind: 'has', value: true });
  });

  it(
    'meters resetting at the plan interval follow the subscription period; others keep the ' +
      'calendar',
    () => {
      const d = new Driver();
      d.run(
        {
          op: 'grantLot',
          environment: 'test',
          customerId: 'ada',
          key: 'api_calls',
          lotId: 'l1',
          amountMicros: 1_000_000_000n,
        },
        T0,
      );
      d.run(
        {
          op: 'consume',
          environment: 'test',
          customerId: 'ada',
          key: 'api_calls',
          amountMicros: 150_000_000n,
        },
        T0,
      );
      d.run(
        {
          op: 'consume',
          environment: 'test',
          customerId: 'ada',
          key: 'tokens',
          amountMicros: 5_000_000n,
        },
        T0,
      );
      const start = T0 + DAY;
      d.run(sync('evt_1', subscription('active', start)), T0 + 2);
      const monthly = balance(d, 'api_calls', T0 + 3);
      // A new billing period: nothing consumed in it yet; it resets at the period's end.
      expect(monthly).toMatchObject({
        kind: 'balance',
        view: { consumed: 0, resets: new Date(start + 30 * DAY).toISOString() },
      });
      expect(balance(d, 'tokens', T0 + 3)).toMatchObject({ view: { consumed: 5 } });
      d.run(
        {
          op: 'consume',
          environment: 'test',
          customerId: 'ada',
          key: 'api_calls',
          amountMicros: 7_000_000n,
        },
        T0 + 4,
      );
      expect(balance(d, 'api_calls', T0 + 5)).toMatchObject({ view: { consumed: 7 } });
      // The renewal moves the period on: usage resets.
      d.run(sync('evt_2', subscription('active', start + 30 * DAY)), T0 + 6);
      expect(balance(d, 'api_calls', T0 + 7)).toMatchObject({ view: { consumed: 0 } });
    },
  );

  it(
    'applies a processor event once, ' + 'and an unchanged subscription only remembers the event',
    () => {
      const d = new Driver();
      d.run(sync('evt_1', subscription('active', T0)), T0);
      const events = d.journal.length;
      d.run(sync('evt_1', subscription('canceled', T0)), T0 + 1);
      expect(d.journal.length).toBe(events);
      expect(has(d, 'audit', T0 + 1)).toMatchObject({ kind: 'has', value: true });
      d.run(sync('evt_2', subscription('active', T0)), T0 + 2);
      expect(d.journal.slice(events).map((e) => e.type)).toEqual(['processorEventNoted']);
    },
  );

  it('an older read of the subscription arriving last changes nothing', () => {
    const d = new Driver();
    d.run(sync('evt_1', subscription('active', T0 + 30 * DAY)), T0);
    d.run(sync('evt_2', subscription('active', T0)), T0 + 1);
    expect(d.run({ op: 'getCommerce', ...at }, T0 + 2)).toMatchObject({
      view: { subscriptions: [{ currentPeriodStart: new Date(T0 + 30 * DAY).toISOString() }] },
    });
    d.run(sync('evt_3', subscription('canceled', T0 + 30 * DAY)), T0 + 3);
    d.run(sync('evt_4', subscription('active', T0 + 30 * DAY)), T0 + 4);
    expect(has(d, 'audit', T0 + 5)).toMatchObject({ kind: 'has', value: false });
  });

  it('a purchase grants its credit lots once, named by the purchase id', () => {
    const d = new Driver();
    const purchase = { id: 'stripe:pi_1', productKey: 'pack', amount: 500, currency: 'usd' };
    const out = d.run({ op: 'recordPurchase', ...at, eventId: 'evt_1', purchase }, T0);
    expect(out).toMatchObject({
      kind: 'commerce',
      view: {
        purchases: [
          {
            id: 'stripe:pi_1',
            status: 'paid',
            amount: 500,
            currency: 'usd',
            refundedAmount: 0,
            grant: { api_calls: 50 },
          },
        ],
      },
    });
    expect(d.journal.map((e) => e.type)).toEqual(['purchaseRecorded', 'lotGranted']);
    expect(balance(d, 'api_calls', T0)).toMatchObject({ view: { balance: 150 } });
    d.run({ op: 'recordPurchase', ...at, eventId: 'evt_2', purchase }, T0 + 1);
    expect(balance(d, 'api_calls', T0 + 1)).toMatchObject({ view: { balance: 150 } });
  });

  it('a paid one-time product adds its features and limits to the plan', () => {
    const config = compileConfig(
      {
        ...CONFIG,
        products: {
          ...CONFIG.products,
          addon: {
            price: { amount: 900, currency: 'usd' },
            entitlements: { audit: true, seats: { included: 3 } },
          },
        },
      },
      2,
    );
    const d = new Driver(config);
    expect(has(d, 'audit', T0)).toMatchObject({ kind: 'has', value: false });
    d.run(
      {
        op: 'recordPurchase',
        ...at,
        eventId: 'evt_1',
        purchase: { id: 'stripe:pi_9', productKey: 'addon', amount: 900, currency: 'usd' },
      },
      T0,
    );
    expect(has(d, 'audit', T0)).toMatchObject({ kind: 'has', value: true });
    expect(d.run({ op: 'limit', ...at, key: 'seats' }, T0)).toMatchObject({
      view: { limit: 8, included: 8 },
    });
  });

  it('context answers the live subscription when asked', () => {
    const d = new Driver();
    const ask = (now: number) =>
      d.run(
        {
          op: 'context',
          ...at,
          patch: {},
          request: { features: [], usage: [], limits: [], subscription: true },
        },
        now,
      );
    expect(ask(T0)).toMatchObject({ kind: 'context', view: { subscription: null } });
    d.run(sync('evt_1', subscription('active', T0)), T0);
    expect(ask(T0 + 1)).toMatchObject({
      view: {
        subscription: {
          id: 'stripe:sub_1',
          productKey: 'pro',
          status: 'active',
          currentPeriodStart: new Date(T0).toISOString(),
        },
      },
    });
    const plain = d.run(
      { op: 'context', ...at, patch: {}, request: { features: [], usage: [], limits: [] } },
      T0 + 2,
    );
    expect(plain.kind === 'context' && 'subscription' in plain.view).toBe(false);
  });

  it('keeps the first processor customer, unless a new one replaces it', () => {
    const d = new Driver();
    d.run({ op: 'setProcessorCustomer', ...at, processorCustomerId: 'cus_1' }, T0);
    const second = d.run(
      { op: 'setProcessorCustomer', ...at, processorCustomerId: 'cus_2' },
      T0 + 1,
    );
    expect(second).toMatchObject({ kind: 'commerce', view: { processorCustomerId: 'cus_1' } });
    const stale = d.run(
      { op: 'setProcessorCustomer', ...at, processorCustomerId: 'cus_3', replaces: 'cus_0' },
      T0 + 2,
    );
    expect(stale).toMatchObject({ view: { processorCustomerId: 'cus_1' } });
    const replaced = d.run(
      { op: 'setProcessorCustomer', ...at, processorCustomerId: 'cus_4', replaces: 'cus_1' },
      T0 + 3,
    );
    expect(replaced).toMatchObject({ view: { processorCustomerId: 'cus_4' } });
  });

  it('replay and the snapshot form rebuild the commerce state', () => {
    const d = new Driver();
    d.run({ op: 'setProcessorCustomer', ...at, processorCustomerId: 'cus_1' }, T0);
    d.run(sync('evt_1', subscription('active', T0)), T0);
    d.run(
      {
        op: 'recordPurchase',
        ...at,
        eventId: 'evt_2',
        purchase: { id: 'stripe:pi_1', productKey: 'pack', amount: 500, currency: 'usd' },
      },
      T0,
    );
    const live = d.customers.get('test\u0000ada') as CustomerState;
    expect(d.replayed().get('test\u0000ada')).toEqual(live);
    expect(fromSnapshot(throughCodec(toSnapshot(live)))).toEqual(live);
  });
});

describe('refunds in the customer actor', () => {
  const purchase = { id: 'stripe:pi_1', productKey: 'pack', amount: 500, currency: 'usd' };
  const request = (mode: 'prorated' | 'full', idempotencyKey: string | null) =>
    ({ target: 'purchase', targetId: purchase.id, mode, idempotencyKey }) as const;
  const quote = (d: Driver, mode: 'prorated' | 'full', key: string | null, now: number) =>
    d.run({ op: 'quoteRefund', ...at, request: request(mode, key) }, now);
  const record = (d: Driver, mode: 'prorated' | 'full', key: string, amount: number, now: number) =>
    d.run(
      {
        op: 'recordRefund',
        ...at,
        refund: {
          ...request(mode, key),
          amount,
          currency: 'usd',
          processorRefundId: `re_${key}_${mode}`,
        },
      },
      now,
    );

  function bought(): Driver {
    const d = new Driver();
    d.run({ op: 'recordPurchase', ...at, eventId: 'evt_1', purchase }, T0);
    // 100 included, then 20 of the lot's 50 credits.
    d.run({ op: 'consume', ...at, key: 'api_calls', amountMicros: 120_000_000n }, T0);
    return d;
  }

  it('prorated returns price × unused / granted and revokes the unused credits', () => {
    const d = bought();
    expect(quote(d, 'prorated', 'k1', T0)).toEqual({
      kind: 'refundQuote',
      view: { recorded: null, amount: 300, currency: 'usd' },
    });
    const answer = {
      kind: 'refund',
      view: {
        id: purchase.id,
        status: 'partially_refunded',
        refund: { amount: 300, currency: 'usd', mode: 'prorated' },
      },
    };
    expect(record(d, 'prorated', 'k1', 300, T0 + 1)).toEqual(answer);
    expect(d.journal.at(-1)).toMatchObject({
      type: 'purchaseRefunded',
      purchaseId: purchase.id,
      refundedAmount: 300,
      revoked: [['api_calls', 30_000_000n]],
    });
    expect(balance(d, 'api_calls', T0 + 1)).toMatchObject({ view: { balance: 0 } });
    // A replay answers the same and journals nothing; the other mode under the key is refused.
    const journaled = d.journal.length;
    expect(record(d, 'prorated', 'k1', 300, T0 + 2)).toEqual(answer);
    expect(quote(d, 'prorated', 'k1', T0 + 2)).toMatchObject({ view: { recorded: answer.view } });
    expect(d.journal.length).toBe(journaled);
    for (const out of [quote(d, 'full', 'k1', T0 + 2), record(d, 'full', 'k1', 200, T0 + 2)])
      expect(out).toEqual({ kind: 'rejected', rejection: { kind: 'idempotency_key_reused' } });
    expect(quote(d, 'prorated', 'k2', T0 + 2)).toMatchObject({
      rejection: { kind: 'already_refunded' },
    });
    expect(quote(d, 'full', 'k3', T0 + 2)).toMatchObject({ view: { amount: 200 } });
    expect(record(d, 'full', 'k3', 200, T0 + 3)).toMatchObject({
      view: { status: 'refunded', refund: { amount: 200 } },
    });
    expect(quote(d, 'full', 'k4', T0 + 3)).toMatchObject({
      rejection: { kind: 'already_refunded' },
    });
    const live = d.customers.get('test\u0000ada') as CustomerState;
    expect(live.commerce?.refunds).toHaveLength(2);
    expect(d.replayed().get('test\u0000ada')).toEqual(live);
    expect(fromSnapshot(throughCodec(toSnapshot(live)))).toEqual(live);
  });

  it('refuses unknown targets; a subscription refund cancels it at once', () => {
    const d = new Driver();
    expect(quote(d, 'full', 'k', T0)).toMatchObject({
      rejection: { kind: 'refund_target_not_found', target: 'purchase' },
    });
    d.run(sync('evt_1', subscription('active', T0)), T0);
    expect(has(d, 'audit', T0)).toMatchObject({ kind: 'has', value: true });
    const refund = {
      target: 'subscription',
      targetId: 'stripe:sub_1',
      mode: 'full',
      idempotencyKey: null,
      amount: 2000,
      currency: 'usd',
      processorRefundId: 're_1',
    } as const;
    expect(d.run({ op: 'recordRefund', ...at, refund }, T0 + 1)).toEqual({
      kind: 'refund',
      view: {
        id: 'stripe:sub_1',
        status: 'canceled',
        refund: { amount: 2000, currency: 'usd', mode: 'full' },
      },
    });
    expect(has(d, 'audit', T0 + 1)).toMatchObject({ kind: 'has', value: false });
    // Reported again (the charge.refunded event): recorded once.
    const journaled = d.journal.length;
    d.run({ op: 'recordRefund', ...at, refund }, T0 + 2);
    expect(d.journal.length).toBe(journaled);
    expect(
      d.run(
        {
          op: 'quoteRefund',
          ...at,
          request: {
            target: 'subscription',
            targetId: 'stripe:sub_1',
            mode: 'full',
            idempotencyKey: null,
          },
        },
        T0 + 2,
      ),
    ).toMatchObject({ rejection: { kind: 'already_refunded' } });
    // A late processor read of the subscription as active does not bring the plan back.
    d.run(sync('evt_2', subscription('active', T0)), T0 + 3);
    expect(has(d, 'audit', T0 + 3)).toMatchObject({ kind: 'has', value: false });
  });
});

describe('overage billed in the customer actor', () => {
  it('keeps the ended period’s overage after the meter moved on, and records a bill once', () => {
    const d = new Driver();
    d.run({ op: 'usageSettings', ...at, key: 'api_calls', overageEnabled: true }, T0);
    d.run({ op: 'consume', ...at, key: 'api_calls', amountMicros: 150_000_000n }, T0);
    const consumed = d.journal.at(-1);
    if (consumed?.type !== 'consumed') throw new Error('expected a consume');
    const period = { subscriptionId: 'stripe:sub_1', periodStartMs: consumed.periodStartMs };
    const due = (now: number) => d.run({ op: 'overageDue', ...at, period }, now);
    expect(due(T0)).toEqual({
      kind: 'overage',
      view: { billed: false, meters: [{ meterKey: 'api_calls', micros: '50000000' }] },
    });
    // A consume in the next month moves the meter on; the ended month's overage stays known.
    d.run({ op: 'consume', ...at, key: 'api_calls', amountMicros: 1_000_000n }, T0 + 40 * DAY);
    expect(due(T0 + 40 * DAY)).toMatchObject({ view: { meters: [{ micros: '50000000' }] } });
    const bill = {
      ...period,
      periodEndMs: period.periodStartMs + 31 * DAY,
      invoiceId: 'in_1',
      currency: 'usd',
      lines: [
        {
          meterKey: 'api_calls',
          micros: 50_000_000n,
          unitAmount: 1,
          amount: 50,
          processorItemId: 'ii_1',
        },
      ],
    };
    d.run({ op: 'recordOverageBill', ...at, bill }, T0 + 40 * DAY);
    expect(d.journal.at(-1)).toMatchObject({ type: 'overageBilled', bill });
    const journaled = d.journal.length;
    d.run({ op: 'recordOverageBill', ...at, bill }, T0 + 41 * DAY);
    expect(d.journal.length).toBe(journaled);
    expect(due(T0 + 41 * DAY)).toMatchObject({ view: { billed: true } });
    const live = d.customers.get('test\u0000ada') as CustomerState;
    expect(d.replayed().get('test\u0000ada')).toEqual(live);
    expect(fromSnapshot(throughCodec(toSnapshot(live)))).toEqual(live);
  });
});
