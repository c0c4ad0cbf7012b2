/**
 * Webhook delivery: every event goes to each enabled endpoint that subscribed to its
 * type, as an HTTP POST of the event's JSON signed exactly as Stripe signs it (the
 * `Stripe-Signature` header made by the SDK's `webhooks.generateTestHeaderString` with
 * the endpoint's `whsec_` secret), so `stripe.webhooks.constructEvent` accepts it.
 *
 * A delivery succeeds on any 2xx answer. Otherwise it is retried, at most `maxAttempts`
 * times in all, after `retryDelayMs`, then twice that, and so on; a retry goes to the
 * back of the endpoint's queue, so later events can overtake it, as on Stripe. Endpoints
 * are served one request at a time, in the order events happened, unless a test switch
 * says otherwise: `mode = 'duplicate'` sends every event twice, `mode = 'reverse'` sends
 * the events of each request in reverse order, and `redeliver(eventId)` sends an event
 * again. Only loopback URLs are ever contacted. Queues and the attempt log are bounded.
 */
import http from 'node:http';
import https from 'node:https';
import Stripe from 'stripe';
import { endpointWants } from './events.js';
import type { SandboxState } from './state.js';

export type DeliveryMode = 'normal' | 'duplicate' | 'reverse';

export interface DeliveryOptions {
  /** Attempts per event and endpoint, first included (default 5). */
  readonly maxAttempts?: number;
  /** Wait before the first retry, doubled for each next one (default 1000 ms). */
  readonly retryDelayMs?: number;
  /** Time allowed for an endpoint to answer (default 10 s). */
  readonly timeoutMs?: number;
}

export interface DeliveryAttempt {
  readonly eventId: string;
  readonly eventType: string;
  readonly endpointId: string;
  readonly attempt: number;
  /** The endpoint's HTTP status, or null when there was no answer. */
  readonly status: number | null;
  readonly error?: string;
}

interface Job {
  readonly eventId: string;
  readonly endpointId: string;
  readonly attempt: number;
  /** Whether a success counts as the endpoint's acknowledgement (not for copies). */
  readonly acknowledges: boolean;
}

const QUEUE_MAX = 10_000;
const LOG_MAX = 1_000;
const BODY_BYTES_MAX = 64 * 1024;

