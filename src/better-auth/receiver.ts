/**
 * The plugin's webhook receiver (`POST /api/auth{webhook.path}`) and its status endpoint
 * (`GET` on the same path), with the lazy registration of the receiver at Tally.
 *
 * Registration (registration.ts) is lazy and idempotent. Nothing is registered at
 * start-up; the receiver registers when a delivery arrives and no endpoint is stored
 * (with `autoRegister`), the status endpoint whenever none is stored. The endpoint (id,
 * secret) is stored in the plugin's table, so every instance on the same database
 * reuses it.
 *
 * A delivery is verified (Standard Webhooks signature over the raw body, timestamp within
 * 5 minutes) with the stored secret: anything forged or stale is refused with 400 and
 * changes nothing. Each `webhook-id` is handled once: it is recorded before `onEvent`
 * runs, and released again when `onEvent` throws, so Tally's retry runs it again.
 */
import { type DBAdapter, HIDE_METADATA } from 'better-auth';
import { APIError, createAuthEndpoint } from 'better-auth/api';
import type { TallyClient } from '../client/index.js';
import { type TallyEvent, verifyWebhook, WebhookVerificationError } from '../webhooks/verify.js';
import { forward } from './endpoints.js';
import type { TallyWebhookOptions } from './options.js';
import {
  type CheckedRegistration,
  checkedRegistration,
  Registrar,
  type RegistrationDefaults,
} from './registration.js';
import { DELIVERY_MODEL, type StoredEndpoint, webhookSchema } from './webhook-schema.js';

export { webhookSchema };

export const WEBHOOK_PATH_DEFAULT = '/tally';
export const WEBHOOK_KEY_DEFAULT = 'better-auth';

/**
 * The status endpoint asks Tally at most this often per process; calls in between share
 * the last answer. It needs no session, so this bounds the calls to Tally (and the use
 * of the server key's rate limit) that anyone on the internet can cause.
 */
const STATUS_REFRESH_MS = 3_000;

/** Handled `webhook-id`s are kept this long; Tally stops retrying one event after about 28 h. */
const DELIVERY_RETENTION_MS = 7 * 24 * 60 * 60 * 1000;

/** What the status endpoint and a start-up warning say about the memory adapter. */
export const MEMORY_ADAPTER_WARNING =
  'tally plugin: the memory adapter keeps the registered webhook endpoint and the handled ' +
  'deliveries in this process only: every instance and every restart registers again ' +
  '(Tally answers the same endpoint) and duplicate deliveries are only caught per process. ' +
  'Use a persistent database adapter.';

export interface ReceiverSettings extends RegistrationDefaults {
  readonly path: string;
  readonly onEvent: TallyWebhookOptions['onEvent'];
}

/** The receiver's settings with their defaults. Throws `TypeError` for a bad path. */
export function receiverSettings(options: TallyWebhookOptions | undefined): ReceiverSettings {
  const path = options?.path ?? WEBHOOK_PATH_DEFAULT;
  if (!/^\/[A-Za-z0-9/_-]*[A-Za-z0-9_-]$/.test(path) || path.includes('//')) {
    throw new TypeError(`tally plugin: webhook.path must look like /tally, got ${path}`);
  }
  return {
    path,
    key: options?.key ?? WEBHOOK_KEY_DEFAULT,
    events: options?.events ?? '*',
    autoRegister: options?.autoRegister ?? true,
    onEvent: options?.onEvent,
  };
}

interface ReceiverContext {
  readonly baseURL: string;
  readonly adapter: DBAdapter;
  readonly isTrustedOrigin: (url: string) => boolean;
  readonly logger: { error: (message: string) => void };
}

/** The receiver URL Tally is given: Better Auth's base URL (with its base path) + path. */
function receiverUrl(baseURL: string, path: string): string {
  return baseURL.replace(/\/+$/, '') + path;
}

/**
 * Records a delivery's `webhook-id`; false when it was already recorded (a duplicate).
 * Also drops records past their retention, so the table stays bounded.
 */
async function claimDelivery(adapter: DBAdapter, webhookId: string, eventType: string) {
  const where = [{ field: 'webhookId', value: webhookId }];
  if ((await adapter.findOne({ model: DELIVERY_MODEL, where })) !== null) return false;
  const now = new Date();
  try {
    await adapter.create({
      model: DELIVERY_MODEL,
      data: { webhookId, eventType, receivedAt: now },
    });
  } catch (error) {
    // The same delivery arriving twice at once: the unique index let one through.
    if ((await adapter.findOne({ model: DELIVERY_MODEL, where })) !== null) return false;
    throw error;
  }
  await adapter.deleteMany({
    model: DELIVERY_MODEL,
    where: [
      {
        field: 'receivedAt',
        operator: 'lt',
        value: new Date(now.getTime() - DELIVERY_RETENTION_MS),
      },
    ],
  });
  return true;
}

