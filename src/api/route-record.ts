/**
 * The route record: one declarative entry per route (method, path, key class, path
 * parameter, query and body schemas, exact-number handling, audited or not, its OpenAPI
 * description, and the handler). The routers, the validation step before every handler
 * and the OpenAPI document are all derived from these records, so they cannot disagree.
 *
 * `compileRoute` compiles a record's schemas once, when its router is built; `runRoute`
 * then runs, per request, the checks that follow the front end's own (key, rate limit,
 * route, key class, readiness, query string, content type, length, body bytes, nesting,
 * JSON) in the order docs/api.md ("Errors") gives: path parameter, query schema, body
 * schema, then exact numbers. The handler receives typed, valid input and only applies
 * the route's domain rules. Per request this costs the checks themselves and one input
 * object, as a hand-written handler would.
 */
import type { ValidateFunction } from 'ajv';
import {
  mayRoundInJson,
  parseAmount,
  AMOUNT_UNITS_MAX,
  type AmountParse,
  type Micros,
} from '../../actors/fixed.js';
import type { AuditTag, Environment } from '../../actors/protocol.js';
import type { KeyRecord } from '../../storage/control-store.js';
import type { ErrorCode } from '../errors.js';
import type { Exchange } from '../http/exchange.js';
import { memberSource, roundedNumberPath } from '../http/json-source.js';
import { Router } from '../http/router.js';
import { newAuditTag } from './audit-tag.js';
import { compileSchema, describeFailure } from './validation.js';

export type JsonSchema = Readonly<Record<string, unknown>>;

export type Method = 'GET' | 'POST' | 'PUT' | 'DELETE';

/**
 * Which key may call a route: none (public), a client or server key of an environment,
 * a server key only, or the operator key only.
 */
export type KeyClass = 'none' | 'client' | 'server' | 'operator';

/**
 * How the numbers of a body are taken:
 * - `as-parsed`: as JSON.parse gives them (the body holds none that is stored);
 * - `exact`: a number JSON.parse did not keep exactly is refused (400 naming it);
 * - `exact-amount`: the body's `amount` is read exactly from the text into micro-units
 *   (`amountMicros`), with the bounds the OpenAPI document publishes for it.
 */
export type NumberHandling = 'as-parsed' | 'exact' | 'exact-amount';

/**
 * Reads the route's one `:name` path segment (still percent-encoded); answers 400 itself
 * and returns null when the value is not acceptable.
 */
export type ParamReader = (raw: string, ex: Exchange) => string | null;

/** A body validator other than the record's schema compiled as is (the billing configuration's). */
export type BodyCheck = (value: unknown, ex: Exchange) => boolean;

export interface BodySpec {
  /** The JSON schema the body is validated with; also the OpenAPI request body. */
  readonly schema: JsonSchema;
  readonly numbers: NumberHandling;
  /** Validates in place of compiling `schema` (it must check `schema` itself). */
  readonly check?: BodyCheck;
}

/** The OpenAPI description of a route; operator routes have none (docs/api.md describes them). */
export interface RouteDoc {
  readonly operationId: string;
  readonly tag:
    | 'service'
    | 'entitlements'
    | 'usage'
    | 'configuration'
    | 'commerce'
    | 'customers'
    | 'contracts'
    | 'audit'
    | 'webhooks'
    | 'docs';
  readonly summary: string;
  readonly description: string;
  /** Which keys the `{key}` path segment takes: any entitlement, only limits, or only meters. */
  readonly pathKey?: 'entitlement' | 'limit' | 'meter';
  /** Answered by a shard worker, whose queue may be full (503 `overloaded`). */
  readonly sharded?: boolean;
  /** The success answer(s); `schema: null` with status 204 means no body. */
  readonly ok: {
    readonly description: string;
    readonly schema: JsonSchema | null;
    readonly statuses?: readonly (200 | 201 | 204)[];
  };
  /** Errors particular to this route; the shared ones follow from the key class and body. */
  readonly errors: readonly ErrorCode[];
}

/**
 * Who called: the key (null on public routes) and its environment (null unless an environment
 * key's).
 */
export interface Caller {
  readonly key: KeyRecord | null;
  readonly environment: Environment | null;
}
export interface EnvironmentCaller extends Caller {
  readonly key: KeyRecord;
  readonly environment: Environment;
}
export interface OperatorCaller extends Caller {
  readonly key: KeyRecord;
  readonly environment: null;
}
export interface PublicCaller extends Caller {
  readonly key: null;
  readonly environment: null;
}

/** What a handler receives: the request, already authenticated and validated. */
export interface RouteInput<B = unknown, Q = unknown, C extends Caller = EnvironmentCaller> {
  readonly ex: Exchange;
  readonly key: C['key'];
  readonly environment: C['environment'];
  /** The decoded `:name` path segment ('' on a route without one). */
  readonly param: string;
  readonly query: Q;
  readonly body: B;
  /** The body as received ('' without one). */
  readonly bodyText: string;
  /** The exact `amount` of an `exact-amount` body, in micro-units (0n otherwise). */
  readonly amountMicros: Micros;
  /** The audit tag of an audited environment route (null otherwise). */
  readonly tag: AuditTag | null;
}

export interface RouteRecord<D, B = unknown, Q = unknown, C extends Caller = EnvironmentCaller> {
  readonly method: Method;
  /** Exact segments; `:name` is a path parameter (at most one). */
  readonly path: string;
  readonly keys: KeyClass;
  /** Required when the path has a `:name` segment. */
  readonly param?: ParamReader;
  /** The query parameters' schema; a route without one refuses any query parameter. */
  readonly query?: JsonSchema;
  readonly body?: BodySpec;
  /** Its changes are written to the audit log (environment routes get an audit tag). */
  readonly audited: boolean;
  readonly doc?: RouteDoc;
  readonly handle: (input: RouteInput<B, Q, C>, deps: D) => void;
}

