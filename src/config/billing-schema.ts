/**
 * The JSON Schema of the billing configuration, pushed with `POST /v1/sync/push` and
 * served publicly at `GET /v1/schema/billing`.
 *
 * It has two readers: ajv, which compiles it once at start-up to check every push at
 * the edge (see validate-config.ts), and a human or an editor writing a configuration,
 * for whom every property carries a description. It says everything a schema can say
 * about shape, ranges and bounds; the cross-references it cannot express (a product
 * naming an undefined entitlement, a meter given a boolean, two default products) are
 * checked by the semantic pass in validate-config.ts, and the descriptions say so.
 *
 * Unknown properties are rejected everywhere so a typo (`prise`, `overrage`) is a 400
 * rather than a silently ignored setting.
 */
import { EVENT_KINDS } from '../../shared/event-kinds.js';
import { AMOUNT_UNITS_MAX, DECIMALS_MAX } from '../../actors/fixed.js';

export const BILLING_SCHEMA_ID = 'https://tally.dev/schemas/billing-config.json';

/**
 * Keys are 1–255 characters and appear in URL paths, so they are URL-safe.
 * `__proto__` is refused: stored records are MessagePack maps decoded into objects, and
 * msgpackr renames that key on decode (it would come back as `__proto_` after a restart).
 */
export const CONFIG_KEY_LENGTH_MAX = 255;
export const CONFIG_KEY_PATTERN = '^(?!__proto__$)[A-Za-z0-9_.:-]+$';

/**
 * Every shard compiles the whole configuration into memory and the OpenAPI document
 * lists every key, so the catalogue is bounded. A thousand entitlements or products is
 * far beyond any real price list, yet keeps a push's validation, compilation and the
 * generated OpenAPI document small and fast.
 */
export const CONFIG_ENTITLEMENTS_MAX = 1000;
export const CONFIG_PRODUCTS_MAX = 1000;
/** A display name is a label, not a document. */
export const CONFIG_NAME_LENGTH_MAX = 255;
/** Forwarding entries each name one receiver of one application; dozens is already odd. */
export const CONFIG_FORWARDING_MAX = 100;
/** A receiver path or integration name longer than this is a mistake, not a URL. */
export const CONFIG_PATH_LENGTH_MAX = 2048;
export const CONFIG_INTEGRATION_LENGTH_MAX = 100;
/** The comma-separated form of `events`; the list of all kinds is far shorter. */
export const CONFIG_EVENTS_TEXT_LENGTH_MAX = 2000;

/**
 * Usage quantities (`included`, `grants`) share the bound of a single usage amount
 * (1e12 units): far above any real allowance, and 1e12 × 10^6 micro-units stays well
 * inside exact integer arithmetic.
 */
export const CONFIG_QUANTITY_MAX = AMOUNT_UNITS_MAX;
export const CONFIG_QUANTITY_DECIMALS_MAX = DECIMALS_MAX;
/**
 * Money in minor units. Processors reject far smaller amounts (Stripe: 8 digits for
 * most currencies); the bound only keeps the value an exact integer in a double.
 */
export const CONFIG_MONEY_MINOR_MAX = 1e12;

/** The outbound event kinds a forwarding entry may subscribe to (docs/webhooks.md). */
export const WEBHOOK_EVENT_TYPES = EVENT_KINDS;

const keyDescription =
  `1–${CONFIG_KEY_LENGTH_MAX} characters of A–Z, a–z, 0–9 and _ . : - ` +
  `(keys appear in URL paths).`;

const quantityDescription =
  `A usage quantity: a finite number from 0 to ${CONFIG_QUANTITY_MAX} with at most ` +
  `${CONFIG_QUANTITY_DECIMALS_MAX} decimal places (checked beyond the schema, since ` +
  'binary floating point cannot test decimal places exactly).';

