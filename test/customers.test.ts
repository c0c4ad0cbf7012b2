/**
 * Customers (rows 9–11): upsert (201/200, merge, null removes a metadata key), lookup and
 * listing from the shards' customer index. The listing property runs against real
 * shard stores: any set of upserted ids, spread over shards, pages back in id order with
 * every customer exactly once, also when more are inserted between pages.
 */
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CustomerIndex } from '../storage/customer-index.js';
import { ShardStore } from '../storage/journal.js';
import { storeFixture } from './support/store-fixture.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';
import path from 'node:path';

const SHARDS = 3;
const { tempDir, openStore } = storeFixture('tally-cindex-', (dir) => ShardStore.open(dir));
const shardOfId = (_env: string, id: string): number =>
  [...Buffer.from(id)].reduce((a, b) => a + b, 0) % SHARDS;

async function putAll(stores: ShardStore[], ids: readonly string[]): Promise<void> {
  await Promise.all(
    ids.map(
      (id) =>
        stores[shardOfId('test', id)]?.append(
          [],
          [{ environment: 'test', id, json: Buffer.from(JSON.stringify({ id })) }],
        ).durable,
    ),
  );
}

function listAll(
  index: CustomerIndex,
  limit: number,
  between?: () => Promise<void>,
): Promise<string[]> {
  return (async () => {
    const seen: string[] = [];
    let after: string | null = null;
    for (let guard = 0; guard < 10_000; guard++) {
      const page = index.page('test', after, limit);
      seen.push(...page.items.map((json) => (JSON.parse(json) as { id: string }).id));
      if (page.nextAfter === null) return seen;
      after = page.nextAfter;
      if (between !== undefined) await between();
    }
    throw new Error('listing did not end');
  })();
}

const byUtf8 = (a: string, b: string): number => Buffer.compare(Buffer.from(a), Buffer.from(b));

describe('customer index pages', () => {
  it('lists every customer exactly once, in id order, across shards', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.uniqueArray(fc.string({ minLength: 1, maxLength: 12 }), { maxLength: 60 }),
        fc.integer({ min: 1, max: 7 }),
        async (ids, limit) => {
          const dir = tempDir();
          const stores = Array.from({ length: SHARDS }, (_, i) =>
            openStore(path.join(dir, `shard-${i}`)),
          );
          await putAll(stores, ids);
          const index = CustomerIndex.open(dir, SHARDS, shardOfId);
          expect(await listAll(index, limit)).toEqual([...ids].sort(byUtf8));
          expect(index.page('live', null, 10).items).toEqual([]);
        },
      ),
      { numRuns: 40 },
    );
  });

  it('customers inserted between pages appear once if they sort after the cursor', async () => {
    const dir = tempDir();
    const stores = Array.from({ length: SHARDS }, (_, i) =>
      openStore(path.join(dir, `shard-${i}`)),
    );
    const first = Array.from({ length: 30 }, (_, i) => `c${String(i * 10).padStart(4, '0')}`);
    await putAll(stores, first);
    const index = CustomerIndex.open(dir, SHARDS, shardOfId);
    let n = 0;
    const later: string[] = [];
    const seen = await listAll(index, 7, async () => {
      const id = `c${String(n++ * 37 + 5).padStart(4, '0')}`;
      later.push(id);
      await putAll(stores, [id]);
    });
    expect(new Set(seen).size).toBe(seen.length);
    expect([...seen].sort(byUtf8)).toEqual(seen);
    for (const id of first) expect(seen).toContain(id);
    expect(later.length).toBeGreaterThanOrEqual(3);
  });
});

