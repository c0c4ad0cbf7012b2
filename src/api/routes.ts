/**
 * The core API's route table: metering reads and writes, limit/usage settings, the
 * billing configuration (push, pull, plans), customers, contracts, the audit log and
 * the OpenAPI document. One record per route (route-record.ts): the router, the
 * validation before each handler and the OpenAPI document (openapi.ts) are derived
 * from `API_ROUTES`, so they cannot disagree.
 *
 * Each handler receives a request that is authenticated and validated (path parameter,
 * query, body, exact numbers); it applies the route's own rules, builds a command and
 * hands it to the customer's shard, or answers from the front end's own state.
 */
import type { BillingConfig, ProductDefinition } from '../../actors/billing-config.js';
import type { AuditTag, Command, Environment, ReplyOutcome } from '../../actors/protocol.js';
import { auditOf, type AuditFields } from '../../actors/ops.js';
import type { WriteCommand } from '../../actors/customer.js';
import type { ProfilePatch } from '../../actors/customer.js';
import type { PerEnvironment } from '../../shared/quotas.js';
import type { ControlStore } from '../../storage/control-store.js';
import type { AuditLog, AuditVerification } from '../../storage/audit-log.js';
import type { CustomerIndex } from '../../storage/customer-index.js';
import type { CustomerTokens } from '../auth/customer-token.js';
import type { CatalogAction } from '../commerce/catalog-sync.js';
import { ProcessorFailure, type Processor } from '../commerce/processor.js';
import { billingConfigSchema } from '../config/billing-schema.js';
import { formatViolations, validateBillingConfig } from '../config/validate-config.js';
import type { Exchange } from '../http/exchange.js';
import { LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX } from '../http/limits.js';
import type { Router } from '../http/router.js';
import type { ReplyHandler, ShardPool } from '../shard-pool.js';
import { auditPage, failVerify } from './audit-page.js';
import { CHANGE_ROUTES } from './change-routes.js';
import { CLIENT_TOKEN_ROUTES } from './client-token-routes.js';
import { COMMERCE_ROUTES, commerceOf, freshRef, processorMessage } from './commerce-routes.js';
import { syncExpansion } from '../commerce/expansion-billing.js';
import { idParam } from './id-param.js';
import { REFUND_ROUTES } from './refund-routes.js';
import { WEBHOOK_ROUTES, type WebhookDeps } from './webhook-routes.js';
import { quotaDetail, renderReply } from './shard-reply.js';
import { decodeCursor, encodeCursor, pageLimit } from './paging.js';
import {
  routerOf,
  type AnyRouteRecord,
  type BodyCheck,
  type CompiledRoute,
  type JsonSchema,
  type RouteRecord,
} from './route-record.js';
import {
  auditQuerySchema,
  contextSchema,
  contractSchema,
  customerListQuerySchema,
  customerQuerySchema,
  customerUpsertSchema,
  isIdLength,
  limitSettingsSchema,
  usageAmountSchema,
  usageSettingsSchema,
  type AuditQuery,
  type ContextBody,
  type ContractBody,
  type CustomerListQuery,
  type CustomerQuery,
  type CustomerUpsertBody,
  type LimitSettingsBody,
  type UsageAmountBody,
  type UsageSettingsBody,
} from './validation.js';

export interface ApiDeps extends WebhookDeps {
  readonly pool: ShardPool;
  readonly control: ControlStore;
  readonly customers: CustomerIndex;
  readonly audit: AuditLog;
  /** Walks an environment's audit chain off the event loop (a piscina task). */
  readonly verifyAudit: (stream: string) => Promise<AuditVerification>;
  /**
   * Stores a new configuration version and its `config.push` audit entry (by `actor`) in one
   * transaction.
   */
  readonly pushConfig: (
    environment: Environment,
    config: BillingConfig,
    actor: string,
  ) => Promise<{ version: number; pushedAtMs: number; catalog: readonly CatalogAction[] }>;
  /** Audit entries a day per environment before audited changes are refused (0 = unlimited). */
  readonly auditQuota: PerEnvironment;
  /** The environment's OpenAPI document, serialised (openapi.ts `openApiCache`). */
  readonly openApiJson: (environment: Environment) => string;
  /** The payment processor (the embedded Stripe sandbox, or Stripe). */
  readonly processor: Processor;
  /** Mints and checks customer-bound client tokens. */
  readonly customerTokens: CustomerTokens;
}

/** A route of this table, as its router holds it. */
export type Route = CompiledRoute<ApiDeps>;

