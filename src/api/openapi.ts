/**
 * The OpenAPI 3.1 document of one environment (`GET /v1/docs/openapi.json`), generated from the
 * configuration last pushed to it.
 *
 * It describes the routes Tally serves today and nothing more: a documented route that
 * answered 404 would make the document lie. Each route is one entry of `OPERATIONS`;
 * the builder derives from the entry the security requirement of its key class, the
 * `{key}` path parameter enumerated for its entitlement type, the query parameters and
 * request body from the very schemas the edge compiles (validation.ts, billing-schema.ts),
 * and one response per status it can answer, with the messages of the error catalog
 * (src/errors.ts) that lead to it. The errors every keyed route shares (401, 403 for the
 * operator key, 429 rate limit, 503, ...) are added from the entry's key class and
 * whether it takes a body, so adding a route is adding one entry.
 *
 * `buildOpenApi` is pure (no clock, no IO): the route in routes.ts caches its serialised
 * output per environment and configuration version.
 */
import type { BillingConfig, EntitlementType } from '../../actors/billing-config.js';
import { AMOUNT_UNITS_MAX, DECIMALS_MAX } from '../../actors/fixed.js';
import { ID_LENGTH_MAX } from '../../shared/limits.js';
import { BODY_BYTES_MAX, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX } from '../http/limits.js';
import type { Environment } from '../../actors/protocol.js';
import { billingConfigSchema, CONFIG_KEY_LENGTH_MAX, CONFIG_KEY_PATTERN } from '../config/billing-schema.js';
import { ERRORS, type ErrorCode } from '../errors.js';
import { checkoutSchema, commerceListQuerySchema } from './commerce-validation.js';
import { auditQuerySchema, contextSchema, contractSchema, customerListQuerySchema, customerQuerySchema, customerUpsertSchema, limitSettingsSchema, usageAmountSchema, usageSettingsSchema } from './validation.js';

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
type PathKey = 'entitlement' | 'limit' | 'meter';

interface OperationEntry {
  readonly method: 'get' | 'post' | 'put' | 'delete';
  /** OpenAPI path template; `{key}` is the entitlement key segment. */
  readonly path: string;
  readonly operationId: string;
  readonly tag: 'service' | 'entitlements' | 'usage' | 'configuration' | 'commerce' | 'customers' | 'contracts' | 'audit' | 'docs';
  readonly summary: string;
  readonly description: string;
  readonly access: OperationAccess;
  readonly pathKey?: PathKey;
  /** A customer id path segment: `{customerId}` (contracts) or `{id}` (customers). */
  readonly pathCustomer?: 'customerId' | 'id';
  readonly query?: ObjectSchema;
  readonly body?: Schema;
  /** Answered by a shard worker, whose queue may be full (503 `overloaded`). */
  readonly sharded?: boolean;
  /** The success answer(s); `schema: null` with status 204 means no body. */
  readonly ok: { readonly description: string; readonly schema: Schema | null; readonly statuses?: readonly (200 | 201 | 204)[] };
  /** Errors particular to this route; the shared ones follow from access and body. */
  readonly errors: readonly ErrorCode[];
}

const ref = (name: string): Schema => ({ $ref: `#/components/schemas/${name}` });

/** Errors whose body carries the balance fields beside `error`. */
const BALANCE_ERRORS: ReadonlySet<ErrorCode> = new Set(['insufficient_balance', 'refund_exceeds_usage']);
/** Errors answered before the key is known, so without rate-limit headers. */
const UNAUTHENTICATED_ERRORS: ReadonlySet<ErrorCode> = new Set(['key_missing', 'key_invalid']);
/** Errors answered with `Retry-After`. */
const RETRY_ERRORS: ReadonlySet<ErrorCode> = new Set(['rate_limited', 'overloaded', 'not_ready']);

const amountSchema = {
  ...usageAmountSchema.properties.amount,
  exclusiveMinimum: 0,
  maximum: AMOUNT_UNITS_MAX,
  description: `Greater than 0, at most ${AMOUNT_UNITS_MAX}, at most ${DECIMALS_MAX} decimal places (checked exactly beyond this schema).`,
};

