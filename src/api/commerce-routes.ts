/**
 * The commerce routes: checkout, the subscription and purchase listings, and the
 * receiver of the payment processor's webhooks.
 *
 * The processor is called here, in the front end, never in the core: each call carries
 * an idempotency key derived from the Tally command that caused it, and what the
 * processor answered goes to the customer's actor as a journaled command. The webhook
 * receiver answers 2xx only once that command is durable (and audited); any failure
 * answers 500, so the processor delivers the event again.
 */
import { randomBytes } from 'node:crypto';
import type Stripe from 'stripe';
import type uWS from 'uWebSockets.js';
import type { BillingConfig } from '../../actors/billing-config.js';
import type { CommerceView, Command, ContractView } from '../../actors/customer.js';
import type { AuditTag, Environment, ReplyOutcome } from '../../actors/protocol.js';
import { auditOf } from '../../actors/ops.js';
import { assert } from '../../shared/assert.js';
import type { AuditLog } from '../../storage/audit-log.js';
import type { ControlStore } from '../../storage/control-store.js';
import { fitKey, IDEMPOTENCY_KEY_MAX } from '../commerce/catalog-sync.js';
import { subscriptionPrice } from '../commerce/contract-prices.js';
import { billOverage, type OverageIo } from '../commerce/overage-billing.js';
import type { Processor } from '../commerce/processor.js';
import { commandsForEvent, META, type ProcessorCommand } from '../commerce/stripe-events.js';
import { checkBodyHeaders, readJsonBody } from '../http/body.js';
import type { Exchange } from '../http/exchange.js';
import type { ShardPool } from '../shard-pool.js';
import { decodeCursor, encodeCursor, pageLimit } from './paging.js';
import type { AnyRouteRecord, JsonSchema, RouteInput, RouteRecord } from './route-record.js';
import { LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX } from '../http/limits.js';
import { renderReply } from './shard-reply.js';
import {
  checkoutSchema,
  commerceListQuerySchema,
  type CheckoutBody,
  type CommerceListQuery,
} from './commerce-validation.js';

export interface CommerceDeps {
  readonly pool: ShardPool;
  readonly control: ControlStore;
  readonly audit: AuditLog;
  readonly processor: Processor;
}

/** The audit actor of changes the processor's events cause (no API key made them). */
export const PROCESSOR_ACTOR = 'processor:stripe';

/** Statuses under which a subscription is active: a new one must go through a plan change. */
const ACTIVE_STATUSES: ReadonlySet<string> = new Set(['active', 'trialing', 'past_due']);

/** A domain outcome the route answers with an error from the catalog. */
export class Answered extends Error {}

/** The customer's shard queue is full (503 `overloaded`). */
export class ShardFull extends Error {}

export interface ShardAnswer {
  readonly outcome: ReplyOutcome;
  readonly body: string;
  readonly effect: string;
}

/** Hands a command to its shard and waits for the (durable, for a write) reply. */
export function ask(
  pool: ShardPool,
  command: Command,
  tag: AuditTag | null = null,
): Promise<ShardAnswer> {
  return new Promise((resolve, reject) => {
    if (!pool.submit(command, (outcome, body, effect) => resolve({ outcome, body, effect }), tag))
      reject(new ShardFull('shard queue is full'));
  });
}

/** The customer's processor customer, subscriptions and purchases. */
export async function commerceOf(
  pool: ShardPool,
  environment: Environment,
  customerId: string,
): Promise<CommerceView> {
  const reply = await ask(pool, { op: 'getCommerce', environment, customerId, key: '' });
  return JSON.parse(reply.body) as CommerceView;
}

/** The customer's contract, or null without one. */
export async function contractOf(
  pool: ShardPool,
  environment: Environment,
  customerId: string,
): Promise<ContractView | null> {
  const reply = await ask(pool, { op: 'getContract', environment, customerId, key: '' });
  return reply.outcome === 'rejected' ? null : (JSON.parse(reply.body) as ContractView);
}

const REF_PREFIX = `${randomBytes(9).toString('base64url')}.c`;
let refCounter = 0;
export function freshRef(): string {
  return `${REF_PREFIX}${(refCounter++).toString(36)}`;
}

function isAbsoluteHttpUrl(value: string): boolean {
  try {
    const parsed = new URL(value);
    return (parsed.protocol === 'http:' || parsed.protocol === 'https:') && parsed.hostname !== '';
  } catch {
    return false;
  }
}

