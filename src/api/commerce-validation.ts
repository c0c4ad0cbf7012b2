/**
 * Request schemas of the commerce routes (checkout, the subscription and purchase
 * listings), compiled once; the OpenAPI document shows the same schemas.
 */
import { Ajv } from 'ajv';
import { ID_LENGTH_MAX } from '../../shared/limits.js';
import { LIST_LIMIT_MAX } from '../http/limits.js';

const ajv = new Ajv({ allErrors: false, strict: true, coerceTypes: false, verbose: true });
const id = { type: 'string', minLength: 1, maxLength: ID_LENGTH_MAX } as const;
const url = {
  type: 'string',
  minLength: 1,
  maxLength: 2048,
  description: 'An absolute http or https URL.',
} as const;

export interface CheckoutBody {
  readonly customerId: string;
  readonly productKey: string;
  readonly successUrl: string;
  readonly cancelUrl: string;
}

/** POST /v1/checkout. */
export const checkoutSchema = {
  type: 'object',
  properties: { customerId: id, productKey: id, successUrl: url, cancelUrl: url },
  required: ['customerId', 'productKey', 'successUrl', 'cancelUrl'],
  additionalProperties: false,
} as const;

export interface CommerceListQuery {
  readonly customerId: string;
  readonly limit?: string;
  readonly cursor?: string;
}

/** GET /v1/subscriptions and GET /v1/purchases. */
export const commerceListQuerySchema = {
  type: 'object',
  properties: {
    customerId: id,
    limit: {
      type: 'string',
      pattern: '^(?:[1-9][0-9]?|100)$',
      description: `a whole number from 1 to ${LIST_LIMIT_MAX}`,
    },
    cursor: { type: 'string', minLength: 1, maxLength: 2048 },
  },
  required: ['customerId'],
  additionalProperties: false,
} as const;

export const validateCheckout = ajv.compile<CheckoutBody>(checkoutSchema);
export const validateCommerceListQuery = ajv.compile<CommerceListQuery>(commerceListQuerySchema);
