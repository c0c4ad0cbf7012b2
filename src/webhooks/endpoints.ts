/**
 * Webhook endpoints on the front end: registration (deduplicated by environment, url and
 * registration key), listing, deletion, secret rotation, operator approval and the status
 * changes delivery reports (failing, disabled). The records live in the control store
 * (storage/webhook-registry.ts); this class keeps them in memory too, since every request
 * and every delivery decision reads them and there are few.
 *
 * Every change writes the endpoint and its audit entry in one event-loop turn, hence one
 * control-store transaction, and is answered only once both are durable. Concurrent
 * registrations of one (environment, url, key) share one promise: the first creates the
 * endpoint, the others answer it, with the same secret.
 */
import { randomBytes } from 'node:crypto';
import { EVENT_KINDS, isEventKind } from '../../shared/event-kinds.js';
import type { Environment } from '../../shared/environment.js';
import type { AuditInput, AuditLog } from '../../storage/audit-log.js';
import {
  putEndpoint,
  readEndpoints,
  removeEndpoint,
  type WebhookEndpointRecord,
  type WebhookStatus,
} from '../../storage/webhook-registry.js';
import type { BinaryDb } from '../../storage/lmdb-env.js';
import type { AddressPolicy } from './address-policy.js';
import { newWebhookSecret } from './sign.js';

/** Endpoints per environment: enough for every service of an application, bounded. */
export const WEBHOOK_ENDPOINTS_MAX = 50;

/** How long a rotated secret still signs deliveries: 24 hours. */
export const PREVIOUS_SECRET_TTL_MS = 24 * 60 * 60 * 1000;

/** Longest endpoint URL. */
export const WEBHOOK_URL_LENGTH_MAX = 2048;

/** The operator stream's chain name (approvals and re-enables are operator actions). */
const OPERATOR_STREAM = 'operator';

/** A refusal the route answers with its error code; `detail` names what is wrong. */
export class WebhookRefusal extends Error {
  constructor(
    readonly code:
      | 'invalid_request'
      | 'webhook_url_not_allowed'
      | 'webhook_not_found'
      | 'too_many_webhooks'
      | 'webhook_status_conflict',
    readonly params: Readonly<Record<string, string | number>>,
  ) {
    super(code);
  }
}

export interface RegisterInput {
  readonly url: string;
  readonly key: string;
  readonly events: string | readonly string[];
}

/**
 * The `events` filter as stored: `['*']`, or the distinct kinds in the order of EVENT_KINDS.
 * Throws a refusal naming an unknown kind.
 */
export function normalizeEvents(events: string | readonly string[]): string[] {
  const given =
    typeof events === 'string' ? events.split(',').map((kind) => kind.trim()) : [...events];
  if (given.includes('*')) return ['*'];
  if (given.length === 0 || given.some((kind) => kind === ''))
    throw new WebhookRefusal('invalid_request', {
      detail: 'events must be "*", or name at least one event kind',
    });
  const unknown = given.find((kind) => !isEventKind(kind));
  if (unknown !== undefined)
    throw new WebhookRefusal('invalid_request', {
      detail:
        `events: unknown event kind ${JSON.stringify(unknown)} ` +
        `(known: ${EVENT_KINDS.join(', ')})`,
    });
  return EVENT_KINDS.filter((kind) => given.includes(kind));
}

/** Whether an endpoint with this filter receives events of `type`. */
export function wants(events: readonly string[], type: string): boolean {
  return events[0] === '*' || events.includes(type);
}

/** The URL parsed and checked for its environment; throws a refusal naming the rule. */
function checkUrl(environment: Environment, raw: string): URL {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new WebhookRefusal('invalid_request', { detail: 'url must be an absolute URL' });
  }
  const refuse = (detail: string) => new WebhookRefusal('webhook_url_not_allowed', { detail });
  if (raw.length > WEBHOOK_URL_LENGTH_MAX)
    throw new WebhookRefusal('invalid_request', {
      detail: `url must be at most ${WEBHOOK_URL_LENGTH_MAX} characters`,
    });
  if (url.protocol !== 'https:' && url.protocol !== 'http:')
    throw refuse('url must use https (or http, for a test endpoint)');
  if (environment === 'live' && url.protocol !== 'https:')
    throw refuse('a live endpoint must use https');
  if (url.username !== '' || url.password !== '')
    throw refuse('url must not carry credentials (user:password@)');
  if (url.hash !== '') throw refuse('url must not have a fragment');
  return url;
}

export type EndpointChange =
  | 'webhook.register'
  | 'webhook.update'
  | 'webhook.delete'
  | 'webhook.rotate'
  | 'webhook.approve'
  | 'webhook.enable'
  | 'webhook.failing'
  | 'webhook.disable';

