/**
 * Recognisers for the core's records read back from disk: a journaled event and a
 * snapshot item. Storage checks every record it reads against them (storage/journal.ts,
 * RecordShapes), so a record of the wrong shape is refused as corrupt at the door; they
 * look at the shape only, and apply and fromSnapshot assert the rest.
 */
import type { CustomerSnapshot } from './snapshot-form.js';
import type { Event } from './types.js';

/** Every event type, so that a new one cannot be left out. */
const EVENT_TYPES: Readonly<Record<Event['type'], true>> = {
  consumed: true,
  refunded: true,
  limitSettingsSet: true,
  usageSettingsSet: true,
  lotGranted: true,
  contractSet: true,
  contractDeleted: true,
  customerUpserted: true,
  processorCustomerSet: true,
  subscriptionSynced: true,
  purchaseRecorded: true,
  processorEventNoted: true,
  purchaseRefunded: true,
  subscriptionRefunded: true,
  overageBilled: true,
};

function isObject(value: unknown): value is Readonly<Record<string, unknown>> {
  return typeof value === 'object' && value !== null;
}

function isEnvironment(value: unknown): boolean {
  return value === 'test' || value === 'live';
}

/** Whether `value` has an event's type, address and time. */
export function isEvent(value: unknown): value is Event {
  return (
    isObject(value) &&
    typeof value.type === 'string' &&
    Object.hasOwn(EVENT_TYPES, value.type) &&
    isEnvironment(value.environment) &&
    typeof value.customerId === 'string' &&
    typeof value.key === 'string' &&
    typeof value.atMs === 'number'
  );
}

/** Whether `value` has a snapshot item's identity, profile and collections. */
export function isCustomerSnapshot(value: unknown): value is CustomerSnapshot {
  return (
    isObject(value) &&
    isEnvironment(value.environment) &&
    typeof value.id === 'string' &&
    typeof value.createdAtMs === 'number' &&
    isObject(value.profile) &&
    Array.isArray(value.meters) &&
    Array.isArray(value.limits) &&
    (value.idempotency === undefined || Array.isArray(value.idempotency)) &&
    (value.keys === undefined || Array.isArray(value.keys))
  );
}
