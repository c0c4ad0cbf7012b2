/**
 * The delivery thread's work: take events from every outbox into the delivery store, fanned
 * out to the endpoints that want them, and deliver them, signed, with retries.
 *
 * Order: each endpoint's deliveries form lanes, one per customer (events without a customer,
 * such as `config.pushed`, share one lane). A lane sends one delivery at a time, oldest
 * first, and the next only once that one succeeded, so an endpoint sees each customer's
 * events in the order they happened, retries included. Lanes of one endpoint run side by
 * side, up to IN_FLIGHT_PER_ENDPOINT_MAX at once.
 *
 * At least once: a delivery leaves the store only once its 2xx is recorded; everything
 * queued is picked up again after a restart. A delivery that failed every attempt of the
 * schedule marks its endpoint `failing` and holds it (nothing more is sent to it, its events
 * queue up) until an operator enables it, which retries the held deliveries first. A `410
 * Gone` disables the endpoint at once and drops what is queued for it.
 */
import { exactJson } from '../../actors/fixed.js';
import type { DeliveryStore, QueuedDelivery } from '../../storage/delivery-store.js';
import type { OutboxEvent } from '../../storage/outbox.js';
import type { WebhookEndpointRecord } from '../../storage/webhook-registry.js';
import type { AddressPolicy } from './address-policy.js';
import { signingSecrets, wants } from './endpoints.js';
import { endpointAgent, postEvent, type PostResult, type PostTarget } from './post.js';
import {
  IN_FLIGHT_PER_ENDPOINT_MAX,
  IN_FLIGHT_TOTAL_MAX,
  OUTBOX_BATCH_MAX,
  QUEUE_WINDOW_PER_ENDPOINT,
  retryDelayMs,
} from './schedule.js';
import { signedHeaders } from './sign.js';

/** An outbox the dispatcher takes events from. */
export interface OutboxSource {
  readonly name: string;
  read(afterSeq: number, limit: number): Array<{ seq: number; event: OutboxEvent }>;
  prune(uptoSeq: number): Promise<unknown>;
}

/** What the dispatcher tells its owner (the front end, which records status changes). */
export type DispatcherReport =
  | {
      readonly t: 'status';
      readonly id: string;
      readonly to: 'failing' | 'disabled';
      readonly reason: string;
    }
  | { readonly t: 'relay'; readonly events: readonly OutboxEvent[] };

export interface DispatcherOptions {
  readonly store: DeliveryStore;
  readonly sources: readonly OutboxSource[];
  readonly endpoints: () => WebhookEndpointRecord[];
  readonly policy: AddressPolicy;
  readonly schedule: readonly number[];
  readonly report: (report: DispatcherReport) => void;
  readonly post?: (target: PostTarget, policy: AddressPolicy) => Promise<PostResult>;
  readonly now?: () => number;
}

interface Row {
  readonly seq: number;
  delivery: QueuedDelivery;
  sending: boolean;
}

interface EndpointState {
  record: WebhookEndpointRecord;
  readonly window: Row[];
  /** Every queued row of the endpoint is in `window` (none waits on disk beyond it). */
  complete: boolean;
  inFlight: number;
  /**
   * Nothing in the window can start before this time (Infinity: not until something about
   * the endpoint changes; 0: look). Saves scanning a window of deliveries waiting for their
   * retry (an endpoint that is down) every time another endpoint's delivery completes.
   */
  idleUntilMs: number;
  agent: ReturnType<typeof endpointAgent> | null;
}

/** The event's JSON body as delivered: `{id, type, createdAt, environment, data}`. */
export function eventBody(event: OutboxEvent): string {
  return exactJson(
    JSON.stringify({
      id: event.id,
      type: event.type,
      createdAt: new Date(event.createdAtMs).toISOString(),
      environment: event.environment,
      data: event.data,
    }),
  );
}

const laneOf = (event: OutboxEvent): string => event.customerId ?? '';

export class Dispatcher {
  readonly #states = new Map<string, EndpointState>();
  #inFlight = 0;
  #timer: NodeJS.Timeout | null = null;
  #stopped = false;
  /** Endpoints that answered 410 here: never loaded again, whatever the table says meanwhile. */
  readonly #goneIds = new Set<string>();
  readonly #post: (target: PostTarget, policy: AddressPolicy) => Promise<PostResult>;
  readonly #now: () => number;

  constructor(private readonly options: DispatcherOptions) {
    this.#post = options.post ?? postEvent;
    this.#now = options.now ?? Date.now;
  }

  /** Loads the endpoints and what is queued for them, then starts delivering. */
  start(): void {
    // Queues of endpoints deleted or disabled while the thread was not running.
    const records = new Map(this.options.endpoints().map((r) => [r.id, r]));
    for (const id of this.options.store.queuedEndpoints()) {
      const record = records.get(id);
      if (record === undefined || record.status === 'disabled')
        void this.options.store.dropQueued(id);
    }
    this.refreshEndpoints();
  }

