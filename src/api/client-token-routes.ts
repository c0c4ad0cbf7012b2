/**
 * `POST /v1/client-tokens`: the application's server mints a customer-bound token for a
 * page to send beside the public client key (src/auth/customer-token.ts,
 * docs/browser.md). Answered by the front end from its own state: no shard is involved,
 * and nothing is stored, so minting is not audited (rotating the secret is).
 */
import { ID_LENGTH_MAX } from '../../shared/limits.js';
import {
  CUSTOMER_TOKEN_TTL_SEC_DEFAULT,
  CUSTOMER_TOKEN_TTL_SEC_MAX,
  type CustomerTokens,
} from '../auth/customer-token.js';
import type { AnyRouteRecord, JsonSchema, RouteInput, RouteRecord } from './route-record.js';

export interface ClientTokenDeps {
  readonly customerTokens: CustomerTokens;
}

export const clientTokenSchema = {
  type: 'object',
  properties: {
    customerId: { type: 'string', minLength: 1, maxLength: ID_LENGTH_MAX },
    ttlSeconds: {
      type: 'integer',
      minimum: 1,
      maximum: CUSTOMER_TOKEN_TTL_SEC_MAX,
      description: `Lifetime in seconds (default ${CUSTOMER_TOKEN_TTL_SEC_DEFAULT}).`,
    },
  },
  required: ['customerId'],
  additionalProperties: false,
} as const;

export interface ClientTokenBody {
  readonly customerId: string;
  readonly ttlSeconds?: number;
}

/** The answer's schema (the OpenAPI document's `ClientToken`). */
export const clientTokenView: JsonSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['token', 'customerId', 'expiresAt', 'ttlSeconds'],
  properties: {
    token: {
      type: 'string',
      description: 'Send it as `x-tally-customer-token` beside the client key.',
    },
    customerId: { type: 'string', description: 'The only customer the token may read.' },
    expiresAt: {
      type: 'string',
      format: 'date-time',
      description: 'When it stops being accepted (ISO 8601, UTC, milliseconds).',
    },
    ttlSeconds: { type: 'integer', description: 'Its lifetime, as granted.' },
  },
};

function mint(ctx: RouteInput<ClientTokenBody>, deps: ClientTokenDeps): void {
  const { customerId, ttlSeconds = CUSTOMER_TOKEN_TTL_SEC_DEFAULT } = ctx.body;
  const minted = deps.customerTokens.mint(ctx.environment, customerId, ttlSeconds, Date.now());
  ctx.ex.json(200, {
    token: minted.token,
    customerId,
    expiresAt: new Date(minted.expiresAtMs).toISOString(),
    ttlSeconds,
  });
}

function route<B>(record: RouteRecord<ClientTokenDeps, B>): AnyRouteRecord<ClientTokenDeps> {
  return record;
}

export const CLIENT_TOKEN_ROUTES: ReadonlyArray<AnyRouteRecord<ClientTokenDeps>> = [
  route<ClientTokenBody>({
    method: 'POST',
    path: '/v1/client-tokens',
    keys: 'server',
    audited: false,
    body: { schema: clientTokenSchema, numbers: 'as-parsed' },
    doc: {
      operationId: 'createClientToken',
      tag: 'browser',
      summary: 'Mint a customer-bound client token',
      description:
        'For a web page of the application: with this token beside the client key, ' +
        'has, limit and balance answer only for `customerId` (403 for any other). ' +
        `\`ttlSeconds\` is 1 to ${CUSTOMER_TOKEN_TTL_SEC_MAX} ` +
        `(default ${CUSTOMER_TOKEN_TTL_SEC_DEFAULT}). The customer need not exist yet.`,
      ok: { description: 'The token.', schema: { $ref: '#/components/schemas/ClientToken' } },
      errors: ['invalid_request'],
    },
    handle: mint,
  }),
];
