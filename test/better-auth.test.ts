/**
 * The Better Auth plugin end to end: a real Better Auth application on a SQLite file
 * database, with the plugin imported through the package's exports, against a running
 * Tally. Billing calls go through `auth.api` (server side, with the request headers) and
 * through `createAuthClient` with the client plugin over real HTTP; the customer always
 * comes from the session.
 */
import net from 'node:net';
import { betterAuth } from 'better-auth';
import { memoryAdapter } from 'better-auth/adapters/memory';
import { createAuthClient } from 'better-auth/client';
import { organization } from 'better-auth/plugins/organization';
import { tally } from 'tally/better-auth';
import { tallyClient } from 'tally/better-auth/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cookieOf, freshEmail, startAuthApp } from './support/better-auth-app.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const CONFIG = {
  entitlements: {
    sso: { type: 'feature' },
    seats: { type: 'limit' },
    api_calls: { type: 'meter', reset: 'month' },
  },
  products: {
    free: {
      name: 'Free',
      default: true,
      entitlements: { api_calls: { included: 10 }, seats: { included: 2 } },
    },
    pro: {
      name: 'Pro',
      price: { amount: 2000, currency: 'usd', interval: 'month' },
      entitlements: { sso: true, api_calls: { included: 1000 } },
    },
  },
};

let tallyServer: ServerProcess;

beforeAll(async () => {
  tallyServer = await startServerProcess({ config: CONFIG });
});

afterAll(async () => {
  await tallyServer?.stop();
});

function pluginOptions() {
  return { apiKey: tallyServer.keys.test.server, baseUrl: tallyServer.base };
}

/** Reads a customer straight from Tally with the server key. */
async function tallyCustomer(id: string) {
  return call(tallyServer.base, 'GET', `/v1/customers/${encodeURIComponent(id)}`, {
    key: tallyServer.keys.test.server,
  });
}

/** Signs a new user up through `auth.api` and answers the session's request headers. */
async function signUp(auth: any, name = 'Ada Lovelace') {
  const email = freshEmail();
  const { headers, response } = await auth.api.signUpEmail({
    body: { email, password: 'correct horse battery', name },
    returnHeaders: true,
  });
  return { email, userId: response.user.id as string, headers: cookieHeaders(headers) };
}

function cookieHeaders(setCookie: Headers): Headers {
  return new Headers({ cookie: cookieOf(setCookie) });
}

/** The status and body an `auth.api` call fails with. */
async function apiError(promise: Promise<unknown>) {
  const error = (await promise.then(
    () => null,
    (e: unknown) => e,
  )) as { statusCode?: number; body?: Record<string, unknown> } | null;
  if (error === null) throw new Error('the call succeeded');
  return { status: error.statusCode, body: error.body ?? {} };
}

