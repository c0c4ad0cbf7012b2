/**
 * The OpenAPI 3.1 document of one environment (`GET /v1/docs/openapi.json`), generated from the
 * configuration last pushed to it.
 *
 * It describes the routes Tally serves today and nothing more: a documented route that
 * answered 404 would make the document lie. Its operations are derived from the route
 * records (public-routes.ts, routes.ts; route-record.ts): method, path, key class, the
 * record's OpenAPI description, and the query parameters and request body from the very
 * schemas the server validates with. The builder adds the security requirement of the
 * key class, the `{key}` path parameter enumerated for its entitlement type, and one
 * response per status the route can answer, with the messages of the error catalog
 * (src/errors.ts) that lead to it. The errors every keyed route shares (401, 403 for the
 * operator key, 429 rate limit, 503, ...) follow from the key class and whether the
 * route takes a body. Operator routes are not in it (docs/api.md describes them).
 *
 * `buildOpenApi` is pure (no clock, no IO); `openApiCache` keeps its serialised output
 * per environment and configuration version for `GET /v1/docs/openapi.json`.
 */
import type { BillingConfig, EntitlementType } from '../../actors/billing-config.js';
import { AMOUNT_UNITS_MAX, DECIMALS_MAX } from '../../actors/fixed.js';
import { ID_LENGTH_MAX } from '../../shared/limits.js';
import { BODY_BYTES_MAX } from '../http/limits.js';
import type { Environment } from '../../actors/protocol.js';
import type { ControlStore } from '../../storage/control-store.js';
import {
  billingConfigSchema,
  CONFIG_KEY_LENGTH_MAX,
  CONFIG_KEY_PATTERN,
} from '../config/billing-schema.js';
import { ERRORS, type ErrorCode } from '../errors.js';
import { PUBLIC_ROUTES } from './public-routes.js';
import type { AnyRouteRecord, BodySpec, Caller, RouteDoc } from './route-record.js';
import { API_ROUTES } from './routes.js';
import { WEBHOOK_SCHEMAS } from './webhook-routes.js';

type Schema = Readonly<Record<string, unknown>>;

interface ObjectSchema {
  readonly properties: Readonly<Record<string, Schema>>;
  readonly required: readonly string[];
}

export interface OpenApiMeta {
  readonly environment: Environment;
  /** The configuration version the document describes; 0 before the first push. */
  readonly version: number;
  readonly pushedAtMs: number | null;
}

/** Who may call an operation: no key, either key class, or a server key only. */
type OperationAccess = 'none' | 'client' | 'server';

/** Which keys an operation's `{key}` takes: any entitlement, only limits, or only meters. */
type PathKey = NonNullable<RouteDoc['pathKey']>;

/** A documented route, as the builder reads it: derived from its record. */
interface OperationEntry extends RouteDoc {
  readonly method: 'get' | 'post' | 'put' | 'delete';
  /** OpenAPI path template: the record's `:name` segments as `{name}`. */
  readonly path: string;
  readonly access: OperationAccess;
  /** A customer id path segment: `{customerId}` (contracts) or `{id}` (customers). */
  readonly pathCustomer?: string;
  readonly query?: ObjectSchema;
  readonly body?: Schema;
}

const ref = (name: string): Schema => ({ $ref: `#/components/schemas/${name}` });

/** Errors whose body carries the balance fields beside `error`. */
const BALANCE_ERRORS: ReadonlySet<ErrorCode> = new Set([
  'insufficient_balance',
  'refund_exceeds_usage',
]);
/** Errors answered before the key is known, so without rate-limit headers. */
const UNAUTHENTICATED_ERRORS: ReadonlySet<ErrorCode> = new Set(['key_missing', 'key_invalid']);
/** Errors answered with `Retry-After`. */
const RETRY_ERRORS: ReadonlySet<ErrorCode> = new Set(['rate_limited', 'overloaded', 'not_ready']);

/**
 * The bounds of an `exact-amount` body's `amount`, which the server checks exactly on the
 * text (route-record.ts) rather than on the double its schema sees; published here so
 * that the document refuses what the server refuses.
 */
const EXACT_AMOUNT_BOUNDS = {
  exclusiveMinimum: 0,
  maximum: AMOUNT_UNITS_MAX,
  description:
    `Greater than 0, at most ${AMOUNT_UNITS_MAX}, at most ${DECIMALS_MAX} decimal ` +
    `places (checked exactly beyond this schema).`,
} as const;

