/**
 * The Stripe sandbox: a Stripe-compatible HTTP server on loopback that the real `stripe`
 * SDK talks to, for development and tests where Stripe itself cannot be reached.
 *
 *     const sandbox = await startStripeSandbox();
 *     const stripe = sandbox.stripe();            // new Stripe(key, { host, port, protocol: 'http'
 *     })
 *     await stripe.customers.create({ email: 'a@example.com' });
 *     await sandbox.close();
 *
 * It keeps everything in memory, bounded. docs/stripe-sandbox.md says what it models
 * and what it does not.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import Stripe from 'stripe';
import { wallClock } from './clock.js';
import { IdempotencyStore } from './idempotency.js';
import { buildSandboxRouter } from './routes.js';
import { requestListener, type SandboxParts } from './server.js';
import { DEFAULT_LIMITS, SandboxState, type SandboxLimits } from './state.js';
import { randomToken } from './store.js';
import { WebhookDeliveries, type DeliveryOptions } from './webhooks.js';

export type {
  DeliveryAttempt,
  DeliveryMode,
  DeliveryOptions,
  WebhookDeliveries,
} from './webhooks.js';
export type { SandboxLimits } from './state.js';

export interface StripeSandboxOptions {
  /** Port to listen on; 0 (the default) picks a free one. */
  readonly port?: number;
  /** Only loopback: the sandbox speaks plain HTTP and has no real users. */
  readonly host?: '127.0.0.1';
  /** The sandbox's wall clock in milliseconds (default `Date.now`). */
  readonly now?: () => number;
  /** The secret key clients must present (default: a fresh `sk_test_…`). */
  readonly secretKey?: string;
  /** Webhook retry policy. */
  readonly webhooks?: DeliveryOptions;
  /** Object and event limits. */
  readonly limits?: Partial<SandboxLimits>;
}

export interface StripeSandbox {
  /** `http://127.0.0.1:<port>`. */
  readonly url: string;
  readonly port: number;
  readonly secretKey: string;
  /** A `stripe` client pointed at the sandbox. */
  stripe(config?: Stripe.StripeConfig): Stripe;
  /** The signing secret of a webhook endpoint (also returned when it is created). */
  webhookSecret(endpointId: string): string | undefined;
  /** Webhook delivery: test switches (`mode`, `redeliver`), `idle()`, the attempt log. */
  readonly deliveries: WebhookDeliveries;
  close(): Promise<void>;
}

function listen(server: http.Server, port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve((server.address() as AddressInfo).port);
    });
  });
}

/** Runs `task` on a later turn, then delivers the events it raised. */
function scheduler(
  parts: () => SandboxParts | undefined,
  pending: Set<NodeJS.Immediate>,
): (task: () => void) => void {
  return (task) => {
    const handle = setImmediate(() => {
      pending.delete(handle);
      const current = parts();
      if (current === undefined) return;
      try {
        task();
      } finally {
        current.deliveries.dispatch(current.state.events.drain());
      }
    });
    pending.add(handle);
  };
}

export async function startStripeSandbox(
  options: StripeSandboxOptions = {},
): Promise<StripeSandbox> {
  const host = options.host ?? '127.0.0.1';
  const secretKey = options.secretKey ?? `sk_test_${randomToken(32)}`;
  if (!secretKey.startsWith('sk_test_'))
    throw new Error('the sandbox secret key must start with sk_test_');
  let parts: SandboxParts | undefined;
  const immediates = new Set<NodeJS.Immediate>();
  const server = http.createServer(requestListener(() => parts));
  const port = await listen(server, options.port ?? 0, host);
  const url = `http://${host}:${port}`;
  const clock = wallClock(options.now);
  const state = new SandboxState(
    clock,
    url,
    scheduler(() => parts, immediates),
    { ...DEFAULT_LIMITS, ...options.limits },
  );
  const deliveries = new WebhookDeliveries(state, options.webhooks);
  parts = {
    state,
    router: buildSandboxRouter(),
    idempotency: new IdempotencyStore(() => clock.nowSeconds()),
    deliveries,
    secretKey,
  };
  return {
    url,
    port,
    secretKey,
    deliveries,
    stripe: (config = {}) =>
      new Stripe(secretKey, { host, port, protocol: 'http', telemetry: false, ...config }),
    webhookSecret: (endpointId) => state.webhookSecrets.get(endpointId),
    close: async () => {
      parts = undefined;
      for (const handle of immediates) clearImmediate(handle);
      deliveries.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
