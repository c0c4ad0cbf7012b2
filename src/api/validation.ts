/**
 * The request schemas of the routes (their records in the route tables compile them,
 * route-record.ts), and the mapping from ajv's errors to one clear message naming the
 * field.
 *
 * Every query and body is checked on the front end, before anything crosses a
 * thread. Unknown fields are refused (as Stripe does) so that typos surface. Numbers
 * that a schema cannot judge exactly (amount decimals) are checked by `parseAmount`.
 */
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import {
  ID_LENGTH_MAX,
  METADATA_KEY_LENGTH_MAX,
  METADATA_KEYS_MAX,
  METADATA_VALUE_LENGTH_MAX,
  PURCHASED_MAX,
} from '../../shared/limits.js';
import { LIST_LIMIT_MAX } from '../http/limits.js';

// verbose: errors carry their schema, so an anyOf can be described by its branches.
const ajv = new Ajv({ allErrors: false, strict: true, coerceTypes: false, verbose: true });

const id = { type: 'string', minLength: 1, maxLength: ID_LENGTH_MAX } as const;

export const customerQuerySchema = {
  type: 'object',
  properties: { customerId: id },
  required: ['customerId'],
  additionalProperties: false,
} as const;

export const usageAmountSchema = {
  type: 'object',
  properties: { customerId: id, amount: { type: 'number' }, idempotencyKey: id },
  required: ['customerId', 'amount'],
  additionalProperties: false,
} as const;

export const limitSettingsSchema = {
  type: 'object',
  properties: {
    customerId: id,
    purchased: { type: 'integer', minimum: 0, maximum: PURCHASED_MAX },
    autoExpansionEnabled: { type: 'boolean' },
  },
  required: ['customerId'],
  additionalProperties: false,
} as const;

export const usageSettingsSchema = {
  type: 'object',
  properties: { customerId: id, overageEnabled: { type: 'boolean' } },
  required: ['customerId', 'overageEnabled'],
  additionalProperties: false,
} as const;

/** PUT /v1/contracts/{customerId}. */
export const contractSchema = {
  type: 'object',
  properties: {
    priceAmount: { type: 'integer', minimum: 0, maximum: 1e12 },
    priceInterval: { enum: ['month', 'year'] },
    entitlements: {
      type: 'object',
      maxProperties: 1000,
      propertyNames: {
        type: 'string',
        minLength: 1,
        maxLength: ID_LENGTH_MAX,
        not: { const: '__proto__' },
      },
      additionalProperties: {
        type: 'object',
        properties: { included: { type: 'number', minimum: 0, maximum: 1e12 } },
        required: ['included'],
        additionalProperties: false,
      },
    },
  },
  required: ['priceAmount', 'priceInterval'],
  additionalProperties: false,
} as const;

export interface ContractBody {
  readonly priceAmount: number;
  readonly priceInterval: 'month' | 'year';
  readonly entitlements?: Readonly<Record<string, { readonly included: number }>>;
}

/**
 * What an email must look like: one `@` with something on each side and no spaces.
 * Deliberately loose (as Stripe is): mailbox syntax is the mail server's business; this
 * only catches a value that is plainly not an address, such as a name in the wrong field.
 */
const EMAIL_PATTERN = '^[^\\s@]+@[^\\s@]+$';

/** POST /v1/customers: create, or update only the fields given. */
export const customerUpsertSchema = {
  type: 'object',
  properties: {
    id,
    name: { anyOf: [{ type: 'string', maxLength: ID_LENGTH_MAX }, { type: 'null' }] },
    email: {
      anyOf: [
        {
          type: 'string',
          maxLength: ID_LENGTH_MAX,
          pattern: EMAIL_PATTERN,
          description: 'an email address (name@domain)',
        },
        { type: 'null' },
      ],
    },
    metadata: {
      type: 'object',
      maxProperties: METADATA_KEYS_MAX,
      propertyNames: {
        type: 'string',
        minLength: 1,
        maxLength: METADATA_KEY_LENGTH_MAX,
        not: { const: '__proto__' },
      },
      additionalProperties: {
        anyOf: [
          { type: 'string', maxLength: METADATA_VALUE_LENGTH_MAX },
          { type: 'number' },
          { type: 'boolean' },
          { type: 'null' },
        ],
      },
    },
  },
  required: ['id'],
  additionalProperties: false,
} as const;

export interface CustomerUpsertBody {
  readonly id: string;
  readonly name?: string | null;
  readonly email?: string | null;
  readonly metadata?: Readonly<Record<string, string | number | boolean | null>>;
}

const entitlementKeys = {
  type: 'array',
  maxItems: 1000,
  items: { type: 'string', minLength: 1, maxLength: ID_LENGTH_MAX },
} as const;