describe('session-bound endpoints (user source)', () => {
  let app: Awaited<ReturnType<typeof startApp>>;
  const startApp = () =>
    startAuthApp({
      emailAndPassword: { enabled: true },
      plugins: [tally(pluginOptions())],
    });
  beforeAll(async () => {
    app = await startApp();
  });
  afterAll(async () => {
    await app?.close();
  });

  it('syncs the signed-in user and answers has, consume, balance, context, checkout', async () => {
    const { auth } = app;
    const { userId, email, headers } = await signUp(auth);
    const synced = await auth.api.tallyCustomerSync({ headers });
    expect(synced).toMatchObject({ id: userId, name: 'Ada Lovelace', email });
    expect((await tallyCustomer(userId)).body).toMatchObject({ id: userId, email });

    expect(await auth.api.tallyHas({ headers, body: { key: 'sso' } })).toEqual({ allowed: false });
    const consumed = await auth.api.tallyUsageConsume({
      headers,
      body: { key: 'api_calls', amount: 3, idempotencyKey: 'req-1' },
    });
    expect(consumed).toMatchObject({ balance: 7, consumed: 3, included: 10 });
    // A retry with the same idempotency key is applied once.
    await auth.api.tallyUsageConsume({
      headers,
      body: { key: 'api_calls', amount: 3, idempotencyKey: 'req-1' },
    });
    const balance = await auth.api.tallyUsageBalance({ headers, body: { key: 'api_calls' } });
    expect(balance).toMatchObject({ balance: 7, consumed: 3 });

    const context = await auth.api.tallyContext({
      headers,
      body: { features: ['sso'], usage: ['api_calls'], limits: ['seats'], includePlans: true },
    });
    expect(context.customer).toMatchObject({ id: userId, name: 'Ada Lovelace' });
    expect(context.features).toEqual({ sso: false });
    expect(context.usage['api_calls']).toMatchObject({ balance: 7 });
    expect(context.limits['seats']).toMatchObject({ limit: 2 });
    expect(context.plans?.map((plan) => plan.key).sort()).toEqual(['free', 'pro']);

    const checkout = await auth.api.tallyCheckout({
      headers,
      body: { productKey: 'pro', successUrl: '/billing/done', cancelUrl: `${app.origin}/billing` },
    });
    expect(checkout.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/checkout\//);
    // The checkout is the session's customer's: paying it makes sso true for that user.
    const paid = await fetch(`${checkout.url}/pay`, { method: 'POST', redirect: 'manual' });
    // The paid page sends the browser back to the success URL, made absolute on the app.
    expect(paid.status).toBe(303);
    expect(paid.headers.get('location')).toBe(`${app.origin}/billing/done`);
    await expect
      .poll(() => auth.api.tallyHas({ headers, body: { key: 'sso' } }), { timeout: 10_000 })
      .toEqual({ allowed: true });
  });

  it('answers 401 without a session, through auth.api and over HTTP', async () => {
    const failed = await apiError(
      app.auth.api.tallyHas({ headers: new Headers(), body: { key: 'sso' } }),
    );
    expect(failed.status).toBe(401);
    const response = await fetch(`${app.origin}/api/auth/tally/has`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', origin: app.origin },
      body: JSON.stringify({ key: 'sso' }),
    });
    expect(response.status).toBe(401);
  });

  it('passes a 429 insufficient_balance through with its balance fields', async () => {
    const { headers } = await signUp(app.auth);
    const failed = await apiError(
      app.auth.api.tallyUsageConsume({ headers, body: { key: 'api_calls', amount: 11 } }),
    );
    expect(failed.status).toBe(429);
    expect(failed.body).toMatchObject({
      code: 'insufficient_balance',
      message: 'insufficient balance for api_calls',
      error: 'insufficient balance for api_calls',
      balance: 10,
      consumed: 0,
    });
  });

  it('passes other service errors through with their status and message', async () => {
    const { headers } = await signUp(app.auth);
    const unknown = await apiError(app.auth.api.tallyHas({ headers, body: { key: 'nope' } }));
    expect(unknown).toMatchObject({
      status: 404,
      body: { code: 'entitlement_not_found', message: 'entitlement nope not found' },
    });
    const wrongType = await apiError(
      app.auth.api.tallyUsageBalance({ headers, body: { key: 'sso' } }),
    );
    expect(wrongType.status).toBe(400);
    expect(wrongType.body['code']).toBe('wrong_entitlement_type');
  });

  it('refuses a body that names a customer, and bills only the session', async () => {
    const victim = await signUp(app.auth, 'Victim');
    const attacker = await signUp(app.auth, 'Attacker');
    const failed = await apiError(
      app.auth.api.tallyUsageConsume({
        headers: attacker.headers,
        body: { key: 'api_calls', amount: 5, customerId: victim.userId } as any,
      }),
    );
    expect(failed.status).toBe(400);
    expect(JSON.stringify(failed.body)).toContain('customerId');
    // Over HTTP as well, and for the body-less sync.
    for (const [route, body] of [
      ['usage/consume', { key: 'api_calls', amount: 5, customerId: victim.userId }],
      ['customer/sync', { customerId: victim.userId }],
      ['checkout/create', { productKey: 'pro', successUrl: '/', cancelUrl: '/', customerId: 'x' }],
    ] as const) {
      const response = await fetch(`${app.origin}/api/auth/tally/${route}`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          origin: app.origin,
          cookie: attacker.headers.get('cookie') ?? '',
        },
        body: JSON.stringify(body),
      });
      expect(response.status, route).toBe(400);
    }
    const victimBalance = await app.auth.api.tallyUsageBalance({
      headers: victim.headers,
      body: { key: 'api_calls' },
    });
    expect(victimBalance).toMatchObject({ consumed: 0, balance: 10 });
    expect((await tallyCustomer(victim.userId)).status).toBe(404);
  });

  it('refuses checkout return URLs on an untrusted origin', async () => {
    const { headers } = await signUp(app.auth);
    const failed = await apiError(
      app.auth.api.tallyCheckout({
        headers,
        body: { productKey: 'pro', successUrl: 'https://evil.example/', cancelUrl: '/' },
      }),
    );
    expect(failed.status).toBe(400);
    expect(failed.body['message']).toContain('successUrl must be on a trusted origin');
  });

  it('works through createAuthClient and the client plugin over HTTP', async () => {
    const { userId, headers } = await signUp(app.auth, 'Grace Hopper');
    const authClient = createAuthClient({
      baseURL: app.origin,
      plugins: [tallyClient()],
      fetchOptions: { headers: { cookie: headers.get('cookie') ?? '', origin: app.origin } },
    });
    const synced = await authClient.tally.customer.sync();
    expect(synced.error).toBeNull();
    expect(synced.data).toMatchObject({ id: userId, name: 'Grace Hopper' });
    expect((await authClient.tally.has({ key: 'sso' })).data).toEqual({ allowed: false });
    const consumed = await authClient.tally.usage.consume({ key: 'api_calls', amount: 4 });
    expect(consumed.data).toMatchObject({ balance: 6 });
    expect((await authClient.tally.usage.balance({ key: 'api_calls' })).data).toMatchObject({
      consumed: 4,
    });
    const context = await authClient.tally.context();
    expect(context.data?.customer.id).toBe(userId);
    const checkout = await authClient.tally.checkout.create({
      productKey: 'pro',
      successUrl: '/done',
      cancelUrl: '/cancel',
    });
    expect(checkout.data?.url).toContain('/checkout/');

    // Errors come back in the envelope, never thrown.
    const short = await authClient.tally.usage.consume({ key: 'api_calls', amount: 1000 });
    expect(short.data).toBeNull();
    expect(short.error).toMatchObject({ status: 429, code: 'insufficient_balance', balance: 6 });
    const anonymous = createAuthClient({ baseURL: app.origin, plugins: [tallyClient()] });
    const refused = await anonymous.tally.has({ key: 'sso' });
    expect(refused.error?.status).toBe(401);
  });
});

