/**
 * The kinds of event Tally sends to webhook endpoints, and the shape every event has.
 *
 * In the leaf because the pure core produces events, the shard shell stores them, the
 * front end validates an endpoint's `events` filter against this list and the exported
 * receiver helper types what it verifies.
 */
import type { Environment } from './environment.js';

/** Every event kind, in the order the docs list them. */
export const EVENT_KINDS = [
  'customer.created',
  'customer.updated',
  'subscription.created',
  'subscription.updated',
  'subscription.canceled',
  'subscription.refunded',
  'purchase.completed',
  'purchase.refunded',
  'usage.exhausted',
  'config.pushed',
] as const;

export type EventKind = (typeof EVENT_KINDS)[number];

const KNOWN = new Set<string>(EVENT_KINDS);

export function isEventKind(value: string): value is EventKind {
  return KNOWN.has(value);
}

/**
 * An event as delivered: the JSON body of every webhook request. `id` (`evt_…`) is also
 * the `webhook-id` header and stays the same across retries and endpoints, so a receiver
 * dedupes on it. `createdAt` is ISO 8601 UTC with milliseconds: the time of the change.
 */
export interface TallyEvent<K extends string = EventKind> {
  id: string;
  type: K;
  createdAt: string;
  environment: Environment;
  data: Record<string, unknown>;
}