/** Declares one route of this table; `B` and `Q` type its validated body and query. */
function route<B = undefined, Q = undefined>(
  record: RouteRecord<ApiDeps, B, Q>,
): AnyRouteRecord<ApiDeps> {
  return record;
}

const ref = (name: string): JsonSchema => ({ $ref: `#/components/schemas/${name}` });

const keyParam = idParam('key');
const customerIdParam = idParam('customerId');

/** A pushed configuration: its schema and every rule a schema cannot say, all listed in one 400. */
const checkBillingConfig: BodyCheck = (value, ex) => {
  const result = validateBillingConfig(value);
  if (result.ok) return true;
  ex.fail('invalid_config', { detail: formatViolations(result.errors) });
  return false;
};

type Input<B = undefined, Q = undefined> = Parameters<RouteRecord<ApiDeps, B, Q>['handle']>[0];

/** Answers with a shard's reply as it is: the status its outcome has, and its body. */
function sendReply(ex: Exchange, outcome: ReplyOutcome, body: string): void {
  const rendered = renderReply(outcome, body);
  ex.send(rendered.status, rendered.body);
}

/**
 * Hands a command to its shard; the reply goes to `onReply` (default: straight back). 503 when the
 * shard is full.
 */
function submit(
  deps: ApiDeps,
  ex: Exchange,
  command: Command,
  onReply: ReplyHandler = (outcome, body) => sendReply(ex, outcome, body),
  audit: AuditTag | null = null,
): void {
  if (!deps.pool.submit(command, onReply, audit)) ex.fail('overloaded', {}, [['retry-after', '1']]);
}

/**
 * Records a successful shard write in the audit log, durably, before the caller hears of
 * it; a failed one (4xx) records nothing. The chain records the tag's reference, and the
 * shard then forgets its stored copy.
 */
function audited(
  deps: ApiDeps,
  ctx: Input<unknown, unknown>,
  fields: AuditFields,
  tag: AuditTag,
  outcome: ReplyOutcome,
  body: string,
  then: FollowUp = sendReply,
): void {
  if (outcome === 'rejected') return sendReply(ctx.ex, outcome, body);
  deps.audit.append(ctx.environment, { ...fields, actor: tag.actor }, Date.now(), tag.ref).then(
    () => {
      then(ctx.ex, outcome, body);
      deps.pool.auditsRecorded(ctx.environment, fields.resourceId, [tag.ref]);
    },
    (error: unknown) => ctx.ex.failInternal(error),
  );
}

/** What answers a durable write: by default its reply, as it is. */
type FollowUp = (ex: Exchange, outcome: ReplyOutcome, body: string) => void;

/** The audit fields of a write that is audited (a programmer error otherwise). */
function fieldsOf(command: WriteCommand): AuditFields {
  const fields = auditOf(command);
  if (fields === null) throw new Error(`${command.op} is not audited`);
  return fields;
}

/**
 * The tag of an audited route (a programmer error on a route not declared audited),
 * flagged when the environment has used up its daily audit quota: the shard then refuses
 * the write if it would change anything.
 */
function tagOf(deps: ApiDeps, ctx: Input<unknown, unknown>): AuditTag {
  if (ctx.tag === null) throw new Error('the route is not declared audited');
  const reached = auditQuotaReached(deps, ctx.environment);
  return reached === null ? ctx.tag : { ...ctx.tag, auditQuotaReached: reached };
}

const DAY_MS = 86_400_000;

/**
 * The environment's daily audit quota when today's entries (UTC) have reached it, else null (also
 * when unlimited).
 */
function auditQuotaReached(deps: ApiDeps, environment: Environment): number | null {
  const limit = deps.auditQuota[environment];
  if (limit === 0) return null;
  const now = Date.now();
  return deps.audit.entriesSince(environment, now - (now % DAY_MS)) >= limit ? limit : null;
}

/**
 * A write that is audited when it changes something; one that changed nothing answers its current
 * state, unaudited.
 */
function submitAudited(
  deps: ApiDeps,
  ctx: Input<unknown, unknown>,
  command: WriteCommand,
  then: FollowUp = sendReply,
): void {
  const fields = fieldsOf(command);
  const tag = tagOf(deps, ctx);
  submit(
    deps,
    ctx.ex,
    command,
    (outcome, reply, effect) =>
      effect === 'unchanged'
        ? then(ctx.ex, outcome, reply)
        : audited(deps, ctx, fields, tag, outcome, reply, then),
    tag,
  );
}

