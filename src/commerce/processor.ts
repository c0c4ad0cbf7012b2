/**
 * The payment processor Tally talks to: a `stripe` client and the secret that signs the
 * webhooks it sends. Everything else in Tally uses this handle and never learns whether
 * it is the embedded Stripe sandbox or the real Stripe API.
 *
 * Without a secret key the sandbox starts in this process, on its own loopback port, and
 * Tally registers its own webhook endpoint there (`/v1/processor/stripe/webhook` on
 * Tally's port), using that endpoint's signing secret. With a secret key the real API is
 * used (or, with an API URL, any Stripe-compatible server), and the webhook secret is the
 * operator's.
 */
import Stripe from 'stripe';
import { startStripeSandbox } from './stripe-sandbox/index.js';

/** Tally's webhook path; the processor posts its events here. */
export const STRIPE_WEBHOOK_PATH = '/v1/processor/stripe/webhook';

export interface ProcessorSettings {
  /** `STRIPE_SECRET_KEY`: absent → the embedded sandbox. */
  readonly secretKey?: string;
  /** `STRIPE_WEBHOOK_SECRET`: required with a secret key. */
  readonly webhookSecret?: string;
  /** `STRIPE_API_URL`: a Stripe-compatible server instead of api.stripe.com (http or https). */
  readonly apiUrl?: string;
}

export interface Processor {
  readonly name: 'stripe';
  readonly stripe: Stripe;
  /** The secret Stripe signs Tally's webhook deliveries with. */
  readonly webhookSecret: string;
  /** The embedded sandbox's address, or null when another server is used. */
  readonly sandboxUrl: string | null;
  close(): Promise<void>;
}

/** A processor call failed: the operation it belonged to answers 502 and changes nothing. */
export class ProcessorFailure extends Error {}

/** SDK retries on network errors and 5xx, each with the same idempotency key. */
const NETWORK_RETRIES = 2;

function clientFor(secretKey: string, apiUrl: string | undefined): Stripe {
  if (apiUrl === undefined)
    return new Stripe(secretKey, { maxNetworkRetries: NETWORK_RETRIES, telemetry: false });
  const url = new URL(apiUrl);
  const protocol = url.protocol === 'http:' ? 'http' : 'https';
  const port = url.port === '' ? (protocol === 'http' ? 80 : 443) : Number(url.port);
  return new Stripe(secretKey, {
    host: url.hostname,
    port,
    protocol,
    maxNetworkRetries: NETWORK_RETRIES,
    telemetry: false,
  });
}

/** Checks the settings before anything starts: a key without its webhook secret is refused. */
export function processorSettingsProblem(settings: ProcessorSettings): string | null {
  if (settings.secretKey === undefined)
    return settings.apiUrl === undefined ? null : 'STRIPE_API_URL needs STRIPE_SECRET_KEY';
  if (settings.webhookSecret === undefined)
    return (
      'STRIPE_SECRET_KEY needs STRIPE_WEBHOOK_SECRET (the signing secret of the webhook ' +
      'endpoint)'
    );
  if (settings.apiUrl !== undefined && !/^https?:\/\/[^/]+\/?$/.test(settings.apiUrl))
    return 'STRIPE_API_URL must be an http(s) origin such as http://127.0.0.1:12111';
  return null;
}

/**
 * Starts the sandbox (no key) or connects to the configured server; `tallyPort` receives the
 * webhooks.
 */
export async function startProcessor(
  settings: ProcessorSettings,
  tallyPort: number,
): Promise<Processor> {
  const problem = processorSettingsProblem(settings);
  if (problem !== null) throw new Error(problem);
  if (settings.secretKey !== undefined && settings.webhookSecret !== undefined) {
    return {
      name: 'stripe',
      stripe: clientFor(settings.secretKey, settings.apiUrl),
      webhookSecret: settings.webhookSecret,
      sandboxUrl: null,
      close: async () => undefined,
    };
  }
  const sandbox = await startStripeSandbox();
  try {
    const stripe = sandbox.stripe({ maxNetworkRetries: NETWORK_RETRIES });
    const endpoint = await stripe.webhookEndpoints.create({
      url: `http://127.0.0.1:${tallyPort}${STRIPE_WEBHOOK_PATH}`,
      enabled_events: ['*'],
    });
    if (endpoint.secret === undefined)
      throw new Error('the sandbox returned a webhook endpoint without its secret');
    return {
      name: 'stripe',
      stripe,
      webhookSecret: endpoint.secret,
      sandboxUrl: sandbox.url,
      close: () => sandbox.close(),
    };
  } catch (error) {
    await sandbox.close();
    throw error;
  }
}