describe('customers over HTTP', () => {
  let server: ServerProcess;
  let sk: string;
  beforeAll(async () => {
    server = await startServerProcess({
      config: {
        entitlements: { api_calls: { type: 'meter' } },
        products: { free: { default: true, entitlements: { api_calls: { included: 10 } } } },
      },
    });
    sk = server.keys.test.server;
  });
  afterAll(async () => {
    await server?.stop();
  });

  const upsert = (body: unknown) => call(server.base, 'POST', '/v1/customers', { key: sk, body });

  it('creates (201), updates only what is given (200), and merges metadata', async () => {
    const created = await upsert({
      id: 'cus_1',
      name: 'Ada',
      email: 'ada@example.com',
      metadata: { plan: 'gold', seats: 3 },
    });
    expect(created).toMatchObject({
      status: 201,
      body: {
        id: 'cus_1',
        name: 'Ada',
        email: 'ada@example.com',
        metadata: { plan: 'gold', seats: 3 },
      },
    });
    const updated = await upsert({ id: 'cus_1', metadata: { plan: null, vip: true } });
    expect(updated).toMatchObject({
      status: 200,
      body: { name: 'Ada', metadata: { seats: 3, vip: true } },
    });
    expect(updated.body.metadata).not.toHaveProperty('plan');
    expect(updated.body.createdAt).toBe(created.body.createdAt);
    expect(await call(server.base, 'GET', '/v1/customers/cus_1', { key: sk })).toMatchObject({
      status: 200,
      body: updated.body,
    });
    expect(await call(server.base, 'GET', '/v1/customers/nobody', { key: sk })).toMatchObject({
      status: 404,
      body: { error: 'customer nobody not found' },
    });
    expect((await upsert({ id: 'cus_1', name: null })).body.name).toBeNull();
  });

  it(
    'refuses a __proto__ metadata or contract key (stored records would rename it), ' +
      'changing nothing',
    async () => {
      const body = JSON.parse('{"id":"cus_proto","metadata":{"__proto__":"x","ok":1}}') as unknown;
      expect(await upsert(body)).toMatchObject({
        status: 400,
        body: { error: 'metadata key __proto__ is not allowed' },
      });
      expect((await call(server.base, 'GET', '/v1/customers/cus_proto', { key: sk })).status).toBe(
        404,
      );
      const contract = JSON.parse(
        '{"priceAmount":1,"priceInterval":"month","entitlements":{"__proto__":{"included":1}}}',
      ) as unknown;
      expect(
        await call(server.base, 'PUT', '/v1/contracts/cus_1', { key: sk, body: contract }),
      ).toMatchObject({
        status: 400,
        body: { error: 'entitlements key __proto__ is not allowed' },
      });
      // As a value (an id), it is just a name.
      expect((await upsert({ id: '__proto__', metadata: { a: 1 } })).status).toBe(201);
      expect(
        (await call(server.base, 'GET', '/v1/customers/__proto__', { key: sk })).body,
      ).toMatchObject({ id: '__proto__', metadata: { a: 1 } });
    },
  );

  it('a consume creates the customer implicitly; it is listed and readable', async () => {
    await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
      key: sk,
      body: { customerId: 'implicit', amount: 1 },
    });
    expect(await call(server.base, 'GET', '/v1/customers/implicit', { key: sk })).toMatchObject({
      status: 200,
      body: { id: 'implicit', name: null, metadata: {} },
    });
    expect((await upsert({ id: 'implicit', name: 'Known now' })).status).toBe(200);
  });

  it('pages through 3+ pages while customers are added, each exactly once', async () => {
    for (let i = 0; i < 25; i++)
      expect((await upsert({ id: `page-${String(i).padStart(3, '0')}` })).status).toBe(201);
    const seen: string[] = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      const res: { status: number; body: any } = await call(
        server.base,
        'GET',
        `/v1/customers?limit=7${cursor === null ? '' : `&cursor=${cursor}`}`,
        { key: sk },
      );
      expect(res.status).toBe(200);
      seen.push(...res.body.data.map((c: { id: string }) => c.id));
      cursor = res.body.nextCursor;
      await upsert({ id: `page-${String(100 + pages).padStart(3, '0')}` });
      pages++;
    } while (cursor !== null);
    expect(pages).toBeGreaterThanOrEqual(4);
    expect(new Set(seen).size).toBe(seen.length);
    expect([...seen].sort()).toEqual(seen);
    for (let i = 0; i < 25; i++) expect(seen).toContain(`page-${String(i).padStart(3, '0')}`);
    const defaults = await call(server.base, 'GET', '/v1/customers', { key: sk });
    expect(defaults.body.data).toHaveLength(20);
    expect(
      (await call(server.base, 'GET', '/v1/customers', { key: server.keys.live.server })).body,
    ).toEqual({ data: [], nextCursor: null });
  });

  it.each([
    [{ name: 'x' }, 'id is required'],
    [{ id: '' }, 'id must be 1 to 255 characters'],
    [{ id: 'x', name: 5 }, 'name must be a string or null'],
    [{ id: 'x', email: 'e'.repeat(256) }, 'email must be at most 255 characters'],
    [{ id: 'x', email: 'Jane Doe' }, 'email must be an email address (name@domain)'],
    [{ id: 'x', email: '' }, 'email must be an email address (name@domain)'],
    [{ id: 'x', email: 'jane doe@example.com' }, 'email must be an email address (name@domain)'],
    [{ id: 'x', email: 'a@b@c' }, 'email must be an email address (name@domain)'],
    [{ id: 'x', metadata: [] }, 'metadata must be an object'],
    [
      { id: 'x', metadata: { k: { nested: true } } },
      'metadata.k must be a string or a number or a boolean or null',
    ],
    [{ id: 'x', metadata: { k: 'v'.repeat(501) } }, 'metadata.k must be at most 500 characters'],
    [{ id: 'x', metadata: { ['k'.repeat(41)]: 1 } }, 'metadata keys must be 1 to 40 characters'],
    [
      { id: 'x', metadata: Object.fromEntries(Array.from({ length: 51 }, (_, i) => [`k${i}`, i])) },
      'metadata may hold at most 50 keys',
    ],
    [{ id: 'x', extra: 1 }, 'extra is not a known field'],
  ])('POST %j → 400 %s', async (body, error) => {
    expect(await upsert(body)).toMatchObject({ status: 400, body: { error } });
  });

  it(
    'an update that changes nothing answers the stored customer, ' + 'unchanged and unaudited',
    async () => {
      const entries = async () =>
        (
          await call(server.base, 'GET', '/v1/audit?action=customer.upsert&limit=100', { key: sk })
        ).body.data.filter((e: { resourceId: string }) => e.resourceId === 'same');
      const created = (await upsert({ id: 'same', name: 'S', metadata: { plan: 'x' } })).body;
      for (const body of [
        { id: 'same' },
        { id: 'same', name: 'S' },
        { id: 'same', metadata: { plan: 'x', gone: null } },
      ]) {
        expect(await upsert(body)).toMatchObject({ status: 200, body: created });
      }
      expect(await entries()).toHaveLength(1);
      expect((await upsert({ id: 'same', name: 'T' })).body).toMatchObject({
        name: 'T',
        metadata: { plan: 'x' },
      });
      expect(await entries()).toHaveLength(2);
    },
  );

  it('merging past 50 metadata keys is refused and changes nothing', async () => {
    await upsert({
      id: 'meta',
      metadata: Object.fromEntries(Array.from({ length: 50 }, (_, i) => [`k${i}`, i])),
    });
    expect(await upsert({ id: 'meta', metadata: { one_more: 1 } })).toMatchObject({
      status: 400,
      body: { error: 'metadata may hold at most 50 keys (would hold 51)' },
    });
    expect(
      Object.keys(
        (await call(server.base, 'GET', '/v1/customers/meta', { key: sk })).body.metadata,
      ),
    ).toHaveLength(50);
  });

  it.each([
    ['/v1/customers?limit=0', 'limit must be a whole number from 1 to 100'],
    ['/v1/customers?limit=101', 'limit must be a whole number from 1 to 100'],
    ['/v1/customers?limit=abc', 'limit must be a whole number from 1 to 100'],
    ['/v1/customers?limit=007', 'limit must be a whole number from 1 to 100'],
    ['/v1/customers?cursor=not-a-cursor', 'cursor is invalid'],
    ['/v1/customers?sort=asc', 'sort is not a known field'],
  ])('GET %s → 400', async (url, error) => {
    expect(await call(server.base, 'GET', url, { key: sk })).toMatchObject({
      status: 400,
      body: { error },
    });
  });

  it('needs a server key', async () => {
    const ck = server.keys.test.client;
    expect((await call(server.base, 'GET', '/v1/customers', { key: ck })).status).toBe(403);
    expect((await call(server.base, 'GET', '/v1/customers/cus_1', { key: ck })).status).toBe(403);
    expect(
      (await call(server.base, 'POST', '/v1/customers', { key: ck, body: { id: 'x' } })).status,
    ).toBe(403);
  });

  it('customers survive a restart', async () => {
    await server.stop();
    server = await startServerProcess({ dataDir: server.dataDir });
    expect(await call(server.base, 'GET', '/v1/customers/cus_1', { key: sk })).toMatchObject({
      status: 200,
      body: { id: 'cus_1' },
    });
  });
});