/**
 * The request body a record publishes: the schema the server validates with, as is; the
 * billing configuration's as a reference to its components; an exact amount with the
 * bounds its exact parse applies.
 */
export function publishedBody(body: BodySpec): Schema {
  if (body.schema === billingConfigSchema) return ref('BillingConfig');
  if (body.numbers !== 'exact-amount') return body.schema;
  const schema = body.schema as { readonly properties: Readonly<Record<string, Schema>> };
  return {
    ...schema,
    properties: {
      ...schema.properties,
      amount: { ...schema.properties['amount'], ...EXACT_AMOUNT_BOUNDS },
    },
  };
}

/** The documented operation of a record, or null for an undocumented (operator) route. */
function operationOf(record: AnyRouteRecord<unknown, Caller>): OperationEntry | null {
  const { doc } = record;
  if (doc === undefined || record.keys === 'operator') return null;
  const path = record.path.replace(/:(\w+)/g, '{$1}');
  const customer = doc.pathKey === undefined ? /\{(customerId|id)\}/.exec(path)?.[1] : undefined;
  return {
    ...doc,
    method: record.method.toLowerCase() as OperationEntry['method'],
    path,
    access: record.keys,
    ...(customer === undefined ? {} : { pathCustomer: customer }),
    ...(record.query === undefined ? {} : { query: record.query as unknown as ObjectSchema }),
    ...(record.body === undefined ? {} : { body: publishedBody(record.body) }),
  };
}

/**
 * Every route Tally serves but the operator's (docs/api.md lists them all), from the route tables.
 */
const OPERATIONS: readonly OperationEntry[] = [...PUBLIC_ROUTES, ...API_ROUTES]
  .map((record) => operationOf(record as AnyRouteRecord<unknown, Caller>))
  .filter((op): op is OperationEntry => op !== null);

/**
 * The OpenAPI path templates of every documented operation, for tests that compare with the router.
 */
export const DOCUMENTED_OPERATIONS: ReadonlyArray<{
  readonly method: string;
  readonly path: string;
}> = OPERATIONS.map(({ method, path }) => ({ method: method.toUpperCase(), path }));

/**
 * Builds the document. Pure and total: `config` is null before the first push, and then
 * no key can be enumerated. Never throws for a configuration that passed validation.
 * The result shares its constant parts (security schemes, headers, the edge's request
 * schemas) with this module and validation.ts: serialise it, never mutate it.
 */
export function buildOpenApi(config: BillingConfig | null, meta: OpenApiMeta): object {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const op of OPERATIONS) {
    const item = (paths[op.path] ??= {});
    item[op.method] = operationObject(op);
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'Tally',
      version: `config v${meta.version}`,
      description: infoDescription(meta),
    },
    tags: [
      { name: 'service', description: 'Health.' },
      { name: 'entitlements', description: 'Features and limits.' },
      { name: 'usage', description: 'Meters: balances, consumption, refunds.' },
      { name: 'configuration', description: 'The billing configuration and its products.' },
      {
        name: 'commerce',
        description: 'Checkout, subscriptions and purchases through the payment processor.',
      },
      { name: 'customers', description: 'Customer records and listings.' },
      { name: 'audit', description: 'The tamper-evident audit log.' },
      { name: 'contracts', description: 'Per-customer prices and included amounts.' },
      { name: 'webhooks', description: 'Endpoints that receive signed events.' },
      { name: 'docs', description: 'This document.' },
    ],
    paths,
    components: {
      schemas: {
        ...keySchemas(config, meta.version),
        ...viewSchemas(),
        ...WEBHOOK_SCHEMAS,
        ...billingConfigSchemas(),
      },
      parameters: keyParameters(),
      headers: HEADERS,
      securitySchemes: SECURITY_SCHEMES,
    },
  };
}

/**
 * The serialised document of an environment, rebuilt only when its configuration version
 * changed; only the latest version of each environment is kept. The version check reads
 * one LMDB key, not the configuration.
 *
 * Generated inline, on the first request after a push, rather than on a piscina thread:
 * building and serialising it for the largest configuration (1000 entitlements, 1000
 * products; a 195 kB document) took 4.5–5.5 ms cold and ~1.5–2.5 ms warm on the 2-core
 * machine (Node 20), once per push and environment. That is far under the 20 ms at which
 * moving it off the event loop would pay for a thread hop and cloning the configuration.
 */