function read(op: 'limit' | 'balance') {
  return (ctx: Input<undefined, CustomerQuery>, deps: ApiDeps): void =>
    submit(deps, ctx.ex, {
      op,
      environment: ctx.environment,
      customerId: ctx.query.customerId,
      key: ctx.param,
    });
}

/** `has`: from the front end's view when it holds a current answer, else from the shard. */
function has(ctx: Input<undefined, CustomerQuery>, deps: ApiDeps): void {
  const { environment } = ctx;
  const { customerId } = ctx.query;
  const held = deps.pool.heldHas(environment, customerId, ctx.param);
  if (held !== undefined) return sendReply(ctx.ex, 'ok', held ? 'true' : 'false');
  submit(deps, ctx.ex, { op: 'has', environment, customerId, key: ctx.param });
}

/**
 * A consume's or refund's command. Written as two literals, never as the keyless command
 * spread into a keyed one: Node 20's V8 gives every object made by a spread plus a property
 * a hidden class of its own. Each keyed consume left a class and its descriptors in the
 * old generation, and the front end's young collections promoted ~500 KB each at 11k
 * keyed consumes/s (3 KB as literals). test/hidden-classes.test.ts holds every command to
 * one class.
 */
export function usageCommand(
  op: 'consume' | 'refund',
  environment: Environment,
  key: string,
  body: UsageAmountBody,
  amountMicros: bigint,
): Extract<Command, { readonly op: 'consume' | 'refund' }> {
  const { customerId, idempotencyKey } = body;
  return idempotencyKey === undefined
    ? { op, environment, customerId, key, amountMicros }
    : { op, environment, customerId, key, amountMicros, idempotencyKey };
}

function usageAmount(op: 'consume' | 'refund') {
  return (ctx: Input<UsageAmountBody>, deps: ApiDeps): void => {
    const command = usageCommand(op, ctx.environment, ctx.param, ctx.body, ctx.amountMicros);
    if (op === 'consume') return submit(deps, ctx.ex, command);
    submitAudited(deps, ctx, command);
  };
}

function limitSettings(ctx: Input<LimitSettingsBody>, deps: ApiDeps): void {
  const { customerId, purchased, autoExpansionEnabled } = ctx.body;
  // A cross-field rule the schema could only phrase as an opaque anyOf error.
  if (purchased === undefined && autoExpansionEnabled === undefined) {
    return ctx.ex.fail('invalid_request', {
      detail: 'purchased or autoExpansionEnabled is required',
    });
  }
  const settings = {
    ...(purchased === undefined ? {} : { purchased }),
    ...(autoExpansionEnabled === undefined ? {} : { autoExpansionEnabled }),
  };
  const command: WriteCommand = {
    op: 'limitSettings',
    environment: ctx.environment,
    customerId,
    key: ctx.param,
    ...settings,
  };
  // A recorded `purchased` is then billed (commerce.md); its answer waits for the processor.
  submitAudited(deps, ctx, command, (ex, outcome, body) => {
    if (outcome === 'rejected' || purchased === undefined) return sendReply(ex, outcome, body);
    billExpansion(deps, ctx, purchased).then(
      () => sendReply(ex, outcome, body),
      (error: unknown) => {
        ex.logWarn('limit expansion billing failed', { error: processorMessage(error) });
        ex.fail('processor_error', { detail: processorMessage(error) });
      },
    );
  });
}

/** Sets the customer's subscription's expansion quantity of the limit to `purchased`. */
async function billExpansion(
  deps: ApiDeps,
  ctx: Input<LimitSettingsBody>,
  purchased: number,
): Promise<void> {
  const view = await commerceOf(deps.pool, ctx.environment, ctx.body.customerId);
  const live =
    view.subscriptions.findLast((s) => ['active', 'trialing', 'past_due'].includes(s.status)) ??
    null;
  const config = (deps.control.latestConfig(ctx.environment)?.config as BillingConfig) ?? null;
  await syncExpansion(
    deps.processor.stripe,
    ctx.environment,
    ctx.param,
    purchased,
    live,
    config,
    `tally-${ctx.environment}-expansion-${freshRef()}`,
  );
}

function usageSettings(ctx: Input<UsageSettingsBody>, deps: ApiDeps): void {
  const { customerId, overageEnabled } = ctx.body;
  submitAudited(deps, ctx, {
    op: 'usageSettings',
    environment: ctx.environment,
    customerId,
    key: ctx.param,
    overageEnabled,
  });
}

