/**
 * The session-bound billing endpoints of the Better Auth plugin. Each requires a
 * signed-in session (Better Auth answers 401 without one), derives the customer from it
 * and calls Tally with the server key. Bodies are strict: a body naming `customerId` (or
 * any field not listed) is a 400, so the browser can never choose the customer.
 *
 * Tally's answers pass through unchanged; so do its errors, with their status, `error`
 * message, `code` and extra fields (a 429 `insufficient_balance` keeps its balance
 * fields) and the rate-limit headers. Better Auth's client reads `message`, so the error
 * text is also given there. A Tally that cannot be reached answers 502.
 */
import { APIError, createAuthEndpoint, sessionMiddleware } from 'better-auth/api';
import * as z from 'zod';
import { type TallyClient, TallyApiError, TallyConnectionError } from '../client/index.js';
import { customerProfile, type FindNamed, resolveCustomer } from './customer-id.js';
import type { TallyPluginOptions, TallySession } from './options.js';

/** Tally's limits on ids and keys (entitlement, product, idempotency), and on the keys
 * one context call names in each of its arrays. */
const KEY_LENGTH_MAX = 255;
const CONTEXT_KEYS_MAX = 1000;
/** Tally's longest customer-token lifetime, in seconds. */
const CLIENT_TOKEN_TTL_MAX = 3600;
const key = z.string().min(1).max(KEY_LENGTH_MAX);
const keys = z.array(key).max(CONTEXT_KEYS_MAX);

/** Headers of a Tally error that the application's caller needs to act on it. */
const PASSED_HEADERS = ['retry-after', 'x-ratelimit-limit', 'x-ratelimit-remaining'] as const;

interface EndpointDeps {
  readonly client: TallyClient;
  readonly options: TallyPluginOptions;
}

/** The endpoints, keyed by their `auth.api` names. */
export function billingEndpoints(deps: EndpointDeps) {
  return { ...customerEndpoints(deps), ...entitlementEndpoints(deps) };
}

/** The customer of the request's session (`sessionMiddleware` has put it on the context). */
const customerOfSession =
  (options: TallyPluginOptions) => (ctx: { context: { session: unknown } }) =>
    resolveCustomer(ctx.context.session as TallySession, options);

const use = [sessionMiddleware];

/** Reads of entitlements and the usage draw. */
function entitlementEndpoints({ client, options }: EndpointDeps) {
  const customerOf = customerOfSession(options);
  return {
    tallyHas: createAuthEndpoint(
      '/tally/has',
      { method: 'POST', use, body: z.strictObject({ key }) },
      async (ctx) => {
        const customer = await customerOf(ctx);
        const allowed = await forward(ctx.context, () => client.has(customer.id, ctx.body.key));
        return ctx.json({ allowed });
      },
    ),
    tallyUsageBalance: createAuthEndpoint(
      '/tally/usage/balance',
      { method: 'POST', use, body: z.strictObject({ key }) },
      async (ctx) => {
        const customer = await customerOf(ctx);
        return ctx.json(
          await forward(ctx.context, () => client.balance(customer.id, ctx.body.key)),
        );
      },
    ),
    tallyUsageConsume: createAuthEndpoint(
      '/tally/usage/consume',
      {
        method: 'POST',
        use,
        body: z.strictObject({ key, amount: z.number(), idempotencyKey: key.optional() }),
      },
      async (ctx) => {
        const customer = await customerOf(ctx);
        const { key: meter, amount, idempotencyKey } = ctx.body;
        const input = {
          customerId: customer.id,
          key: meter,
          amount,
          ...(idempotencyKey === undefined ? {} : { idempotencyKey }),
        };
        return ctx.json(await forward(ctx.context, () => client.consume(input)));
      },
    ),
  };
}