export function openApiCache(
  control: Pick<ControlStore, 'latestConfig' | 'latestConfigVersion'>,
): (environment: Environment) => string {
  const cache = new Map<Environment, { readonly version: number; readonly json: string }>();
  return (environment) => {
    let cached = cache.get(environment);
    if (cached === undefined || cached.version !== control.latestConfigVersion(environment)) {
      const latest = control.latestConfig(environment);
      const version = latest?.version ?? 0;
      const meta = { environment, version, pushedAtMs: latest?.pushedAtMs ?? null };
      cached = {
        version,
        json: JSON.stringify(
          buildOpenApi(latest === null ? null : (latest.config as BillingConfig), meta),
        ),
      };
      cache.set(environment, cached);
    }
    return cached.json;
  };
}

function infoDescription(meta: OpenApiMeta): string {
  const source =
    meta.pushedAtMs === null
      ? 'No billing configuration has been pushed to this environment yet, so no keys are ' +
        'enumerated.'
      : `Generated from billing configuration v${meta.version}, ` +
        `pushed ${new Date(meta.pushedAtMs).toISOString()}.`;
  return (
    `The Tally API of the \`${meta.environment}\` environment. ${source} ` +
    'Every error body is `{"error": message}`; 409 and 429 on usage add the balance fields. ' +
    'A known path called with a method it does not list answers 405 with `Allow`; an ' +
    'unknown path 404. ' +
    `Bodies are JSON (\`content-type: application/json\`), at most ${BODY_BYTES_MAX} bytes.`
  );
}

// ---------------------------------------------------------------------------
// Operations

function operationObject(op: OperationEntry): Record<string, unknown> {
  const parameters = [
    ...(op.pathKey === undefined
      ? []
      : [{ $ref: `#/components/parameters/${KEY_PARAMETERS[op.pathKey]}` }]),
    ...(op.pathCustomer === undefined ? [] : [{ ...CUSTOMER_ID_PARAMETER, name: op.pathCustomer }]),
    ...(op.query === undefined ? [] : queryParameters(op.query)),
  ];
  return {
    operationId: op.operationId,
    tags: [op.tag],
    summary: op.summary,
    description: `${op.description} ${ACCESS_TEXT[op.access]}`,
    security: SECURITY[op.access],
    ...(parameters.length === 0 ? {} : { parameters }),
    ...(op.body === undefined
      ? {}
      : { requestBody: { required: true, content: { 'application/json': { schema: op.body } } } }),
    responses: responsesOf(op),
  };
}

const CUSTOMER_ID_PARAMETER = {
  name: 'customerId',
  in: 'path',
  required: true,
  description: "The application's id of the customer (percent-encoded).",
  schema: { type: 'string', minLength: 1, maxLength: ID_LENGTH_MAX },
};

const ACCESS_TEXT: Record<OperationAccess, string> = {
  none: 'No key is needed.',
  client: 'Either key class: a client key (`ck_…`) or a server key (`sk_…`) of the environment.',
  server: 'A server key (`sk_…`) of the environment; a client key answers 403.',
};

const SERVER_KEY = [{ serverKey: [] }, { serverBearer: [] }];
const SECURITY: Record<OperationAccess, readonly object[]> = {
  none: [],
  client: [...SERVER_KEY, { clientKey: [] }, { clientBearer: [] }],
  server: SERVER_KEY,
};

/** One query parameter per property of the edge's query schema; unknown ones answer 400. */
function queryParameters(query: ObjectSchema): object[] {
  return Object.entries(query.properties).map(([name, schema]) => ({
    name,
    in: 'query',
    required: query.required.includes(name),
    schema,
    ...(name === 'customerId'
      ? {
          description:
            "The application's id of the customer. An unknown customer reads as on the " +
            'default product.',
        }
      : {}),
  }));
}