describe('customer tokens for pages', () => {
  it('mints a token for the session customer only (auth.api and client plugin)', async () => {
    const app = await startAuthApp({
      emailAndPassword: { enabled: true },
      plugins: [tally(pluginOptions())],
    });
    try {
      const { userId, headers } = await signUp(app.auth, 'Page Reader');
      const minted = await app.auth.api.tallyClientToken({ headers, body: { ttlSeconds: 120 } });
      expect(minted).toMatchObject({ customerId: userId, ttlSeconds: 120 });
      const read = (customerId: string, token: string) =>
        fetch(`${tallyServer.base}/v1/entitlements/sso/has?customerId=${customerId}`, {
          headers: {
            'x-tally-key': tallyServer.keys.test.client,
            'x-tally-customer-token': token,
          },
        });
      expect((await read(userId, minted.token)).status).toBe(200);
      expect((await read('someone-else', minted.token)).status).toBe(403);

      const authClient = createAuthClient({
        baseURL: app.origin,
        plugins: [tallyClient()],
        fetchOptions: { headers: { cookie: headers.get('cookie') ?? '', origin: app.origin } },
      });
      const viaClient = await authClient.tally.clientToken();
      expect(viaClient.error).toBeNull();
      expect(viaClient.data).toMatchObject({ customerId: userId, ttlSeconds: 900 });
      expect((await read(userId, viaClient.data?.token ?? '')).status).toBe(200);
      // The body can never name the customer.
      const named = await apiError(
        app.auth.api.tallyClientToken({ headers, body: { customerId: 'someone-else' } as never }),
      );
      expect(named.status).toBe(400);
      const anonymous = createAuthClient({ baseURL: app.origin, plugins: [tallyClient()] });
      expect((await anonymous.tally.clientToken()).error?.status).toBe(401);
    } finally {
      await app.close();
    }
  });
});

