/**
 * What the audit log records for an audited shard write, derived from the command alone.
 *
 * One function for both places that record it: the front end appends it to the chain, and
 * the shard stores the same entry with the change (protocol.ts, AuditTag) so that a crash
 * between the two cannot lose it. Deriving it here, rather than carrying it on the wire,
 * keeps the hot path (`context`) to two short strings per command.
 */
import type { WriteCommand } from './customer.js';
import { exactAmountValue } from './fixed.js';

export interface AuditFields {
  readonly action: string;
  readonly resourceType: string;
  /** Always the customer's id: every shard write is one customer's. */
  readonly resourceId: string;
  readonly data: Readonly<Record<string, unknown>>;
}

/** The entry an audited write records (without its actor), or null for a write that is not audited. */
export function auditOf(command: WriteCommand): AuditFields | null {
  const resourceId = command.customerId;
  switch (command.op) {
    case 'upsertCustomer':
    case 'context':
      return { action: 'customer.upsert', resourceType: 'customer', resourceId, data: { ...command.patch } };
    case 'putContract':
      return { action: 'contract.put', resourceType: 'contract', resourceId, data: command.contract };
    case 'deleteContract':
      return { action: 'contract.delete', resourceType: 'contract', resourceId, data: {} };
    case 'limitSettings': {
      const { key, purchased, autoExpansionEnabled } = command;
      const data = { key, ...(purchased === undefined ? {} : { purchased }), ...(autoExpansionEnabled === undefined ? {} : { autoExpansionEnabled }) };
      return { action: 'limit.settings', resourceType: 'limit', resourceId, data };
    }
    case 'usageSettings':
      return { action: 'usage.settings', resourceType: 'meter', resourceId, data: { key: command.key, overageEnabled: command.overageEnabled } };
    case 'refund': {
      const { key, amountMicros, idempotencyKey } = command;
      return { action: 'usage.refund', resourceType: 'meter', resourceId, data: { key, amount: exactAmountValue(amountMicros), ...(idempotencyKey === undefined ? {} : { idempotencyKey }) } };
    }
    case 'consume':
    case 'grantLot':
      return null;
  }
}