export function processorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * Whether the processor still has the customer (the embedded sandbox forgets everything on
 * restart).
 */
async function stillExists(stripe: Stripe, processorCustomerId: string): Promise<boolean> {
  try {
    const customer = await stripe.customers.retrieve(processorCustomerId);
    return customer.deleted !== true;
  } catch (error) {
    if (error instanceof Error && (error as { code?: unknown }).code === 'resource_missing')
      return false;
    throw error;
  }
}

/**
 * The Stripe customer of a Tally customer: created once (idempotently) and remembered by
 * its actor; created again, replacing the remembered one, only when the processor no
 * longer has it.
 */
async function processorCustomer(
  deps: CommerceDeps,
  environment: Environment,
  customerId: string,
  known: string | null,
): Promise<{ id: string; created: boolean }> {
  const { stripe } = deps.processor;
  if (known !== null && (await stillExists(stripe, known))) return { id: known, created: false };
  const customer = await stripe.customers.create(
    { metadata: { [META.environment]: environment, [META.customerId]: customerId } },
    {
      idempotencyKey: fitKey(
        `tally-${environment}-customer-`,
        customerId,
        known === null ? '' : `-after-${known}`,
        IDEMPOTENCY_KEY_MAX,
      ),
    },
  );
  const command = {
    op: 'setProcessorCustomer',
    environment,
    customerId,
    key: '',
    processorCustomerId: customer.id,
    ...(known === null ? {} : { replaces: known }),
  } as const;
  const reply = await ask(deps.pool, command);
  if (reply.outcome === 'rejected') throw new Error(`setProcessorCustomer rejected: ${reply.body}`);
  // A concurrent checkout may have stored another one first: that one stays.
  const stored = (JSON.parse(reply.body) as CommerceView).processorCustomerId;
  return { id: stored ?? customer.id, created: stored === customer.id };
}

async function createSession(
  deps: CommerceDeps,
  ctx: RouteInput<CheckoutBody>,
  body: CheckoutBody,
  config: BillingConfig,
): Promise<Stripe.Checkout.Session> {
  const { environment } = ctx;
  const product = config.products[body.productKey];
  const price = product?.price;
  assert(price !== undefined, 'the route checked that the product has a price');
  const view = await commerceOf(deps.pool, environment, body.customerId);
  const recurring = price.interval !== undefined;
  if (recurring && view.subscriptions.some((s) => ACTIVE_STATUSES.has(s.status))) {
    ctx.ex.fail('subscription_exists', { customerId: body.customerId });
    throw new Answered();
  }
  const { stripe } = deps.processor;
  // A plan is sold at the customer's contract price, when there is a contract.
  const contract = recurring ? await contractOf(deps.pool, environment, body.customerId) : null;
  const found = await subscriptionPrice(
    stripe,
    environment,
    body.customerId,
    body.productKey,
    price,
    contract,
  );
  const customer = await processorCustomer(
    deps,
    environment,
    body.customerId,
    view.processorCustomerId,
  );
  const metadata = {
    [META.environment]: environment,
    [META.customerId]: body.customerId,
    [META.productKey]: body.productKey,
  };
  return stripe.checkout.sessions.create(
    {
      mode: recurring ? 'subscription' : 'payment',
      customer: customer.id,
      line_items: [{ price: found.id, quantity: 1 }],
      success_url: body.successUrl,
      cancel_url: body.cancelUrl,
      client_reference_id: body.customerId,
      metadata,
      ...(recurring ? { subscription_data: { metadata } } : { payment_intent_data: { metadata } }),
    },
    { idempotencyKey: `tally-${environment}-checkout-${freshRef()}` },
  );
}