/** The errors a route can answer: those of its key class and body, then its own. */
function errorCodesOf(op: OperationEntry): ErrorCode[] {
  const codes: ErrorCode[] = [];
  if (op.access !== 'none') {
    codes.push(
      'key_missing',
      'key_invalid',
      'environment_key_required',
      'rate_limited',
      'not_ready',
      'invalid_query',
    );
    if (op.access === 'server') codes.push('server_key_required');
  }
  if (op.body !== undefined) codes.push('content_type', 'invalid_json', 'body_too_large');
  if (op.sharded === true) codes.push('overloaded');
  codes.push(...op.errors, 'internal');
  return codes;
}

function responsesOf(op: OperationEntry): Record<string, unknown> {
  const keyed = op.access !== 'none';
  const byStatus = new Map<number, ErrorCode[]>();
  for (const code of errorCodesOf(op)) {
    const status = ERRORS[code].status;
    const codes = byStatus.get(status) ?? [];
    if (!codes.includes(code)) codes.push(code);
    byStatus.set(status, codes);
  }
  const responses: Record<string, unknown> = {};
  for (const status of op.ok.statuses ?? [200]) {
    responses[String(status)] = {
      description: op.ok.description,
      ...(keyed ? { headers: headersOf([]) } : {}),
      ...(op.ok.schema === null
        ? {}
        : { content: { 'application/json': { schema: op.ok.schema } } }),
    };
  }
  for (const status of [...byStatus.keys()].sort((a, b) => a - b)) {
    responses[String(status)] = errorResponse(byStatus.get(status) ?? [], keyed);
  }
  return responses;
}

function errorResponse(codes: readonly ErrorCode[], keyed: boolean): object {
  const withBalance = codes.filter((code) => BALANCE_ERRORS.has(code)).length;
  const schema =
    withBalance === 0
      ? ref('Error')
      : withBalance === codes.length
        ? ref('BalanceError')
        : { anyOf: [ref('Error'), ref('BalanceError')] };
  const rateCounted = keyed && !codes.every((code) => UNAUTHENTICATED_ERRORS.has(code));
  const headers = rateCounted ? headersOf(codes) : retryHeaderOf(codes);
  return {
    description: codes.map((code) => `\`${code}\`: ${ERRORS[code].message}`).join('; '),
    ...(Object.keys(headers).length === 0 ? {} : { headers }),
    content: { 'application/json': { schema } },
  };
}

/** The rate-limit headers of a keyed response (absent when the key class is unlimited). */
function headersOf(codes: readonly ErrorCode[]): Record<string, unknown> {
  return {
    'X-RateLimit-Limit': { $ref: '#/components/headers/X-RateLimit-Limit' },
    'X-RateLimit-Remaining': { $ref: '#/components/headers/X-RateLimit-Remaining' },
    'X-RateLimit-Reset': { $ref: '#/components/headers/X-RateLimit-Reset' },
    ...retryHeaderOf(codes),
  };
}

