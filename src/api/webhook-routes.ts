/**
 * The webhook routes: registration (`POST /v1/webhooks`, deduplicated by environment, url
 * and registration key), listing, one endpoint, deletion, secret rotation and the attempt
 * log; and the operator's approval and re-enable under `/v1/admin/webhooks`. The rules
 * (https for live, public addresses only, known event kinds) live in src/webhooks/; these
 * records only turn their outcomes into answers (docs/webhooks.md).
 */
import { ID_LENGTH_MAX } from '../../shared/limits.js';
import type { DeliveryLog } from '../../storage/delivery-store.js';
import type { WebhookEndpointRecord } from '../../storage/webhook-registry.js';
import { decodeComponent } from '../http/query.js';
import type { Exchange } from '../http/exchange.js';
import { LIST_LIMIT_MAX } from '../http/limits.js';
import { endpointView, WebhookRefusal, type WebhookEndpoints } from '../webhooks/endpoints.js';
import { EVENT_KINDS } from '../../shared/event-kinds.js';
import type { AdminContext, AdminRouteEntry } from './admin-routes.js';
import { decodeCursor, encodeCursor, pageLimit } from './paging.js';
import type { AnyRouteRecord, JsonSchema, ParamReader, RouteRecord } from './route-record.js';

export interface WebhookDeps {
  readonly webhooks: WebhookEndpoints;
  readonly deliveries: DeliveryLog;
  /** Tells the delivery thread an operator enabled an endpoint: it retries what it holds. */
  readonly resumeDeliveries: (endpointId: string) => void;
}

export interface RegisterBody {
  readonly url: string;
  readonly key: string;
  readonly events?: string | readonly string[];
}

interface DeliveriesQuery {
  readonly limit?: string;
  readonly cursor?: string;
}

const ref = (name: string): JsonSchema => ({ $ref: `#/components/schemas/${name}` });

/** POST /v1/webhooks. `events` defaults to every kind. */
export const registerSchema = {
  type: 'object',
  properties: {
    url: { type: 'string', minLength: 1, maxLength: 2048, description: 'The receiver.' },
    key: {
      type: 'string',
      minLength: 1,
      maxLength: ID_LENGTH_MAX,
      description: 'Registration key: with the url, what makes the endpoint unique.',
    },
    events: {
      description:
        '`"*"` (every kind), a comma-separated string of kinds, or an array of kinds. ' +
        'Default `"*"`.',
      anyOf: [
        { type: 'string', minLength: 1, maxLength: 1024 },
        {
          type: 'array',
          minItems: 1,
          maxItems: 32,
          items: { type: 'string', minLength: 1, maxLength: 64 },
        },
      ],
    },
  },
  required: ['url', 'key'],
  additionalProperties: false,
} as const;

const deliveriesQuerySchema = {
  type: 'object',
  properties: {
    limit: {
      type: 'string',
      pattern: '^[0-9]{1,4}$',
      description: `a whole number from 1 to ${LIST_LIMIT_MAX}`,
    },
    cursor: { type: 'string', minLength: 1, maxLength: 2048 },
  },
  required: [],
  additionalProperties: false,
} as const;

/** A webhook endpoint id path segment (`we_…`). */
const endpointId: ParamReader = (raw, ex) => {
  const id = decodeComponent(raw, false);
  if (id === null || !/^we_[A-Za-z0-9_-]{1,64}$/.test(id)) {
    ex.fail('invalid_query', { detail: 'id must be a webhook endpoint id (we_…)' });
    return null;
  }
  return id;
};

/** Answers a refusal from the endpoint rules, or 500 for anything else. */
function failWith(ex: Exchange, error: unknown): void {
  if (error instanceof WebhookRefusal) return ex.fail(error.code, error.params);
  ex.failInternal(error);
}

function answer(ex: Exchange, status: number, work: Promise<WebhookEndpointRecord>): void {
  work.then(
    (record) => ex.json(status, endpointView(record)),
    (error: unknown) => failWith(ex, error),
  );
}

function route<B = undefined, Q = undefined>(
  record: RouteRecord<WebhookDeps, B, Q>,
): AnyRouteRecord<WebhookDeps> {
  return record;
}

const ENDPOINT_ERRORS = ['webhook_not_found'] as const;