function push(ctx: Input<BillingConfig>, deps: ApiDeps): void {
  const reached = auditQuotaReached(deps, ctx.environment);
  if (reached !== null) {
    return ctx.ex.fail('quota_exceeded', {
      detail: quotaDetail({
        kind: 'quota_exceeded',
        quota: 'auditEntriesPerDay',
        environment: ctx.environment,
        limit: reached,
      }),
    });
  }
  deps.pushConfig(ctx.environment, ctx.body, ctx.key.id).then(
    ({ version, pushedAtMs, catalog }) => {
      ctx.ex.logInfo('configuration pushed', {
        environment: ctx.environment,
        version,
        actor: ctx.key.id,
      });
      ctx.ex.send(
        200,
        JSON.stringify({ version, pushedAt: new Date(pushedAtMs).toISOString(), catalog }),
      );
    },
    (error: unknown) =>
      error instanceof ProcessorFailure
        ? ctx.ex.fail('processor_error', { detail: error.message })
        : ctx.ex.failInternal(error),
  );
}

function pull(ctx: Input, deps: ApiDeps): void {
  const latest = deps.control.latestConfig(ctx.environment);
  if (latest === null) return ctx.ex.fail('config_not_found');
  ctx.ex.json(200, {
    config: latest.config,
    version: latest.version,
    pushedAt: new Date(latest.pushedAtMs).toISOString(),
  });
}

/** The shard address of a contract: the customer, no entitlement key. */
const contractAddress = (ctx: Input<unknown>) =>
  ({ environment: ctx.environment, customerId: ctx.param, key: '' }) as const;

function putContract(ctx: Input<ContractBody>, deps: ApiDeps): void {
  const { priceAmount, priceInterval, entitlements } = ctx.body;
  const contract = { priceAmount, priceInterval, entitlements: entitlements ?? {} };
  submitAudited(deps, ctx, { op: 'putContract', ...contractAddress(ctx), contract });
}

/** The fields of a customer body that change the stored customer. */
function profilePatch({ name, email, metadata }: CustomerUpsertBody): ProfilePatch {
  return {
    ...(name === undefined ? {} : { name }),
    ...(email === undefined ? {} : { email }),
    ...(metadata === undefined ? {} : { metadata }),
  };
}

/**
 * POST /v1/customers: 201 created / 200 updated; an update that changed nothing answers 200,
 * unaudited.
 */
function upsertCustomer(ctx: Input<CustomerUpsertBody>, deps: ApiDeps): void {
  const patch = profilePatch(ctx.body);
  submitAudited(deps, ctx, {
    op: 'upsertCustomer',
    environment: ctx.environment,
    customerId: ctx.body.id,
    key: '',
    patch,
  });
}

/**
 * POST /v1/context: one call that upserts the customer and answers features,
 * balances and limits (and, when asked, the live subscription) from the customer's shard.
 * `plans` (from the configuration) is added here, on the front end.
 */
function context(ctx: Input<ContextBody>, deps: ApiDeps): void {
  const {
    customer,
    features = [],
    usage = [],
    limits = [],
    includePlans,
    includeSubscription,
  } = ctx.body;
  const extra = [
    ...(includePlans === true
      ? [`"plans":${JSON.stringify(productViews(deps, ctx.environment))}`]
      : []),
  ];
  const patch = profilePatch(customer);
  // The shard answers the live subscription itself (the customer's state holds it).
  const request = {
    features,
    usage,
    limits,
    ...(includeSubscription === true ? { subscription: true as const } : {}),
  };
  const command = {
    op: 'context',
    environment: ctx.environment,
    customerId: customer.id,
    key: '',
    patch,
    request,
  } as const;
  // The shard stores the entry only if the call creates or changes the customer.
  const tag = tagOf(deps, ctx);
  submit(
    deps,
    ctx.ex,
    command,
    (outcome, reply, effect) => {
      if (outcome === 'rejected') return sendReply(ctx.ex, outcome, reply);
      // The shard renders `{customer, features, usage, limits}`; splice our fields before its
      // closing brace.
      const body = extra.length > 0 ? `${reply.slice(0, -1)},${extra.join(',')}}` : reply;
      if (effect !== 'wrote') return ctx.ex.send(200, body);
      // It created or changed the customer: audited like POST /v1/customers.
      audited(deps, ctx, fieldsOf(command), tag, 'ok', body);
    },
    tag,
  );
}

