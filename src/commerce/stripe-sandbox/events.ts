/**
 * The event log: every change the sandbox makes is recorded as a Stripe `Event`.
 *
 * Events are typed by the SDK's own union (`Stripe.Event`), so `emit('invoice.paid', x)`
 * only accepts an invoice. Each event carries a snapshot of its object at the time it
 * happened, the request that caused it, and `pending_webhooks` (endpoints that have not
 * yet acknowledged it). Events raised by one request form a batch; the server hands each
 * batch to webhook delivery once the request is done.
 */
import Stripe from 'stripe';
import type { SandboxClock } from './clock.js';
import { Collection, newId, wireCopy } from './store.js';

export type EventType = Stripe.Event['type'];
export type EventOf<T extends EventType> = Extract<Stripe.Event, { type: T }>;
export type EventObject<T extends EventType> = EventOf<T>['data']['object'];

/** The request an event comes from, as Stripe reports it in `event.request`. */
export interface RequestInfo {
  readonly id: string | null;
  readonly idempotencyKey: string | null;
}

/** Whether an endpoint subscribed to `type` (`*` is every type). */
export function endpointWants(endpoint: Stripe.WebhookEndpoint, type: string): boolean {
  return (
    endpoint.status === 'enabled' &&
    (endpoint.enabled_events.includes('*') || endpoint.enabled_events.includes(type))
  );
}

export class EventLog {
  readonly collection: Collection<Stripe.Event>;
  #batch: Stripe.Event[] = [];
  /** The request being handled; events raised outside a request have none. */
  request: RequestInfo = { id: null, idempotencyKey: null };

  constructor(
    private readonly clock: SandboxClock,
    private readonly endpoints: Collection<Stripe.WebhookEndpoint>,
    limit: number,
  ) {
    this.collection = new Collection('event', limit, true);
  }

  emit<T extends EventType>(
    type: T,
    object: EventObject<T>,
    previous?: Partial<EventObject<T>>,
    created?: number,
  ): EventOf<T> {
    const pending = [...this.endpoints.all()].filter((endpoint) =>
      endpointWants(endpoint, type),
    ).length;
    const event = {
      id: newId('evt'),
      object: 'event',
      api_version: Stripe.API_VERSION,
      created: created ?? this.clock.nowSeconds(),
      data: {
        object: wireCopy(object),
        ...(previous === undefined ? {} : { previous_attributes: wireCopy(previous) }),
      },
      livemode: false,
      pending_webhooks: pending,
      request: { id: this.request.id, idempotency_key: this.request.idempotencyKey },
      type,
    } satisfies Stripe.EventBase as unknown as EventOf<T>;
    this.collection.insert(event);
    this.#batch.push(event);
    return event;
  }

  /** The events raised since the last call, oldest first. */
  drain(): Stripe.Event[] {
    const batch = this.#batch;
    this.#batch = [];
    return batch;
  }

  /** Records that one endpoint acknowledged the event. */
  acknowledged(eventId: string): void {
    const event = this.collection.find(eventId);
    if (event !== undefined && event.pending_webhooks > 0) event.pending_webhooks -= 1;
  }
}

/**
 * `data.previous_attributes` of an `*.updated` event: the old values of the top-level
 * fields that changed.
 */
export function previousAttributes<T extends object>(before: T, after: T): Partial<T> {
  const previous: Partial<T> = {};
  for (const key of Object.keys(before) as Array<keyof T>) {
    if (JSON.stringify(before[key]) !== JSON.stringify(after[key])) previous[key] = before[key];
  }
  return previous;
}
