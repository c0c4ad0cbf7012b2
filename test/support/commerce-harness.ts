/**
 * A Tally server process pointed at a Stripe sandbox that runs in the test process, as it
 * would be at Stripe (STRIPE_SECRET_KEY, STRIPE_WEBHOOK_SECRET, STRIPE_API_URL), so tests
 * move the sandbox's clock, use its test clocks and keep it across Tally restarts.
 *
 * Tally reaches the sandbox through a pass-through proxy the test can arm: after the
 * sandbox has answered a matching request, the proxy kills Tally (SIGKILL) instead of
 * passing the answer on, which is a crash between a processor call and what Tally does
 * with its answer.
 */
import http from 'node:http';
import net from 'node:net';
import { expect } from 'vitest';
import { startStripeSandbox, type StripeSandbox } from '../../src/commerce/stripe-sandbox/index.js';
import { call, startServerProcess, tempDataDir, type ServerProcess } from './server-process.js';

export const URLS = {
  successUrl: 'https://app.example.com/done',
  cancelUrl: 'https://app.example.com/cancel',
};

export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** Polls `probe` until it returns true (events are delivered asynchronously). */
export async function eventually(probe: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    if (await probe()) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** Forwards every request to the sandbox; `crashOn` arms the crash described above. */
class CrashingProxy {
  crashOn: ((method: string, path: string) => boolean) | null = null;
  onCrash: (() => Promise<void>) | null = null;
  private server: http.Server | null = null;

  constructor(private readonly target: number) {}

  async listen(): Promise<number> {
    this.server = http.createServer((req, res) => this.forward(req, res));
    await new Promise<void>((resolve) => this.server?.listen(0, '127.0.0.1', resolve));
    return (this.server.address() as net.AddressInfo).port;
  }

  private forward(req: http.IncomingMessage, res: http.ServerResponse): void {
    const upstream = http.request(
      {
        host: '127.0.0.1',
        port: this.target,
        method: req.method,
        path: req.url,
        headers: req.headers,
      },
      (answer) => {
        const chunks: Buffer[] = [];
        answer.on('data', (chunk: Buffer) => chunks.push(chunk));
        answer.on('end', () => {
          const crash = this.crashOn;
          if (crash?.(req.method ?? '', req.url ?? '')) {
            this.crashOn = null;
            void this.onCrash?.().then(() => res.destroy());
            return;
          }
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          res.end(Buffer.concat(chunks));
        });
      },
    );
    upstream.on('error', () => res.destroy());
    req.pipe(upstream);
  }

  close(): Promise<void> {
    return new Promise((resolve) => {
      this.server?.closeAllConnections();
      this.server?.close(() => resolve());
    });
  }
}

export interface Harness {
  server: ServerProcess;
  readonly sandbox: StripeSandbox;
  readonly proxy: CrashingProxy;
  /** The sandbox's wall clock (milliseconds); tests move it. */
  now: number;
  readonly webhookEndpointId: string;
  restart(): Promise<void>;
  close(): Promise<void>;
}

export async function startHarness(config: unknown, startMs: number): Promise<Harness> {
  const state = { now: startMs };
  const sandbox = await startStripeSandbox({
    now: () => state.now,
    webhooks: { maxAttempts: 30, retryDelayMs: 100, timeoutMs: 5000 },
  });
  const proxy = new CrashingProxy(sandbox.port);
  const proxyPort = await proxy.listen();
  const port = await freePort();
  const endpoint = await sandbox.stripe().webhookEndpoints.create({
    url: `http://127.0.0.1:${port}/v1/processor/stripe/webhook`,
    enabled_events: ['*'],
  });
  const env = {
    PORT: String(port),
    STRIPE_SECRET_KEY: sandbox.secretKey,
    STRIPE_WEBHOOK_SECRET: endpoint.secret ?? '',
    STRIPE_API_URL: `http://127.0.0.1:${proxyPort}`,
  };
  const dataDir = tempDataDir('commerce2');
  const server = await startServerProcess({ dataDir, env, config });
  const harness: Harness = {
    server,
    sandbox,
    proxy,
    get now() {
      return state.now;
    },
    set now(value: number) {
      state.now = value;
    },
    webhookEndpointId: endpoint.id,
    async restart() {
      harness.server = await startServerProcess({ dataDir, env, keys: harness.server.keys });
    },
    async close() {
      await harness.server.stop();
      await proxy.close();
      await sandbox.close();
    },
  };
  proxy.onCrash = () => harness.server.kill9();
  return harness;
}

/** A request with the test environment's server key. */
export function api(h: Harness, method: string, path: string, body?: unknown) {
  return call(h.server.base, method, path, {
    key: h.server.keys.test.server,
    ...(body === undefined ? {} : { body }),
  });
}

/** Opens a checkout for `productKey`, pays it, and waits until Tally has the result. */
export async function buy(h: Harness, customerId: string, productKey: string): Promise<void> {
  const checkout = await api(h, 'POST', '/v1/checkout', { customerId, productKey, ...URLS });
  expect(checkout.status, JSON.stringify(checkout.body)).toBe(200);
  const paid = await fetch(`${checkout.body.url as string}/pay`, {
    method: 'POST',
    redirect: 'manual',
  });
  expect(paid.status).toBe(303);
  await h.sandbox.deliveries.idle();
}