describe('context', () => {
  let server: ServerProcess;
  let sk: string;
  beforeAll(async () => {
    server = await startServerProcess({
      config: {
        entitlements: {
          sso: { type: 'feature' },
          audit: { type: 'feature' },
          seats: { type: 'limit' },
          api_calls: { type: 'meter' },
          tokens: { type: 'meter', reset: 'never' },
        },
        products: {
          free: {
            name: 'Free',
            default: true,
            entitlements: {
              sso: true,
              seats: { included: 3 },
              api_calls: { included: 100 },
              tokens: { included: 5 },
            },
          },
        },
      },
    });
    sk = server.keys.test.server;
  });
  afterAll(async () => {
    await server?.stop();
  });
  const context = (body: unknown) => call(server.base, 'POST', '/v1/context', { key: sk, body });

  it('upserts the customer and answers features, usage and limits', async () => {
    await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
      key: sk,
      body: { customerId: 'ctx', amount: 30 },
    });
    const res = await context({
      customer: { id: 'ctx', name: 'Ctx Ltd' },
      features: ['sso', 'audit', 'seats'],
      usage: ['api_calls', 'tokens'],
      limits: ['seats'],
    });
    expect(res.status).toBe(200);
    expect(res.body.customer).toMatchObject({ id: 'ctx', name: 'Ctx Ltd' });
    expect(res.body.features).toEqual({ sso: true, audit: false, seats: true });
    expect(res.body.usage.api_calls).toMatchObject({ balance: 70, consumed: 30, included: 100 });
    expect(res.body.usage.tokens).toMatchObject({ balance: 5, resets: null });
    expect(res.body.limits).toEqual({
      seats: {
        limit: 3,
        included: 3,
        purchased: 0,
        expansionAllowed: false,
        autoExpansionEnabled: false,
      },
    });
    expect(res.body).not.toHaveProperty('plans');
    expect(res.body).not.toHaveProperty('subscription');
    expect((await call(server.base, 'GET', '/v1/customers/ctx', { key: sk })).body).toMatchObject({
      name: 'Ctx Ltd',
    });
  });

  it('creates an unknown customer and adds plans and subscription when asked', async () => {
    const res = await context({
      customer: { id: 'ctx-new' },
      includePlans: true,
      includeSubscription: true,
    });
    expect(res).toMatchObject({
      status: 200,
      body: {
        customer: { id: 'ctx-new', name: null },
        features: {},
        usage: {},
        limits: {},
        subscription: null,
      },
    });
    expect(res.body.plans.map((p: { key: string }) => p.key)).toEqual(['free']);
    expect((await call(server.base, 'GET', '/v1/customers/ctx-new', { key: sk })).status).toBe(200);
  });

  it(
    'writes (and audits as customer.upsert) only ' + 'a call that creates or changes the customer',
    async () => {
      const entries = async () =>
        (
          await call(server.base, 'GET', '/v1/audit?resourceType=customer&limit=100', { key: sk })
        ).body.data.filter((e: { resourceId: string }) => e.resourceId === 'ctx-aud');
      const stored = async () =>
        (await call(server.base, 'GET', '/v1/customers/ctx-aud', { key: sk })).body;
      expect(
        (await context({ customer: { id: 'ctx-aud', name: 'N', metadata: { tier: 'a' } } })).status,
      ).toBe(200);
      const created = await stored();
      expect(await entries()).toMatchObject([
        { action: 'customer.upsert', data: { name: 'N', metadata: { tier: 'a' } } },
      ]);
      // The same profile again, a subset of it, or removing a key it does not have: nothing to
      // write.
      for (const customer of [
        { id: 'ctx-aud', name: 'N', metadata: { tier: 'a' } },
        { id: 'ctx-aud', name: 'N' },
        { id: 'ctx-aud', metadata: { gone: null } },
        { id: 'ctx-aud' },
      ]) {
        expect((await context({ customer })).status).toBe(200);
      }
      expect(await stored()).toEqual(created);
      expect(await entries()).toHaveLength(1);
      // A change is written, stamped and audited.
      await new Promise((resolve) => setTimeout(resolve, 5));
      expect(
        (await context({ customer: { id: 'ctx-aud', metadata: { tier: null } } })).body.customer,
      ).toMatchObject({ name: 'N', metadata: {} });
      expect((await stored()).updatedAt > created.updatedAt).toBe(true);
      expect(await entries()).toMatchObject([
        { action: 'customer.upsert', data: { metadata: { tier: null } } },
        { data: { name: 'N' } },
      ]);
    },
  );

  it('unknown keys are 404 naming the key; wrong types 400; nothing is created then', async () => {
    expect(await context({ customer: { id: 'ctx-bad' }, features: ['nope'] })).toMatchObject({
      status: 404,
      body: { error: 'entitlement nope not found' },
    });
    expect(await context({ customer: { id: 'ctx-bad' }, usage: ['seats'] })).toMatchObject({
      status: 400,
      body: { error: 'seats is a limit, not a meter' },
    });
    expect(await context({ customer: { id: 'ctx-bad' }, limits: ['api_calls'] })).toMatchObject({
      status: 400,
      body: { error: 'api_calls is a meter, not a limit' },
    });
    expect((await call(server.base, 'GET', '/v1/customers/ctx-bad', { key: sk })).status).toBe(404);
    expect(await context({ features: ['sso'] })).toMatchObject({
      status: 400,
      body: { error: 'customer is required' },
    });
    expect(await context({ customer: {} })).toMatchObject({
      status: 400,
      body: { error: 'customer.id is required' },
    });
    expect(await context({ customer: { id: 'x' }, features: 'sso' })).toMatchObject({
      status: 400,
      body: { error: 'features must be an array' },
    });
    expect(
      (
        await call(server.base, 'POST', '/v1/context', {
          key: server.keys.test.client,
          body: { customer: { id: 'x' } },
        })
      ).status,
    ).toBe(403);
  });
});