describe('customer id sources', () => {
  it('organization: the active organization, mapped, named after it; 400 without one', async () => {
    const app = await startAuthApp({
      emailAndPassword: { enabled: true },
      plugins: [
        organization(),
        tally({
          ...pluginOptions(),
          customerId: 'organization',
          mapCustomerId: ({ source, id }) => `${source}:${id}`,
        }),
      ],
    });
    try {
      const { headers, email } = await signUp(app.auth);
      const none = await apiError(app.auth.api.tallyCustomerSync({ headers }));
      expect(none.status).toBe(400);
      expect(none.body['message']).toContain('no active organization');

      const org = await app.auth.api.createOrganization({
        headers,
        body: { name: 'Acme Inc', slug: `acme-${process.pid}` },
      });
      const synced = await app.auth.api.tallyCustomerSync({ headers });
      expect(synced).toMatchObject({ id: `organization:${org?.id}`, name: 'Acme Inc' });
      expect(synced.email).not.toBe(email);
      await app.auth.api.tallyUsageConsume({ headers, body: { key: 'api_calls', amount: 2 } });
      const stored = await call(
        tallyServer.base,
        'GET',
        `/v1/usage/api_calls/balance?customerId=${encodeURIComponent(`organization:${org?.id}`)}`,
        { key: tallyServer.keys.test.server },
      );
      expect(stored.body).toMatchObject({ consumed: 2 });
    } finally {
      await app.close();
    }
  });

  it('team: the active team, named after it; 400 without one', async () => {
    const app = await startAuthApp({
      emailAndPassword: { enabled: true },
      // After the organization plugin or before it: the order does not matter.
      plugins: [
        tally({ ...pluginOptions(), customerId: 'team' }),
        organization({ teams: { enabled: true } }),
      ],
    });
    try {
      const { headers, userId } = await signUp(app.auth);
      const none = await apiError(app.auth.api.tallyCustomerSync({ headers }));
      expect(none.status).toBe(400);
      expect(none.body['message']).toContain('no active team');
      const org = await app.auth.api.createOrganization({
        headers,
        body: { name: 'Team Org', slug: `team-org-${process.pid}` },
      });
      const team = await app.auth.api.createTeam({
        headers,
        body: { name: 'Platform', organizationId: org?.id as string },
      });
      await app.auth.api.addTeamMember({ headers, body: { teamId: team.id, userId } });
      await app.auth.api.setActiveTeam({ headers, body: { teamId: team.id } });
      expect(await app.auth.api.tallyCustomerSync({ headers })).toMatchObject({
        id: team.id,
        name: 'Platform',
      });
    } finally {
      await app.close();
    }
  });

  it('resolveCustomerId answers the final id and bypasses mapCustomerId', async () => {
    const app = await startAuthApp({
      emailAndPassword: { enabled: true },
      plugins: [
        tally({
          ...pluginOptions(),
          resolveCustomerId: async (session) => `acct:${session.user.email}`,
          mapCustomerId: ({ id }) => `mapped:${id}`,
        }),
      ],
    });
    try {
      const { headers, email } = await signUp(app.auth);
      expect(await app.auth.api.tallyCustomerSync({ headers })).toMatchObject({
        id: `acct:${email}`,
      });
    } finally {
      await app.close();
    }
  });

  it('a function source is used unchanged, or mapped when mapCustomerId is set', async () => {
    const source = (session: { user: { id: string } }) => `ws-${session.user.id}`;
    const plain = await startAuthApp({
      emailAndPassword: { enabled: true },
      plugins: [tally({ ...pluginOptions(), customerId: source })],
    });
    const mapped = await startAuthApp({
      emailAndPassword: { enabled: true },
      plugins: [
        tally({
          ...pluginOptions(),
          customerId: source,
          mapCustomerId: ({ source: kind, id }) => `${kind}/${id}`,
        }),
      ],
    });
    try {
      const a = await signUp(plain.auth);
      expect(await plain.auth.api.tallyCustomerSync({ headers: a.headers })).toMatchObject({
        id: `ws-${a.userId}`,
      });
      const b = await signUp(mapped.auth);
      expect(await mapped.auth.api.tallyCustomerSync({ headers: b.headers })).toMatchObject({
        id: `custom/ws-${b.userId}`,
      });
    } finally {
      await plain.close();
      await mapped.close();
    }
  });

  it('init refuses an organization or team source without the organization plugin', async () => {
    // Better Auth runs init when it builds its context; an application awaiting it (or
    // serving its first request) fails with the message.
    const withoutOrganization = betterAuth({
      database: memoryAdapter({}),
      plugins: [tally({ ...pluginOptions(), customerId: 'organization' })],
    });
    await expect(withoutOrganization.$context).rejects.toThrow(
      /organization plugin provides: add organization\(\) to plugins/,
    );
    const withoutTeams = betterAuth({
      database: memoryAdapter({}),
      plugins: [organization(), tally({ ...pluginOptions(), customerId: 'team' })],
    });
    await expect(withoutTeams.$context).rejects.toThrow(/teams: \{ enabled: true \}/);
  });

  it('the opt-in sign-up hook creates the customer with name and email', async () => {
    const app = await startAuthApp({
      emailAndPassword: { enabled: true },
      plugins: [tally({ ...pluginOptions(), syncCustomerOnSignUp: true })],
    });
    try {
      const { userId, email } = await signUp(app.auth, 'Signed Up');
      const stored = await tallyCustomer(userId);
      expect(stored.status).toBe(200);
      expect(stored.body).toMatchObject({ id: userId, name: 'Signed Up', email });
    } finally {
      await app.close();
    }
  });
});

