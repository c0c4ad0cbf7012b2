/**
 * Validation of a pushed billing configuration, at the edge, before anything crosses a
 * thread.
 *
 * Two passes, both always run so that one 400 lists every violation: the compiled JSON
 * Schema (billing-schema.ts) checks shape, ranges and bounds; the semantic pass checks
 * what a schema cannot say — cross-references between products and entitlements, the
 * type-specific shape of a product's grant, decimal places, the default product. The
 * semantic pass reads the document as `unknown` and skips whatever the schema already
 * rejected, so a malformed document yields schema messages, not a crash or duplicates.
 *
 * Contract: a document accepted here is one `compileConfig` (actors/billing-config.ts)
 * compiles without throwing, with every product key resolving to a defined entitlement
 * of the right type. test/config-validate.test.ts checks that as a property.
 */
import assert from 'node:assert/strict';
import { Ajv2020, type ErrorObject } from 'ajv/dist/2020.js';
import type { BillingConfig, EntitlementType } from '../../actors/billing-config.js';
import { quantityToMicros } from '../../actors/fixed.js';
import {
  billingConfigSchema,
  CLIENT_ORIGIN_PATTERN,
  CONFIG_KEY_LENGTH_MAX,
  CONFIG_KEY_PATTERN,
  CONFIG_QUANTITY_DECIMALS_MAX,
  CONFIG_QUANTITY_MAX,
  WEBHOOK_EVENT_TYPES,
} from './billing-schema.js';

export type ConfigValidation =
  | { readonly ok: true; readonly config: BillingConfig }
  | { readonly ok: false; readonly errors: string[] };

/**
 * User-supplied text quoted in a message (an invalid key, an unknown property) is cut to this
 * length.
 */
const QUOTED_LENGTH_MAX = 64;
const ROOT_NAME = 'configuration';

// strictNumbers rejects NaN and ±Infinity (possible from a JS caller, not from JSON);
// union types are used on purpose (`true | {included}`, `"*" | ["..."]`) and read more
// plainly than oneOf, whose failures produce one error per branch.
const ajv = new Ajv2020({
  allErrors: true,
  strict: true,
  strictNumbers: true,
  allowUnionTypes: true,
});
const validateShape = ajv.compile(billingConfigSchema);

/**
 * Checks a pushed document against the schema and the semantic rules. Rejection is a
 * value, never an exception: any value JSON.parse can produce (and, as tested, any
 * acyclic JS value) yields a result. On failure `errors` holds every violation found,
 * one line each naming the dotted path, schema violations first, without duplicates.
 * On success `config` is the same object, typed.
 */
export function validateBillingConfig(doc: unknown): ConfigValidation {
  const shapeOk = validateShape(doc);
  const shapeErrors = shapeOk ? [] : schemaViolations(doc, validateShape.errors ?? []);
  const errors = [...new Set([...shapeErrors, ...semanticViolations(doc)])];
  if (errors.length > 0) return { ok: false, errors };
  return { ok: true, config: doc as BillingConfig };
}

/**
 * The single 400 message for a rejected push: every violation, none left out (a push is
 * fixed in one round trip only if all are listed).
 * Each line quotes at most QUOTED_LENGTH_MAX characters of user text, so the message stays
 * within a small multiple of the 1 MiB body that produced it. `errors` must be non-empty.
 */
export function formatViolations(errors: readonly string[]): string {
  assert.ok(errors.length > 0, 'formatViolations needs at least one violation');
  return `invalid billing configuration: ${errors.join('; ')}`;
}

// ---------------------------------------------------------------------------------
// Paths and quoting

type PathSegment = string | number;

/** `products.pro.entitlements.seats`, `webhooks.forwarding[0].events`, `products["a.b"]`. */
function joinPath(segments: readonly PathSegment[]): string {
  if (segments.length === 0) return ROOT_NAME;
  let text = '';
  for (const segment of segments) {
    if (typeof segment === 'number') text += `[${segment}]`;
    else if (/^[A-Za-z0-9_:-]+$/.test(segment)) text += text === '' ? segment : `.${segment}`;
    else text += `[${quote(segment)}]`;
  }
  return text;
}

