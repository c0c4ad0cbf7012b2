/**
 * The op table: one record per command op, holding everything the layers around the
 * core need to know about it, so that an op is described in one place.
 *
 * A record says whether the op reads or writes (the shard answers reads at once and
 * holds write replies until the journal is durable), which entitlement its `key` must
 * name (decide checks it), its wire code and slots (protocol.ts), the audit entry it
 * records, whether it rewrites the customer's index row, and what a success answers
 * with, which also says how that answer becomes a JSON body. Adding an op means its
 * command type (core/types.ts), a record here, its cases in decide and apply, and tests.
 * Pure: it imports only the core's types and amount formatting.
 */
import { assert } from '../shared/assert.js';
import type { EntitlementType } from './billing-config.js';
import { exactAmountValue, exactJson } from './fixed.js';
import type {
  Addressed,
  Command,
  ContextRequest,
  ContractInput,
  Outcome,
  ProfilePatch,
  PurchaseInput,
  ReadCommand,
  OverageBill,
  OveragePeriod,
  RefundInput,
  RefundRequest,
  SubscriptionInput,
} from './core/types.js';

export type Op = Command['op'];
export type CommandOf<O extends Op> = Extract<Command, { readonly op: O }>;

/** One op-specific slot of a command on the wire (protocol.ts, WireBatch). */
export type WireValue =
  | number
  | string
  | bigint
  | boolean
  | null
  | ContractInput
  | ProfilePatch
  | ContextRequest
  | SubscriptionInput
  | PurchaseInput
  | RefundRequest
  | RefundInput
  | OveragePeriod
  | OverageBill;

/** What the audit log records for an audited write, derived from the command alone. */
export interface AuditFields {
  readonly action: string;
  readonly resourceType: string;
  /** Always the customer's id: every shard write is one customer's. */
  readonly resourceId: string;
  readonly data: Readonly<Record<string, unknown>>;
}

/** What a success answers with (the outcome's kind), which also decides how it is rendered. */
export type Answer = Exclude<Outcome['kind'], 'rejected'>;

interface OpSpecOf<O extends Op, C = CommandOf<O>> {
  readonly op: O;
  /** The op's number on the wire, and its index in OPS_BY_CODE. */
  readonly code: number;
  /** Reads answer at once from memory; writes wait until their journal record is durable. */
  readonly access: 'read' | 'write';
  /**
   * What the command's `key` must name: an entitlement of this type, of any type
   * ('any'), or nothing (null: a customer-level op, whose key is '').
   */
  readonly entitlement: EntitlementType | 'any' | null;
  /** Whether a write that changed something changes the customer's index row. */
  readonly changesIndex: boolean;
  /**
   * Whether a write that changed nothing answers as a read, at once, rather than with the
   * group it was decided in (its answer then acknowledges no write).
   */
  readonly unchangedIsRead: boolean;
  /** The audit entry of a write (without its actor), or null when the op is not audited. */
  readonly audit: ((command: C) => AuditFields) | null;
  /** The two op-specific wire slots of a command. */
  readonly wireA: (command: C) => WireValue;
  readonly wireB: (command: C) => WireValue;
  /** The command read back from its address and wire slots (the inverse of wireA/wireB). */
  readonly fromWire: (address: Addressed, a: WireValue, b: WireValue) => C;
  /** What a success answers with. */
  readonly answer: Answer;
}

/** A table record: the op's spec and the rendering of its answer, with the command type erased. */
export interface OpRecord extends OpSpecOf<Op, Command> {
  /** The JSON body of a success outcome (a rejection is rendered by the front end). */
  readonly body: (outcome: Outcome) => string;
}

const none = (): null => null;
const booleanBody = (outcome: Outcome): string =>
  outcome.kind === 'has' && outcome.value ? 'true' : 'false';
const jsonBody = (outcome: Outcome): string => JSON.stringify(viewOf(outcome));
/** For replies carrying usage amounts: exact at 10^9 units and more (fixed.ts). */
const exactBody = (outcome: Outcome): string => exactJson(JSON.stringify(viewOf(outcome)));
const emptyBody = (): string => '';

/** How each kind of answer becomes a body. */
const BODIES: Readonly<Record<Answer, (outcome: Outcome) => string>> = {
  has: booleanBody,
  limit: jsonBody,
  balance: exactBody,
  contract: jsonBody,
  deleted: emptyBody,
  customer: jsonBody,
  context: exactBody,
  commerce: jsonBody,
  refund: jsonBody,
  refundQuote: jsonBody,
  overage: jsonBody,
};