/** The receiver and status endpoints, keyed by their `auth.api` names. */
export function receiverEndpoints(client: TallyClient, settings: ReceiverSettings) {
  const registrar = new Registrar(client, settings);
  const lastChecks = new Map<string, { atMs: number; check: Promise<CheckedRegistration> }>();
  /** The status endpoint's check, shared by the calls of STATUS_REFRESH_MS. */
  const checked = (adapter: DBAdapter, url: string): Promise<CheckedRegistration> => {
    const now = Date.now();
    const last = lastChecks.get(url);
    if (last !== undefined && now - last.atMs < STATUS_REFRESH_MS) return last.check;
    const check = checkedRegistration(adapter, registrar, url);
    lastChecks.set(url, { atMs: now, check });
    // A failed check is not kept: the next call tries again.
    check.catch(() => lastChecks.delete(url));
    return check;
  };
  // Not in the client plugin (Tally posts here; operators and deploy scripts call the
  // status), but on `auth.api` and over HTTP.
  const metadata = HIDE_METADATA;
  return {
    tallyWebhook: createAuthEndpoint(
      settings.path,
      { method: 'POST', disableBody: true, cloneRequest: true, metadata },
      async (ctx) => {
        const request = ctx.request;
        if (request === undefined) {
          throw new APIError('BAD_REQUEST', {
            message: 'the webhook receiver is called over HTTP only (it needs the raw body)',
            code: 'RAW_BODY_REQUIRED',
          });
        }
        const rawBody = await request.text();
        const url = receiverUrl(ctx.context.baseURL, settings.path);
        const endpoint = await receivingEndpoint(ctx.context, registrar, url);
        const event = verified(rawBody, request.headers, endpoint.secret);
        // verifyWebhook refuses a delivery without webhook-id, so it is present here.
        const webhookId = request.headers.get('webhook-id') as string;
        const handled = await handleOnce(ctx.context, webhookId, event, settings.onEvent);
        if (handled === 'duplicate') return ctx.json({ received: true, duplicate: true });
        return ctx.json({ received: true });
      },
    ),
    tallyWebhookStatus: createAuthEndpoint(
      settings.path,
      { method: 'GET', metadata },
      async (ctx) => {
        const url = receiverUrl(ctx.context.baseURL, settings.path);
        const { endpoint, status } = await forward(ctx.context, () =>
          checked(ctx.context.adapter, url),
        );
        const persistent = ctx.context.adapter.id !== 'memory';
        return ctx.json({
          registered: true,
          endpointId: endpoint.endpointId,
          url: endpoint.url,
          events: endpoint.events,
          status,
          persistent,
          ...(persistent ? {} : { warning: MEMORY_ADAPTER_WARNING }),
        });
      },
    ),
  };
}

/** The delivery's event, or a 400 saying why it was refused (nothing runs then). */
function verified(rawBody: string, headers: Headers, secret: string): TallyEvent {
  try {
    return verifyWebhook(rawBody, headers, secret);
  } catch (error) {
    if (!(error instanceof WebhookVerificationError)) throw error;
    throw new APIError('BAD_REQUEST', {
      message: `webhook refused: ${error.message}`,
      code: error.code.toUpperCase(),
    });
  }
}

/**
 * Runs `onEvent` once per `webhook-id`: `duplicate` when the id was handled before. When
 * `onEvent` throws, the id is released and the answer is 500, so Tally's retry runs it
 * again.
 */
async function handleOnce(
  context: ReceiverContext,
  webhookId: string,
  event: TallyEvent,
  onEvent: TallyWebhookOptions['onEvent'],
): Promise<'handled' | 'duplicate'> {
  const adapter = context.adapter;
  if (!(await claimDelivery(adapter, webhookId, event.type))) return 'duplicate';
  try {
    await onEvent?.(event);
  } catch (error) {
    await adapter.delete({
      model: DELIVERY_MODEL,
      where: [{ field: 'webhookId', value: webhookId }],
    });
    context.logger.error(`tally plugin: onEvent failed for ${event.id}: ${error}`);
    throw new APIError('INTERNAL_SERVER_ERROR', {
      message: 'onEvent failed; Tally will deliver the event again',
      code: 'EVENT_HANDLER_FAILED',
    });
  }
  return 'handled';
}

/**
 * The endpoint a delivery is verified with: the stored one, else (with `autoRegister`, of
 * the options or of the configuration's forwarding entry) a registration; without
 * either, 503 so Tally delivers again once the status endpoint has been called.
 */
async function receivingEndpoint(
  context: ReceiverContext,
  registrar: Registrar,
  url: string,
): Promise<StoredEndpoint> {
  const stored = await registrar.stored(context.adapter, url);
  if (stored !== null) return stored;
  const registration = await forward(context, () => registrar.registrationFor(url));
  if (!registration.autoRegister) {
    throw new APIError('SERVICE_UNAVAILABLE', {
      message: `no Tally webhook endpoint is registered for ${url}: call GET ${url} once`,
      code: 'WEBHOOK_NOT_REGISTERED',
    });
  }
  return forward(context, () => registrar.ensure(context.adapter, url, registration));
}