function quote(text: string): string {
  const cut = text.length > QUOTED_LENGTH_MAX ? `${text.slice(0, QUOTED_LENGTH_MAX)}…` : text;
  return JSON.stringify(cut);
}

/** Turns ajv's JSON pointer into segments, using the document to tell array indices from keys. */
function pointerSegments(doc: unknown, pointer: string): PathSegment[] {
  if (pointer === '') return [];
  const segments: PathSegment[] = [];
  let node: unknown = doc;
  for (const raw of pointer.slice(1).split('/')) {
    const segment = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (Array.isArray(node)) {
      segments.push(Number(segment));
      node = node[Number(segment)];
    } else {
      segments.push(segment);
      const record = asRecord(node);
      node = record !== null && Object.hasOwn(record, segment) ? record[segment] : undefined;
    }
  }
  return segments;
}

// ---------------------------------------------------------------------------------
// Schema errors → messages

const PATTERN_PHRASES: ReadonlyMap<string, string> = new Map([
  [CONFIG_KEY_PATTERN, 'must contain only A-Z, a-z, 0-9 and _ . : - (and must not be __proto__)'],
  ['^[a-z]{3}$', 'must be a three-letter lowercase ISO 4217 currency code, e.g. usd'],
  ['^/\\S*$', 'must start with / and contain no whitespace'],
  [
    CLIENT_ORIGIN_PATTERN,
    'must be "*" or an origin: scheme://host with an optional :port, lower case, no path ' +
      '(e.g. https://app.example.com)',
  ],
]);

const KEY_RULE =
  `keys are 1-${CONFIG_KEY_LENGTH_MAX} characters of A-Z, a-z, 0-9 and _ . : - ` +
  `(not __proto__)`;

function schemaViolations(doc: unknown, errors: readonly ErrorObject[]): string[] {
  const messages: string[] = [];
  for (const error of errors) {
    // A key's own failures (pattern, length) are reported once, by `propertyNames`.
    if (error.propertyName !== undefined && error.keyword !== 'propertyNames') continue;
    messages.push(describeSchemaError(pointerSegments(doc, error.instancePath), error));
  }
  return messages;
}

function describeSchemaError(segments: readonly PathSegment[], error: ErrorObject): string {
  const path = joinPath(segments);
  const params = error.params as Record<string, unknown>;
  switch (error.keyword) {
    case 'required':
      return `${joinPath([...segments, String(params.missingProperty)])} is required`;
    case 'additionalProperties':
      return `${path} has unknown property ${quote(String(params.additionalProperty))}`;
    case 'propertyNames':
      return `${path} has invalid key ${quote(String(params.propertyName))}: ${KEY_RULE}`;
    case 'type':
      return `${path} must be ${typePhrase(params.type)}`;
    case 'enum':
      return `${path} must be one of ${(params.allowedValues as unknown[]).map(String).join(', ')}`;
    case 'minimum':
    case 'maximum':
    case 'exclusiveMinimum':
    case 'exclusiveMaximum':
      return `${path} must be ${String(params.comparison)} ${String(params.limit)}`;
    case 'minLength':
      return params.limit === 1
        ? `${path} must not be empty`
        : `${path} must be at least ${String(params.limit)} characters`;
    case 'maxLength':
      return `${path} must be at most ${String(params.limit)} characters`;
    case 'pattern':
      return (
        `${path} ` +
        `${PATTERN_PHRASES.get(String(params.pattern)) ?? `must match ${String(params.pattern)}`}`
      );
    case 'maxProperties':
      return `${path} has more than ${String(params.limit)} entries`;
    case 'minItems':
      return `${path} must have at least ${String(params.limit)} item(s)`;
    case 'maxItems':
      return `${path} must have at most ${String(params.limit)} items`;
    case 'uniqueItems':
      return `${path} has duplicate items (${String(params.j)} and ${String(params.i)})`;
    default:
      return `${path} ${error.message ?? 'is invalid'}`;
  }
}