describe('Tally unreachable', () => {
  it('answers 502 TALLY_UNREACHABLE', async () => {
    const port = await closedPort();
    const app = await startAuthApp({
      emailAndPassword: { enabled: true },
      plugins: [tally({ apiKey: 'sk_test_unused', baseUrl: `http://127.0.0.1:${port}` })],
    });
    try {
      const { headers } = await signUp(app.auth);
      const failed = await apiError(app.auth.api.tallyHas({ headers, body: { key: 'sso' } }));
      expect(failed.status).toBe(502);
      expect(failed.body).toMatchObject({ code: 'TALLY_UNREACHABLE' });
      expect(failed.body['message']).toContain('ECONNREFUSED');
    } finally {
      await app.close();
    }
  });
});

/** A loopback port nothing listens on (one the kernel just handed out and took back). */
async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

describe('rate limits', () => {
  it('a 429 rate_limited passes through with Retry-After', async () => {
    const limited = await startServerProcess({
      config: CONFIG,
      env: { TALLY_RATE_LIMIT_SERVER: '4' },
    });
    const app = await startAuthApp({
      emailAndPassword: { enabled: true },
      plugins: [tally({ apiKey: limited.keys.test.server, baseUrl: limited.base })],
    });
    try {
      const { headers } = await signUp(app.auth);
      const cookie = headers.get('cookie') ?? '';
      let last: Response | undefined;
      for (let i = 0; i < 6; i++) {
        last = await fetch(`${app.origin}/api/auth/tally/has`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', origin: app.origin, cookie },
          body: JSON.stringify({ key: 'sso' }),
        });
        if (last.status === 429) break;
        expect(last.status).toBe(200);
      }
      expect(last?.status).toBe(429);
      expect(Number(last?.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      expect(await last?.json()).toMatchObject({ code: 'rate_limited' });
    } finally {
      await app.close();
      await limited.stop();
    }
  });
});
