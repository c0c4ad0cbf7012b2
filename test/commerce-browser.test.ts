/**
 * A real browser buys a plan: Debian's `chromium`, driven by playwright-core (no browser
 * download), opens the checkout URL Tally answered, presses Subscribe on the embedded
 * sandbox's page, lands on the success URL, and the customer's entitlement flips.
 *
 * Skipped, saying so, only when no chromium binary is installed
 * (`apt-get install chromium`; TALLY_CHROMIUM names another binary).
 */
import http from 'node:http';
import type net from 'node:net';
import { chromium } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findChromium } from './support/chromium.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

const CHROMIUM = findChromium('commerce-browser.test.ts');

const CONFIG = {
  entitlements: { reports: { type: 'feature' } },
  products: {
    free: { default: true, entitlements: {} },
    pro: {
      name: 'Pro',
      price: { amount: 2000, currency: 'usd', interval: 'month' },
      entitlements: { reports: true },
    },
  },
};

describe.skipIf(CHROMIUM === undefined)('buying a plan in a browser', () => {
  let server: ServerProcess;
  let app: http.Server;
  let appUrl: string;
  beforeAll(async () => {
    server = await startServerProcess({ config: CONFIG });
    // The application's success page, where the checkout sends the browser back.
    app = http.createServer((_req, res) =>
      res.end('<!doctype html><title>Thanks</title><h1>Thanks</h1>'),
    );
    await new Promise<void>((resolve) => app.listen(0, '127.0.0.1', resolve));
    appUrl = `http://127.0.0.1:${(app.address() as net.AddressInfo).port}`;
  }, 60_000);
  afterAll(async () => {
    await server?.stop();
    await new Promise<void>((resolve) =>
      app === undefined ? resolve() : app.close(() => resolve()),
    );
  });

  it('opens the checkout URL, presses Subscribe, and has() flips', async () => {
    const key = server.keys.test.server;
    const has = async () =>
      (await call(server.base, 'GET', '/v1/entitlements/reports/has?customerId=web', { key }))
        .body as boolean;
    expect(await has()).toBe(false);
    const checkout = await call(server.base, 'POST', '/v1/checkout', {
      key,
      body: {
        customerId: 'web',
        productKey: 'pro',
        successUrl: `${appUrl}/thanks`,
        cancelUrl: `${appUrl}/cancel`,
      },
    });
    expect(checkout.status).toBe(200);
    const browser = await chromium.launch({
      executablePath: CHROMIUM as string,
      args: ['--no-sandbox'],
    });
    try {
      const page = await browser.newPage();
      await page.goto(checkout.body.url as string);
      expect(await page.textContent('body')).toContain('Pro');
      await Promise.all([
        page.waitForURL(`${appUrl}/thanks`),
        page.getByRole('button', { name: /subscribe/i }).click(),
      ]);
      expect(await page.textContent('h1')).toBe('Thanks');
    } finally {
      await browser.close();
    }
    const deadline = Date.now() + 15_000;
    while (!(await has()) && Date.now() < deadline)
      await new Promise((resolve) => setTimeout(resolve, 50));
    expect(await has()).toBe(true);
  }, 60_000);
});