function viewOf(outcome: Outcome): unknown {
  assert('view' in outcome, `a ${outcome.kind} outcome has no view`);
  return outcome.view;
}

/** Reads of one entitlement: nothing besides the address on the wire. */
function entitlementRead<O extends 'has' | 'limit' | 'balance'>(
  op: O,
  code: number,
  entitlement: EntitlementType | 'any',
): OpSpecOf<O> {
  return {
    op,
    code,
    access: 'read',
    entitlement,
    changesIndex: false,
    unchangedIsRead: false,
    audit: null,
    wireA: none,
    wireB: none,
    fromWire: (address) => ({ op, ...address }) as CommandOf<O>,
    answer: op,
  };
}

function customerUpsertAudit(command: {
  readonly customerId: string;
  readonly patch: ProfilePatch;
}): AuditFields {
  return {
    action: 'customer.upsert',
    resourceType: 'customer',
    resourceId: command.customerId,
    data: { ...command.patch },
  };
}

const OP_TABLE: { readonly [O in Op]: OpSpecOf<O> } = {
  has: entitlementRead('has', 0, 'any'),
  limit: entitlementRead('limit', 1, 'limit'),
  balance: entitlementRead('balance', 2, 'meter'),
  consume: {
    op: 'consume',
    code: 3,
    access: 'write',
    entitlement: 'meter',
    changesIndex: false,
    unchangedIsRead: false,
    audit: null,
    wireA: (command) => command.amountMicros,
    wireB: (command) => command.idempotencyKey ?? null,
    fromWire: (address, a, b) => ({
      op: 'consume',
      ...address,
      amountMicros: a as bigint,
      ...(b === null ? {} : { idempotencyKey: b as string }),
    }),
    answer: 'balance',
  },
  refund: {
    op: 'refund',
    code: 4,
    access: 'write',
    entitlement: 'meter',
    changesIndex: false,
    unchangedIsRead: false,
    audit: ({ customerId, key, amountMicros, idempotencyKey }) => ({
      action: 'usage.refund',
      resourceType: 'meter',
      resourceId: customerId,
      data: {
        key,
        amount: exactAmountValue(amountMicros),
        ...(idempotencyKey === undefined ? {} : { idempotencyKey }),
      },
    }),
    wireA: (command) => command.amountMicros,
    wireB: (command) => command.idempotencyKey ?? null,
    fromWire: (address, a, b) => ({
      op: 'refund',
      ...address,
      amountMicros: a as bigint,
      ...(b === null ? {} : { idempotencyKey: b as string }),
    }),
    answer: 'balance',
  },
  limitSettings: {
    op: 'limitSettings',
    code: 5,
    access: 'write',
    entitlement: 'limit',
    changesIndex: false,
    unchangedIsRead: false,
    audit: ({ customerId, key, purchased, autoExpansionEnabled }) => ({
      action: 'limit.settings',
      resourceType: 'limit',
      resourceId: customerId,
      data: {
        key,
        ...(purchased === undefined ? {} : { purchased }),
        ...(autoExpansionEnabled === undefined ? {} : { autoExpansionEnabled }),
      },
    }),
    wireA: (command) => command.purchased ?? null,
    wireB: (command) => command.autoExpansionEnabled ?? null,
    fromWire: (address, a, b) => ({
      op: 'limitSettings',
      ...address,
      ...(a === null ? {} : { purchased: a as number }),
      ...(b === null ? {} : { autoExpansionEnabled: b as boolean }),
    }),
    answer: 'limit',
  },
  usageSettings: {
    op: 'usageSettings',
    code: 6,
    access: 'write',
    entitlement: 'meter',
    changesIndex: false,
    unchangedIsRead: false,
    audit: ({ customerId, key, overageEnabled }) => ({
      action: 'usage.settings',
      resourceType: 'meter',
      resourceId: customerId,
      data: { key, overageEnabled },
    }),
    wireA: (command) => command.overageEnabled,
    wireB: none,
    fromWire: (address, a) => ({ op: 'usageSettings', ...address, overageEnabled: a as boolean }),
    answer: 'balance',
  },
  grantLot: {
    op: 'grantLot',
    code: 7,
    access: 'write',
    entitlement: 'meter',
    changesIndex: false,
    unchangedIsRead: false,
    audit: null,
    wireA: (command) => command.amountMicros,
    wireB: (command) => command.lotId,
    fromWire: (address, a, b) => ({
      op: 'grantLot',
      ...address,
      amountMicros: a as bigint,
      lotId: b as string,
    }),
    answer: 'balance',
  },
  getContract: {
    op: 'getContract',
    code: 8,
    access: 'read',
    entitlement: null,
    changesIndex: false,
    unchangedIsRead: false,
    audit: null,
    wireA: none,
    wireB: none,
    fromWire: (address) => ({ op: 'getContract', ...address }),
    answer: 'contract',
  },
  putContract: {
    op: 'putContract',
    code: 9,
    access: 'write',
    entitlement: null,
    changesIndex: false,
    unchangedIsRead: false,
    audit: ({ customerId, contract }) => ({
      action: 'contract.put',
      resourceType: 'contract',
      resourceId: customerId,
      data: contract,
    }),
    wireA: (command) => command.contract,
    wireB: none,
    fromWire: (address, a) => ({ op: 'putContract', ...address, contract: a as ContractInput }),
    answer: 'contract',
  },
  deleteContract: {
    op: 'deleteContract',
    code: 10,
    access: 'write',
    entitlement: null,
    changesIndex: false,
    unchangedIsRead: false,
    audit: ({ customerId }) => ({
      action: 'contract.delete',
      resourceType: 'contract',
      resourceId: customerId,
      data: {},
    }),
    wireA: none,
    wireB: none,
    fromWire: (address) => ({ op: 'deleteContract', ...address }),
    answer: 'deleted',
  },
  upsertCustomer: {
    op: 'upsertCustomer',
    code: 11,
    access: 'write',
    entitlement: null,
    changesIndex: true,
    unchangedIsRead: false,
    audit: customerUpsertAudit,
    wireA: (command) => command.patch,
    wireB: none,
    fromWire: (address, a) => ({ op: 'upsertCustomer', ...address, patch: a as ProfilePatch }),
    answer: 'customer',
  },
  context: {
    op: 'context',
    code: 12,
    access: 'write',
    entitlement: null,
    changesIndex: true,
    // The application's hot path repeats the same profile: an unchanged one is only a read.
    unchangedIsRead: true,
    // Audited like POST /v1/customers: a context call is an upsert that also reads.
    audit: customerUpsertAudit,
    wireA: (command) => command.patch,
    wireB: (command) => command.request,
    fromWire: (address, a, b) => ({
      op: 'context',
      ...address,
      patch: a as ProfilePatch,
      request: b as ContextRequest,
    }),
    answer: 'context',
  },
  getCommerce: {
    op: 'getCommerce',
    code: 13,
    access: 'read',
    entitlement: null,
    changesIndex: false,
    unchangedIsRead: false,
    audit: null,
    wireA: none,
    wireB: none,
    fromWire: (address) => ({ op: 'getCommerce', ...address }),
    answer: 'commerce',
  },
  setProcessorCustomer: {
    op: 'setProcessorCustomer',
    code: 14,
    access: 'write',
    entitlement: null,
    // It may create the customer (a checkout creates it implicitly).
    changesIndex: true,
    unchangedIsRead: false,
    audit: null,
    wireA: (command) => command.processorCustomerId,
    wireB: (command) => command.replaces ?? null,
    fromWire: (address, a, b) => ({
      op: 'setProcessorCustomer',
      ...address,
      processorCustomerId: a as string,
      ...(b === null ? {} : { replaces: b as string }),
    }),
    answer: 'commerce',
  },
  syncSubscription: {
    op: 'syncSubscription',
    code: 15,
    access: 'write',
    entitlement: null,
    changesIndex: true,
    unchangedIsRead: false,
    audit: ({ customerId, eventId, subscription }) => ({
      action: 'subscription.sync',
      resourceType: 'subscription',
      resourceId: customerId,
      data: {
        eventId,
        productKey: subscription.productKey,
        status: subscription.status,
        processorSubscriptionId: subscription.processorSubscriptionId,
      },
    }),
    wireA: (command) => command.eventId,
    wireB: (command) => command.subscription,
    fromWire: (address, a, b) => ({
      op: 'syncSubscription',
      ...address,
      eventId: a as string | null,
      subscription: b as SubscriptionInput,
    }),
    answer: 'commerce',
  },
  recordPurchase: {
    op: 'recordPurchase',
    code: 16,
    access: 'write',
    entitlement: null,
    changesIndex: true,
    unchangedIsRead: false,
    audit: ({ customerId, eventId, purchase }) => ({
      action: 'purchase.record',
      resourceType: 'purchase',
      resourceId: customerId,
      data: {
        eventId,
        purchaseId: purchase.id,
        productKey: purchase.productKey,
        amount: purchase.amount,
        currency: purchase.currency,
      },
    }),
    wireA: (command) => command.eventId,
    wireB: (command) => command.purchase,
    fromWire: (address, a, b) => ({
      op: 'recordPurchase',
      ...address,
      eventId: a as string | null,
      purchase: b as PurchaseInput,
    }),
    answer: 'commerce',
  },
  quoteRefund: {
    op: 'quoteRefund',
    code: 17,
    access: 'read',
    entitlement: null,
    changesIndex: false,
    unchangedIsRead: false,
    audit: null,
    wireA: (command) => command.request,
    wireB: none,
    fromWire: (address, a) => ({ op: 'quoteRefund', ...address, request: a as RefundRequest }),
    answer: 'refundQuote',
  },
  recordRefund: {
    op: 'recordRefund',
    code: 18,
    access: 'write',
    entitlement: null,
    changesIndex: false,
    unchangedIsRead: false,
    // `subscription.refund` or `purchase.refund`, with what was returned and how.
    audit: ({ customerId, refund }) => ({
      action: `${refund.target}.refund`,
      resourceType: refund.target,
      resourceId: customerId,
      data: {
        id: refund.targetId,
        mode: refund.mode,
        amount: refund.amount,
        currency: refund.currency,
        idempotencyKey: refund.idempotencyKey,
        processorRefundId: refund.processorRefundId,
      },
    }),
    wireA: (command) => command.refund,
    wireB: none,
    fromWire: (address, a) => ({ op: 'recordRefund', ...address, refund: a as RefundInput }),
    answer: 'refund',
  },
  overageDue: {
    op: 'overageDue',
    code: 19,
    access: 'read',
    entitlement: null,
    changesIndex: false,
    unchangedIsRead: false,
    audit: null,
    wireA: (command) => command.period,
    wireB: none,
    fromWire: (address, a) => ({ op: 'overageDue', ...address, period: a as OveragePeriod }),
    answer: 'overage',
  },
  recordOverageBill: {
    op: 'recordOverageBill',
    code: 20,
    access: 'write',
    entitlement: null,
    changesIndex: false,
    unchangedIsRead: false,
    // Recorded in the journal (the bill names the subscription, period, invoice and lines).
    audit: null,
    wireA: (command) => command.bill,
    wireB: none,
    fromWire: (address, a) => ({ op: 'recordOverageBill', ...address, bill: a as OverageBill }),
    answer: 'commerce',
  },
};

