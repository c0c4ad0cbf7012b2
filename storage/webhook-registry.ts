/**
 * Webhook endpoints as the control store keeps them: `webhooks` maps the endpoint id →
 * frame(WebhookEndpointRecord). The front end is the only writer (registration, approval,
 * rotation, status changes); the delivery thread reads the same table directly to learn
 * which endpoints exist, as LMDB readers never block the writer.
 *
 * A write resolves once durable (the control store's options): a registration is answered
 * only once the endpoint would survive a crash. Reads verify each record's checksum and
 * shape and throw on a corrupt one.
 */
import { assert } from '../shared/assert.js';
import type { Environment } from '../shared/environment.js';
import { decodeRecord, encodeRecord } from './codec.js';
import { durableVoid, freshSnapshot, type BinaryDb } from './lmdb-env.js';

/**
 * `active`: receives events. `pending_approval`: a live endpoint an operator has not approved
 * yet (receives nothing). `failing`: its last delivery failed every attempt; events queue up
 * until an operator enables it again. `disabled`: it answered 410 Gone, or an operator
 * disabled it; it receives nothing.
 */
export type WebhookStatus = 'active' | 'pending_approval' | 'failing' | 'disabled';

export interface WebhookEndpointRecord {
  id: string;
  environment: Environment;
  url: string;
  /** The registration key: with the environment and url, what makes an endpoint unique. */
  key: string;
  /** Event kinds it receives; `['*']` for every kind. */
  events: string[];
  status: WebhookStatus;
  /** Why it is failing or disabled (null otherwise). */
  statusReason: string | null;
  secret: string;
  /** The secret a rotation replaced, still signed with until `previousSecretUntilMs`. */
  previousSecret: string | null;
  previousSecretUntilMs: number | null;
  createdAtMs: number;
  updatedAtMs: number;
}

const STATUSES = new Set<string>(['active', 'pending_approval', 'failing', 'disabled']);

export function isWebhookEndpointRecord(value: unknown): value is WebhookEndpointRecord {
  if (typeof value !== 'object' || value === null) return false;
  const r = value as Record<string, unknown>;
  return (
    typeof r.id === 'string' &&
    (r.environment === 'test' || r.environment === 'live') &&
    typeof r.url === 'string' &&
    typeof r.key === 'string' &&
    Array.isArray(r.events) &&
    r.events.every((kind) => typeof kind === 'string') &&
    typeof r.status === 'string' &&
    STATUSES.has(r.status) &&
    (r.statusReason === null || typeof r.statusReason === 'string') &&
    typeof r.secret === 'string' &&
    (r.previousSecret === null || typeof r.previousSecret === 'string') &&
    (r.previousSecretUntilMs === null || typeof r.previousSecretUntilMs === 'number') &&
    typeof r.createdAtMs === 'number' &&
    typeof r.updatedAtMs === 'number'
  );
}

/**
 * Every endpoint in the table, ordered by id. Throws if a stored record is corrupt. Reads a
 * fresh snapshot: the delivery thread reads what the front end's thread wrote (an enable
 * read stale would leave the endpoint failing).
 */
export function readEndpoints(db: BinaryDb): WebhookEndpointRecord[] {
  const endpoints: WebhookEndpointRecord[] = [];
  for (const { key, value } of freshSnapshot(db).getRange({})) {
    const decoded = decodeRecord(value);
    if (!decoded.ok || !isWebhookEndpointRecord(decoded.value) || decoded.value.id !== key)
      throw new Error(`control store: webhook endpoint ${String(key)} is corrupt`);
    endpoints.push(decoded.value);
  }
  return endpoints;
}

/** Stores (inserts or replaces) an endpoint; resolves once durable. */
export function putEndpoint(db: BinaryDb, record: WebhookEndpointRecord): Promise<void> {
  assert(isWebhookEndpointRecord(record), 'putEndpoint: malformed endpoint record');
  return durableVoid(db.put(record.id, encodeRecord(record)), `webhook ${record.id} write`);
}

/** Removes an endpoint; resolves once durable. */
export function removeEndpoint(db: BinaryDb, id: string): Promise<void> {
  return durableVoid(db.remove(id), `webhook ${id} removal`);
}