/** Every route Tally serves but the operator's (docs/api.md lists them all). */
const OPERATIONS: readonly OperationEntry[] = [
  {
    method: 'get', path: '/healthz', operationId: 'getHealth', tag: 'service', access: 'none',
    summary: 'Readiness', description: 'Answers 200 once recovery from disk has finished.',
    ok: { description: 'The service is ready.', schema: ref('Health') }, errors: ['not_ready'],
  },
  {
    method: 'get', path: '/v1/schema/billing', operationId: 'getBillingSchema', tag: 'configuration', access: 'none',
    summary: 'JSON Schema of the billing configuration', description: 'Public: no key is needed.',
    ok: { description: 'A JSON Schema (draft 2020-12).', schema: ref('JsonSchemaDocument') }, errors: [],
  },
  {
    method: 'get', path: '/v1/entitlements/{key}/has', operationId: 'hasEntitlement', tag: 'entitlements',
    access: 'client', pathKey: 'entitlement', query: customerQuerySchema, sharded: true,
    summary: 'Does the customer have the entitlement?',
    description: 'Any type: a feature when granted, a limit when its limit > 0, a meter when its balance > 0 or overage is enabled.',
    ok: { description: 'Whether the customer has it.', schema: { type: 'boolean' } },
    errors: ['not_configured', 'entitlement_not_found'],
  },
  {
    method: 'get', path: '/v1/entitlements/{key}/limit', operationId: 'getLimit', tag: 'entitlements',
    access: 'client', pathKey: 'limit', query: customerQuerySchema, sharded: true,
    summary: 'A numeric limit of the customer', description: 'Limits only; another type answers 400.',
    ok: { description: 'The limit.', schema: ref('LimitView') },
    errors: ['not_configured', 'entitlement_not_found', 'wrong_entitlement_type'],
  },
  {
    method: 'post', path: '/v1/entitlements/{key}/limit/settings', operationId: 'setLimitSettings', tag: 'entitlements',
    access: 'server', pathKey: 'limit', body: limitSettingsSchema, sharded: true,
    summary: 'Set purchased expansion or auto-expansion consent',
    description: 'At least one of `purchased`, `autoExpansionEnabled`; both need `expansion` in the customer\'s plan.',
    ok: { description: 'The updated limit.', schema: ref('LimitView') },
    errors: ['not_configured', 'entitlement_not_found', 'wrong_entitlement_type', 'invalid_request', 'expansion_not_allowed'],
  },
  {
    method: 'get', path: '/v1/usage/{key}/balance', operationId: 'getBalance', tag: 'usage',
    access: 'client', pathKey: 'meter', query: customerQuerySchema, sharded: true,
    summary: 'A meter balance of the customer', description: 'Meters only; another type answers 400.',
    ok: { description: 'The balance.', schema: ref('BalanceView') },
    errors: ['not_configured', 'entitlement_not_found', 'wrong_entitlement_type'],
  },
  {
    method: 'post', path: '/v1/usage/{key}/consume', operationId: 'consumeUsage', tag: 'usage',
    access: 'server', pathKey: 'meter', sharded: true,
    body: { ...usageAmountSchema, properties: { ...usageAmountSchema.properties, amount: amountSchema } },
    summary: 'Consume usage',
    description: 'Draws included allowance, then purchased-credit lots oldest first, then overage when enabled. ' +
      'All-or-nothing: when short, 429 with the balance fields and nothing drawn. A retry with the same ' +
      '`idempotencyKey` (kept 24 h) is applied once and answers the current balance.',
    ok: { description: 'The balance after the draw.', schema: ref('BalanceView') },
    errors: ['not_configured', 'entitlement_not_found', 'wrong_entitlement_type', 'invalid_request', 'idempotency_key_reused', 'insufficient_balance'],
  },
  {
    method: 'post', path: '/v1/usage/{key}/refund', operationId: 'refundUsage', tag: 'usage',
    access: 'server', pathKey: 'meter', sharded: true,
    body: { ...usageAmountSchema, properties: { ...usageAmountSchema.properties, amount: amountSchema } },
    summary: 'Refund usage',
    description: 'Unwinds the current period\'s recorded usage: overage, then the lots drawn (newest first), then ' +
      'included allowance. Beyond the refundable usage: 409 with the balance fields.',
    ok: { description: 'The balance after the refund.', schema: ref('BalanceView') },
    errors: ['not_configured', 'entitlement_not_found', 'wrong_entitlement_type', 'invalid_request', 'idempotency_key_reused', 'refund_exceeds_usage'],
  },
  {
    method: 'post', path: '/v1/usage/{key}/settings', operationId: 'setUsageSettings', tag: 'usage',
    access: 'server', pathKey: 'meter', body: usageSettingsSchema, sharded: true,
    summary: 'Enable or disable overage', description: '`overageEnabled: true` needs `overage` in the customer\'s plan.',
    ok: { description: 'The updated balance.', schema: ref('BalanceView') },
    errors: ['not_configured', 'entitlement_not_found', 'wrong_entitlement_type', 'invalid_request', 'overage_not_allowed'],
  },
  {
    method: 'post', path: '/v1/sync/push', operationId: 'pushConfig', tag: 'configuration', access: 'server',
    body: ref('BillingConfig'),
    summary: 'Push a billing configuration',
    description: 'Validated against the schema and then for what a schema cannot say; a 400 lists every violation. ' +
      'Priced products are then created or updated at the payment processor (502 when it fails, and nothing is stored). ' +
      'The pushed version applies at once; this document is regenerated from it.',
    ok: { description: 'The version assigned, and what the push did at the processor.', schema: ref('PushResult') }, errors: ['invalid_config', 'processor_error'],
  },
  {
    method: 'get', path: '/v1/sync/pull', operationId: 'pullConfig', tag: 'configuration', access: 'server',
    summary: 'The last pushed configuration', description: 'Exactly the pushed document, with its version.',
    ok: { description: 'The configuration.', schema: ref('PullResult') }, errors: ['config_not_found'],
  },
  {
    method: 'get', path: '/v1/plans', operationId: 'listPlans', tag: 'configuration', access: 'server',
    summary: 'The products of the configuration', description: 'Named plans for compatibility; the records are products.',
    ok: { description: 'Every product.', schema: ref('PlanList') }, errors: [],
  },
  {
    method: 'post', path: '/v1/checkout', operationId: 'createCheckout', tag: 'commerce', access: 'server',
    body: checkoutSchema, sharded: true,
    summary: 'A hosted checkout for a priced product',
    description: 'A recurring product opens a subscription checkout, a one-time product a payment. The customer is created ' +
      'if needed. Nothing changes until the processor reports the payment. 409 when the customer already has an active ' +
      'subscription and the product is recurring: change plans with POST /v1/subscriptions/change.',
    ok: { description: 'The checkout page\'s address.', schema: ref('CheckoutSession') },
    errors: ['invalid_request', 'not_configured', 'product_not_found', 'product_not_purchasable', 'subscription_exists', 'processor_error'],
  },
  {
    method: 'get', path: '/v1/subscriptions', operationId: 'listSubscriptions', tag: 'commerce', access: 'server',
    query: commerceListQuerySchema, sharded: true,
    summary: 'A customer\'s subscriptions, in id order',
    description: `Pages of at most \`limit\` (default ${LIST_LIMIT_DEFAULT}, at most ${LIST_LIMIT_MAX}); pass \`nextCursor\` as \`cursor\`.`,
    ok: { description: 'A page.', schema: ref('SubscriptionList') }, errors: [],
  },
  {
    method: 'get', path: '/v1/purchases', operationId: 'listPurchases', tag: 'commerce', access: 'server',
    query: commerceListQuerySchema, sharded: true,
    summary: 'A customer\'s one-time purchases, in id order',
    description: `Pages of at most \`limit\` (default ${LIST_LIMIT_DEFAULT}, at most ${LIST_LIMIT_MAX}); pass \`nextCursor\` as \`cursor\`.`,
    ok: { description: 'A page.', schema: ref('PurchaseList') }, errors: [],
  },
  {
    method: 'get', path: '/v1/contracts/{customerId}', operationId: 'getContract', tag: 'contracts', access: 'server',
    pathCustomer: 'customerId', sharded: true,
    summary: 'A customer\'s contract', description: 'The stored contract; 404 when the customer has none.',
    ok: { description: 'The contract.', schema: ref('Contract') }, errors: ['contract_not_found'],
  },
  {
    method: 'put', path: '/v1/contracts/{customerId}', operationId: 'putContract', tag: 'contracts', access: 'server',
    pathCustomer: 'customerId', body: contractSchema, sharded: true,
    summary: 'Set a customer\'s contract',
    description: 'Replaces the contract. `entitlements.{key}.included` replaces the plan\'s included amount of a limit or meter; ' +
      'for a feature, `included > 0` grants it and `0` denies it. Keys must be entitlements of the configuration. ' +
      'An unknown customer is created.',
    ok: { description: 'The stored contract.', schema: ref('Contract') }, errors: ['invalid_request'],
  },
  {
    method: 'delete', path: '/v1/contracts/{customerId}', operationId: 'deleteContract', tag: 'contracts', access: 'server',
    pathCustomer: 'customerId', sharded: true,
    summary: 'Remove a customer\'s contract', description: 'The plan\'s values apply again.',
    ok: { description: 'Removed.', schema: null, statuses: [204] }, errors: ['contract_not_found'],
  },
  {
    method: 'get', path: '/v1/audit', operationId: 'listAudit', tag: 'audit', access: 'server', query: auditQuerySchema,
    summary: 'The audit log, newest first',
    description: 'Every administrative mutation of the environment (config push, customer upsert, contracts, settings, usage refunds), ' +
      `hash-chained. Filter by \`action\` and \`resourceType\`; \`limit\` (default ${LIST_LIMIT_DEFAULT}, at most ${LIST_LIMIT_MAX}) and \`cursor\` page.`,
    ok: { description: 'A page.', schema: ref('AuditList') }, errors: [],
  },
  {
    method: 'get', path: '/v1/audit/verify', operationId: 'verifyAudit', tag: 'audit', access: 'server',
    summary: 'Check the audit chain', description: 'Recomputes every entry\'s hash and link; reports the first entry that breaks the chain.',
    ok: { description: 'The verdict.', schema: ref('AuditVerification') }, errors: [],
  },
  {
    method: 'post', path: '/v1/context', operationId: 'getContext', tag: 'customers', access: 'server',
    body: contextSchema, sharded: true,
    summary: 'Upsert a customer and read its entitlements in one call',
    description: '`features` takes any entitlement (as `/has`), `usage` only meters, `limits` only limits. ' +
      'An unknown key is 404 naming it; a key of the wrong type 400. `plans` and `subscription` (the live subscription or null) only when asked for.',
    ok: { description: 'The customer and the requested answers.', schema: ref('Context') },
    errors: ['invalid_request', 'not_configured', 'entitlement_not_found', 'wrong_entitlement_type'],
  },
  {
    method: 'post', path: '/v1/customers', operationId: 'upsertCustomer', tag: 'customers', access: 'server',
    body: customerUpsertSchema, sharded: true,
    summary: 'Create or update a customer',
    description: '201 when the customer is new, 200 when it existed (also when a consume created it). Only the fields ' +
      'given change; metadata keys merge and a `null` value removes a key (at most 50 keys).',
    ok: { description: 'The stored customer.', schema: ref('Customer'), statuses: [200, 201] }, errors: ['invalid_request'],
  },
  {
    method: 'get', path: '/v1/customers', operationId: 'listCustomers', tag: 'customers', access: 'server',
    query: customerListQuerySchema,
    summary: 'Customers in id order',
    description: `Pages of at most \`limit\` (default ${LIST_LIMIT_DEFAULT}, at most ${LIST_LIMIT_MAX}); pass \`nextCursor\` as \`cursor\` for the next page. ` +
      'Cursors are opaque and stay valid while customers are added.',
    ok: { description: 'A page.', schema: ref('CustomerList') }, errors: [],
  },
  {
    method: 'get', path: '/v1/customers/{id}', operationId: 'getCustomer', tag: 'customers', access: 'server',
    pathCustomer: 'id',
    summary: 'One customer', description: 'Customers created implicitly by a consume exist too.',
    ok: { description: 'The customer.', schema: ref('Customer') }, errors: ['customer_not_found'],
  },
  {
    method: 'get', path: '/v1/docs/openapi.json', operationId: 'getOpenApi', tag: 'docs', access: 'client',
    summary: 'This document', description: 'Generated from the configuration last pushed to the key\'s environment.',
    ok: { description: 'An OpenAPI 3.1 document.', schema: ref('OpenApiDocument') }, errors: [],
  },
];

