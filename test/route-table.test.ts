/**
 * The route tables drive the routers, the validation before each handler and the OpenAPI
 * document: every documented route appears in the document with its method and key
 * class, the document's request schemas and query parameters are the very schemas the
 * server compiled its validators from, the handler only runs on valid input, and a
 * promise of a route that rejects answers 500 and logs its cause with the request id.
 */
import type { HttpResponse } from 'uWebSockets.js';
import { describe, expect, it } from 'vitest';
import { AMOUNT_UNITS_MAX, parseAmount } from '../actors/fixed.js';
import { buildAdminRouter, type AdminDeps } from '../src/api/admin-routes.js';
import { buildOpenApi, publishedBody } from '../src/api/openapi.js';
import { buildPublicRouter, PUBLIC_ROUTES } from '../src/api/public-routes.js';
import {
  compileRoute,
  runRoute,
  type AnyRouteRecord,
  type Caller,
  type RouteRecord,
} from '../src/api/route-record.js';
import { API_ROUTES, buildApiRouter, type ApiDeps } from '../src/api/routes.js';
import { snapshotRoutes } from '../src/api/snapshot-routes.js';
import { billingConfigSchema } from '../src/config/billing-schema.js';
import { Exchange } from '../src/http/exchange.js';
import { createLogger } from '../src/observability/log.js';
import { Observability } from '../src/observability/observability.js';
import type { Snapshots } from '../src/snapshots.js';
import type { KeyRecord } from '../storage/control-store.js';
import { PRODUCT_EXAMPLE_CONFIG } from './support/product-example.js';

type Doc = Record<string, any>;

const doc = buildOpenApi(PRODUCT_EXAMPLE_CONFIG, {
  environment: 'test',
  version: 1,
  pushedAtMs: 0,
}) as Doc;
const DOCUMENTED: ReadonlyArray<AnyRouteRecord<unknown, Caller>> = [
  ...PUBLIC_ROUTES,
  ...API_ROUTES,
] as ReadonlyArray<AnyRouteRecord<unknown, Caller>>;
const openApiPath = (path: string): string => path.replace(/:(\w+)/g, '{$1}');
const operationOf = (record: { method: string; path: string }): Doc | undefined =>
  doc.paths[openApiPath(record.path)]?.[record.method.toLowerCase()];

/** Every route the server registers, from the routers themselves (no handler runs). */
function registeredRoutes(): string[] {
  const routers = [
    buildPublicRouter({ isReady: () => true, storageFull: () => false }),
    buildApiRouter({} as ApiDeps),
    buildAdminRouter({} as AdminDeps, snapshotRoutes({} as AdminDeps, {} as Snapshots)),
  ];
  return routers.flatMap((router) =>
    router.list().map(({ method, pattern }) => `${method} ${pattern}`),
  );
}

/** A recording stand-in for uWS's response: status, headers and body written. */
function recorder() {
  const written: string[] = [];
  const res = {
    onAborted: () => res,
    onData: () => res,
    cork(fn: () => void) {
      fn();
      return res;
    },
    writeStatus(status: string) {
      written.push(`status ${status}`);
      return res;
    },
    writeHeader: () => res,
    end(body: string) {
      written.push(`body ${body}`);
      return res;
    },
  };
  return { res: res as unknown as HttpResponse, written };
}

function observer() {
  const lines: Array<Record<string, unknown>> = [];
  const obs = new Observability(
    createLogger('info', {
      write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>),
    }),
  );
  return { obs, lines };
}

const SERVER_KEY: KeyRecord = {
  id: 'key_test',
  prefix: 'sk_test_x',
  hashHex: '',
  environment: 'test',
  keyClass: 'server',
  createdAtMs: 0,
  revokedAtMs: null,
};