/** GET /v1/customers/{id}: read from the customer index, no shard involved. */
function getCustomer(ctx: Input, deps: ApiDeps): void {
  const json = deps.customers.get(ctx.environment, ctx.param);
  if (json === null) return ctx.ex.fail('customer_not_found', { id: ctx.param });
  ctx.ex.send(200, json);
}

/** GET /v1/customers: pages in id order, `{data, nextCursor}`, from the index. */
function listCustomers(ctx: Input<undefined, CustomerListQuery>, deps: ApiDeps): void {
  const limit = pageLimit(ctx.ex, ctx.query.limit);
  if (limit === null) return;
  let after: string | null = null;
  if (ctx.query.cursor !== undefined) {
    after = decodeCursor(ctx.ex, ctx.query.cursor, ({ after: id }) =>
      typeof id === 'string' && isIdLength(id) ? id : null,
    );
    if (after === null) return;
  }
  const page = deps.customers.page(ctx.environment, after, limit);
  const next =
    page.nextAfter === null ? 'null' : JSON.stringify(encodeCursor({ after: page.nextAfter }));
  ctx.ex.send(200, `{"data":[${page.items.join(',')}],"nextCursor":${next}}`);
}

/** GET /v1/audit/verify: walks the environment's hash chain. */
function verifyAudit(ctx: Input, deps: ApiDeps): void {
  deps.verifyAudit(ctx.environment).then(
    (verdict) => ctx.ex.json(200, verdict),
    (error: unknown) => failVerify(ctx.ex, error),
  );
}

/** One product of the pushed configuration as the plans listing shows it. */
export function productView(key: string, product: ProductDefinition): Record<string, unknown> {
  return {
    key,
    name: product.name ?? key,
    type:
      product.price === undefined
        ? 'free'
        : product.price.interval === undefined
          ? 'one_time'
          : 'recurring',
    default: product.default === true,
    price: product.price ?? null,
    entitlements: product.entitlements ?? {},
    grants: product.grants ?? {},
  };
}

function productViews(deps: ApiDeps, environment: Environment): Array<Record<string, unknown>> {
  const latest = deps.control.latestConfig(environment);
  const products = latest === null ? {} : (latest.config as BillingConfig).products;
  return Object.entries(products).map(([key, product]) => productView(key, product));
}

const ENTITLEMENT_ERRORS = ['not_configured', 'entitlement_not_found'] as const;
const TYPED_ERRORS = [...ENTITLEMENT_ERRORS, 'wrong_entitlement_type'] as const;