/** The OpenAPI path templates of every documented operation, for tests that compare with the router. */
export const DOCUMENTED_OPERATIONS: ReadonlyArray<{ readonly method: string; readonly path: string }> =
  OPERATIONS.map(({ method, path }) => ({ method: method.toUpperCase(), path }));

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
      { name: 'commerce', description: 'Checkout, subscriptions and purchases through the payment processor.' },
      { name: 'customers', description: 'Customer records and listings.' },
      { name: 'audit', description: 'The tamper-evident audit log.' },
      { name: 'contracts', description: 'Per-customer prices and included amounts.' },
      { name: 'docs', description: 'This document.' },
    ],
    paths,
    components: {
      schemas: { ...keySchemas(config, meta.version), ...viewSchemas(), ...billingConfigSchemas() },
      parameters: keyParameters(),
      headers: HEADERS,
      securitySchemes: SECURITY_SCHEMES,
    },
  };
}

function infoDescription(meta: OpenApiMeta): string {
  const source = meta.pushedAtMs === null
    ? 'No billing configuration has been pushed to this environment yet, so no keys are enumerated.'
    : `Generated from billing configuration v${meta.version}, pushed ${new Date(meta.pushedAtMs).toISOString()}.`;
  return `The Tally API of the \`${meta.environment}\` environment. ${source} ` +
    'Every error body is `{"error": message}`; 409 and 429 on usage add the balance fields. ' +
    'A known path called with a method it does not list answers 405 with `Allow`; an unknown path 404. ' +
    `Bodies are JSON (\`content-type: application/json\`), at most ${BODY_BYTES_MAX} bytes.`;
}