  /** Rereads the endpoints: new ones start, deleted or disabled ones lose their queue. */
  refreshEndpoints(): void {
    const records = new Map(this.options.endpoints().map((r) => [r.id, r]));
    for (const [id, state] of this.#states) {
      const record = records.get(id);
      if (record !== undefined && record.status !== 'disabled') continue;
      this.#states.delete(id);
      state.agent?.destroy();
      void this.options.store.dropQueued(id);
    }
    for (const record of records.values()) {
      // Disabled here (410): skipped until the stored record says so too (an operator may
      // enable it after that).
      if (this.#goneIds.has(record.id)) {
        if (record.status === 'disabled') this.#goneIds.delete(record.id);
        continue;
      }
      if (record.status === 'disabled') continue;
      const state = this.#states.get(record.id);
      // A status set here (failing) keeps the stored record's updatedAtMs: only a change
      // stored since (the failing status recorded, an operator's enable) replaces it.
      if (state === undefined) this.#states.set(record.id, this.#load(record));
      else if (state.record.updatedAtMs !== record.updatedAtMs) {
        state.record = record;
        state.idleUntilMs = 0;
      }
    }
    this.#pump();
  }

  #load(record: WebhookEndpointRecord): EndpointState {
    const state: EndpointState = {
      record,
      window: [],
      complete: false,
      inFlight: 0,
      idleUntilMs: 0,
      agent: null,
    };
    this.#refill(state);
    return state;
  }

  #refill(state: EndpointState): void {
    const room = QUEUE_WINDOW_PER_ENDPOINT - state.window.length;
    if (state.complete || room <= 0) return;
    const after = state.window.at(-1)?.seq ?? 0;
    const rows = this.options.store.queued(state.record.id, after, room);
    for (const { seq, delivery } of rows) state.window.push({ seq, delivery, sending: false });
    state.complete = rows.length < room;
    if (rows.length > 0) state.idleUntilMs = 0;
  }

  /**
   * An operator enabled the endpoint: its held deliveries get a fresh schedule, oldest first.
   */
  async resume(id: string): Promise<void> {
    this.refreshEndpoints();
    const state = this.#states.get(id);
    if (state === undefined) return;
    const now = this.#now();
    const held = state.window.filter((row) => row.delivery.exhausted);
    for (const row of held)
      row.delivery = { ...row.delivery, attempts: 0, exhausted: false, nextAttemptAtMs: now };
    state.idleUntilMs = 0;
    await this.options.store.replaceQueued(
      id,
      held.map(({ seq, delivery }) => ({ seq, delivery })),
    );
    this.#pump();
  }

  /**
   * Takes what every outbox holds beyond its cursor into the store, one batch per outbox, and
   * prunes the outbox once the copy is durable. Resolves with the number of events taken.
   */
  async takeOutboxes(): Promise<number> {
    let taken = 0;
    for (const source of this.options.sources) {
      const cursor = this.options.store.cursor(source.name);
      const rows = source.read(cursor, OUTBOX_BATCH_MAX);
      const last = rows.at(-1);
      if (last === undefined) continue;
      // Read after the rows: an endpoint registered before a change was made is committed
      // before the change's event, so it is seen here even if its message has not arrived.
      this.refreshEndpoints();
      const now = this.#now();
      const deliveries: Array<{ endpointId: string; event: OutboxEvent; dueAtMs: number }> = [];
      const relayed: OutboxEvent[] = [];
      for (const { event } of rows) {
        for (const state of this.#states.values()) {
          if (this.#takes(state.record, event))
            deliveries.push({ endpointId: state.record.id, event, dueAtMs: now });
        }
        if (event.environment === 'test') relayed.push(event);
      }
      // Every test event goes to the owner for the dev relay, whether a listener is connected
      // or not (it drops them when none is): a flag telling this thread when one connects
      // could arrive after the event was taken, and a listener would miss an event made
      // after it connected. One message per batch, and only for test events.
      if (relayed.length > 0) this.options.report({ t: 'relay', events: relayed });
      const keys = await this.options.store.enqueue(source.name, last.seq, deliveries);
      keys.forEach(({ endpointId, seq }, i) => {
        const state = this.#states.get(endpointId);
        const delivery = deliveries[i];
        if (state === undefined || delivery === undefined || !state.complete) return;
        if (state.window.length >= QUEUE_WINDOW_PER_ENDPOINT) state.complete = false;
        else {
          state.idleUntilMs = 0;
          state.window.push({
            seq,
            delivery: {
              event: delivery.event,
              attempts: 0,
              nextAttemptAtMs: now,
              exhausted: false,
            },
            sending: false,
          });
        }
      });
      void source.prune(last.seq);
      taken += rows.length;
    }
    if (taken > 0) this.#pump();
    return taken;
  }

  /**
   * Whether an endpoint gets this event: its environment, created since it was registered,
   * its filter, and not awaiting approval.
   */
  #takes(record: WebhookEndpointRecord, event: OutboxEvent): boolean {
    return (
      record.environment === event.environment &&
      event.createdAtMs >= record.createdAtMs &&
      (record.status === 'active' || record.status === 'failing') &&
      wants(record.events, event.type)
    );
  }

  /** Starts every delivery that may start now, and sets the timer for the next one due. */
  #pump(): void {
    if (this.#stopped) return;
    const now = this.#now();
    let nextDue = Number.POSITIVE_INFINITY;
    for (const state of this.#states.values()) {
      if (state.record.status !== 'active') continue;
      if (state.idleUntilMs > now) {
        nextDue = Math.min(nextDue, state.idleUntilMs);
        continue;
      }
      nextDue = Math.min(nextDue, this.#pumpEndpoint(state, now));
    }
    this.#arm(nextDue - now);
  }

  /** Starts what may start of one endpoint's window; answers when its next row is due. */
  #pumpEndpoint(state: EndpointState, now: number): number {
    let nextDue = Number.POSITIVE_INFINITY;
    let scannedAll = true;
    const blocked = new Set<string>();
    for (const row of state.window) {
      if (this.#inFlight >= IN_FLIGHT_TOTAL_MAX || state.inFlight >= IN_FLIGHT_PER_ENDPOINT_MAX) {
        scannedAll = false;
        break;
      }
      const lane = laneOf(row.delivery.event);
      if (blocked.has(lane)) continue;
      blocked.add(lane); // this row is the lane's head: nothing after it in the lane may go
      if (row.sending || row.delivery.exhausted) continue;
      if (row.delivery.nextAttemptAtMs > now) {
        nextDue = Math.min(nextDue, row.delivery.nextAttemptAtMs);
        continue;
      }
      this.#send(state, row);
      scannedAll = false;
    }
    // Nothing could start: nothing will before the next row is due, or something changes.
    state.idleUntilMs = scannedAll ? nextDue : 0;
    return nextDue;
  }

  #arm(delayMs: number): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    if (!Number.isFinite(delayMs)) return;
    this.#timer = setTimeout(() => this.#pump(), Math.max(0, Math.min(delayMs, 2 ** 31 - 1)));
  }

  #send(state: EndpointState, row: Row): void {
    row.sending = true;
    state.inFlight++;
    this.#inFlight++;
    const { record } = state;
    const event = row.delivery.event;
    const body = eventBody(event);
    const now = this.#now();
    state.agent ??= endpointAgent(record.url, IN_FLIGHT_PER_ENDPOINT_MAX);
    const target: PostTarget = {
      url: record.url,
      environment: record.environment,
      headers: { ...signedHeaders(event.id, now, body, signingSecrets(record, now)) },
      body,
      agent: state.agent,
    };
    // A failed write of the delivery store rejects #settle: unhandled, it ends the thread,
    // and the front end stops the process (recovery from disk is the only repair).
    void this.#post(target, this.options.policy).then((result) =>
      this.#settle(state, row, now, result),
    );
  }

  async #settle(state: EndpointState, row: Row, atMs: number, result: PostResult): Promise<void> {
    const delivery = row.delivery;
    const attempts = delivery.attempts + 1;
    const ok = result.error === null;
    const attempt = {
      eventId: delivery.event.id,
      type: delivery.event.type,
      attempt: attempts,
      atMs,
      durationMs: result.durationMs,
      responseStatus: result.status,
      ok,
      error: result.error,
    };
    const id = state.record.id;
    // Deleted or disabled while the attempt was out: its queue is gone, keep no row for it.
    const dropped = this.#states.get(id) !== state;
    let next: QueuedDelivery | null = null;
    if (!ok && !dropped) {
      const delay = retryDelayMs(this.options.schedule, attempts);
      next = {
        ...delivery,
        attempts,
        exhausted: delay === null,
        nextAttemptAtMs: this.#now() + (delay ?? 0),
      };
    }
    await this.options.store.recordAttempt(id, row.seq, attempt, next);
    state.inFlight--;
    this.#inFlight--;
    row.sending = false;
    state.idleUntilMs = 0;
    if (next === null) state.window.splice(state.window.indexOf(row), 1);
    else row.delivery = next;
    if (result.status === 410) this.#gone(state);
    else if (next?.exhausted === true) this.#failing(state, result.error ?? 'failed');
    this.#refill(state);
    this.#pump();
  }

  #gone(state: EndpointState): void {
    const { id } = state.record;
    this.#goneIds.add(id);
    state.record = { ...state.record, status: 'disabled' };
    this.#states.delete(id);
    state.agent?.destroy();
    void this.options.store.dropQueued(id);
    this.options.report({
      t: 'status',
      id,
      to: 'disabled',
      reason: 'the receiver answered 410 Gone',
    });
  }

  #failing(state: EndpointState, error: string): void {
    if (state.record.status !== 'active') return;
    state.record = { ...state.record, status: 'failing' };
    const reason = `every attempt of a delivery failed; the last: ${error}`;
    this.options.report({ t: 'status', id: state.record.id, to: 'failing', reason });
  }

  /** Stops starting deliveries; those in flight finish. */
  stop(): void {
    this.#stopped = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    for (const state of this.#states.values()) state.agent?.destroy();
  }
}