/** Whether webhooks may be sent to `url`: http(s) on this machine only. */
export function isLoopbackUrl(url: string): boolean {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return false;
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') return false;
  if (parsed.username !== '' || parsed.password !== '') return false;
  const host = parsed.hostname;
  return host === 'localhost' || host === '[::1]' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

/** POSTs `payload` to `url`; resolves with the status, rejects on no answer. */
function post(
  url: string,
  payload: string,
  signature: string,
  timeoutMs: number,
  inFlight: Set<http.ClientRequest>,
): Promise<number> {
  return new Promise((resolve, reject) => {
    const target = new URL(url);
    const send = target.protocol === 'https:' ? https.request : http.request;
    const request = send(target, {
      method: 'POST',
      agent: false,
      timeout: timeoutMs,
      headers: {
        'content-type': 'application/json; charset=utf-8',
        'content-length': Buffer.byteLength(payload),
        'stripe-signature': signature,
        'user-agent': 'Stripe/1.0 (+https://stripe.com/docs/webhooks)',
        connection: 'close',
      },
    });
    inFlight.add(request);
    request.on('response', (response) => {
      let received = 0;
      response.on('data', (chunk: Buffer) => {
        received += chunk.length;
        if (received > BODY_BYTES_MAX) response.destroy();
      });
      response.on('close', () => resolve(response.statusCode ?? 0));
    });
    request.on('timeout', () => request.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    request.on('error', reject);
    request.on('close', () => inFlight.delete(request));
    request.end(payload);
  });
}

export class WebhookDeliveries {
  /** Test switch: how batches of events are sent (see the file header). */
  mode: DeliveryMode = 'normal';
  readonly #log: DeliveryAttempt[] = [];
  readonly #queues = new Map<string, Job[]>();
  readonly #busy = new Set<string>();
  readonly #timers = new Set<NodeJS.Timeout>();
  readonly #requests = new Set<http.ClientRequest>();
  #pending = 0;
  #waiters: Array<() => void> = [];
  #closed = false;
  readonly #maxAttempts: number;
  readonly #retryDelayMs: number;
  readonly #timeoutMs: number;

  constructor(
    private readonly state: SandboxState,
    options: DeliveryOptions = {},
  ) {
    this.#maxAttempts = Math.max(1, Math.min(options.maxAttempts ?? 5, 20));
    this.#retryDelayMs = Math.max(0, options.retryDelayMs ?? 1000);
    this.#timeoutMs = Math.max(1, options.timeoutMs ?? 10_000);
  }

  /** The most recent delivery attempts, oldest first. */
  get attempts(): readonly DeliveryAttempt[] {
    return [...this.#log];
  }

  /** Queues a batch of events (those of one request) for every endpoint that wants them. */
  dispatch(events: readonly Stripe.Event[]): void {
    const ordered = this.mode === 'reverse' ? [...events].reverse() : events;
    for (const endpoint of this.state.webhookEndpoints.all()) {
      for (const event of ordered) {
        if (!endpointWants(endpoint, event.type)) continue;
        this.#enqueue({
          eventId: event.id,
          endpointId: endpoint.id,
          attempt: 1,
          acknowledges: true,
        });
        if (this.mode === 'duplicate')
          this.#enqueue({
            eventId: event.id,
            endpointId: endpoint.id,
            attempt: 1,
            acknowledges: false,
          });
      }
    }
  }

  /** Sends an event again to every endpoint that wants it (or to one endpoint). */
  redeliver(eventId: string, endpointId?: string): void {
    const event = this.state.events.collection.get(eventId);
    if (endpointId !== undefined) this.state.webhookEndpoints.get(endpointId);
    for (const endpoint of this.state.webhookEndpoints.all()) {
      if (
        (endpointId === undefined || endpoint.id === endpointId) &&
        endpointWants(endpoint, event.type)
      ) {
        this.#enqueue({ eventId, endpointId: endpoint.id, attempt: 1, acknowledges: false });
      }
    }
  }

  /** Resolves once nothing is queued, in flight or waiting for a retry. */
  idle(): Promise<void> {
    if (this.#pending === 0 || this.#closed) return Promise.resolve();
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  #enqueue(job: Job): void {
    if (this.#closed) return;
    const queue = this.#queues.get(job.endpointId) ?? [];
    if (queue.length >= QUEUE_MAX) {
      this.#record(job, null, 'dropped: the endpoint queue is full');
      return;
    }
    queue.push(job);
    this.#queues.set(job.endpointId, queue);
    this.#pending += 1;
    void this.#pump(job.endpointId);
  }

  /** Sends the endpoint's queued jobs one after the other. */
  async #pump(endpointId: string): Promise<void> {
    if (this.#busy.has(endpointId)) return;
    this.#busy.add(endpointId);
    try {
      for (
        let job = this.#queues.get(endpointId)?.shift();
        job !== undefined && !this.#closed;
        job = this.#queues.get(endpointId)?.shift()
      ) {
        await this.#attempt(job);
      }
    } finally {
      this.#busy.delete(endpointId);
    }
  }

  async #attempt(job: Job): Promise<void> {
    const endpoint = this.state.webhookEndpoints.find(job.endpointId);
    const event = this.state.events.collection.find(job.eventId);
    const secret = this.state.webhookSecrets.get(job.endpointId);
    if (
      endpoint === undefined ||
      event === undefined ||
      secret === undefined ||
      endpoint.status !== 'enabled'
    )
      return this.#finish(job, null, 'dropped: endpoint or event no longer exists');
    if (!isLoopbackUrl(endpoint.url)) return this.#finish(job, null, 'refused: not a loopback URL');
    const payload = JSON.stringify(event, null, 2);
    const signature = Stripe.webhooks.generateTestHeaderString({ payload, secret });
    let status: number | null = null;
    let error: string | undefined;
    try {
      status = await post(endpoint.url, payload, signature, this.#timeoutMs, this.#requests);
    } catch (cause) {
      error = cause instanceof Error ? cause.message : String(cause);
    }
    if (status !== null && status >= 200 && status < 300) {
      if (job.acknowledges) this.state.events.acknowledged(job.eventId);
      return this.#finish(job, status);
    }
    if (job.attempt >= this.#maxAttempts || this.#closed)
      return this.#finish(job, status, error ?? 'gave up after the last attempt');
    this.#record(job, status, error);
    this.#retryLater(job);
  }

  /** Puts a failed job back at the end of its queue after the backoff. */
  #retryLater(job: Job): void {
    const delay = this.#retryDelayMs * 2 ** (job.attempt - 1);
    const timer = setTimeout(() => {
      this.#timers.delete(timer);
      this.#pending -= 1;
      this.#enqueue({ ...job, attempt: job.attempt + 1 });
    }, delay);
    timer.unref();
    this.#timers.add(timer);
  }

  #finish(job: Job, status: number | null, error?: string): void {
    this.#record(job, status, error);
    this.#pending = Math.max(0, this.#pending - 1);
    this.#settle();
  }

  #record(job: Job, status: number | null, error?: string): void {
    const eventType = this.state.events.collection.find(job.eventId)?.type ?? 'unknown';
    this.#log.push({
      eventId: job.eventId,
      eventType,
      endpointId: job.endpointId,
      attempt: job.attempt,
      status,
      ...(error === undefined ? {} : { error }),
    });
    if (this.#log.length > LOG_MAX) this.#log.splice(0, this.#log.length - LOG_MAX);
  }

  #settle(): void {
    if (this.#pending > 0 && !this.#closed) return;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const resolve of waiters) resolve();
  }

  /** Stops delivering: drops queues and retries, aborts requests in flight. */
  close(): void {
    this.#closed = true;
    for (const timer of this.#timers) clearTimeout(timer);
    this.#timers.clear();
    for (const request of this.#requests) request.destroy();
    this.#queues.clear();
    this.#pending = 0;
    this.#settle();
  }
}