// ---------------------------------------------------------------------------
// Operations

function operationObject(op: OperationEntry): Record<string, unknown> {
  const parameters = [
    ...(op.pathKey === undefined ? [] : [{ $ref: `#/components/parameters/${KEY_PARAMETERS[op.pathKey]}` }]),
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
    ...(op.body === undefined ? {} : { requestBody: { required: true, content: { 'application/json': { schema: op.body } } } }),
    responses: responsesOf(op),
  };
}

const CUSTOMER_ID_PARAMETER = {
  name: 'customerId',
  in: 'path',
  required: true,
  description: 'The application\'s id of the customer (percent-encoded).',
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
    ...(name === 'customerId' ? { description: 'The application\'s id of the customer. An unknown customer reads as on the default product.' } : {}),
  }));
}

/** The errors a route can answer: those of its key class and body, then its own. */
function errorCodesOf(op: OperationEntry): ErrorCode[] {
  const codes: ErrorCode[] = [];
  if (op.access !== 'none') {
    codes.push('key_missing', 'key_invalid', 'environment_key_required', 'rate_limited', 'not_ready', 'invalid_query');
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
      ...(op.ok.schema === null ? {} : { content: { 'application/json': { schema: op.ok.schema } } }),
    };
  }
  for (const status of [...byStatus.keys()].sort((a, b) => a - b)) {
    responses[String(status)] = errorResponse(byStatus.get(status) ?? [], keyed);
  }
  return responses;
}