export class WebhookEndpoints {
  readonly #byId = new Map<string, WebhookEndpointRecord>();
  /** `environment \0 url \0 key` → id. */
  readonly #byIdentity = new Map<string, string>();
  /** Registrations being written, by identity: concurrent ones wait for the same write. */
  readonly #registering = new Map<
    string,
    Promise<{ record: WebhookEndpointRecord; created: boolean }>
  >();
  /** Called after every durable change (the delivery thread rereads the table). */
  onChange: () => void = () => undefined;

  constructor(
    private readonly db: BinaryDb,
    private readonly audit: AuditLog,
    private readonly policy: AddressPolicy,
  ) {
    for (const record of readEndpoints(db)) this.#remember(record);
  }

  #remember(record: WebhookEndpointRecord): void {
    this.#byId.set(record.id, record);
    this.#byIdentity.set(identity(record.environment, record.url, record.key), record.id);
  }

  /** The environment's endpoints, oldest first. */
  list(environment: Environment): WebhookEndpointRecord[] {
    return [...this.#byId.values()]
      .filter((record) => record.environment === environment)
      .sort((a, b) => a.createdAtMs - b.createdAtMs || (a.id < b.id ? -1 : 1));
  }

  /** Every endpoint (operator listing). */
  all(): WebhookEndpointRecord[] {
    return [...this.#byId.values()].sort((a, b) => a.createdAtMs - b.createdAtMs);
  }

  /** The endpoint, if it exists (in `environment`, when one is given). */
  find(id: string, environment?: Environment): WebhookEndpointRecord | undefined {
    const record = this.#byId.get(id);
    return environment === undefined || record?.environment === environment ? record : undefined;
  }

  /**
   * Registers an endpoint, or answers the one registered with the same environment, url and
   * key (updating its `events` when they differ). Rejects with a WebhookRefusal for a URL the
   * environment's rules refuse, an unknown event kind, or too many endpoints.
   */
  register(
    environment: Environment,
    input: RegisterInput,
    actor: string,
  ): Promise<{ record: WebhookEndpointRecord; created: boolean }> {
    let events: string[];
    let url: URL;
    try {
      events = normalizeEvents(input.events);
      url = checkUrl(environment, input.url);
    } catch (error) {
      return Promise.reject(error);
    }
    const id = identity(environment, input.url, input.key);
    const pending = this.#registering.get(id);
    // Another registration of this identity is being written: it is this one's answer too,
    // as an endpoint that already existed.
    if (pending !== undefined) return pending.then(({ record }) => ({ record, created: false }));
    const done = this.#register(environment, input, url, events, actor).finally(() =>
      this.#registering.delete(id),
    );
    this.#registering.set(id, done);
    return done;
  }

  async #register(
    environment: Environment,
    input: RegisterInput,
    url: URL,
    events: string[],
    actor: string,
  ): Promise<{ record: WebhookEndpointRecord; created: boolean }> {
    const existingId = this.#byIdentity.get(identity(environment, input.url, input.key));
    const existing = existingId === undefined ? undefined : this.#byId.get(existingId);
    if (existing !== undefined) {
      if (sameEvents(existing.events, events)) return { record: existing, created: false };
      const updated = { ...existing, events, updatedAtMs: Date.now() };
      await this.#write(updated, 'webhook.update', actor, { events });
      return { record: updated, created: false };
    }
    if (this.list(environment).length >= WEBHOOK_ENDPOINTS_MAX)
      throw new WebhookRefusal('too_many_webhooks', { max: WEBHOOK_ENDPOINTS_MAX });
    const refused = await this.policy.checkHost(environment, url.hostname);
    if (refused !== null) throw new WebhookRefusal('webhook_url_not_allowed', { detail: refused });
    const now = Date.now();
    const record: WebhookEndpointRecord = {
      id: `we_${randomBytes(12).toString('base64url')}`,
      environment,
      url: input.url,
      key: input.key,
      events,
      status: environment === 'live' ? 'pending_approval' : 'active',
      statusReason: null,
      secret: newWebhookSecret(),
      previousSecret: null,
      previousSecretUntilMs: null,
      createdAtMs: now,
      updatedAtMs: now,
    };
    await this.#write(record, 'webhook.register', actor, {
      url: record.url,
      key: record.key,
      events,
      status: record.status,
    });
    return { record, created: true };
  }

  /** Deletes an endpoint; its queued deliveries are dropped. Rejects `webhook_not_found`. */
  async remove(environment: Environment, id: string, actor: string): Promise<void> {
    const record = this.#existing(id, environment);
    const entry = { action: 'webhook.delete', resourceType: 'webhook', resourceId: id, actor };
    const written = removeEndpoint(this.db, id);
    const audited = this.audit.append(
      environment,
      { ...entry, data: { url: record.url, key: record.key } },
      Date.now(),
    );
    this.#byId.delete(id);
    this.#byIdentity.delete(identity(record.environment, record.url, record.key));
    await Promise.all([written, audited]);
    this.onChange();
  }

  /**
   * Issues a new secret; the previous one still signs deliveries for 24 hours (both
   * signatures are sent). Rejects `webhook_not_found`.
   */
  async rotate(
    environment: Environment,
    id: string,
    actor: string,
  ): Promise<WebhookEndpointRecord> {
    const record = this.#existing(id, environment);
    const now = Date.now();
    const rotated = {
      ...record,
      secret: newWebhookSecret(),
      previousSecret: record.secret,
      previousSecretUntilMs: now + PREVIOUS_SECRET_TTL_MS,
      updatedAtMs: now,
    };
    await this.#write(rotated, 'webhook.rotate', actor, {
      previousSecretUntil: new Date(now + PREVIOUS_SECRET_TTL_MS).toISOString(),
    });
    return rotated;
  }

  /**
   * Moves an endpoint to `status` for `change` (approval, re-enable, failing, disabled),
   * audited in its environment's log and, for an operator's action, the operator stream.
   * Rejects `webhook_not_found`, or `webhook_status_conflict` when `from` does not hold the
   * endpoint's current status.
   */
  async setStatus(
    id: string,
    change: EndpointChange,
    to: WebhookStatus,
    from: readonly WebhookStatus[],
    actor: string,
    reason: string | null = null,
  ): Promise<WebhookEndpointRecord> {
    const record = this.#existing(id);
    if (!from.includes(record.status))
      throw new WebhookRefusal('webhook_status_conflict', { id, status: record.status });
    const updated = { ...record, status: to, statusReason: reason, updatedAtMs: Date.now() };
    const operator = change === 'webhook.approve' || change === 'webhook.enable';
    await this.#write(updated, change, actor, { status: to, reason }, operator);
    return updated;
  }

  #existing(id: string, environment?: Environment): WebhookEndpointRecord {
    const record = this.find(id, environment);
    if (record === undefined) throw new WebhookRefusal('webhook_not_found', { id });
    return record;
  }

  /** Stores the record and its audit entry (and the operator's) in one turn; then remembers it. */
  async #write(
    record: WebhookEndpointRecord,
    action: EndpointChange,
    actor: string,
    data: Record<string, unknown>,
    operator = false,
  ): Promise<void> {
    const entry: AuditInput = {
      action,
      resourceType: 'webhook',
      resourceId: record.id,
      actor,
      data: { ...data, url: record.url },
    };
    const now = Date.now();
    const writes = [
      putEndpoint(this.db, record),
      this.audit.append(record.environment, entry, now),
    ];
    if (operator)
      writes.push(
        this.audit.append(
          OPERATOR_STREAM,
          { ...entry, data: { ...entry.data, environment: record.environment } },
          now,
        ),
      );
    await Promise.all(writes);
    this.#remember(record);
    this.onChange();
  }
}

