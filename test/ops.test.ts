/**
 * The op table (actors/ops.ts): every op has a record whose wire code is its index, whose
 * wire slots carry the command there and back unchanged, and whose read/write split and
 * audit entry are the ones the API documents.
 */
import { describe, expect, it } from 'vitest';
import type { Command } from '../actors/customer.js';
import { auditOf, isRead, OPS, OPS_BY_CODE, type Op } from '../actors/ops.js';
import { decodeBatch, pushCommand, type WireBatch } from '../actors/protocol.js';

const at = { environment: 'live', customerId: 'c1' } as const;

/** One command per op, with every optional field present (and a second without, below). */
const SAMPLES: { readonly [O in Op]: Extract<Command, { op: O }> } = {
  has: { op: 'has', ...at, key: 'sso' },
  limit: { op: 'limit', ...at, key: 'seats' },
  balance: { op: 'balance', ...at, key: 'api_calls' },
  consume: {
    op: 'consume',
    ...at,
    key: 'api_calls',
    amountMicros: 1_500_000n,
    idempotencyKey: 'k1',
  },
  refund: { op: 'refund', ...at, key: 'api_calls', amountMicros: 2n, idempotencyKey: 'k2' },
  limitSettings: {
    op: 'limitSettings',
    ...at,
    key: 'seats',
    purchased: 3,
    autoExpansionEnabled: true,
  },
  usageSettings: { op: 'usageSettings', ...at, key: 'api_calls', overageEnabled: true },
  grantLot: { op: 'grantLot', ...at, key: 'api_calls', lotId: 'lot1', amountMicros: 7n },
  getContract: { op: 'getContract', ...at, key: '' },
  putContract: {
    op: 'putContract',
    ...at,
    key: '',
    contract: { priceAmount: 100, priceInterval: 'year', entitlements: { seats: { included: 9 } } },
  },
  deleteContract: { op: 'deleteContract', ...at, key: '' },
  upsertCustomer: {
    op: 'upsertCustomer',
    ...at,
    key: '',
    patch: { name: 'Ada', metadata: { tier: 2 } },
  },
  context: {
    op: 'context',
    ...at,
    key: '',
    patch: { email: null },
    request: { features: ['sso'], usage: ['api_calls'], limits: [] },
  },
  getCommerce: { op: 'getCommerce', ...at, key: '' },
  setProcessorCustomer: {
    op: 'setProcessorCustomer',
    ...at,
    key: '',
    processorCustomerId: 'cus_2',
    replaces: 'cus_1',
  },
  syncSubscription: {
    op: 'syncSubscription',
    ...at,
    key: '',
    eventId: 'evt_1',
    subscription: {
      productKey: 'pro',
      status: 'active',
      currentPeriodStartMs: 1,
      currentPeriodEndMs: 2,
      cancelAtPeriodEnd: false,
      processor: 'stripe',
      processorSubscriptionId: 'sub_1',
    },
  },
  recordPurchase: {
    op: 'recordPurchase',
    ...at,
    key: '',
    eventId: null,
    purchase: { id: 'stripe:pi_1', productKey: 'pack', amount: 500, currency: 'usd' },
  },
  quoteRefund: {
    op: 'quoteRefund',
    ...at,
    key: '',
    request: {
      target: 'purchase',
      targetId: 'stripe:pi_1',
      mode: 'prorated',
      idempotencyKey: 'r1',
    },
  },
  recordRefund: {
    op: 'recordRefund',
    ...at,
    key: '',
    refund: {
      target: 'subscription',
      targetId: 'stripe:sub_1',
      mode: 'full',
      idempotencyKey: null,
      amount: 2000,
      currency: 'usd',
      processorRefundId: 're_1',
    },
  },
  overageDue: {
    op: 'overageDue',
    ...at,
    key: '',
    period: { subscriptionId: 'stripe:sub_1', periodStartMs: 1 },
  },
  recordOverageBill: {
    op: 'recordOverageBill',
    ...at,
    key: '',
    bill: {
      subscriptionId: 'stripe:sub_1',
      periodStartMs: 1,
      periodEndMs: 2,
      invoiceId: 'in_1',
      currency: 'usd',
      lines: [
        { meterKey: 'api_calls', micros: 3n, unitAmount: 2, amount: 0, processorItemId: 'ii_1' },
      ],
    },
  },
};

const WITHOUT_OPTIONALS: readonly Command[] = [
  { op: 'consume', ...at, key: 'api_calls', amountMicros: 1n },
  { op: 'refund', ...at, key: 'api_calls', amountMicros: 1n },
  { op: 'limitSettings', ...at, key: 'seats' },
  { op: 'setProcessorCustomer', ...at, key: '', processorCustomerId: 'cus_1' },
];

function roundTrip(command: Command): Command {
  const wire: WireBatch = [];
  pushCommand(wire, 1, command);
  const [envelope] = decodeBatch(wire);
  return envelope?.command as Command;
}

describe('op table', () => {
  it('has one record per op, its wire code being its index', () => {
    expect(OPS_BY_CODE.map((record) => record.op).sort()).toEqual(Object.keys(SAMPLES).sort());
    OPS_BY_CODE.forEach((record, code) =>
      expect([record.code, OPS[record.op]]).toEqual([code, record]),
    );
  });

  it('carries every command over the wire and back unchanged', () => {
    for (const command of [...Object.values(SAMPLES), ...WITHOUT_OPTIONALS])
      expect(roundTrip(command)).toEqual(command);
  });

  it('carries the audit tag with the command', () => {
    const wire: WireBatch = [];
    pushCommand(wire, 7, SAMPLES.refund, { actor: 'key_1', ref: 'abc.1' });
    expect(decodeBatch(wire)).toEqual([
      { id: 7, command: SAMPLES.refund, audit: { actor: 'key_1', ref: 'abc.1' } },
    ]);
  });

  it('splits reads from writes', () => {
    const reads = Object.values(SAMPLES)
      .filter((command) => isRead(command))
      .map((command) => command.op);
    expect(reads.sort()).toEqual([
      'balance',
      'getCommerce',
      'getContract',
      'has',
      'limit',
      'overageDue',
      'quoteRefund',
    ]);
  });

  it('derives the audit entry of each audited write from the command', () => {
    const actions = Object.fromEntries(
      Object.values(SAMPLES).map((command) => [command.op, auditOf(command)?.action ?? null]),
    );
    expect(actions).toEqual({
      has: null,
      limit: null,
      balance: null,
      consume: null,
      refund: 'usage.refund',
      limitSettings: 'limit.settings',
      usageSettings: 'usage.settings',
      grantLot: null,
      getContract: null,
      putContract: 'contract.put',
      deleteContract: 'contract.delete',
      upsertCustomer: 'customer.upsert',
      context: 'customer.upsert',
      getCommerce: null,
      setProcessorCustomer: null,
      syncSubscription: 'subscription.sync',
      recordPurchase: 'purchase.record',
      quoteRefund: null,
      recordRefund: 'subscription.refund',
      overageDue: null,
      recordOverageBill: null,
    });
    expect(auditOf(SAMPLES.refund)).toEqual({
      action: 'usage.refund',
      resourceType: 'meter',
      resourceId: 'c1',
      data: { key: 'api_calls', amount: 0.000002, idempotencyKey: 'k2' },
    });
    expect(auditOf(WITHOUT_OPTIONALS[2] as Command)?.data).toEqual({ key: 'seats' });
  });
});