/** POST /v1/context. */
export const contextSchema = {
  type: 'object',
  properties: {
    customer: customerUpsertSchema,
    features: entitlementKeys,
    usage: entitlementKeys,
    limits: entitlementKeys,
    includePlans: { type: 'boolean' },
    includeSubscription: { type: 'boolean' },
  },
  required: ['customer'],
  additionalProperties: false,
} as const;

export interface ContextBody {
  readonly customer: CustomerUpsertBody;
  readonly features?: readonly string[];
  readonly usage?: readonly string[];
  readonly limits?: readonly string[];
  readonly includePlans?: boolean;
  readonly includeSubscription?: boolean;
}

/**
 * A listing's `limit` as the query gives it (a string): a whole number from 1 to 100. The
 * pattern says the range too, so the OpenAPI document (which publishes these schemas)
 * refuses what the server refuses; `description` is also the error's wording.
 */
const LIST_LIMIT_QUERY = {
  type: 'string',
  pattern: '^(?:[1-9][0-9]?|100)$',
  description: `a whole number from 1 to ${LIST_LIMIT_MAX}`,
} as const;

/**
 * Every action and resource type an environment's audit log can hold, including those
 * reserved for routes not built yet (commerce, webhooks), so a filter with a typo
 * is a 400 naming the allowed values rather than an empty page.
 */
export const AUDIT_ACTIONS = [
  'config.push',
  'customer.upsert',
  'contract.put',
  'contract.delete',
  'limit.settings',
  'usage.settings',
  'usage.refund',
  'checkout.create',
  'subscription.sync',
  'purchase.record',
  'subscription.change',
  'subscription.refund',
  'purchase.refund',
  'webhook.register',
  'webhook.update',
  'webhook.delete',
  'webhook.rotate',
  'webhook.approve',
  'webhook.enable',
  'webhook.failing',
  'webhook.disable',
  'key.create',
  'key.revoke',
] as const;
export const AUDIT_RESOURCE_TYPES = [
  'config',
  'customer',
  'contract',
  'limit',
  'meter',
  'checkout',
  'subscription',
  'purchase',
  'webhook',
  'key',
] as const;

/** GET /v1/audit. */
export const auditQuerySchema = {
  type: 'object',
  properties: {
    action: { type: 'string', enum: AUDIT_ACTIONS },
    resourceType: { type: 'string', enum: AUDIT_RESOURCE_TYPES },
    limit: LIST_LIMIT_QUERY,
    cursor: { type: 'string', minLength: 1, maxLength: 2048 },
  },
  required: [],
  additionalProperties: false,
} as const;

/**
 * GET /v1/admin/audit: the operator stream's actions are the operator's own (docs/operations.md).
 */
export const operatorAuditQuerySchema = {
  ...auditQuerySchema,
  properties: {
    ...auditQuerySchema.properties,
    action: { type: 'string', minLength: 1, maxLength: 64 },
    resourceType: { type: 'string', minLength: 1, maxLength: 64 },
  },
} as const;

export interface AuditQuery {
  readonly action?: string;
  readonly resourceType?: string;
  readonly limit?: string;
  readonly cursor?: string;
}

/** GET /v1/customers: query values are strings; limit is checked as a number after. */
export const customerListQuerySchema = {
  type: 'object',
  properties: {
    limit: LIST_LIMIT_QUERY,
    cursor: { type: 'string', minLength: 1, maxLength: 2048 },
  },
  required: [],
  additionalProperties: false,
} as const;

export interface CustomerListQuery {
  readonly limit?: string;
  readonly cursor?: string;
}

export interface CustomerQuery {
  readonly customerId: string;
}
export interface UsageAmountBody {
  readonly customerId: string;
  readonly amount: number;
  readonly idempotencyKey?: string;
}
export interface LimitSettingsBody {
  readonly customerId: string;
  readonly purchased?: number;
  readonly autoExpansionEnabled?: boolean;
}
export interface UsageSettingsBody {
  readonly customerId: string;
  readonly overageEnabled: boolean;
}

/** POST /v1/admin/keys: an environment key of either class (the operator key only rotates). */
export const keyCreateSchema = {
  type: 'object',
  properties: { environment: { enum: ['test', 'live'] }, class: { enum: ['server', 'client'] } },
  required: ['environment', 'class'],
  additionalProperties: false,
} as const;

export interface KeyCreateBody {
  readonly environment: 'test' | 'live';
  readonly class: 'server' | 'client';
}

/** The customer body of an offline snapshot edit (the CLI), checked as the API checks it. */
export const validateCustomerUpsert = ajv.compile<CustomerUpsertBody>(customerUpsertSchema);

