/**
 * The OpenAPI document: valid OpenAPI 3.1 per an independent validator, valid
 * JSON Schema 2020-12 wherever it holds a schema, `{key}` enumerated per route type,
 * exactly the routes the router serves, and — against a real server — a description of
 * what the server actually answers: real responses of several routes are validated with
 * ajv against the schema and headers the document gives for their path, method and
 * status. Also: either key class may read it, it is cached per configuration version and
 * follows a new push, and each environment gets its own.
 */
import { Validator } from '@seriousme/openapi-schema-validator';
import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { BillingConfig } from '../actors/billing-config.js';
import { buildOpenApi, DOCUMENTED_OPERATIONS } from '../src/api/openapi.js';
import { buildApiRouter, type ApiDeps } from '../src/api/routes.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';
import { PRODUCT_EXAMPLE_CONFIG } from './support/product-example.js';

// ajv-formats is CommonJS; under NodeNext its default import is the module object.
const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ??
  addFormatsModule) as (ajv: Ajv2020) => void;

/** The full example configuration (test/support/product-example.ts). */
const PRODUCT_CONFIG: BillingConfig = PRODUCT_EXAMPLE_CONFIG;

type Doc = Record<string, any>;

const docOf = (config: BillingConfig | null, version = config === null ? 0 : 1): Doc =>
  buildOpenApi(config, {
    environment: 'test',
    version,
    pushedAtMs: config === null ? null : Date.UTC(2026, 0, 2),
  }) as Doc;

async function expectValidOpenApi(doc: Doc): Promise<void> {
  const validator = new Validator();
  const result = await validator.validate(doc);
  expect(result.errors, JSON.stringify(result.errors)).toBeUndefined();
  expect(result.valid).toBe(true);
  expect(validator.version).toBe('3.1');
}

/** Follows local `$ref`s (`#/...`) through the document. */
function deref(doc: Doc, node: any): any {
  let current = node;
  while (
    current !== null &&
    typeof current === 'object' &&
    typeof current.$ref === 'string' &&
    current.$ref.startsWith('#/')
  ) {
    current = (current.$ref as string)
      .slice(2)
      .split('/')
      .reduce((at: any, part: string) => at?.[part.replace(/~1/g, '/').replace(/~0/g, '~')], doc);
  }
  return current;
}