const definitions = {
  key: {
    description: `An entitlement or product key: ${keyDescription}`,
    type: 'string',
    minLength: 1,
    maxLength: CONFIG_KEY_LENGTH_MAX,
    pattern: CONFIG_KEY_PATTERN,
  },
  name: {
    description: 'A human-readable display name.',
    type: 'string',
    minLength: 1,
    maxLength: CONFIG_NAME_LENGTH_MAX,
  },
  moneyMinor: {
    description:
      "An amount of money in integer minor units of the product's currency (e.g. cents: " +
      '2000 is $20.00).',
    type: 'integer',
    minimum: 0,
    maximum: CONFIG_MONEY_MINOR_MAX,
  },
  unitPrice: {
    type: 'object',
    additionalProperties: false,
    required: ['unitAmount'],
    properties: {
      unitAmount: {
        $ref: '#/$defs/moneyMinor',
        description:
          "Price of one additional unit, in integer minor units of the product's currency.",
      },
    },
  },
  entitlement: {
    description: 'An entitlement definition: a boolean feature, a numeric limit or a usage meter.',
    type: 'object',
    additionalProperties: false,
    required: ['type'],
    properties: {
      type: {
        description:
          '`feature`: on or off. `limit`: a numeric allowance (e.g. seats), optionally ' +
          'expandable. ' +
          '`meter`: consumable usage with a balance that resets every period.',
        enum: ['feature', 'limit', 'meter'],
      },
      name: { $ref: '#/$defs/name', description: 'Display name of the entitlement.' },
      reset: {
        description:
          'Meters only (an error on a feature or limit): when included usage renews. ' +
          'Calendar periods ' +
          'in UTC (day 00:00, week Monday 00:00, month the 1st, year 1 January); a meter ' +
          'whose reset ' +
          "equals the interval of the customer's paid subscription follows its billing " +
          'period instead. ' +
          'Default `month`; `never` never renews.',
        enum: ['day', 'week', 'month', 'year', 'never'],
      },
    },
  },
  productEntitlement: {
    description:
      'What the product grants of one entitlement. A feature takes `true`, `false` or ' +
      '`{"included": n}` ' +
      '(granted when n > 0). A limit or a meter takes an object (a boolean is an error): ' +
      '`included` is ' +
      'the allowance (whole for a limit), `expansion` lets a limit be raised by purchase, ' +
      '`overage` lets ' +
      'a meter be used beyond its balance.',
    type: ['boolean', 'object'],
    additionalProperties: false,
    properties: {
      included: {
        description:
          `Included allowance (default 0). ${quantityDescription} A limit's must be ` +
          `a whole number.`,
        type: 'number',
        minimum: 0,
        maximum: CONFIG_QUANTITY_MAX,
      },
      expansion: {
        $ref: '#/$defs/unitPrice',
        description:
          'Limits only: present means the limit may be raised by purchase at `unitAmount` ' +
          'per unit.',
      },
      overage: {
        $ref: '#/$defs/unitPrice',
        description:
          'Meters only: present means usage beyond the balance is allowed, billed at ' +
          '`unitAmount` per unit.',
      },
    },
  },
  price: {
    description:
      "The product's price. With `interval` the product is a recurring plan; without, a " +
      'one-time purchase.',
    type: 'object',
    additionalProperties: false,
    required: ['amount', 'currency'],
    properties: {
      amount: {
        $ref: '#/$defs/moneyMinor',
        description: 'Price per interval (or once), in integer minor units.',
      },
      currency: {
        description: 'Three-letter ISO 4217 currency code in lower case, e.g. `usd`.',
        type: 'string',
        pattern: '^[a-z]{3}$',
      },
      interval: {
        description: 'Billing interval of a recurring plan. Omit for a one-time purchase.',
        enum: ['month', 'year'],
      },
    },
  },
  product: {
    description:
      'A product: a recurring plan (price with interval), a one-time purchase (price ' +
      'without), or free.',
    type: 'object',
    additionalProperties: false,
    properties: {
      name: { $ref: '#/$defs/name', description: 'Display name of the product.' },
      default: {
        description:
          'Applies to every customer without an active subscription. At most one product may be ' +
          'default, and it must be free (no price).',
        type: 'boolean',
      },
      price: { $ref: '#/$defs/price', description: 'Omit for a free product.' },
      entitlements: {
        description:
          'Entitlement key → what this product grants of it. Every key must be defined in ' +
          'the top-level ' +
          '`entitlements`. A one-time product grants features and limits here (until ' +
          'refunded) and meter ' +
          'credits through `grants`.',
        type: 'object',
        maxProperties: CONFIG_ENTITLEMENTS_MAX,
        propertyNames: { $ref: '#/$defs/key' },
        additionalProperties: { $ref: '#/$defs/productEntitlement' },
      },
      grants: {
        description:
          'One-time products only (price without interval): meter key → credits added as ' +
          'a purchased-credit ' +
          `lot on purchase. Every key must name a meter. Amounts are > 0; ${quantityDescription}`,
        type: 'object',
        maxProperties: CONFIG_ENTITLEMENTS_MAX,
        propertyNames: { $ref: '#/$defs/key' },
        additionalProperties: {
          description: 'Credits granted for the meter.',
          type: 'number',
          exclusiveMinimum: 0,
          maximum: CONFIG_QUANTITY_MAX,
        },
      },
    },
  },
  forwarding: {
    description: 'A webhook receiver on the application that events are forwarded to.',
    type: 'object',
    additionalProperties: false,
    required: ['key', 'path', 'events'],
    properties: {
      key: {
        description:
          `The receiver's registration key, unique among forwarding ` +
          `entries: ${keyDescription}`,
        type: 'string',
        minLength: 1,
        maxLength: CONFIG_KEY_LENGTH_MAX,
        pattern: CONFIG_KEY_PATTERN,
      },
      path: {
        description: "The receiver's path on the application's base URL, e.g. `/api/auth/tally`.",
        type: 'string',
        maxLength: CONFIG_PATH_LENGTH_MAX,
        pattern: '^/\\S*$',
      },
      events: {
        description:
          'Event kinds to deliver: `"*"` for all, a comma-separated string or an array of kinds. ' +
          `Kinds: ${WEBHOOK_EVENT_TYPES.join(', ')}. \`*\` must stand alone.`,
        type: ['string', 'array'],
        minLength: 1,
        maxLength: CONFIG_EVENTS_TEXT_LENGTH_MAX,
        minItems: 1,
        maxItems: WEBHOOK_EVENT_TYPES.length + 1,
        uniqueItems: true,
        items: {
          description: 'An event kind, or `*` for all.',
          enum: ['*', ...WEBHOOK_EVENT_TYPES],
        },
      },
      integration: {
        description: 'The integration that owns the receiver, e.g. `better-auth`.',
        type: 'string',
        minLength: 1,
        maxLength: CONFIG_INTEGRATION_LENGTH_MAX,
      },
      autoRegister: {
        description:
          'Register the receiver lazily when the integration first sees a delivery or its ' +
          'status call.',
        type: 'boolean',
      },
    },
  },
} as const;