/** Every environment route, in router order (each route's metrics series). */
export const API_ROUTES: ReadonlyArray<AnyRouteRecord<ApiDeps>> = [
  ...COMMERCE_ROUTES,
  ...CLIENT_TOKEN_ROUTES,
  ...CHANGE_ROUTES,
  ...REFUND_ROUTES,
  ...WEBHOOK_ROUTES,
  route<undefined, CustomerQuery>({
    method: 'GET',
    path: '/v1/entitlements/:key/has',
    keys: 'client',
    browser: true,
    param: keyParam,
    query: customerQuerySchema,
    audited: false,
    doc: {
      operationId: 'hasEntitlement',
      tag: 'entitlements',
      pathKey: 'entitlement',
      sharded: true,
      summary: 'Does the customer have the entitlement?',
      description:
        'Any type: a feature when granted, a limit when its limit > 0, a meter when its ' +
        'balance > 0 or overage is enabled.',
      ok: { description: 'Whether the customer has it.', schema: { type: 'boolean' } },
      errors: [...ENTITLEMENT_ERRORS],
    },
    handle: has,
  }),
  route<undefined, CustomerQuery>({
    method: 'GET',
    path: '/v1/entitlements/:key/limit',
    keys: 'client',
    browser: true,
    param: keyParam,
    query: customerQuerySchema,
    audited: false,
    doc: {
      operationId: 'getLimit',
      tag: 'entitlements',
      pathKey: 'limit',
      sharded: true,
      summary: 'A numeric limit of the customer',
      description: 'Limits only; another type answers 400.',
      ok: { description: 'The limit.', schema: ref('LimitView') },
      errors: [...TYPED_ERRORS],
    },
    handle: read('limit'),
  }),
  route<LimitSettingsBody>({
    method: 'POST',
    path: '/v1/entitlements/:key/limit/settings',
    keys: 'server',
    param: keyParam,
    audited: true,
    body: { schema: limitSettingsSchema, numbers: 'exact' },
    doc: {
      operationId: 'setLimitSettings',
      tag: 'entitlements',
      pathKey: 'limit',
      sharded: true,
      summary: 'Set purchased expansion or auto-expansion consent',
      description:
        'At least one of `purchased`, `autoExpansionEnabled`; both need `expansion` in ' +
        "the customer's plan.",
      ok: { description: 'The updated limit.', schema: ref('LimitView') },
      errors: [...TYPED_ERRORS, 'invalid_request', 'expansion_not_allowed', 'processor_error'],
    },
    handle: limitSettings,
  }),
  route<undefined, CustomerQuery>({
    method: 'GET',
    path: '/v1/usage/:key/balance',
    keys: 'client',
    browser: true,
    param: keyParam,
    query: customerQuerySchema,
    audited: false,
    doc: {
      operationId: 'getBalance',
      tag: 'usage',
      pathKey: 'meter',
      sharded: true,
      summary: 'A meter balance of the customer',
      description: 'Meters only; another type answers 400.',
      ok: { description: 'The balance.', schema: ref('BalanceView') },
      errors: [...TYPED_ERRORS],
    },
    handle: read('balance'),
  }),
  route<UsageAmountBody>({
    method: 'POST',
    path: '/v1/usage/:key/consume',
    keys: 'server',
    param: keyParam,
    audited: false,
    body: { schema: usageAmountSchema, numbers: 'exact-amount' },
    doc: {
      operationId: 'consumeUsage',
      tag: 'usage',
      pathKey: 'meter',
      sharded: true,
      summary: 'Consume usage',
      description:
        'Draws included allowance, then purchased-credit lots oldest first, then overage ' +
        'when enabled. ' +
        'All-or-nothing: when short, 429 with the balance fields and nothing drawn. A ' +
        'retry with the same ' +
        '`idempotencyKey` (kept 24 h) is applied once and answers the current balance.',
      ok: { description: 'The balance after the draw.', schema: ref('BalanceView') },
      errors: [
        ...TYPED_ERRORS,
        'invalid_request',
        'idempotency_key_reused',
        'insufficient_balance',
      ],
    },
    handle: usageAmount('consume'),
  }),
  route<UsageAmountBody>({
    method: 'POST',
    path: '/v1/usage/:key/refund',
    keys: 'server',
    param: keyParam,
    audited: true,
    body: { schema: usageAmountSchema, numbers: 'exact-amount' },
    doc: {
      operationId: 'refundUsage',
      tag: 'usage',
      pathKey: 'meter',
      sharded: true,
      summary: 'Refund usage',
      description:
        "Unwinds the current period's recorded usage: overage, then the lots drawn " +
        '(newest first), then ' +
        'included allowance. Beyond the refundable usage: 409 with the balance fields.',
      ok: { description: 'The balance after the refund.', schema: ref('BalanceView') },
      errors: [
        ...TYPED_ERRORS,
        'invalid_request',
        'idempotency_key_reused',
        'refund_exceeds_usage',
      ],
    },
    handle: usageAmount('refund'),
  }),
  route<UsageSettingsBody>({
    method: 'POST',
    path: '/v1/usage/:key/settings',
    keys: 'server',
    param: keyParam,
    audited: true,
    body: { schema: usageSettingsSchema, numbers: 'as-parsed' },
    doc: {
      operationId: 'setUsageSettings',
      tag: 'usage',
      pathKey: 'meter',
      sharded: true,
      summary: 'Enable or disable overage',
      description: "`overageEnabled: true` needs `overage` in the customer's plan.",
      ok: { description: 'The updated balance.', schema: ref('BalanceView') },
      errors: [...TYPED_ERRORS, 'invalid_request', 'overage_not_allowed'],
    },
    handle: usageSettings,
  }),
  route<BillingConfig>({
    method: 'POST',
    path: '/v1/sync/push',
    keys: 'server',
    audited: true,
    body: { schema: billingConfigSchema, numbers: 'exact', check: checkBillingConfig },
    doc: {
      operationId: 'pushConfig',
      tag: 'configuration',
      summary: 'Push a billing configuration',
      description:
        'Validated against the schema and then for what a schema cannot say; a 400 lists ' +
        'every violation. ' +
        'The pushed version applies at once; this document is regenerated from it.',
      ok: {
        description: 'The version assigned, and what the push did at the payment processor.',
        schema: ref('PushResult'),
      },
      errors: ['invalid_config', 'processor_error'],
    },
    handle: push,
  }),
  route({
    method: 'GET',
    path: '/v1/sync/pull',
    keys: 'server',
    audited: false,
    doc: {
      operationId: 'pullConfig',
      tag: 'configuration',
      summary: 'The last pushed configuration',
      description: 'Exactly the pushed document, with its version.',
      ok: { description: 'The configuration.', schema: ref('PullResult') },
      errors: ['config_not_found'],
    },
    handle: pull,
  }),
  route({
    method: 'GET',
    path: '/v1/plans',
    keys: 'server',
    audited: false,
    doc: {
      operationId: 'listPlans',
      tag: 'configuration',
      summary: 'The products of the configuration',
      description: 'Named plans for compatibility; the records are products.',
      ok: { description: 'Every product.', schema: ref('PlanList') },
      errors: [],
    },
    handle: (ctx, deps) => ctx.ex.json(200, { data: productViews(deps, ctx.environment) }),
  }),
  route<undefined, AuditQuery>({
    method: 'GET',
    path: '/v1/audit',
    keys: 'server',
    query: auditQuerySchema,
    audited: false,
    doc: {
      operationId: 'listAudit',
      tag: 'audit',
      summary: 'The audit log, newest first',
      description:
        'Every administrative mutation of the environment (config push, customer upsert, ' +
        'contracts, settings, usage refunds), ' +
        `hash-chained. Filter by \`action\` and \`resourceType\`; \`limit\` ` +
        `(default ${LIST_LIMIT_DEFAULT}, at most ${LIST_LIMIT_MAX}) and \`cursor\` page.`,
      ok: { description: 'A page.', schema: ref('AuditList') },
      errors: [],
    },
    handle: (ctx, deps) => auditPage(ctx.ex, deps.audit, ctx.environment, ctx.query),
  }),
  route({
    method: 'GET',
    path: '/v1/audit/verify',
    keys: 'server',
    audited: false,
    doc: {
      operationId: 'verifyAudit',
      tag: 'audit',
      summary: 'Check the audit chain',
      description:
        "Recomputes every entry's hash and link; reports the first entry that breaks the chain.",
      ok: { description: 'The verdict.', schema: ref('AuditVerification') },
      errors: [],
    },
    handle: verifyAudit,
  }),
  route<ContextBody>({
    method: 'POST',
    path: '/v1/context',
    keys: 'server',
    audited: true,
    body: { schema: contextSchema, numbers: 'exact' },
    doc: {
      operationId: 'getContext',
      tag: 'customers',
      sharded: true,
      summary: 'Upsert a customer and read its entitlements in one call',
      description:
        '`features` takes any entitlement (as `/has`), `usage` only meters, `limits` only ' +
        'limits. ' +
        'An unknown key is 404 naming it; a key of the wrong type 400. `plans` and ' +
        '`subscription` (null until commerce) only when asked for.',
      ok: { description: 'The customer and the requested answers.', schema: ref('Context') },
      errors: [
        'invalid_request',
        'not_configured',
        'entitlement_not_found',
        'wrong_entitlement_type',
      ],
    },
    handle: context,
  }),
  route<CustomerUpsertBody>({
    method: 'POST',
    path: '/v1/customers',
    keys: 'server',
    audited: true,
    body: { schema: customerUpsertSchema, numbers: 'exact' },
    doc: {
      operationId: 'upsertCustomer',
      tag: 'customers',
      sharded: true,
      summary: 'Create or update a customer',
      description:
        '201 when the customer is new, 200 when it existed (also when a consume created ' +
        'it). Only the fields ' +
        'given change; metadata keys merge and a `null` value removes a key (at most 50 keys).',
      ok: { description: 'The stored customer.', schema: ref('Customer'), statuses: [200, 201] },
      errors: ['invalid_request'],
    },
    handle: upsertCustomer,
  }),
  route<undefined, CustomerListQuery>({
    method: 'GET',
    path: '/v1/customers',
    keys: 'server',
    query: customerListQuerySchema,
    audited: false,
    doc: {
      operationId: 'listCustomers',
      tag: 'customers',
      summary: 'Customers in id order',
      description:
        `Pages of at most \`limit\` (default ${LIST_LIMIT_DEFAULT}, at ` +
        `most ${LIST_LIMIT_MAX}); pass \`nextCursor\` as \`cursor\` for the next page. ` +
        'Cursors are opaque and stay valid while customers are added.',
      ok: { description: 'A page.', schema: ref('CustomerList') },
      errors: [],
    },
    handle: listCustomers,
  }),
  route({
    method: 'GET',
    path: '/v1/customers/:id',
    keys: 'server',
    param: idParam('id'),
    audited: false,
    doc: {
      operationId: 'getCustomer',
      tag: 'customers',
      summary: 'One customer',
      description: 'Customers created implicitly by a consume exist too.',
      ok: { description: 'The customer.', schema: ref('Customer') },
      errors: ['customer_not_found'],
    },
    handle: getCustomer,
  }),
  route({
    method: 'GET',
    path: '/v1/contracts/:customerId',
    keys: 'server',
    param: customerIdParam,
    audited: false,
    doc: {
      operationId: 'getContract',
      tag: 'contracts',
      sharded: true,
      summary: "A customer's contract",
      description: 'The stored contract; 404 when the customer has none.',
      ok: { description: 'The contract.', schema: ref('Contract') },
      errors: ['contract_not_found'],
    },
    handle: (ctx, deps) => submit(deps, ctx.ex, { op: 'getContract', ...contractAddress(ctx) }),
  }),
  route<ContractBody>({
    method: 'PUT',
    path: '/v1/contracts/:customerId',
    keys: 'server',
    param: customerIdParam,
    audited: true,
    body: { schema: contractSchema, numbers: 'exact' },
    doc: {
      operationId: 'putContract',
      tag: 'contracts',
      sharded: true,
      summary: "Set a customer's contract",
      description:
        "Replaces the contract. `entitlements.{key}.included` replaces the plan's " +
        'included amount of a limit or meter; ' +
        'for a feature, `included > 0` grants it and `0` denies it. Keys must be ' +
        'entitlements of the configuration. ' +
        'An unknown customer is created.',
      ok: { description: 'The stored contract.', schema: ref('Contract') },
      errors: ['invalid_request'],
    },
    handle: putContract,
  }),
  route({
    method: 'DELETE',
    path: '/v1/contracts/:customerId',
    keys: 'server',
    param: customerIdParam,
    audited: true,
    doc: {
      operationId: 'deleteContract',
      tag: 'contracts',
      sharded: true,
      summary: "Remove a customer's contract",
      description: "The plan's values apply again.",
      ok: { description: 'Removed.', schema: null, statuses: [204] },
      errors: ['contract_not_found'],
    },
    handle: (ctx, deps) =>
      submitAudited(deps, ctx, { op: 'deleteContract', ...contractAddress(ctx) }),
  }),
  route({
    method: 'GET',
    path: '/v1/docs/openapi.json',
    keys: 'client',
    audited: false,
    doc: {
      operationId: 'getOpenApi',
      tag: 'docs',
      summary: 'This document',
      description: "Generated from the configuration last pushed to the key's environment.",
      ok: { description: 'An OpenAPI 3.1 document.', schema: ref('OpenApiDocument') },
      errors: [],
    },
    handle: (ctx, deps) => ctx.ex.send(200, deps.openApiJson(ctx.environment)),
  }),
];