function typePhrase(type: unknown): string {
  const names = Array.isArray(type) ? type.map(String) : [String(type)];
  const withArticle = names.map((name) => (/^[aeiou]/.test(name) ? `an ${name}` : `a ${name}`));
  return withArticle.join(' or ');
}

// ---------------------------------------------------------------------------------
// Semantic pass

type Json = Record<string, unknown>;
/** Entitlement key → its type, or null when the definition exists but its type is invalid. */
type EntitlementTypes = ReadonlyMap<string, EntitlementType | null>;

function asRecord(value: unknown): Json | null {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
    ? (value as Json)
    : null;
}

function semanticViolations(doc: unknown): string[] {
  const root = asRecord(doc);
  if (root === null) return [];
  const errors: string[] = [];
  const types = entitlementTypes(asRecord(root.entitlements), errors);
  const products = asRecord(root.products);
  if (products !== null) {
    for (const [key, product] of Object.entries(products)) {
      const record = asRecord(product);
      if (record !== null) checkProduct(key, record, types, errors);
    }
    checkSingleDefault(products, errors);
  }
  const webhooks = asRecord(root.webhooks);
  if (webhooks !== null && Array.isArray(webhooks.forwarding))
    checkForwarding(webhooks.forwarding, errors);
  const client = asRecord(root.client);
  if (client !== null && Array.isArray(client.allowedOrigins))
    checkOrigins(client.allowedOrigins, errors);
  return errors;
}

/** `*` allows every origin, so naming others beside it is a mistake about what it means. */
function checkOrigins(origins: readonly unknown[], errors: string[]): void {
  if (origins.includes('*') && origins.length > 1)
    errors.push('client.allowedOrigins: "*" must stand alone (it already allows every origin)');
}

/**
 * Collects entitlement types (as a Map, so `toString` is never mistaken for a key) and checks
 * `reset`.
 */
function entitlementTypes(entitlements: Json | null, errors: string[]): EntitlementTypes {
  const types = new Map<string, EntitlementType | null>();
  for (const [key, definition] of Object.entries(entitlements ?? {})) {
    const record = asRecord(definition);
    const type = record?.type;
    const valid = type === 'feature' || type === 'limit' || type === 'meter';
    types.set(key, valid ? type : null);
    if (valid && type !== 'meter' && record?.reset !== undefined) {
      errors.push(
        `${joinPath(['entitlements', key, 'reset'])} is only allowed on a ` +
          `meter; ${quote(key)} is a ${type}`,
      );
    }
  }
  return types;
}

/** A price without an interval: a one-time purchase rather than a recurring plan. */
function isOneTime(product: Json): boolean {
  const price = asRecord(product.price);
  return price !== null && price.interval === undefined;
}

function checkProduct(key: string, product: Json, types: EntitlementTypes, errors: string[]): void {
  const oneTime = isOneTime(product);
  for (const [entKey, value] of Object.entries(asRecord(product.entitlements) ?? {})) {
    const path = ['products', key, 'entitlements', entKey];
    const type = types.get(entKey);
    if (type === undefined) errors.push(`${joinPath(path)} is not a defined entitlement`);
    else if (type !== null) checkGrantValue(path, entKey, type, value, oneTime, errors);
  }
  const grants = asRecord(product.grants);
  if (grants !== null && !oneTime) {
    errors.push(
      `${joinPath(['products', key, 'grants'])} is only allowed on a one-time product ` +
        `(price without interval)`,
    );
  }
  for (const [meterKey, amount] of Object.entries(grants ?? {})) {
    const path = ['products', key, 'grants', meterKey];
    const type = types.get(meterKey);
    if (type === undefined) errors.push(`${joinPath(path)} is not a defined entitlement`);
    else if (type !== null && type !== 'meter') {
      errors.push(`${joinPath(path)} must name a meter; ${quote(meterKey)} is a ${type}`);
    }
    checkQuantity(path, amount, false, errors);
  }
  if (product.default === true && asRecord(product.price) !== null) {
    const what = oneTime ? 'is a one-time product (price without interval)' : 'has a price';
    errors.push(
      `${joinPath(['products', key])} is default but ${what}; the default product must be ` +
        `free (no price)`,
    );
  }
}