export const billingConfigSchema = {
  $schema: 'https://json-schema.org/draft/2020-12/schema',
  $id: BILLING_SCHEMA_ID,
  title: 'Tally billing configuration',
  description:
    'Entitlements, products and webhook forwarding of one environment, pushed with ' +
    '`POST /v1/sync/push`. Unknown properties are rejected. Beyond this schema the ' +
    'service checks ' +
    'that products name defined entitlements of the right type and that at most one free ' +
    'product is default.',
  type: 'object',
  additionalProperties: false,
  required: ['entitlements', 'products'],
  properties: {
    $schema: {
      description: 'Optional: the URL of this schema, for editors. Ignored by the service.',
      type: 'string',
      maxLength: CONFIG_PATH_LENGTH_MAX,
    },
    entitlements: {
      description:
        `Entitlement key → definition. At most ${CONFIG_ENTITLEMENTS_MAX}. ` +
        `Keys: ${keyDescription}`,
      type: 'object',
      maxProperties: CONFIG_ENTITLEMENTS_MAX,
      propertyNames: { $ref: '#/$defs/key' },
      additionalProperties: { $ref: '#/$defs/entitlement' },
    },
    products: {
      description:
        `Product key → definition. At most ${CONFIG_PRODUCTS_MAX}. ` + `Keys: ${keyDescription}`,
      type: 'object',
      maxProperties: CONFIG_PRODUCTS_MAX,
      propertyNames: { $ref: '#/$defs/key' },
      additionalProperties: { $ref: '#/$defs/product' },
    },
    webhooks: {
      description: 'Delivery of events to the application.',
      type: 'object',
      additionalProperties: false,
      properties: {
        devTunnel: {
          description:
            'Enable the development relay (`tally listen --forward-to`), which forwards ' +
            'test-environment ' +
            'events to a local receiver. Never used in the live environment.',
          type: 'boolean',
        },
        forwarding: {
          description: `Receivers on the application. At most ${CONFIG_FORWARDING_MAX}.`,
          type: 'array',
          maxItems: CONFIG_FORWARDING_MAX,
          items: { $ref: '#/$defs/forwarding' },
        },
      },
    },
  },
  $defs: definitions,
} as const;