/** The records by op name; a command's record is `OPS[command.op]`. */
export const OPS: Readonly<Record<Op, OpRecord>> = withBodies(
  OP_TABLE as unknown as Readonly<Record<Op, OpSpecOf<Op, Command>>>,
);

/** The records by wire code. */
export const OPS_BY_CODE: readonly OpRecord[] = Object.values(OPS).sort((a, b) => a.code - b.code);
OPS_BY_CODE.forEach((record, index) =>
  assert(record.code === index, `op ${record.op} has code ${record.code}, expected ${index}`),
);

/** Reads are answered at once from memory; everything else is a write. */
export function isRead(command: Command): command is ReadCommand {
  return OPS[command.op].access === 'read';
}

/**
 * The entry an audited write records (without its actor), or null for a write that is not audited.
 */
export function auditOf(command: Command): AuditFields | null {
  const audit = OPS[command.op].audit;
  return audit === null ? null : audit(command);
}

function withBodies(
  specs: Readonly<Record<Op, OpSpecOf<Op, Command>>>,
): Readonly<Record<Op, OpRecord>> {
  const records: Partial<Record<Op, OpRecord>> = {};
  for (const spec of Object.values(specs))
    records[spec.op] = { ...spec, body: BODIES[spec.answer] };
  return records as Record<Op, OpRecord>;
}