/** Every keyed environment route, its schemas compiled. */
export function buildApiRouter(deps: ApiDeps): Router<Route> {
  for (const { method, path, keys } of API_ROUTES) {
    if (keys !== 'client' && keys !== 'server')
      throw new Error(`${method} ${path}: environment routes take a client or server key`);
  }
  return routerOf(API_ROUTES, deps);
}

/**
 * The routes a front-end thread after the first serves itself (TALLY_FRONTENDS): the metering
 * hot path, whose handlers use nothing but the shards. Every other request it relays to the
 * first front end.
 */
export const FRONT_END_THREAD_ROUTES: ReadonlyArray<readonly [string, string]> = [
  ['GET', '/v1/entitlements/:key/has'],
  ['GET', '/v1/entitlements/:key/limit'],
  ['GET', '/v1/usage/:key/balance'],
  ['POST', '/v1/usage/:key/consume'],
];

/** The router of a later front end: FRONT_END_THREAD_ROUTES, handing commands to `pool`. */
export function buildFrontEndThreadRouter(pool: ShardPool): Router<Route> {
  const records = API_ROUTES.filter(({ method, path }) =>
    FRONT_END_THREAD_ROUTES.some(([m, p]) => m === method && p === path),
  );
  if (records.length !== FRONT_END_THREAD_ROUTES.length)
    throw new Error('a front-end thread route is missing from the route table');
  // These handlers read `deps.pool` alone (has, limit, balance, consume above).
  return routerOf(records, { pool } as unknown as ApiDeps);
}