/** The environment routes: records of the API route table (routes.ts spreads them in). */
export const WEBHOOK_ROUTES: ReadonlyArray<AnyRouteRecord<WebhookDeps>> = [
  route<RegisterBody>({
    method: 'POST',
    path: '/v1/webhooks',
    keys: 'server',
    audited: true,
    body: { schema: registerSchema, numbers: 'as-parsed' },
    doc: {
      operationId: 'registerWebhook',
      tag: 'webhooks',
      summary: 'Register a webhook endpoint (idempotent by url and key)',
      description:
        'Creates the endpoint (201) or answers the one already registered in this environment ' +
        'with the same `url` and `key` (200; its `events` are updated when they differ). ' +
        'Concurrent registrations create one endpoint. Every answer carries its `secret`. A ' +
        'live endpoint must use https, reach only public addresses and starts ' +
        '`pending_approval` until an operator approves it. Event kinds: ' +
        `${EVENT_KINDS.join(', ')}.`,
      ok: {
        description: 'The endpoint, with its signing secret.',
        schema: ref('WebhookEndpoint'),
        statuses: [200, 201],
      },
      errors: ['invalid_request', 'webhook_url_not_allowed', 'too_many_webhooks'],
    },
    handle: (ctx, deps) => {
      const { url, key, events } = ctx.body;
      deps.webhooks.register(ctx.environment, { url, key, events: events ?? '*' }, ctx.key.id).then(
        ({ record, created }) => ctx.ex.json(created ? 201 : 200, endpointView(record)),
        (error: unknown) => failWith(ctx.ex, error),
      );
    },
  }),
  route({
    method: 'GET',
    path: '/v1/webhooks',
    keys: 'server',
    audited: false,
    doc: {
      operationId: 'listWebhooks',
      tag: 'webhooks',
      summary: "The environment's webhook endpoints, oldest first",
      description: 'Every endpoint of the environment (at most 50), with its secret.',
      ok: { description: 'The endpoints.', schema: ref('WebhookEndpointList') },
      errors: [],
    },
    handle: (ctx, deps) =>
      ctx.ex.json(200, {
        data: deps.webhooks.list(ctx.environment).map((record) => endpointView(record)),
        nextCursor: null,
      }),
  }),
  route({
    method: 'GET',
    path: '/v1/webhooks/:id',
    keys: 'server',
    param: endpointId,
    audited: false,
    doc: {
      operationId: 'getWebhook',
      tag: 'webhooks',
      summary: 'One webhook endpoint',
      description: 'The endpoint with its secret and status.',
      ok: { description: 'The endpoint.', schema: ref('WebhookEndpoint') },
      errors: [...ENDPOINT_ERRORS],
    },
    handle: (ctx, deps) => {
      const record = deps.webhooks.find(ctx.param, ctx.environment);
      if (record === undefined) return ctx.ex.fail('webhook_not_found', { id: ctx.param });
      ctx.ex.json(200, endpointView(record));
    },
  }),
  route({
    method: 'DELETE',
    path: '/v1/webhooks/:id',
    keys: 'server',
    param: endpointId,
    audited: true,
    doc: {
      operationId: 'deleteWebhook',
      tag: 'webhooks',
      summary: 'Delete a webhook endpoint',
      description: 'It receives nothing more; what was queued for it is dropped.',
      ok: { description: 'Deleted.', schema: null, statuses: [204] },
      errors: [...ENDPOINT_ERRORS],
    },
    handle: (ctx, deps) =>
      deps.webhooks.remove(ctx.environment, ctx.param, ctx.key.id).then(
        () => ctx.ex.send(204, ''),
        (error: unknown) => failWith(ctx.ex, error),
      ),
  }),
  route({
    method: 'POST',
    path: '/v1/webhooks/:id/rotate',
    keys: 'server',
    param: endpointId,
    audited: true,
    doc: {
      operationId: 'rotateWebhookSecret',
      tag: 'webhooks',
      summary: "Rotate an endpoint's signing secret",
      description:
        'Issues a new secret. For 24 hours deliveries carry two signatures, one with each ' +
        'secret, so receivers can switch without losing a delivery.',
      ok: { description: 'The endpoint, with its new secret.', schema: ref('WebhookEndpoint') },
      errors: [...ENDPOINT_ERRORS],
    },
    handle: (ctx, deps) =>
      answer(ctx.ex, 200, deps.webhooks.rotate(ctx.environment, ctx.param, ctx.key.id)),
  }),
  route<undefined, DeliveriesQuery>({
    method: 'GET',
    path: '/v1/webhooks/:id/deliveries',
    keys: 'server',
    param: endpointId,
    query: deliveriesQuerySchema,
    audited: false,
    doc: {
      operationId: 'listWebhookDeliveries',
      tag: 'webhooks',
      summary: "An endpoint's delivery attempts, newest first",
      description:
        'Each attempt: the event, its attempt number, when, how long it took, the ' +
        "receiver's status and the error (timeout, refused connection, non-2xx). `pending` " +
        'counts the deliveries still queued.',
      ok: { description: 'A page.', schema: ref('WebhookDeliveryList') },
      errors: [...ENDPOINT_ERRORS],
    },
    handle: (ctx, deps) => {
      if (deps.webhooks.find(ctx.param, ctx.environment) === undefined)
        return ctx.ex.fail('webhook_not_found', { id: ctx.param });
      const limit = pageLimit(ctx.ex, ctx.query.limit);
      if (limit === null) return;
      let before: number | null = null;
      if (ctx.query.cursor !== undefined) {
        before = decodeCursor(ctx.ex, ctx.query.cursor, (p) =>
          typeof p.before === 'number' ? p.before : null,
        );
        if (before === null) return;
      }
      const page = deps.deliveries.page(ctx.param, limit, before);
      ctx.ex.json(200, {
        data: page.data.map(({ seq, atMs, ...attempt }) => ({
          id: `del_${seq}`,
          at: new Date(atMs).toISOString(),
          ...attempt,
        })),
        pending: deps.deliveries.pendingCount(ctx.param),
        nextCursor: page.nextBefore === null ? null : encodeCursor({ before: page.nextBefore }),
      });
    },
  }),
];