/**
 * Whether an id taken from a path or a cursor has 1 to ID_LENGTH_MAX characters counted
 * as the schemas count them (ajv: code points, so an emoji is one), so that an id the
 * body and query schemas accept is accepted in a path too.
 */
export function isIdLength(value: string): boolean {
  if (value.length <= ID_LENGTH_MAX) return value.length > 0;
  let codePoints = 0;
  for (const _ of value) if (++codePoints > ID_LENGTH_MAX) return false;
  return true;
}

export type Checked<T> =
  | { readonly ok: true; readonly value: T }
  | { readonly ok: false; readonly message: string };

/** Compiles a route's query or body schema (once, when its router is built). */
export function compileSchema(schema: object): ValidateFunction {
  return ajv.compile(schema);
}

/** Runs a compiled validator and, on failure, names the offending field. */
export function check<T>(
  validate: ValidateFunction<T>,
  value: unknown,
  what: 'body' | 'query',
): Checked<T> {
  if (validate(value)) return { ok: true, value };
  return { ok: false, message: describeFailure(validate, what) };
}

/** The message for the last failed run of `validate`: one sentence naming the field. */
export function describeFailure(validate: ValidateFunction, what: 'body' | 'query'): string {
  // A failed anyOf reports its branches' errors first; the anyOf itself says it best.
  const error =
    validate.errors?.find((e) => e.keyword === 'anyOf' || e.keyword === 'propertyNames') ??
    validate.errors?.[0];
  return error === undefined ? `invalid ${what}` : describe(error, what);
}

function fieldOf(error: ErrorObject): string {
  return error.instancePath.replace(/^\//, '').replace(/\//g, '.');
}

function describe(error: ErrorObject, what: 'body' | 'query'): string {
  const field = fieldOf(error);
  const within = (name: unknown): string =>
    field === '' ? String(name) : `${field}.${String(name)}`;
  const p = error.params as Record<string, unknown>;
  switch (error.keyword) {
    case 'required':
      return `${within(p['missingProperty'])} is required`;
    case 'additionalProperties':
      return `${within(p['additionalProperty'])} is not a known field`;
    case 'type':
      return field === ''
        ? `request ${what} must be a JSON object`
        : `${field} must be ${article(String(p['type']))}`;
    case 'minLength':
    case 'maxLength': {
      const bounds = error.parentSchema as { minLength?: number; maxLength?: number } | undefined;
      return (
        `${field} must be ${String(bounds?.minLength ?? 0)} ` +
        `to ${String(bounds?.maxLength ?? ID_LENGTH_MAX)} characters`
      );
    }
    case 'enum':
      return `${field} must be one of ${(p['allowedValues'] as unknown[]).join(', ')}`;
    case 'propertyNames': {
      // Stored records decode into objects, where msgpackr renames this one key.
      if (p['propertyName'] === '__proto__') return `${field} key __proto__ is not allowed`;
      const names = error.schema as { minLength?: number; maxLength?: number };
      return (
        `${field} keys must be ${String(names.minLength ?? 1)} ` +
        `to ${String(names.maxLength)} characters`
      );
    }
    case 'anyOf': {
      const branches =
        (
          error.parentSchema as
            | {
                anyOf?: Array<{
                  type?: string;
                  maxLength?: number;
                  pattern?: string;
                  description?: string;
                }>;
              }
            | undefined
        )?.anyOf ?? [];
      const text = typeof error.data === 'string' ? error.data : null;
      const tooLong = branches.find(
        (b) =>
          b.type === 'string' &&
          text !== null &&
          b.maxLength !== undefined &&
          text.length > b.maxLength,
      );
      if (tooLong !== undefined)
        return `${field} must be at most ${String(tooLong.maxLength)} characters`;
      const misshapen = branches.find(
        (b) =>
          b.type === 'string' &&
          text !== null &&
          b.pattern !== undefined &&
          !new RegExp(b.pattern, 'u').test(text),
      );
      if (misshapen !== undefined)
        return `${field} must be ${misshapen.description ?? 'well formed'}`;
      return `${field} must be ${branches.map((b) => article(String(b.type))).join(' or ')}`;
    }
    case 'pattern': {
      const schema = error.parentSchema as { description?: string } | undefined;
      return `${field} must be ${schema?.description ?? 'well formed'}`;
    }
    case 'maxProperties':
      return `${field} may hold at most ${String(p['limit'])} keys`;
    default:
      // ajv's own wording already starts with "must ..." (minimum, maximum, maxProperties).
      return `${field || what} ${String(error.message)}`;
  }
}

function article(type: string): string {
  if (type === 'integer') return 'a whole number';
  if (type === 'object') return 'an object';
  if (type === 'array') return 'an array';
  if (type === 'null') return 'null';
  return `a ${type}`;
}