const pointerPart = (part: string): string =>
  encodeURIComponent(part.replace(/~/g, '~0').replace(/\//g, '~1'));

/**
 * Compiles schemas out of the document with a strict draft 2020-12 ajv, resolving its
 * `#/components/...` references. The OpenAPI members around the schemas are declared as
 * plain keywords so that strict mode judges the schemas only.
 */
function schemaCompiler(doc: Doc) {
  const ajv = new Ajv2020({
    strict: true,
    strictTypes: true,
    allowUnionTypes: true,
    allErrors: true,
  });
  addFormats(ajv);
  ajv.addVocabulary(['openapi', 'info', 'tags', 'paths', 'components']);
  const id = 'https://tally.test/openapi.json';
  ajv.addSchema(doc, id);
  return (pointer: readonly string[]) =>
    ajv.compile({ $ref: `${id}#/${pointer.map(pointerPart).join('/')}` });
}

/** Every place in the document that holds a schema, as a JSON pointer. */
function schemaPointers(doc: Doc): string[][] {
  const pointers: string[][] = Object.keys(doc.components.schemas).map((name) => [
    'components',
    'schemas',
    name,
  ]);
  for (const [name, parameter] of Object.entries<any>(doc.components.parameters)) {
    if (parameter.schema !== undefined) pointers.push(['components', 'parameters', name, 'schema']);
  }
  for (const name of Object.keys(doc.components.headers))
    pointers.push(['components', 'headers', name, 'schema']);
  for (const [path, item] of Object.entries<any>(doc.paths)) {
    for (const [method, op] of Object.entries<any>(item)) {
      const at = ['paths', path, method];
      (op.parameters ?? []).forEach(
        (p: any, i: number) =>
          p.schema !== undefined && pointers.push([...at, 'parameters', String(i), 'schema']),
      );
      if (op.requestBody !== undefined)
        pointers.push([...at, 'requestBody', 'content', 'application/json', 'schema']);
      for (const [status, response] of Object.entries<any>(op.responses)) {
        if (response.content !== undefined)
          pointers.push([...at, 'responses', status, 'content', 'application/json', 'schema']);
        for (const [header, value] of Object.entries<any>(response.headers ?? {})) {
          if (value.schema !== undefined)
            pointers.push([...at, 'responses', status, 'headers', header, 'schema']);
        }
      }
    }
  }
  return pointers;
}

function everyValue(node: unknown, visit: (key: string, value: unknown) => void): void {
  if (node === null || typeof node !== 'object') return;
  for (const [key, value] of Object.entries(node)) {
    visit(key, value);
    everyValue(value, visit);
  }
}

/**
 * The `{key}` parameter's enum of an operation (undefined without enum), null without the
 * parameter.
 */
function keyEnum(doc: Doc, method: string, path: string): string[] | undefined | null {
  const parameters: any[] = (doc.paths[path][method].parameters ?? []).map((p: any) =>
    deref(doc, p),
  );
  const key = parameters.find((p) => p.in === 'path' && p.name === 'key');
  return key === undefined ? null : deref(doc, key.schema).enum;
}

const HAS = '/v1/entitlements/{key}/has';
const LIMIT = '/v1/entitlements/{key}/limit';
const LIMIT_SETTINGS = '/v1/entitlements/{key}/limit/settings';
const BALANCE = '/v1/usage/{key}/balance';
const CONSUME = '/v1/usage/{key}/consume';
const REFUND = '/v1/usage/{key}/refund';
const USAGE_SETTINGS = '/v1/usage/{key}/settings';

describe('buildOpenApi', () => {
  it('the document for the full example configuration is valid OpenAPI 3.1', async () => {
    const doc = docOf(PRODUCT_CONFIG, 3);
    await expectValidOpenApi(doc);
    expect(doc.openapi).toBe('3.1.0');
    expect(doc.info).toMatchObject({ title: 'Tally', version: 'config v3' });
    expect(doc.servers).toBeUndefined();
  });

  it('every schema in it compiles as strict JSON Schema 2020-12, and no enum is empty', () => {
    for (const doc of [
      docOf(PRODUCT_CONFIG),
      docOf(null),
      docOf({ entitlements: { sso: { type: 'feature' } }, products: {} }),
    ]) {
      const compile = schemaCompiler(doc);
      const pointers = schemaPointers(doc);
      expect(pointers.length).toBeGreaterThan(100);
      for (const pointer of pointers)
        expect(() => compile(pointer), pointer.join(' ')).not.toThrow();
      everyValue(doc, (key, value) => {
        if (key === 'enum')
          expect(Array.isArray(value) && value.length > 0, JSON.stringify(value)).toBe(true);
      });
    }
  });

  it(
    'enumerates {key} per route type: every entitlement for /has, limits for /limit, meters ' +
      'for /usage',
    () => {
      const doc = docOf(PRODUCT_CONFIG);
      expect(keyEnum(doc, 'get', HAS)).toEqual(['sso', 'seats', 'api_calls']);
      for (const [method, path] of [
        ['get', LIMIT],
        ['post', LIMIT_SETTINGS],
      ] as const)
        expect(keyEnum(doc, method, path)).toEqual(['seats']);
      for (const [method, path] of [
        ['get', BALANCE],
        ['post', CONSUME],
        ['post', REFUND],
        ['post', USAGE_SETTINGS],
      ] as const) {
        expect(keyEnum(doc, method, path)).toEqual(['api_calls']);
      }
      const keyed = Object.entries<any>(doc.paths).flatMap(([path, item]) =>
        Object.keys(item)
          .filter((m) => keyEnum(doc, m, path) !== null)
          .map((m) => `${m} ${path}`),
      );
      expect(keyed).toHaveLength(7);
      expect(doc.components.schemas.ProductKey.enum).toEqual(['free', 'pro', 'credits_5k']);
      expect(doc.components.schemas.PlanKey.enum).toEqual(['pro']);
      expect(deref(doc, doc.components.schemas.Plan.properties.key).enum).toEqual([
        'free',
        'pro',
        'credits_5k',
      ]);
    },
  );

  it('a type without keys gets no enum (an empty one is invalid) and says so', async () => {
    const doc = docOf({ entitlements: { sso: { type: 'feature' } }, products: {} }, 2);
    await expectValidOpenApi(doc);
    expect(keyEnum(doc, 'get', HAS)).toEqual(['sso']);
    expect(keyEnum(doc, 'get', LIMIT)).toBeUndefined();
    expect(keyEnum(doc, 'post', CONSUME)).toBeUndefined();
    expect(doc.components.schemas.LimitKey.description).toMatch(/defines none/);
    expect(doc.components.schemas.ProductKey).not.toHaveProperty('enum');
  });

  it('without any pushed configuration the document is still valid, with no enums', async () => {
    const doc = docOf(null);
    await expectValidOpenApi(doc);
    expect(doc.info.version).toBe('config v0');
    expect(doc.info.description).toMatch(/No billing configuration has been pushed/);
    for (const name of ['EntitlementKey', 'LimitKey', 'MeterKey', 'ProductKey', 'PlanKey']) {
      expect(doc.components.schemas[name]).not.toHaveProperty('enum');
      expect(doc.components.schemas[name].description).toMatch(/no configuration has been pushed/);
    }
  });

  it("a listing's documented limit accepts exactly what the server accepts: 1 to 100", () => {
    const doc = docOf(PRODUCT_CONFIG);
    for (const path of ['/v1/customers', '/v1/audit']) {
      const limit = (
        doc.paths[path].get.parameters as Array<{ name: string; schema: object }>
      ).find((p) => p.name === 'limit');
      const accepts = new Ajv2020({ strict: false }).compile(limit?.schema ?? {});
      const accepted = Array.from({ length: 1001 }, (_, n) => String(n)).filter((text) =>
        accepts(text),
      );
      expect(accepted, path).toEqual(Array.from({ length: 100 }, (_, n) => String(n + 1)));
      for (const text of ['007', '1.5', '-1', 'abc', ''])
        expect(accepts(text), `${path} ${text}`).toBe(false);
    }
  });

  it('documents exactly the routes the server serves', () => {
    // The handlers are closures over deps; building the router calls none of them.
    const router = buildApiRouter({} as ApiDeps);
    const served = [
      { method: 'GET', path: '/healthz' },
      { method: 'GET', path: '/v1/schema/billing' },
      ...router
        .list()
        .map(({ method, pattern }) => ({ method, path: pattern.replace(/:(\w+)/g, '{$1}') })),
    ];
    const key = (op: { method: string; path: string }) => `${op.method} ${op.path}`;
    expect(DOCUMENTED_OPERATIONS.map(key).sort()).toEqual(served.map(key).sort());
  });

  it(
    'security: either key class on has, limit, balance and the document; a server key ' +
      'elsewhere; none on public routes',
    () => {
      const doc = docOf(PRODUCT_CONFIG);
      const schemes = doc.components.securitySchemes;
      for (const name of ['serverKey', 'clientKey'])
        expect(schemes[name]).toMatchObject({ type: 'apiKey', in: 'header', name: 'x-tally-key' });
      for (const name of ['serverBearer', 'clientBearer'])
        expect(schemes[name]).toMatchObject({ type: 'http', scheme: 'bearer' });
      const names = (method: string, path: string) =>
        (doc.paths[path][method].security as object[]).flatMap((r) => Object.keys(r)).sort();
      for (const path of [HAS, LIMIT, BALANCE, '/v1/docs/openapi.json']) {
        expect(names('get', path)).toEqual([
          'clientBearer',
          'clientKey',
          'serverBearer',
          'serverKey',
        ]);
      }
      for (const [method, path] of [
        ['post', CONSUME],
        ['post', REFUND],
        ['post', USAGE_SETTINGS],
        ['post', LIMIT_SETTINGS],
        ['post', '/v1/sync/push'],
        ['get', '/v1/sync/pull'],
        ['get', '/v1/plans'],
      ]) {
        expect(names(method as string, path as string)).toEqual(['serverBearer', 'serverKey']);
        expect(doc.paths[path as string][method as string].responses['403'].description).toContain(
          'server_key_required',
        );
      }
      for (const path of ['/healthz', '/v1/schema/billing']) {
        expect(doc.paths[path].get.security).toEqual([]);
        expect(doc.paths[path].get.responses['401']).toBeUndefined();
      }
    },
  );

  it(
    "each keyed route lists the statuses it can answer; request bodies are the edge's " + 'schemas',
    () => {
      const doc = docOf(PRODUCT_CONFIG);
      for (const [path, item] of Object.entries<any>(doc.paths)) {
        for (const op of Object.values<any>(item)) {
          if (op.security.length === 0) continue;
          expect('200' in op.responses || '204' in op.responses, `${path} success`).toBe(true);
          for (const status of ['400', '401', '403', '429', '500', '503'])
            expect(op.responses, `${path} ${status}`).toHaveProperty(status);
          expect(op.responses['429'].headers).toHaveProperty('Retry-After');
          expect(op.responses['401'].headers).toBeUndefined();
          expect(Object.keys(op.responses).includes('413')).toBe(op.requestBody !== undefined);
        }
      }
      expect(
        doc.paths[CONSUME].post.responses['429'].content['application/json'].schema.anyOf,
      ).toHaveLength(2);
      expect(doc.paths[REFUND].post.responses['409'].content['application/json'].schema).toEqual({
        $ref: '#/components/schemas/BalanceError',
      });
      expect(doc.paths[CONSUME].post.requestBody.content['application/json'].schema).toMatchObject({
        required: ['customerId', 'amount'],
        additionalProperties: false,
        properties: { amount: { type: 'number', exclusiveMinimum: 0 } },
      });
      expect(
        doc.paths['/v1/sync/push'].post.requestBody.content['application/json'].schema,
      ).toEqual({
        $ref: '#/components/schemas/BillingConfig',
      });
    },
  );
});

// ---------------------------------------------------------------------------
// Against a real server

type Reply = { status: number; body: any; headers: Headers };

/** Checks a real response against the document: status listed, body and headers per its schemas. */
function expectDocumented(doc: Doc, method: string, path: string, reply: Reply): void {
  const compile = schemaCompiler(doc);
  const responses = doc.paths[path]?.[method]?.responses;
  expect(responses, `${method} ${path}`).toBeDefined();
  const response = deref(doc, responses[String(reply.status)]);
  expect(response, `${method} ${path} answered an undocumented ${reply.status}`).toBeDefined();
  expect(reply.headers.get('content-type')).toBe('application/json');
  const validate = compile([
    'paths',
    path,
    method,
    'responses',
    String(reply.status),
    'content',
    'application/json',
    'schema',
  ]);
  expect(
    validate(reply.body),
    `${method} ${path} ${reply.status}: ${JSON.stringify(validate.errors)} ` +
      `for ${JSON.stringify(reply.body)}`,
  ).toBe(true);
  const documented = new Map<string, any>(
    Object.entries<any>(response.headers ?? {}).map(([name, h]) => [
      name.toLowerCase(),
      deref(doc, h),
    ]),
  );
  for (const [name, header] of documented) {
    const value = reply.headers.get(name);
    if (header.required === true) expect(value, `${name} on ${reply.status}`).not.toBeNull();
    if (value !== null) {
      const check = new Ajv2020({ strict: true }).compile(header.schema);
      expect(check(Number(value)), `${name}: ${value}`).toBe(true);
    }
  }
  for (const name of [
    'x-ratelimit-limit',
    'x-ratelimit-remaining',
    'x-ratelimit-reset',
    'retry-after',
  ]) {
    if (reply.headers.get(name) !== null)
      expect(
        documented.has(name),
        `undocumented ${name} on ${method} ${path} ${reply.status}`,
      ).toBe(true);
  }
}

function expectKeyParameter(
  doc: Doc,
  method: string,
  path: string,
  accepted: string,
  refused: string,
): void {
  const compile = schemaCompiler(doc);
  const parameter = (doc.paths[path][method].parameters as any[]).find(
    (p) => deref(doc, p).name === 'key',
  );
  expect(parameter.$ref).toMatch(/^#\/components\/parameters\//);
  const validate = compile([...(parameter.$ref as string).slice(2).split('/'), 'schema']);
  expect(validate(accepted), accepted).toBe(true);
  expect(validate(refused), refused).toBe(false);
}

async function rawGet(
  base: string,
  path: string,
  headers: Record<string, string>,
): Promise<{ status: number; text: string }> {
  const response = await fetch(base + path, { headers });
  return { status: response.status, text: await response.text() };
}

describe('GET /v1/docs/openapi.json', () => {
  let server: ServerProcess;
  let sk: string;
  let ck: string;
  let doc: Doc;
  const get = (path: string, key: string) => call(server.base, 'GET', path, { key });
  const post = (path: string, body: unknown, key = sk) =>
    call(server.base, 'POST', path, { key, body });

  beforeAll(async () => {
    server = await startServerProcess();
    sk = server.keys.test.server;
    ck = server.keys.test.client;
    expect((await post('/v1/sync/push', PRODUCT_CONFIG)).status).toBe(200);
    const res = await get('/v1/docs/openapi.json', ck);
    expect(res.status).toBe(200);
    doc = res.body as Doc;
  });

  afterAll(async () => {
    await server?.stop();
  });

  it(
    'answers either key class (also as Bearer) with the same valid document; 401 without a ' +
      'key',
    async () => {
      await expectValidOpenApi(doc);
      expect(doc.info.version).toBe('config v1');
      const byClient = await rawGet(server.base, '/v1/docs/openapi.json', { 'x-tally-key': ck });
      const byServer = await rawGet(server.base, '/v1/docs/openapi.json', { 'x-tally-key': sk });
      const byBearer = await rawGet(server.base, '/v1/docs/openapi.json', {
        authorization: `Bearer ${ck}`,
      });
      expect([byClient.status, byServer.status, byBearer.status]).toEqual([200, 200, 200]);
      expect(byServer.text).toBe(byClient.text);
      expect(byBearer.text).toBe(byClient.text);
      expect(JSON.parse(byClient.text)).toEqual(doc);
      const anonymous = await call(server.base, 'GET', '/v1/docs/openapi.json');
      expect(anonymous.status).toBe(401);
      expectDocumented(doc, 'get', '/v1/docs/openapi.json', anonymous);
      expectDocumented(
        doc,
        'get',
        '/v1/docs/openapi.json',
        await get('/v1/docs/openapi.json', server.keys.admin),
      );
    },
  );

  it('describes what the read routes answer (client key)', async () => {
    expectDocumented(doc, 'get', HAS, await get('/v1/entitlements/sso/has?customerId=oa-read', ck));
    expectDocumented(
      doc,
      'get',
      HAS,
      await get('/v1/entitlements/api_calls/has?customerId=oa-read', ck),
    );
    expectDocumented(
      doc,
      'get',
      LIMIT,
      await get('/v1/entitlements/seats/limit?customerId=oa-read', ck),
    );
    expectDocumented(
      doc,
      'get',
      BALANCE,
      await get('/v1/usage/api_calls/balance?customerId=oa-read', ck),
    );
    const unknown = await get('/v1/entitlements/nope/has?customerId=oa-read', ck);
    expect(unknown).toMatchObject({ status: 404, body: { error: 'entitlement nope not found' } });
    expectDocumented(doc, 'get', HAS, unknown);
    const wrongType = await get('/v1/entitlements/sso/limit?customerId=oa-read', ck);
    expect(wrongType.status).toBe(400);
    expectDocumented(doc, 'get', LIMIT, wrongType);
    expectDocumented(doc, 'get', BALANCE, await get('/v1/usage/api_calls/balance', ck));
    expectKeyParameter(doc, 'get', HAS, 'sso', 'nope');
    expectKeyParameter(doc, 'get', LIMIT, 'seats', 'sso');
    expectKeyParameter(doc, 'get', BALANCE, 'api_calls', 'seats');
  });

  it(
    'describes what the write routes answer, ' + 'including 429 and 409 with the balance fields',
    async () => {
      const c = 'oa-write';
      const consumed = await post('/v1/usage/api_calls/consume', {
        customerId: c,
        amount: 40,
        idempotencyKey: 'k1',
      });
      expect(consumed).toMatchObject({ status: 200, body: { balance: 60 } });
      expectDocumented(doc, 'post', CONSUME, consumed);
      const short = await post('/v1/usage/api_calls/consume', { customerId: c, amount: 1000 });
      expect(short).toMatchObject({
        status: 429,
        body: { error: 'insufficient balance for api_calls', balance: 60 },
      });
      expectDocumented(doc, 'post', CONSUME, short);
      const tooMuch = await post('/v1/usage/api_calls/refund', { customerId: c, amount: 1000 });
      expect(tooMuch.status).toBe(409);
      expectDocumented(doc, 'post', REFUND, tooMuch);
      expectDocumented(
        doc,
        'post',
        REFUND,
        await post('/v1/usage/api_calls/refund', { customerId: c, amount: 10 }),
      );
      expectDocumented(
        doc,
        'post',
        USAGE_SETTINGS,
        await post('/v1/usage/api_calls/settings', { customerId: c, overageEnabled: false }),
      );
      expectDocumented(
        doc,
        'post',
        USAGE_SETTINGS,
        await post('/v1/usage/api_calls/settings', { customerId: c, overageEnabled: true }),
      );
      expectDocumented(
        doc,
        'post',
        LIMIT_SETTINGS,
        await post('/v1/entitlements/seats/limit/settings', {
          customerId: c,
          autoExpansionEnabled: false,
        }),
      );
      expectDocumented(
        doc,
        'post',
        LIMIT_SETTINGS,
        await post('/v1/entitlements/seats/limit/settings', { customerId: c, purchased: 2 }),
      );
      const asClient = await post('/v1/usage/api_calls/consume', { customerId: c, amount: 1 }, ck);
      expect(asClient.status).toBe(403);
      expectDocumented(doc, 'post', CONSUME, asClient);
      const wrongType = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
        key: sk,
        rawBody: '{}',
        headers: { 'content-type': 'text/plain' },
      });
      expectDocumented(doc, 'post', CONSUME, wrongType);
      const huge = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
        key: sk,
        rawBody: 'x'.repeat(1024 * 1024 + 1),
        headers: { 'content-type': 'application/json' },
      });
      expect(huge.status).toBe(413);
      expectDocumented(doc, 'post', CONSUME, huge);
    },
  );

  it('describes the configuration and public routes', async () => {
    expectDocumented(doc, 'get', '/v1/plans', await get('/v1/plans', sk));
    expectDocumented(doc, 'get', '/v1/sync/pull', await get('/v1/sync/pull', sk));
    expectDocumented(
      doc,
      'post',
      '/v1/sync/push',
      await post('/v1/sync/push', { entitlements: {}, products: { x: { prise: 1 } } }),
    );
    expectDocumented(doc, 'get', '/healthz', await call(server.base, 'GET', '/healthz'));
    expectDocumented(
      doc,
      'get',
      '/v1/schema/billing',
      await call(server.base, 'GET', '/v1/schema/billing'),
    );
  });

  it(
    'is cached per configuration version and follows a new push; ' + 'each environment has its own',
    async () => {
      const first = await rawGet(server.base, '/v1/docs/openapi.json', { 'x-tally-key': ck });
      const again = await rawGet(server.base, '/v1/docs/openapi.json', { 'x-tally-key': ck });
      expect(again.text).toBe(first.text);

      const next = {
        ...PRODUCT_CONFIG,
        entitlements: {
          ...PRODUCT_CONFIG.entitlements,
          storage: { type: 'meter', reset: 'never' },
          projects: { type: 'limit' },
        },
        products: {
          ...PRODUCT_CONFIG.products,
          team: { name: 'Team', price: { amount: 9000, currency: 'usd', interval: 'year' } },
        },
      } satisfies BillingConfig;
      const pushed = await post('/v1/sync/push', next);
      expect(pushed.status).toBe(200);
      expectDocumented(doc, 'post', '/v1/sync/push', pushed);
      const updated = (await get('/v1/docs/openapi.json', ck)).body as Doc;
      await expectValidOpenApi(updated);
      expect(updated.info.version).toBe(`config v${pushed.body.version as number}`);
      expect(keyEnum(updated, 'get', HAS)).toEqual([
        'sso',
        'seats',
        'api_calls',
        'storage',
        'projects',
      ]);
      expect(keyEnum(updated, 'get', LIMIT)).toEqual(['seats', 'projects']);
      expect(keyEnum(updated, 'post', CONSUME)).toEqual(['api_calls', 'storage']);
      expect(updated.components.schemas.PlanKey.enum).toEqual(['pro', 'team']);
      expectDocumented(
        updated,
        'get',
        BALANCE,
        await get('/v1/usage/storage/balance?customerId=oa-new', ck),
      );
      expect((await rawGet(server.base, '/v1/docs/openapi.json', { 'x-tally-key': sk })).text).toBe(
        JSON.stringify(updated),
      );

      const live = await get('/v1/docs/openapi.json', server.keys.live.client);
      expect(live.status).toBe(200);
      await expectValidOpenApi(live.body);
      expect(live.body.info.version).toBe('config v0');
      expect(keyEnum(live.body, 'get', HAS)).toBeUndefined();
    },
  );
});