/** What a product grants of one entitlement must fit the entitlement's type. */
function checkGrantValue(
  path: readonly PathSegment[],
  entKey: string,
  type: EntitlementType,
  value: unknown,
  oneTime: boolean,
  errors: string[],
): void {
  const name = quote(entKey);
  if (typeof value === 'boolean') {
    if (type !== 'feature') {
      errors.push(
        `${joinPath(path)} must be an object such as {"included": 1}, not a ` +
          `boolean; ${name} is a ${type}`,
      );
    }
    return;
  }
  const grant = asRecord(value);
  if (grant === null) return;
  if (type === 'meter' && oneTime) {
    errors.push(
      `${joinPath(path)}: a one-time product adds meter credits through grants, not entitlements`,
    );
  }
  if (grant.expansion !== undefined && type !== 'limit') {
    errors.push(
      `${joinPath([...path, 'expansion'])} is only allowed on a limit; ${name} is a ${type}`,
    );
  }
  if (grant.overage !== undefined && type !== 'meter') {
    errors.push(
      `${joinPath([...path, 'overage'])} is only allowed on a meter; ${name} is a ${type}`,
    );
  }
  checkQuantity([...path, 'included'], grant.included, type === 'limit', errors);
}

/**
 * Decimal places are counted on the shortest decimal string of the double — the digits
 * the client wrote — by the same conversion the core uses, so what passes here converts
 * exactly there. Values the schema rejected (out of range, not numbers) are skipped.
 */
function checkQuantity(
  path: readonly PathSegment[],
  value: unknown,
  whole: boolean,
  errors: string[],
): void {
  if (typeof value !== 'number' || !(value >= 0 && value <= CONFIG_QUANTITY_MAX)) return;
  if (whole && !Number.isInteger(value)) {
    errors.push(`${joinPath(path)} must be a whole number for a limit`);
  } else if (quantityToMicros(value) === null) {
    errors.push(
      `${joinPath(path)} must have at most ${CONFIG_QUANTITY_DECIMALS_MAX} decimal places`,
    );
  }
}

function checkSingleDefault(products: Json, errors: string[]): void {
  const defaults = Object.entries(products)
    .filter(([, product]) => asRecord(product)?.default === true)
    .map(([key]) => key);
  if (defaults.length > 1) {
    const listed = defaults.map(quote).join(', ');
    errors.push(
      `products has ${defaults.length} default products (${listed}); at most one may be default`,
    );
  }
}

const EVENT_TYPES: ReadonlySet<string> = new Set(WEBHOOK_EVENT_TYPES);

/** Forwarding keys are unique; `events` names known kinds, and `*` stands alone. */
function checkForwarding(entries: readonly unknown[], errors: string[]): void {
  const firstIndexByKey = new Map<string, number>();
  entries.forEach((entry, index) => {
    const record = asRecord(entry);
    if (record === null) return;
    if (typeof record.key === 'string') {
      const first = firstIndexByKey.get(record.key);
      if (first === undefined) firstIndexByKey.set(record.key, index);
      else
        errors.push(
          `${joinPath(['webhooks', 'forwarding', index, 'key'])} duplicates ` +
            `webhooks.forwarding[${first}].key`,
        );
    }
    checkEvents(['webhooks', 'forwarding', index, 'events'], record.events, errors);
  });
}

function checkEvents(path: readonly PathSegment[], events: unknown, errors: string[]): void {
  if (events === '') return; // reported by the schema
  const fromText = typeof events === 'string';
  const kinds = fromText ? events.split(',').map((kind) => kind.trim()) : events;
  if (!Array.isArray(kinds) || kinds.length === 0) return;
  if (kinds.includes('*') && kinds.length > 1)
    errors.push(`${joinPath(path)}: "*" must stand alone`);
  if (!fromText) return; // the schema's enum already checked each item of an array
  for (const kind of kinds as string[]) {
    if (kind === '') errors.push(`${joinPath(path)} has an empty entry`);
    else if (kind !== '*' && !EVENT_TYPES.has(kind))
      errors.push(`${joinPath(path)} names unknown event kind ${quote(kind)}`);
  }
}