describe('the route tables', () => {
  it(
    'every documented route appears in the OpenAPI document with its method and key class, ' +
      'and nothing else does',
    () => {
      for (const record of DOCUMENTED) {
        const op = operationOf(record);
        expect(op, `${record.method} ${record.path}`).toBeDefined();
        expect(op?.operationId).toBe(record.doc?.operationId);
        expect(op?.summary).toBe(record.doc?.summary);
        expect(op?.security.length === 0).toBe(record.keys === 'none');
        expect(((op?.security ?? []) as object[]).some((s) => 'clientKey' in s)).toBe(
          record.keys === 'client',
        );
      }
      const documented = Object.entries<Doc>(doc.paths).flatMap(([path, item]) =>
        Object.keys(item).map((method) => `${method.toUpperCase()} ${path}`),
      );
      expect(documented.sort()).toEqual(
        DOCUMENTED.map((r) => `${r.method} ${openApiPath(r.path)}`).sort(),
      );
    },
  );

  it(
    'the routers register exactly the table records; operator routes are the only ' +
      'undocumented ones',
    () => {
      const registered = registeredRoutes();
      expect(new Set(registered).size).toBe(registered.length);
      for (const record of DOCUMENTED)
        expect(registered).toContain(`${record.method} ${record.path}`);
      const operator = registered.filter(
        (route) => !DOCUMENTED.some((r) => `${r.method} ${r.path}` === route),
      );
      expect(operator.length).toBeGreaterThan(10);
      for (const route of operator) expect(route).toMatch(/^[A-Z]+ \/v1\/admin\//);
    },
  );

  it(
    "the document's request bodies and query parameters are the schemas the server compiled " +
      'its validators from',
    () => {
      for (const record of DOCUMENTED) {
        const compiled = compileRoute(record, {});
        const op = operationOf(record) as Doc;
        const published = op.requestBody?.content['application/json'].schema;
        expect(published === undefined, record.path).toBe(record.body === undefined);
        if (record.body !== undefined) {
          if (record.body.check === undefined)
            expect(compiled.validateBody?.schema).toBe(record.body.schema);
          if (record.body.schema === billingConfigSchema) {
            expect(published).toEqual({ $ref: '#/components/schemas/BillingConfig' });
          } else if (record.body.numbers === 'exact-amount') {
            // The schema validated, with the bounds its exact parse applies on `amount`.
            const {
              exclusiveMinimum,
              maximum,
              description: _,
              ...rest
            } = published.properties.amount;
            expect({ ...published, properties: { ...published.properties, amount: rest } }).toEqual(
              record.body.schema,
            );
            expect([exclusiveMinimum, maximum]).toEqual([0, AMOUNT_UNITS_MAX]);
            expect([
              parseAmount(0).ok,
              parseAmount(AMOUNT_UNITS_MAX).ok,
              parseAmount(AMOUNT_UNITS_MAX + 1).ok,
            ]).toEqual([false, true, false]);
          } else {
            expect(published).toBe(record.body.schema);
            expect(published).toBe(publishedBody(record.body));
          }
        }
        const query = (op.parameters ?? []).filter((p: Doc) => p.in === 'query');
        const schema = record.query as
          | { properties: Record<string, object>; required: string[] }
          | undefined;
        expect(compiled.validateQuery?.schema).toBe(record.query);
        expect(query.map((p: Doc) => p.name)).toEqual(Object.keys(schema?.properties ?? {}));
        for (const p of query) {
          expect(p.schema).toBe(schema?.properties[p.name]);
          expect(p.required).toBe(schema?.required.includes(p.name));
        }
      }
    },
  );

  it(
    'validates before the handler runs: path parameter, query, body, exact amount; the ' +
      'handler gets typed input',
    () => {
      const seen: unknown[] = [];
      const record: RouteRecord<null, { customerId: string; amount: number }> = {
        ...(API_ROUTES.find((r) => r.path === '/v1/usage/:key/consume') as AnyRouteRecord<never>),
        handle: (input) => void seen.push([input.param, input.body.customerId, input.amountMicros]),
      };
      const route = compileRoute(record as AnyRouteRecord<null>, null);
      const run = (param: string, bodyText: string) => {
        const { obs } = observer();
        const out = recorder();
        runRoute(
          route,
          new Exchange(out.res, 'POST', '/v1/usage/x/consume', obs),
          SERVER_KEY,
          'test',
          [param],
          {},
          JSON.parse(bodyText),
          bodyText,
        );
        return out.written;
      };
      expect(run('%ZZ', '{"customerId":"c","amount":1}')).toContain(
        'body {"error":"key has invalid percent-encoding","code":"invalid_query"}',
      );
      expect(run('calls', '{"amount":1}')).toContain(
        'body {"error":"customerId is required","code":"invalid_request"}',
      );
      expect(run('calls', '{"customerId":"c","amount":0}')).toContain(
        'body {"error":"amount must be greater than 0","code":"invalid_request"}',
      );
      expect(seen).toEqual([]);
      expect(run('api%5Fcalls', '{"customerId":"c","amount":12345678901.000001}')).toEqual([]);
      expect(seen).toEqual([['api_calls', 'c', 12345678901000001n]]);
    },
  );

  it(
    'a rejected promise in a route answers ' + '500 and logs its cause with the request id',
    async () => {
      const deps = {
        pushConfig: () => Promise.reject(new Error('disk gone')),
        auditQuota: { test: 0, live: 0 },
      } as unknown as ApiDeps;
      const found = buildApiRouter(deps).lookup('POST', '/v1/sync/push');
      if (found.kind !== 'match') throw new Error('no push route');
      const { obs, lines } = observer();
      const out = recorder();
      const ex = new Exchange(out.res, 'POST', '/v1/sync/push', obs);
      const bodyText = JSON.stringify(PRODUCT_EXAMPLE_CONFIG);
      runRoute(found.match.route, ex, SERVER_KEY, 'test', [], {}, JSON.parse(bodyText), bodyText);
      await new Promise((resolve) => setImmediate(resolve));
      expect(out.written).toContain('status 500 Internal Server Error');
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatchObject({ level: 'error', requestId: ex.requestId, status: 500 });
      expect(JSON.stringify(lines[0]?.['err'])).toContain('disk gone');
    },
  );
});
