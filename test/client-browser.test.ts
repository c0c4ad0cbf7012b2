/**
 * A real browser calls Tally from a web page (docs/browser.md): Debian's `chromium`,
 * driven by playwright-core, loads a page from one origin and calls `has` and `balance`
 * on Tally, another origin, with the client key and a customer token. From the allowed
 * origin the answers arrive; from another origin the browser blocks them; a server
 * route (consume) is blocked by its preflight and never reaches Tally.
 *
 * Skipped, saying so, only when no chromium binary is installed
 * (`apt-get install chromium`; TALLY_CHROMIUM names another binary).
 */
import http from 'node:http';
import type net from 'node:net';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findChromium } from './support/chromium.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const CHROMIUM = findChromium('client-browser.test.ts');

const CONFIG = {
  entitlements: { reports: { type: 'feature' }, api_calls: { type: 'meter' } },
  products: {
    free: { default: true, entitlements: { reports: true, api_calls: { included: 100 } } },
  },
};

/** A page server on 127.0.0.1, port 0: its origin is `http://127.0.0.1:<port>`. */
async function pageServer(): Promise<{ server: http.Server; origin: string }> {
  const server = http.createServer((_req, res) => {
    res.setHeader('content-type', 'text/html');
    res.end('<!doctype html><title>App</title><h1>App</h1>');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, origin: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}` };
}

/** What a `fetch` from the page gave: the status and JSON body, or the error it threw. */
type PageFetch = { status: number; body: unknown } | { error: string };

function pageFetch(
  page: Page,
  url: string,
  init: { method?: string; headers: Record<string, string>; body?: string },
): Promise<PageFetch> {
  return page.evaluate(
    async ({ url, init }) => {
      try {
        const response = await fetch(url, init);
        return { status: response.status, body: await response.json() };
      } catch (error) {
        return { error: String(error) };
      }
    },
    { url, init },
  );
}

describe.skipIf(CHROMIUM === undefined)('calling Tally from a web page', () => {
  let tally: ServerProcess;
  let allowed: { server: http.Server; origin: string };
  let other: { server: http.Server; origin: string };
  let browser: Browser;

  beforeAll(async () => {
    allowed = await pageServer();
    other = await pageServer();
    tally = await startServerProcess({
      config: { ...CONFIG, client: { allowedOrigins: [allowed.origin] } },
    });
    // Tally answers on `localhost`: another host than the pages', so every call is cross-origin.
    browser = await chromium.launch({ executablePath: CHROMIUM as string, args: ['--no-sandbox'] });
  }, 60_000);
  afterAll(async () => {
    await browser?.close();
    await tally?.stop();
    for (const page of [allowed, other])
      await new Promise<void>((resolve) =>
        page === undefined ? resolve() : page.server.close(() => resolve()),
      );
  });

  async function openPage(origin: string): Promise<Page> {
    const page = await browser.newPage();
    await page.goto(`${origin}/`);
    return page;
  }

  const tallyUrl = (path: string) => `http://localhost:${tally.port}${path}`;

  async function token(customerId: string): Promise<string> {
    const minted = await call(tally.base, 'POST', '/v1/client-tokens', {
      key: tally.keys.test.server,
      body: { customerId, ttlSeconds: 300 },
    });
    expect(minted.status).toBe(200);
    return minted.body.token as string;
  }

  it('an allowed origin reads has and balance with the client key and a token', async () => {
    const page = await openPage(allowed.origin);
    const headers = {
      'x-tally-key': tally.keys.test.client,
      'x-tally-customer-token': await token('web'),
    };
    expect(
      await pageFetch(page, tallyUrl('/v1/entitlements/reports/has?customerId=web'), { headers }),
    ).toEqual({ status: 200, body: true });
    const balance = await pageFetch(page, tallyUrl('/v1/usage/api_calls/balance?customerId=web'), {
      headers,
    });
    expect(balance).toMatchObject({ status: 200, body: { balance: 100, included: 100 } });
    // The page can read an error too, and the token holds it to its own customer.
    expect(
      await pageFetch(page, tallyUrl('/v1/entitlements/reports/has?customerId=other'), { headers }),
    ).toMatchObject({ status: 403, body: { code: 'customer_token_mismatch' } });
    // Its rate-limit headers are exposed to the page.
    const remaining = await page.evaluate(
      async ({ url, headers }) =>
        (await fetch(url, { headers })).headers.get('x-ratelimit-remaining'),
      { url: tallyUrl('/v1/entitlements/reports/has?customerId=web'), headers },
    );
    expect(Number(remaining)).toBeGreaterThan(0);
    await page.close();
  });

  it('another origin is blocked by the browser', async () => {
    const page = await openPage(other.origin);
    const headers = { 'x-tally-key': tally.keys.test.client };
    for (const path of [
      '/v1/entitlements/reports/has?customerId=web',
      '/v1/usage/api_calls/balance?customerId=web',
    ]) {
      const answer = await pageFetch(page, tallyUrl(path), { headers });
      expect(answer, path).toEqual({ error: 'TypeError: Failed to fetch' });
    }
    await page.close();
  });

  it('a server route is blocked, and the request never reaches Tally', async () => {
    const page = await openPage(allowed.origin);
    const consume = await pageFetch(page, tallyUrl('/v1/usage/api_calls/consume'), {
      method: 'POST',
      headers: { 'x-tally-key': tally.keys.test.client, 'content-type': 'application/json' },
      body: JSON.stringify({ customerId: 'web', amount: 5 }),
    });
    expect(consume).toEqual({ error: 'TypeError: Failed to fetch' });
    // Even a leaked server key gets nowhere from a page: its replies carry no CORS headers.
    const withServerKey = await pageFetch(
      page,
      tallyUrl('/v1/entitlements/reports/has?customerId=web'),
      { headers: { 'x-tally-key': tally.keys.test.server } },
    );
    expect(withServerKey).toEqual({ error: 'TypeError: Failed to fetch' });
    await page.close();
    const balance = await call(tally.base, 'GET', '/v1/usage/api_calls/balance?customerId=web', {
      key: tally.keys.test.server,
    });
    expect(balance.body).toMatchObject({ balance: 100, consumed: 0 });
  });
});