function identity(environment: Environment, url: string, key: string): string {
  return `${environment}\0${url}\0${key}`;
}

function sameEvents(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((kind, i) => kind === b[i]);
}

/** The endpoint as the API shows it, with its secret. */
export function endpointView(record: WebhookEndpointRecord, nowMs = Date.now()) {
  const previousValid =
    record.previousSecretUntilMs !== null && record.previousSecretUntilMs > nowMs;
  return {
    id: record.id,
    url: record.url,
    key: record.key,
    events: record.events[0] === '*' ? '*' : record.events,
    environment: record.environment,
    status: record.status,
    statusReason: record.statusReason,
    secret: record.secret,
    previousSecretExpiresAt:
      previousValid && record.previousSecretUntilMs !== null
        ? new Date(record.previousSecretUntilMs).toISOString()
        : null,
    createdAt: new Date(record.createdAtMs).toISOString(),
    updatedAt: new Date(record.updatedAtMs).toISOString(),
  };
}

/** The secrets a delivery is signed with now: the current one, then a rotated one still valid. */
export function signingSecrets(record: WebhookEndpointRecord, nowMs: number): string[] {
  return record.previousSecret !== null &&
    record.previousSecretUntilMs !== null &&
    record.previousSecretUntilMs > nowMs
    ? [record.secret, record.previousSecret]
    : [record.secret];
}