describe('the document against a rate-limited server', () => {
  let server: ServerProcess;

  beforeAll(async () => {
    server = await startServerProcess({ env: { TALLY_RATE_LIMIT_CLIENT: '3' } });
  });

  afterAll(async () => {
    await server?.stop();
  });

  it('documents the 429 with Retry-After and the X-RateLimit headers', async () => {
    const ck = server.keys.test.client;
    // Windows are aligned to the whole minute: start far enough from a boundary that all
    // four requests fall into one window.
    const toBoundaryMs = 60_000 - (Date.now() % 60_000);
    if (toBoundaryMs < 5_000)
      await new Promise((resolve) => setTimeout(resolve, toBoundaryMs + 100));
    const served = await call(server.base, 'GET', '/v1/docs/openapi.json', { key: ck });
    expect(served.status).toBe(200);
    const doc = served.body as Doc;
    expect(served.headers.get('x-ratelimit-remaining')).toBe('2');
    expectDocumented(doc, 'get', '/v1/docs/openapi.json', served);
    expectDocumented(
      doc,
      'get',
      HAS,
      await call(server.base, 'GET', '/v1/entitlements/sso/has?customerId=c', { key: ck }),
    );
    await call(server.base, 'GET', '/v1/entitlements/sso/has?customerId=c', { key: ck });
    const limited = await call(server.base, 'GET', '/v1/entitlements/sso/has?customerId=c', {
      key: ck,
    });
    expect(limited.status).toBe(429);
    expect(limited.headers.get('retry-after')).not.toBeNull();
    expectDocumented(doc, 'get', HAS, limited);
  });
});