/** The operator's webhook routes (admin-routes.ts takes them as extra entries). */
export function webhookAdminRoutes(deps: WebhookDeps): AdminRouteEntry[] {
  const change =
    (work: (ctx: AdminContext) => Promise<WebhookEndpointRecord>, after?: (id: string) => void) =>
    (ctx: AdminContext) =>
      work(ctx).then(
        (record) => {
          after?.(record.id);
          const { secret: _secret, ...view } = endpointView(record);
          ctx.ex.json(200, view);
        },
        (error: unknown) => failWith(ctx.ex, error),
      );
  return [
    [
      'GET',
      '/v1/admin/webhooks',
      {
        keys: 'operator',
        audited: false,
        handle: (ctx) =>
          ctx.ex.json(200, {
            data: deps.webhooks.all().map((record) => {
              const { secret: _secret, ...view } = endpointView(record);
              return view;
            }),
          }),
      },
    ],
    [
      'POST',
      '/v1/admin/webhooks/:id/approve',
      {
        keys: 'operator',
        param: endpointId,
        audited: true,
        handle: change((ctx) =>
          deps.webhooks.setStatus(
            ctx.param,
            'webhook.approve',
            'active',
            ['pending_approval'],
            ctx.key.id,
          ),
        ),
      },
    ],
    [
      'POST',
      '/v1/admin/webhooks/:id/enable',
      {
        keys: 'operator',
        param: endpointId,
        audited: true,
        handle: change(
          (ctx) =>
            deps.webhooks.setStatus(
              ctx.param,
              'webhook.enable',
              'active',
              ['failing', 'disabled'],
              ctx.key.id,
            ),
          deps.resumeDeliveries,
        ),
      },
    ],
  ];
}

const isoTime = { type: 'string', format: 'date-time' } as const;

function closed(properties: Readonly<Record<string, JsonSchema>>): JsonSchema {
  return {
    type: 'object',
    properties,
    required: Object.keys(properties),
    additionalProperties: false,
  };
}

/** The answers' schemas, for the OpenAPI document's components. */
export const WEBHOOK_SCHEMAS: Readonly<Record<string, JsonSchema>> = {
  WebhookEndpoint: closed({
    id: { type: 'string', description: '`we_…`.' },
    url: { type: 'string' },
    key: { type: 'string' },
    events: {
      anyOf: [{ const: '*' }, { type: 'array', items: { enum: [...EVENT_KINDS] } }],
    },
    environment: { enum: ['test', 'live'] },
    status: { enum: ['active', 'pending_approval', 'failing', 'disabled'] },
    statusReason: { type: ['string', 'null'] },
    secret: { type: 'string', description: '`whsec_…`: verifies the signatures.' },
    previousSecretExpiresAt: {
      type: ['string', 'null'],
      description: 'After a rotation, until when the previous secret also signs.',
    },
    createdAt: isoTime,
    updatedAt: isoTime,
  }),
  WebhookEndpointList: closed({
    data: { type: 'array', items: ref('WebhookEndpoint') },
    nextCursor: { type: 'null' },
  }),
  WebhookDelivery: closed({
    id: { type: 'string' },
    eventId: { type: 'string' },
    type: { type: 'string' },
    attempt: { type: 'integer', minimum: 1 },
    at: isoTime,
    durationMs: { type: 'number', minimum: 0 },
    responseStatus: { type: ['integer', 'null'] },
    ok: { type: 'boolean' },
    error: { type: ['string', 'null'] },
  }),
  WebhookDeliveryList: closed({
    data: { type: 'array', items: ref('WebhookDelivery') },
    pending: { type: 'integer', minimum: 0 },
    nextCursor: { type: ['string', 'null'] },
  }),
};