/** The customer record itself: sync, checkout and the one-call context. */
function customerEndpoints({ client, options }: EndpointDeps) {
  const customerOf = customerOfSession(options);
  return {
    tallyCustomerSync: createAuthEndpoint(
      '/tally/customer/sync',
      { method: 'POST', use, body: z.strictObject({}).optional() },
      async (ctx) => {
        const session = ctx.context.session as TallySession;
        const customer = await customerOf(ctx);
        const profile = await customerProfile(session, customer, namesFrom(ctx.context));
        return ctx.json(
          await forward(ctx.context, () => client.upsertCustomer({ id: customer.id, ...profile })),
        );
      },
    ),
    tallyCheckout: createAuthEndpoint(
      '/tally/checkout/create',
      {
        method: 'POST',
        use,
        body: z.strictObject({
          productKey: key,
          successUrl: z.string().min(1),
          cancelUrl: z.string().min(1),
        }),
      },
      async (ctx) => {
        const customer = await customerOf(ctx);
        const input = {
          customerId: customer.id,
          productKey: ctx.body.productKey,
          successUrl: trustedUrl(ctx.context, 'successUrl', ctx.body.successUrl),
          cancelUrl: trustedUrl(ctx.context, 'cancelUrl', ctx.body.cancelUrl),
        };
        return ctx.json(await forward(ctx.context, () => client.checkout(input)));
      },
    ),
    /** A customer token for the session's customer: the page reads it with the client key. */
    tallyClientToken: createAuthEndpoint(
      '/tally/client-token',
      {
        method: 'POST',
        use,
        body: z
          .strictObject({
            ttlSeconds: z.number().int().min(1).max(CLIENT_TOKEN_TTL_MAX).optional(),
          })
          .optional(),
      },
      async (ctx) => {
        const customer = await customerOf(ctx);
        const ttlSeconds = ctx.body?.ttlSeconds;
        const input = {
          customerId: customer.id,
          ...(ttlSeconds === undefined ? {} : { ttlSeconds }),
        };
        return ctx.json(await forward(ctx.context, () => client.createClientToken(input)));
      },
    ),
    tallyContext: createAuthEndpoint(
      '/tally/context',
      {
        method: 'POST',
        use,
        body: z
          .strictObject({
            features: keys.optional(),
            usage: keys.optional(),
            limits: keys.optional(),
            includePlans: z.boolean().optional(),
            includeSubscription: z.boolean().optional(),
          })
          .optional(),
      },
      async (ctx) => {
        const session = ctx.context.session as TallySession;
        const customer = await customerOf(ctx);
        const profile = await customerProfile(session, customer, namesFrom(ctx.context));
        const input = { customer: { id: customer.id, ...profile }, ...(ctx.body ?? {}) };
        return ctx.json(await forward(ctx.context, () => client.context(input)));
      },
    ),
  };
}

interface AuthContextPart {
  readonly baseURL: string;
  readonly isTrustedOrigin: (url: string) => boolean;
  readonly logger: { error: (message: string) => void };
  readonly adapter: {
    findOne: <T>(query: {
      model: string;
      where: Array<{ field: string; value: string }>;
    }) => Promise<T | null>;
  };
}

/** The name of an organization or team row, through Better Auth's adapter. */
function namesFrom(context: AuthContextPart): FindNamed {
  return async (model, id) => {
    const row = await context.adapter.findOne<{ name?: unknown }>({
      model,
      where: [{ field: 'id', value: id }],
    });
    return typeof row?.name === 'string' ? row.name : null;
  };
}

/**
 * A checkout return URL: a path is taken relative to the application's origin; an
 * absolute URL must be on a trusted origin (Better Auth's `trustedOrigins`), so a
 * crafted request cannot send a paying user to another site. Otherwise 400.
 */
function trustedUrl(context: AuthContextPart, field: string, value: string): string {
  let url: URL;
  try {
    url = new URL(value, new URL(context.baseURL).origin);
  } catch {
    throw new APIError('BAD_REQUEST', { message: `${field} is not a URL`, code: 'INVALID_URL' });
  }
  if (!context.isTrustedOrigin(url.href)) {
    throw new APIError('BAD_REQUEST', {
      message: `${field} must be on a trusted origin (trustedOrigins): ${url.origin}`,
      code: 'UNTRUSTED_URL',
    });
  }
  return url.href;
}

/**
 * Runs one Tally call and turns its failure into the `APIError` Better Auth answers
 * with: Tally's own status, body and rate-limit headers, or 502 when Tally could not be
 * reached. A 401 or 403 from Tally means the plugin's key is wrong or revoked, which the
 * browser cannot fix, so it is also logged for the operator.
 */
export async function forward<T>(context: AuthContextPart, call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (error) {
    if (error instanceof TallyApiError) {
      if (error.status === 401 || error.status === 403) {
        context.logger.error(`tally plugin: Tally refused the server key: ${error.message}`);
      }
      const headers = new Headers();
      for (const name of PASSED_HEADERS) {
        const value = error.headers.get(name);
        if (value !== null) headers.set(name, value);
      }
      const status = error.status as ConstructorParameters<typeof APIError>[0];
      throw new APIError(status, { ...error.body, message: error.message }, headers);
    }
    if (error instanceof TallyConnectionError) {
      throw new APIError('BAD_GATEWAY', { message: error.message, code: 'TALLY_UNREACHABLE' });
    }
    throw error;
  }
}