/** A record as a router holds it, its input types erased (the table mixes them). */
// The table mixes records of different body and query types; each is checked where it is declared.
// biome-ignore lint/suspicious/noExplicitAny: the table mixes body and query types
export type AnyRouteRecord<D, C extends Caller = EnvironmentCaller> = RouteRecord<D, any, any, C>;

/** A record ready to serve: its schemas compiled once, and the deps its handler gets. */
export interface CompiledRoute<D, C extends Caller = EnvironmentCaller> {
  readonly record: AnyRouteRecord<D, C>;
  readonly deps: D;
  readonly hasBody: boolean;
  readonly takesQuery: boolean;
  /** Compiled from the record's query schema (`validateQuery.schema` is that very object). */
  readonly validateQuery: ValidateFunction | null;
  /** Compiled from the record's body schema, unless the record brings its own check. */
  readonly validateBody: ValidateFunction | null;
  readonly checkBody: BodyCheck | null;
  readonly numbers: NumberHandling;
  readonly tagged: boolean;
}

const AMOUNT_MESSAGES: Record<Exclude<AmountParse, { ok: true }>['reason'], string> = {
  not_number: 'amount must be a number',
  not_positive: 'amount must be greater than 0',
  too_many_decimals: 'amount must have at most 6 decimal places',
  too_large: `amount must be at most ${AMOUNT_UNITS_MAX}`,
};

/** Compiles a record's schemas; throws (at startup) on a record that contradicts itself. */
export function compileRoute<D, C extends Caller>(
  record: AnyRouteRecord<D, C>,
  deps: D,
): CompiledRoute<D, C> {
  const hasParam = record.path.includes('/:');
  if (hasParam !== (record.param !== undefined))
    throw new Error(
      `${record.method} ${record.path}: a path parameter needs a param reader, and only then`,
    );
  const body = record.body;
  const validateBody =
    body === undefined || body.check !== undefined ? null : compileSchema(body.schema);
  let checkBody: BodyCheck | null = body?.check ?? null;
  if (validateBody !== null)
    checkBody = (value, ex) =>
      validateBody(value) || failed(ex, 'invalid_request', validateBody, 'body');
  return {
    record,
    deps,
    hasBody: body !== undefined,
    takesQuery: record.query !== undefined,
    validateQuery: record.query === undefined ? null : compileSchema(record.query),
    validateBody,
    checkBody,
    numbers: body?.numbers ?? 'as-parsed',
    tagged: record.audited && record.keys !== 'operator',
  };
}

/** A router over compiled records, in table order (their metrics series). */
export function routerOf<D, C extends Caller>(
  records: ReadonlyArray<AnyRouteRecord<D, C>>,
  deps: D,
): Router<CompiledRoute<D, C>> {
  const router = new Router<CompiledRoute<D, C>>();
  for (const record of records) router.add(record.method, record.path, compileRoute(record, deps));
  return router;
}

function failed(
  ex: Exchange,
  code: ErrorCode,
  validate: ValidateFunction,
  what: 'body' | 'query',
): false {
  ex.fail(code, { detail: describeFailure(validate, what) });
  return false;
}

/**
 * Runs the route's own checks and then its handler: path parameter, query schema, body
 * schema, exact numbers. Each failure is answered here (400 naming the field).
 */
export function runRoute<D, C extends Caller>(
  route: CompiledRoute<D, C>,
  ex: Exchange,
  key: C['key'],
  environment: C['environment'],
  params: readonly string[],
  query: Readonly<Record<string, string>>,
  body: unknown,
  bodyText: string,
): void {
  const { record } = route;
  let param = '';
  if (record.param !== undefined) {
    const value = record.param(params[0] ?? '', ex);
    if (value === null) return;
    param = value;
  }
  if (route.validateQuery !== null && !route.validateQuery(query))
    return void failed(ex, 'invalid_query', route.validateQuery, 'query');
  if (route.checkBody !== null && !route.checkBody(body, ex)) return;
  let amountMicros: Micros = 0n;
  if (route.numbers === 'exact') {
    if (!keepsEveryNumber(ex, bodyText)) return;
  } else if (route.numbers === 'exact-amount') {
    // A literal JSON.parse may have rounded is read exactly from the text (actors/fixed.ts).
    const literal = mayRoundInJson(bodyText) ? memberSource(bodyText, 'amount') : undefined;
    const amount = parseAmount((body as { amount: unknown }).amount, literal);
    if (!amount.ok) return ex.fail('invalid_request', { detail: AMOUNT_MESSAGES[amount.reason] });
    amountMicros = amount.micros;
  }
  const tag = route.tagged && key !== null ? newAuditTag(key.id) : null;
  record.handle(
    { ex, key, environment, param, query, body, bodyText, amountMicros, tag },
    route.deps,
  );
}

/**
 * Refuses (400 naming the field) a body holding a number JSON.parse did not keep exactly,
 * such as `99999999999.999999` or a 20-digit id in metadata: stored as parsed, it would
 * silently become another value. Usage amounts are read exactly from the text instead
 * (`exact-amount`). Returns false when it answered.
 */
function keepsEveryNumber(ex: Exchange, bodyText: string): boolean {
  const path = mayRoundInJson(bodyText) ? roundedNumberPath(bodyText) : null;
  if (path === null) return true;
  ex.fail('invalid_request', {
    detail: `${path} cannot be stored exactly: a JSON number keeps at most 15 significant digits`,
  });
  return false;
}