/** POST /v1/checkout: a hosted checkout session for a priced product; answers `{url}`. */
function checkout(ctx: RouteInput<CheckoutBody>, deps: CommerceDeps): void {
  const { successUrl, cancelUrl, productKey, customerId } = ctx.body;
  if (!isAbsoluteHttpUrl(successUrl))
    return ctx.ex.fail('invalid_request', {
      detail: 'successUrl must be an absolute http or https URL',
    });
  if (!isAbsoluteHttpUrl(cancelUrl))
    return ctx.ex.fail('invalid_request', {
      detail: 'cancelUrl must be an absolute http or https URL',
    });
  const latest = deps.control.latestConfig(ctx.environment);
  if (latest === null) return ctx.ex.fail('not_configured', { environment: ctx.environment });
  const config = latest.config as BillingConfig;
  const product = config.products[productKey];
  if (product === undefined) return ctx.ex.fail('product_not_found', { productKey });
  if (product.price === undefined) return ctx.ex.fail('product_not_purchasable', { productKey });
  createSession(deps, ctx, ctx.body, config)
    .then(async (session) => {
      if (session.url === null) throw new Error('the processor returned a session without a url');
      const data = { productKey, sessionId: session.id, mode: session.mode };
      await deps.audit.append(
        ctx.environment,
        {
          action: 'checkout.create',
          resourceType: 'checkout',
          resourceId: customerId,
          actor: ctx.key.id,
          data,
        },
        Date.now(),
      );
      ctx.ex.json(200, { url: session.url });
    })
    .catch((error: unknown) => {
      if (error instanceof Answered || ctx.ex.done) return;
      if (error instanceof ShardFull) return ctx.ex.fail('overloaded', {}, [['retry-after', '1']]);
      ctx.ex.logWarn('checkout failed', { error: processorMessage(error) });
      ctx.ex.fail('processor_error', { detail: processorMessage(error) });
    });
}

/** GET /v1/subscriptions and GET /v1/purchases: the customer's records in id order, paged. */
function list(what: 'subscriptions' | 'purchases') {
  return (ctx: RouteInput<undefined, CommerceListQuery>, deps: CommerceDeps): void => {
    const limit = pageLimit(ctx.ex, ctx.query.limit);
    if (limit === null) return;
    let after = '';
    if (ctx.query.cursor !== undefined) {
      const decoded = decodeCursor(ctx.ex, ctx.query.cursor, ({ after: at }) =>
        typeof at === 'string' ? at : null,
      );
      if (decoded === null) return;
      after = decoded;
    }
    commerceOf(deps.pool, ctx.environment, ctx.query.customerId).then(
      (view) => {
        const records: ReadonlyArray<{ readonly id: string }> = view[what];
        const sorted = records.filter((r) => r.id > after).sort((a, b) => (a.id < b.id ? -1 : 1));
        const page = sorted.slice(0, limit);
        const last = page[page.length - 1];
        const nextCursor =
          sorted.length > limit && last !== undefined ? encodeCursor({ after: last.id }) : null;
        ctx.ex.json(200, { data: page, nextCursor });
      },
      () => ctx.ex.fail('overloaded', {}, [['retry-after', '1']]),
    );
  };
}

/**
 * Applies a write durably with its audit entry (made by `actor`); resolves with the shard's
 * answer once both are on disk. A rejected write records nothing.
 */
export async function applyAudited(
  deps: CommerceDeps,
  command: Command,
  actor: string,
): Promise<ShardAnswer> {
  const tag: AuditTag = { ref: freshRef(), actor };
  const reply = await ask(deps.pool, command, tag);
  if (reply.outcome === 'rejected' || reply.effect !== 'wrote') return reply;
  const fields = auditOf(command);
  if (fields === null) return reply;
  await deps.audit.append(command.environment, { ...fields, actor }, Date.now(), tag.ref);
  deps.pool.auditsRecorded(command.environment, fields.resourceId, [tag.ref]);
  return reply;
}

/** Applies one processor command durably, with its audit entry; resolves once both are on disk. */
async function applyProcessorCommand(deps: CommerceDeps, command: ProcessorCommand): Promise<void> {
  const reply = await applyAudited(deps, { ...command, key: '' }, PROCESSOR_ACTOR);
  if (reply.outcome === 'rejected')
    throw new Error(`${command.op} rejected: ${renderReply(reply.outcome, reply.body).body}`);
}

/** What overage billing uses of the service. */
function overageIo(deps: CommerceDeps): OverageIo {
  return {
    stripe: deps.processor.stripe,
    latestConfig: (environment) =>
      (deps.control.latestConfig(environment)?.config as BillingConfig | undefined) ?? null,
    run: async (command) => {
      const reply = await ask(deps.pool, command);
      if (reply.outcome === 'rejected')
        throw new Error(`${command.op} rejected: ${renderReply(reply.outcome, reply.body).body}`);
      return reply.body;
    },
  };
}

