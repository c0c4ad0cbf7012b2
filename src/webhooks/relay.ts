/**
 * The dev relay: a WebSocket at `GET /v1/listen` that `tally listen` holds open to receive
 * the test environment's events as they happen and forward them to a local receiver.
 *
 * Test environment only: the upgrade takes a test server key (any other key is refused
 * with 403 `relay_test_only`), and the test configuration's `webhooks.devTunnel: false`
 * turns it off (403 `relay_disabled`). Each event is sent once per forwarding entry of the
 * test configuration whose `events` want it, with that entry's `path`, signed with the
 * secret of the test endpoint registered under the entry's `key` (so a receiver verifies
 * relayed events with the secret it got at registration), or with the relay secret when
 * none is; without forwarding entries, once, with path '' and the relay secret. The relay
 * secret is made once per data directory and sent to every listener when it connects.
 *
 * Live only: nothing is kept for a listener that is not connected (registered endpoints
 * have the outbox for that). Events reach this module from the delivery thread, which
 * hands over test events only while a listener is connected; a new listener is greeted
 * (`ready`) once the thread knows, so every event made after the greeting reaches it.
 */
import { STATUS_CODES } from 'node:http';
import type uWS from 'uWebSockets.js';
import type { BillingConfig, ForwardingEntry } from '../../actors/billing-config.js';
import type { ControlStore } from '../../storage/control-store.js';
import type { OutboxEvent } from '../../storage/outbox.js';
import { bearerToken, type KeyRing } from '../auth/keys.js';
import { errorBody, ERRORS, type ErrorCode } from '../errors.js';
import { eventBody } from './dispatcher.js';
import { normalizeEvents, signingSecrets, wants, type WebhookEndpoints } from './endpoints.js';
import { newWebhookSecret, signedHeaders } from './sign.js';

export const RELAY_PATH = '/v1/listen';

const RELAY_SECRET_META = 'relaySecret';

/** Bytes a listener may have unsent before it is dropped: a stuck listener costs no more. */
export const LISTENER_BACKPRESSURE_MAX = 16 * 1024 * 1024;

interface Listener {
  /** Event kinds it asked for (`?events=`), `['*']` by default. */
  readonly events: string[];
}

/** A message to a listener. */
export type RelayMessage =
  | {
      readonly type: 'ready';
      readonly environment: 'test';
      readonly secret: string;
      readonly forwarding: ReadonlyArray<{ key: string; path: string }>;
    }
  | {
      readonly type: 'event';
      readonly eventId: string;
      readonly eventType: string;
      readonly path: string;
      readonly headers: Readonly<Record<string, string>>;
      readonly body: string;
    };

function refuse(res: uWS.HttpResponse, code: ErrorCode, params = {}): void {
  res.cork(() => {
    res
      .writeStatus(`${ERRORS[code].status} ${STATUS_CODES[ERRORS[code].status] ?? ''}`)
      .writeHeader('content-type', 'application/json')
      .end(errorBody(code, params));
  });
}

export class DevRelay {
  readonly #sockets = new Set<uWS.WebSocket<Listener>>();
  readonly #secret: string;

  private constructor(
    private readonly keys: KeyRing,
    private readonly control: ControlStore,
    private readonly endpoints: WebhookEndpoints,
    secret: string,
  ) {
    this.#secret = secret;
  }

  /** The relay, with its secret made (durably) on the first start. */
  static async open(
    keys: KeyRing,
    control: ControlStore,
    endpoints: WebhookEndpoints,
  ): Promise<DevRelay> {
    let secret = control.getMeta(RELAY_SECRET_META);
    if (typeof secret !== 'string') {
      secret = newWebhookSecret();
      await control.putMeta(RELAY_SECRET_META, secret);
    }
    return new DevRelay(keys, control, endpoints, secret as string);
  }