function retryHeaderOf(codes: readonly ErrorCode[]): Record<string, unknown> {
  const retrying = codes.filter((code) => RETRY_ERRORS.has(code));
  if (retrying.length === 0) return {};
  if (retrying.length === codes.length)
    return { 'Retry-After': { $ref: '#/components/headers/Retry-After' } };
  return {
    'Retry-After': {
      description:
        `Whole seconds to wait; sent ` +
        `with ${retrying.map((code) => `\`${code}\``).join(', ')} only.`,
      schema: { type: 'integer', minimum: 1 },
    },
  };
}

// ---------------------------------------------------------------------------
// Components

const SECURITY_SCHEMES = {
  serverKey: {
    type: 'apiKey',
    in: 'header',
    name: 'x-tally-key',
    description:
      'A server key (`sk_test_…` or `sk_live_…`); it selects the environment. Never ship ' +
      'it to a browser.',
  },
  clientKey: {
    type: 'apiKey',
    in: 'header',
    name: 'x-tally-key',
    description:
      'A client key (`ck_test_…` or `ck_live_…`): browser-safe, for has, limit, balance ' +
      'and this document.',
  },
  serverBearer: {
    type: 'http',
    scheme: 'bearer',
    description: 'A server key as `Authorization: Bearer sk_…`.',
  },
  clientBearer: {
    type: 'http',
    scheme: 'bearer',
    description: 'A client key as `Authorization: Bearer ck_…`.',
  },
} as const;

const HEADERS = {
  'X-RateLimit-Limit': {
    description:
      'Requests per minute allowed for this key. Absent when the key class is not rate limited.',
    schema: { type: 'integer', minimum: 1 },
  },
  'X-RateLimit-Remaining': {
    description: 'Requests left in the current one-minute window.',
    schema: { type: 'integer', minimum: 0 },
  },
  'X-RateLimit-Reset': {
    description:
      'When the current window ends, in Unix epoch seconds (windows are aligned to the ' +
      'whole minute, UTC).',
    schema: { type: 'integer', minimum: 0 },
  },
  'Retry-After': {
    description: 'Whole seconds to wait before retrying (at least 1).',
    required: true,
    schema: { type: 'integer', minimum: 1 },
  },
} as const;

const KEY_PARAMETERS: Record<PathKey, string> = {
  entitlement: 'EntitlementKeyPath',
  limit: 'LimitKeyPath',
  meter: 'MeterKeyPath',
};
const KEY_SCHEMAS: Record<PathKey, string> = {
  entitlement: 'EntitlementKey',
  limit: 'LimitKey',
  meter: 'MeterKey',
};

function keyParameters(): Record<string, object> {
  const parameters: Record<string, object> = {};
  for (const kind of Object.keys(KEY_PARAMETERS) as PathKey[]) {
    parameters[KEY_PARAMETERS[kind]] = {
      name: 'key',
      in: 'path',
      required: true,
      description: 'Entitlement key. A key not in the configuration answers 404.',
      schema: ref(KEY_SCHEMAS[kind]),
    };
  }
  return parameters;
}

/** Enumerates the keys of each kind; an empty enum is not valid JSON Schema, so none then. */
function keySchema(keys: readonly string[], what: string, version: number): Schema {
  if (keys.length > 0)
    return { type: 'string', enum: keys, description: `${what} of configuration v${version}.` };
  return {
    type: 'string',
    minLength: 1,
    maxLength: CONFIG_KEY_LENGTH_MAX,
    pattern: CONFIG_KEY_PATTERN,
    description:
      version === 0
        ? `${what}: none yet, since no configuration has been pushed (so no enum); every ` +
          `key answers 404.`
        : `${what}: configuration v${version} defines none (an empty enum is not valid JSON ` +
          `Schema); every key answers 404 or 400.`,
  };
}

function keySchemas(config: BillingConfig | null, version: number): Record<string, Schema> {
  const entitlements = Object.entries(config?.entitlements ?? {});
  const ofType = (type: EntitlementType): string[] =>
    entitlements.filter(([, def]) => def.type === type).map(([key]) => key);
  const products = Object.entries(config?.products ?? {});
  return {
    EntitlementKey: keySchema(
      entitlements.map(([key]) => key),
      'Every entitlement key (features, limits and meters)',
      version,
    ),
    LimitKey: keySchema(ofType('limit'), 'The limit keys', version),
    MeterKey: keySchema(ofType('meter'), 'The meter keys', version),
    ProductKey: keySchema(
      products.map(([key]) => key),
      'Every product key',
      version,
    ),
    PlanKey: keySchema(
      products.filter(([, def]) => def.price?.interval !== undefined).map(([key]) => key),
      'The recurring products (plans)',
      version,
    ),
  };
}

const isoTime = {
  type: 'string',
  format: 'date-time',
  description: 'ISO 8601 UTC with milliseconds.',
} as const;

const BALANCE_PROPERTIES = {
  balance: {
    type: 'number',
    minimum: 0,
    description: 'Included allowance left plus purchased-credit lots; never negative.',
  },
  included: {
    type: 'number',
    minimum: 0,
    description: "The plan's included allowance per period.",
  },
  consumed: {
    type: 'number',
    minimum: 0,
    description: 'Usage recorded in the current period, overage included.',
  },
  overage: {
    type: 'number',
    minimum: 0,
    description: 'Usage beyond the balance in the current period.',
  },
  overageAllowed: { type: 'boolean', description: 'The plan allows overage.' },
  overageEnabled: { type: 'boolean', description: 'The customer enabled overage.' },
  resets: {
    ...isoTime,
    type: ['string', 'null'],
    description: 'End of the current period; null for `reset: never`.',
  },
} as const;

function closedObject(
  properties: Readonly<Record<string, Schema>>,
  required = Object.keys(properties),
): Schema {
  return { type: 'object', properties, required, additionalProperties: false };
}

function viewSchemas(): Record<string, Schema> {
  return {
    Error: closedObject({
      error: {
        type: 'string',
        description: 'What went wrong; names the field where one is at fault.',
      },
      code: ref('ErrorCode'),
    }),
    BalanceError: closedObject({
      error: { type: 'string' },
      code: ref('ErrorCode'),
      ...BALANCE_PROPERTIES,
    }),
    ErrorCode: {
      enum: Object.keys(ERRORS),
      description:
        "The error's key in the error catalog: stable, for programs to branch on (the " +
        'message is for people and may change).',
    },
    BalanceView: closedObject(BALANCE_PROPERTIES),
    LimitView: closedObject({
      limit: { type: 'integer', minimum: 0, description: '`included + purchased`.' },
      included: { type: 'integer', minimum: 0 },
      purchased: { type: 'integer', minimum: 0 },
      expansionAllowed: { type: 'boolean' },
      autoExpansionEnabled: { type: 'boolean' },
    }),
    Health: closedObject({ ok: { const: true } }),
    PushResult: closedObject({
      version: { type: 'integer', minimum: 1 },
      pushedAt: isoTime,
      catalog: {
        type: 'array',
        items: ref('CatalogAction'),
        description: 'What the push did at the payment processor, per priced product.',
      },
    }),
    CatalogAction: closedObject({
      // A plain string: the push answers about the configuration it stores, not the one this
      // document was made from.
      productKey: { type: 'string' },
      product: { enum: ['created', 'updated', 'unchanged'] },
      processorProductId: { type: 'string' },
      price: { enum: ['created', 'unchanged'] },
      processorPriceId: { type: 'string' },
      lookupKey: {
        type: 'string',
        description: '`<environment>:<product key>:<amount>-<currency>-<interval|once>`.',
      },
      archivedPrices: {
        type: 'array',
        items: { type: 'string' },
        description: "The product's earlier prices, archived by this push.",
      },
    }),
    PullResult: closedObject({
      config: ref('BillingConfig'),
      version: { type: 'integer', minimum: 1 },
      pushedAt: isoTime,
    }),
    Plan: closedObject({
      key: ref('ProductKey'),
      name: { type: 'string' },
      type: { enum: ['free', 'recurring', 'one_time'] },
      default: { type: 'boolean' },
      price: { anyOf: [ref('ConfigPrice'), { type: 'null' }] },
      entitlements: { type: 'object', additionalProperties: ref('ConfigProductEntitlement') },
      grants: { type: 'object', additionalProperties: { type: 'number' } },
    }),
    PlanList: closedObject({ data: { type: 'array', items: ref('Plan') } }),
    CheckoutSession: closedObject({
      url: { type: 'string', description: "The processor's hosted checkout page." },
    }),
    Subscription: closedObject({
      id: { type: 'string', description: '`stripe:<processor subscription id>`.' },
      customerId: { type: 'string' },
      productKey: { type: 'string' },
      status: { type: 'string', description: "The processor's status: `active`, `canceled`, …" },
      currentPeriodStart: isoTime,
      currentPeriodEnd: isoTime,
      cancelAtPeriodEnd: { type: 'boolean' },
      processor: { const: 'stripe' },
      processorSubscriptionId: { type: 'string' },
    }),
    SubscriptionList: closedObject({
      data: { type: 'array', items: ref('Subscription') },
      nextCursor: { type: ['string', 'null'] },
    }),
    Purchase: closedObject({
      id: {
        type: 'string',
        description: '`stripe:<payment intent id>`; also the id of the credit lots it granted.',
      },
      customerId: { type: 'string' },
      productKey: { type: 'string' },
      status: { const: 'paid' },
      amount: { type: 'integer', minimum: 0, description: 'Integer minor units of `currency`.' },
      currency: { type: 'string' },
      refundedAmount: { type: 'integer', minimum: 0 },
      grant: {
        type: 'object',
        additionalProperties: { type: 'number' },
        description: 'Meter key → credits granted.',
      },
      createdAt: isoTime,
    }),
    PurchaseList: closedObject({
      data: { type: 'array', items: ref('Purchase') },
      nextCursor: { type: ['string', 'null'] },
    }),
    Customer: closedObject({
      id: { type: 'string' },
      name: { type: ['string', 'null'] },
      email: { type: ['string', 'null'] },
      metadata: {
        type: 'object',
        additionalProperties: { type: ['string', 'number', 'boolean', 'null'] },
      },
      createdAt: isoTime,
      updatedAt: isoTime,
    }),
    Context: {
      ...closedObject({
        customer: ref('Customer'),
        features: { type: 'object', additionalProperties: { type: 'boolean' } },
        usage: { type: 'object', additionalProperties: ref('BalanceView') },
        limits: { type: 'object', additionalProperties: ref('LimitView') },
        plans: { type: 'array', items: ref('Plan') },
        subscription: {
          anyOf: [ref('Subscription'), { type: 'null' }],
          description: 'The live subscription (active, trialing or past due), or null.',
        },
      }),
      required: ['customer', 'features', 'usage', 'limits'],
    },
    CustomerList: closedObject({
      data: { type: 'array', items: ref('Customer') },
      nextCursor: { type: ['string', 'null'] },
    }),
    AuditEntry: closedObject({
      id: { type: 'string' },
      seq: { type: 'integer', minimum: 1 },
      at: isoTime,
      action: { type: 'string' },
      resourceType: { type: 'string' },
      resourceId: { type: 'string' },
      actor: {
        type: 'string',
        description: 'The id of the key that made the change (never the key).',
      },
      data: { type: 'object' },
      prevHash: { type: 'string', pattern: '^[0-9a-f]{64}$' },
      hash: { type: 'string', pattern: '^[0-9a-f]{64}$' },
    }),
    AuditList: closedObject({
      data: { type: 'array', items: ref('AuditEntry') },
      nextCursor: { type: ['string', 'null'] },
    }),
    AuditVerification: {
      oneOf: [
        closedObject({
          ok: { const: true },
          entries: { type: 'integer', minimum: 0 },
          lastHash: { type: 'string' },
        }),
        closedObject({
          ok: { const: false },
          entries: { type: 'integer', minimum: 0 },
          brokenAt: { type: 'string' },
          reason: { type: 'string' },
        }),
      ],
    },
    Contract: closedObject({
      customerId: { type: 'string' },
      priceAmount: {
        type: 'integer',
        minimum: 0,
        description: 'Integer minor units of the product currency per interval.',
      },
      priceInterval: { enum: ['month', 'year'] },
      entitlements: {
        type: 'object',
        additionalProperties: closedObject({ included: { type: 'number', minimum: 0 } }),
      },
      updatedAt: isoTime,
    }),
    JsonSchemaDocument: {
      type: 'object',
      required: ['$schema', 'type', 'properties'],
      properties: {
        $schema: { const: billingConfigSchema.$schema },
        type: { const: 'object' },
        properties: { type: 'object' },
      },
    },
    OpenApiDocument: {
      type: 'object',
      required: ['openapi', 'info', 'paths', 'components'],
      properties: {
        openapi: { const: '3.1.0' },
        info: { type: 'object' },
        paths: { type: 'object' },
        components: { type: 'object' },
      },
    },
  };
}

/**
 * The billing configuration's schema as components: its `$defs` become `Config<Name>`
 * and its internal references are rewritten to them. Embedding it whole, with its own
 * `$id` and `$defs`, is valid JSON Schema 2020-12 but many OpenAPI tools cannot resolve
 * references inside an embedded resource.
 */
function billingConfigSchemas(): Record<string, Schema> {
  const { $schema: _schema, $id: _id, $defs, ...root } = billingConfigSchema;
  const schemas: Record<string, Schema> = { BillingConfig: rewriteDefsRefs(root) as Schema };
  for (const [name, def] of Object.entries($defs))
    schemas[configDefName(name)] = rewriteDefsRefs(def) as Schema;
  return schemas;
}

function configDefName(name: string): string {
  return `Config${name.charAt(0).toUpperCase()}${name.slice(1)}`;
}

function rewriteDefsRefs(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(rewriteDefsRefs);
  if (value === null || typeof value !== 'object') return value;
  const out: Record<string, unknown> = {};
  for (const [name, inner] of Object.entries(value)) {
    out[name] =
      name === '$ref' && typeof inner === 'string' && inner.startsWith('#/$defs/')
        ? `#/components/schemas/${configDefName(inner.slice('#/$defs/'.length))}`
        : rewriteDefsRefs(inner);
  }
  return out;
}