function errorResponse(codes: readonly ErrorCode[], keyed: boolean): object {
  const withBalance = codes.filter((code) => BALANCE_ERRORS.has(code)).length;
  const schema = withBalance === 0 ? ref('Error')
    : withBalance === codes.length ? ref('BalanceError')
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
  if (retrying.length === codes.length) return { 'Retry-After': { $ref: '#/components/headers/Retry-After' } };
  return {
    'Retry-After': {
      description: `Whole seconds to wait; sent with ${retrying.map((code) => `\`${code}\``).join(', ')} only.`,
      schema: { type: 'integer', minimum: 1 },
    },
  };
}

// ---------------------------------------------------------------------------
// Components

const SECURITY_SCHEMES = {
  serverKey: {
    type: 'apiKey', in: 'header', name: 'x-tally-key',
    description: 'A server key (`sk_test_…` or `sk_live_…`); it selects the environment. Never ship it to a browser.',
  },
  clientKey: {
    type: 'apiKey', in: 'header', name: 'x-tally-key',
    description: 'A client key (`ck_test_…` or `ck_live_…`): browser-safe, for has, limit, balance and this document.',
  },
  serverBearer: { type: 'http', scheme: 'bearer', description: 'A server key as `Authorization: Bearer sk_…`.' },
  clientBearer: { type: 'http', scheme: 'bearer', description: 'A client key as `Authorization: Bearer ck_…`.' },
} as const;

const HEADERS = {
  'X-RateLimit-Limit': {
    description: 'Requests per minute allowed for this key. Absent when the key class is not rate limited.',
    schema: { type: 'integer', minimum: 1 },
  },
  'X-RateLimit-Remaining': {
    description: 'Requests left in the current one-minute window.',
    schema: { type: 'integer', minimum: 0 },
  },
  'X-RateLimit-Reset': {
    description: 'When the current window ends, in Unix epoch seconds (windows are aligned to the whole minute, UTC).',
    schema: { type: 'integer', minimum: 0 },
  },
  'Retry-After': {
    description: 'Whole seconds to wait before retrying (at least 1).',
    required: true,
    schema: { type: 'integer', minimum: 1 },
  },
} as const;

const KEY_PARAMETERS: Record<PathKey, string> = { entitlement: 'EntitlementKeyPath', limit: 'LimitKeyPath', meter: 'MeterKeyPath' };
const KEY_SCHEMAS: Record<PathKey, string> = { entitlement: 'EntitlementKey', limit: 'LimitKey', meter: 'MeterKey' };

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
  if (keys.length > 0) return { type: 'string', enum: keys, description: `${what} of configuration v${version}.` };
  return {
    type: 'string',
    minLength: 1,
    maxLength: CONFIG_KEY_LENGTH_MAX,
    pattern: CONFIG_KEY_PATTERN,
    description: version === 0
      ? `${what}: none yet, since no configuration has been pushed (so no enum); every key answers 404.`
      : `${what}: configuration v${version} defines none (an empty enum is not valid JSON Schema); every key answers 404 or 400.`,
  };
}

function keySchemas(config: BillingConfig | null, version: number): Record<string, Schema> {
  const entitlements = Object.entries(config?.entitlements ?? {});
  const ofType = (type: EntitlementType): string[] => entitlements.filter(([, def]) => def.type === type).map(([key]) => key);
  const products = Object.entries(config?.products ?? {});
  return {
    EntitlementKey: keySchema(entitlements.map(([key]) => key), 'Every entitlement key (features, limits and meters)', version),
    LimitKey: keySchema(ofType('limit'), 'The limit keys', version),
    MeterKey: keySchema(ofType('meter'), 'The meter keys', version),
    ProductKey: keySchema(products.map(([key]) => key), 'Every product key', version),
    PlanKey: keySchema(products.filter(([, def]) => def.price?.interval !== undefined).map(([key]) => key), 'The recurring products (plans)', version),
  };
}

const isoTime = { type: 'string', format: 'date-time', description: 'ISO 8601 UTC with milliseconds.' } as const;

const BALANCE_PROPERTIES = {
  balance: { type: 'number', minimum: 0, description: 'Included allowance left plus purchased-credit lots; never negative.' },
  included: { type: 'number', minimum: 0, description: 'The plan\'s included allowance per period.' },
  consumed: { type: 'number', minimum: 0, description: 'Usage recorded in the current period, overage included.' },
  overage: { type: 'number', minimum: 0, description: 'Usage beyond the balance in the current period.' },
  overageAllowed: { type: 'boolean', description: 'The plan allows overage.' },
  overageEnabled: { type: 'boolean', description: 'The customer enabled overage.' },
  resets: { ...isoTime, type: ['string', 'null'], description: 'End of the current period; null for `reset: never`.' },
} as const;

function closedObject(properties: Readonly<Record<string, Schema>>, required = Object.keys(properties)): Schema {
  return { type: 'object', properties, required, additionalProperties: false };
}

function viewSchemas(): Record<string, Schema> {
  return {
    Error: closedObject({ error: { type: 'string', description: 'What went wrong; names the field where one is at fault.' }, code: ref('ErrorCode') }),
    BalanceError: closedObject({ error: { type: 'string' }, code: ref('ErrorCode'), ...BALANCE_PROPERTIES }),
    ErrorCode: {
      enum: Object.keys(ERRORS),
      description: 'The error\'s key in the error catalog: stable, for programs to branch on (the message is for people and may change).',
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
      catalog: { type: 'array', items: ref('CatalogAction'), description: 'What the push did at the payment processor, per priced product.' },
    }),
    CatalogAction: closedObject({
      // A plain string: the push answers about the configuration it stores, not the one this document was made from.
      productKey: { type: 'string' },
      product: { enum: ['created', 'updated', 'unchanged'] },
      processorProductId: { type: 'string' },
      price: { enum: ['created', 'unchanged'] },
      processorPriceId: { type: 'string' },
      lookupKey: { type: 'string', description: '`<environment>:<product key>:<amount>-<currency>-<interval|once>`.' },
      archivedPrices: { type: 'array', items: { type: 'string' }, description: 'The product\'s earlier prices, archived by this push.' },
    }),
    PullResult: closedObject({ config: ref('BillingConfig'), version: { type: 'integer', minimum: 1 }, pushedAt: isoTime }),
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
    CheckoutSession: closedObject({ url: { type: 'string', description: 'The processor\'s hosted checkout page.' } }),
    Subscription: closedObject({
      id: { type: 'string', description: '`stripe:<processor subscription id>`.' },
      customerId: { type: 'string' },
      productKey: { type: 'string' },
      status: { type: 'string', description: 'The processor\'s status: `active`, `canceled`, …' },
      currentPeriodStart: isoTime,
      currentPeriodEnd: isoTime,
      cancelAtPeriodEnd: { type: 'boolean' },
      processor: { const: 'stripe' },
      processorSubscriptionId: { type: 'string' },
    }),
    SubscriptionList: closedObject({ data: { type: 'array', items: ref('Subscription') }, nextCursor: { type: ['string', 'null'] } }),
    Purchase: closedObject({
      id: { type: 'string', description: '`stripe:<payment intent id>`; also the id of the credit lots it granted.' },
      customerId: { type: 'string' },
      productKey: { type: 'string' },
      status: { const: 'paid' },
      amount: { type: 'integer', minimum: 0, description: 'Integer minor units of `currency`.' },
      currency: { type: 'string' },
      refundedAmount: { type: 'integer', minimum: 0 },
      grant: { type: 'object', additionalProperties: { type: 'number' }, description: 'Meter key → credits granted.' },
      createdAt: isoTime,
    }),
    PurchaseList: closedObject({ data: { type: 'array', items: ref('Purchase') }, nextCursor: { type: ['string', 'null'] } }),
    Customer: closedObject({
      id: { type: 'string' },
      name: { type: ['string', 'null'] },
      email: { type: ['string', 'null'] },
      metadata: { type: 'object', additionalProperties: { type: ['string', 'number', 'boolean', 'null'] } },
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
        subscription: { anyOf: [ref('Subscription'), { type: 'null' }], description: 'The live subscription (active, trialing or past due), or null.' },
      }),
      required: ['customer', 'features', 'usage', 'limits'],
    },
    CustomerList: closedObject({ data: { type: 'array', items: ref('Customer') }, nextCursor: { type: ['string', 'null'] } }),
    AuditEntry: closedObject({
      id: { type: 'string' },
      seq: { type: 'integer', minimum: 1 },
      at: isoTime,
      action: { type: 'string' },
      resourceType: { type: 'string' },
      resourceId: { type: 'string' },
      actor: { type: 'string', description: 'The id of the key that made the change (never the key).' },
      data: { type: 'object' },
      prevHash: { type: 'string', pattern: '^[0-9a-f]{64}$' },
      hash: { type: 'string', pattern: '^[0-9a-f]{64}$' },
    }),
    AuditList: closedObject({ data: { type: 'array', items: ref('AuditEntry') }, nextCursor: { type: ['string', 'null'] } }),
    AuditVerification: {
      oneOf: [
        closedObject({ ok: { const: true }, entries: { type: 'integer', minimum: 0 }, lastHash: { type: 'string' } }),
        closedObject({ ok: { const: false }, entries: { type: 'integer', minimum: 0 }, brokenAt: { type: 'string' }, reason: { type: 'string' } }),
      ],
    },
    Contract: closedObject({
      customerId: { type: 'string' },
      priceAmount: { type: 'integer', minimum: 0, description: 'Integer minor units of the product currency per interval.' },
      priceInterval: { enum: ['month', 'year'] },
      entitlements: { type: 'object', additionalProperties: closedObject({ included: { type: 'number', minimum: 0 } }) },
      updatedAt: isoTime,
    }),
    JsonSchemaDocument: {
      type: 'object',
      required: ['$schema', 'type', 'properties'],
      properties: { $schema: { const: billingConfigSchema.$schema }, type: { const: 'object' }, properties: { type: 'object' } },
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
  for (const [name, def] of Object.entries($defs)) schemas[configDefName(name)] = rewriteDefsRefs(def) as Schema;
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
    out[name] = name === '$ref' && typeof inner === 'string' && inner.startsWith('#/$defs/')
      ? `#/components/schemas/${configDefName(inner.slice('#/$defs/'.length))}`
      : rewriteDefsRefs(inner);
  }
  return out;
}