  #testConfig(): BillingConfig | null {
    return (this.control.latestConfig('test')?.config as BillingConfig | undefined) ?? null;
  }

  /** The upgrade: a test server key, the relay not turned off, a valid `events` filter. */
  upgrade(res: uWS.HttpResponse, req: uWS.HttpRequest, context: uWS.us_socket_context_t): void {
    const presented = req.getHeader('x-tally-key') || bearerToken(req.getHeader('authorization'));
    const query = new URLSearchParams(req.getQuery() ?? '');
    const secKey = req.getHeader('sec-websocket-key');
    const secProtocol = req.getHeader('sec-websocket-protocol');
    const secExtensions = req.getHeader('sec-websocket-extensions');
    if (presented === '') return refuse(res, 'key_missing');
    const key = this.keys.verify(presented);
    if (key === null) return refuse(res, 'key_invalid');
    if (key.environment !== 'test' || key.keyClass !== 'server')
      return refuse(res, 'relay_test_only');
    if (this.#testConfig()?.webhooks?.devTunnel === false) return refuse(res, 'relay_disabled');
    let events: string[];
    try {
      events = normalizeEvents(query.get('events') ?? '*');
    } catch {
      return refuse(res, 'invalid_query', { detail: 'events names an unknown event kind' });
    }
    res.upgrade<Listener>({ events }, secKey, secProtocol, secExtensions, context);
  }

  /**
   * Tells the delivery thread whether any listener is connected; settles once it knows.
   * Set by the server (default: nothing to tell).
   */
  onListening: (listening: boolean) => Promise<void> = () => Promise.resolve();
  /** Settles once the delivery thread knows the current listeners are there. */
  #listening: Promise<void> = Promise.resolve();

  open(socket: uWS.WebSocket<Listener>): void {
    this.#sockets.add(socket);
    if (this.#sockets.size === 1) this.#listening = this.onListening(true);
    // Greeted once test events flow here: every event made after the greeting is relayed.
    void this.#listening.then(() => {
      if (this.#sockets.has(socket)) this.#greet(socket);
    });
  }

  #greet(socket: uWS.WebSocket<Listener>): void {
    const forwarding = (this.#testConfig()?.webhooks?.forwarding ?? []).map(({ key, path }) => ({
      key,
      path,
    }));
    const ready: RelayMessage = {
      type: 'ready',
      environment: 'test',
      secret: this.#secret,
      forwarding,
    };
    socket.send(JSON.stringify(ready));
  }

  close(socket: uWS.WebSocket<Listener>): void {
    if (this.#sockets.delete(socket) && this.#sockets.size === 0)
      this.#listening = this.onListening(false);
  }

  /** The secrets a relayed delivery for `entry` is signed with. */
  #secretsFor(entry: ForwardingEntry | null, nowMs: number): string[] {
    if (entry === null) return [this.#secret];
    const registered = this.endpoints
      .list('test')
      .filter((endpoint) => endpoint.key === entry.key)
      .at(-1);
    return registered === undefined ? [this.#secret] : signingSecrets(registered, nowMs);
  }

  /** Sends a test event to every listener that wants it, once per matching target. */
  deliver(event: OutboxEvent): void {
    if (event.environment !== 'test' || this.#sockets.size === 0) return;
    const config = this.#testConfig();
    if (config?.webhooks?.devTunnel === false) return;
    const entries = config?.webhooks?.forwarding ?? [];
    const targets: Array<ForwardingEntry | null> =
      entries.length === 0
        ? [null]
        : entries.filter((entry) => wants(normalizeEvents(entry.events), event.type));
    const body = eventBody(event);
    const now = Date.now();
    for (const entry of targets) {
      const message: RelayMessage = {
        type: 'event',
        eventId: event.id,
        eventType: event.type,
        path: entry?.path ?? '',
        headers: { ...signedHeaders(event.id, now, body, this.#secretsFor(entry, now)) },
        body,
      };
      const text = JSON.stringify(message);
      for (const socket of this.#sockets) {
        if (!wants(socket.getUserData().events, event.type)) continue;
        if (socket.getBufferedAmount() > LISTENER_BACKPRESSURE_MAX) socket.end(1013, 'too slow');
        else socket.send(text);
      }
    }
  }

  /** Closes every listener (the server is stopping). */
  closeAll(): void {
    for (const socket of [...this.#sockets]) socket.end(1001, 'server stopping');
  }
}

/**
 * The uWS behaviour of the relay route; `relay()` is null until the server is ready (the
 * upgrade then answers 503 `not_ready`).
 */
export function relayBehavior(relay: () => DevRelay | null): uWS.WebSocketBehavior<Listener> {
  return {
    idleTimeout: 120,
    sendPingsAutomatically: true,
    maxBackpressure: LISTENER_BACKPRESSURE_MAX,
    maxPayloadLength: 4096,
    upgrade: (res, req, context) => {
      const current = relay();
      if (current === null) return refuse(res, 'not_ready');
      current.upgrade(res, req, context);
    },
    open: (socket) => relay()?.open(socket),
    close: (socket) => relay()?.close(socket),
  };
}