/** Verifies and handles one webhook delivery (the raw body and its signature). */
function receiveWebhook(deps: CommerceDeps, ex: Exchange, text: string, signature: string): void {
  let event: Stripe.Event;
  try {
    event = deps.processor.stripe.webhooks.constructEvent(
      text,
      signature,
      deps.processor.webhookSecret,
    );
  } catch (error) {
    return ex.fail('invalid_signature', { detail: processorMessage(error) });
  }
  commandsForEvent(deps.processor.stripe, event)
    .then(async (commands) => {
      for (const command of commands) await applyProcessorCommand(deps, command);
      if (event.type === 'invoice.created' && event.data.object.id !== undefined)
        await billOverage(overageIo(deps), event.data.object.id);
      ex.json(200, { received: true });
    })
    .catch((error: unknown) => {
      ex.logWarn('processor event failed; the processor will deliver it again', {
        eventId: event.id,
        type: event.type,
        error: processorMessage(error),
      });
      ex.fail('processor_event_failed', { id: event.id });
    });
}

/**
 * POST /v1/processor/stripe/webhook, answered before any key is asked for: the
 * processor signs the raw body instead (`Stripe-Signature`). Headers are read here,
 * synchronously, as uWS requires.
 */
export function webhookHandler(deps: CommerceDeps): (ex: Exchange, req: uWS.HttpRequest) => void {
  return (ex, req) => {
    if (ex.method !== 'POST')
      return ex.fail('method_not_allowed', { method: ex.method, path: ex.path }, [
        ['allow', 'POST'],
      ]);
    const signature = req.getHeader('stripe-signature');
    if (!checkBodyHeaders(ex, req.getHeader('content-type'), req.getHeader('content-length')))
      return;
    readJsonBody(ex, (_value, text) => receiveWebhook(deps, ex, text, signature));
  };
}

const ref = (name: string): JsonSchema => ({ $ref: `#/components/schemas/${name}` });
const PAGING =
  `Pages of at most \`limit\` (default ${LIST_LIMIT_DEFAULT}, at ` +
  `most ${LIST_LIMIT_MAX}); pass \`nextCursor\` as \`cursor\`.`;

/** The keyed commerce routes: records of the API route table (routes.ts spreads them in). */
export const COMMERCE_ROUTES: ReadonlyArray<AnyRouteRecord<CommerceDeps>> = [
  route<CheckoutBody>({
    method: 'POST',
    path: '/v1/checkout',
    keys: 'server',
    audited: true,
    body: { schema: checkoutSchema, numbers: 'as-parsed' },
    doc: {
      operationId: 'createCheckout',
      tag: 'commerce',
      sharded: true,
      summary: 'A hosted checkout for a priced product',
      description:
        'A recurring product opens a subscription checkout, a one-time product a payment. ' +
        'The customer is created ' +
        'if needed. Nothing changes until the processor reports the payment. 409 when the ' +
        'customer already has an active ' +
        'subscription and the product is recurring: change plans with POST ' +
        '/v1/subscriptions/change.',
      ok: { description: "The checkout page's address.", schema: ref('CheckoutSession') },
      errors: [
        'invalid_request',
        'not_configured',
        'product_not_found',
        'product_not_purchasable',
        'subscription_exists',
        'processor_error',
      ],
    },
    handle: checkout,
  }),
  route<undefined, CommerceListQuery>({
    method: 'GET',
    path: '/v1/subscriptions',
    keys: 'server',
    query: commerceListQuerySchema,
    audited: false,
    doc: {
      operationId: 'listSubscriptions',
      tag: 'commerce',
      sharded: true,
      summary: "A customer's subscriptions, in id order",
      description: PAGING,
      ok: { description: 'A page.', schema: ref('SubscriptionList') },
      errors: [],
    },
    handle: list('subscriptions'),
  }),
  route<undefined, CommerceListQuery>({
    method: 'GET',
    path: '/v1/purchases',
    keys: 'server',
    query: commerceListQuerySchema,
    audited: false,
    doc: {
      operationId: 'listPurchases',
      tag: 'commerce',
      sharded: true,
      summary: "A customer's one-time purchases, in id order",
      description: PAGING,
      ok: { description: 'A page.', schema: ref('PurchaseList') },
      errors: [],
    },
    handle: list('purchases'),
  }),
];

function route<B = undefined, Q = undefined>(
  record: RouteRecord<CommerceDeps, B, Q>,
): AnyRouteRecord<CommerceDeps> {
  return record;
}
