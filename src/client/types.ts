/**
 * The shapes Tally's HTTP API answers with, as the typed client returns them. They are the
 * public wire contract (docs/api.md), written out here so that an application importing
 * `tally/client` gets types without importing any of the service's own modules.
 */

/** A numeric allowance (`GET /v1/entitlements/{key}/limit`). */
export interface Limit {
  readonly limit: number;
  readonly included: number;
  readonly purchased: number;
  readonly expansionAllowed: boolean;
  readonly autoExpansionEnabled: boolean;
}

/** A meter's balance (`GET /v1/usage/{key}/balance`, consume and refund answers). */
export interface Balance {
  readonly balance: number;
  readonly included: number;
  readonly consumed: number;
  readonly overage: number;
  readonly overageAllowed: boolean;
  readonly overageEnabled: boolean;
  /** End of the current period, ISO 8601 UTC; null for a meter that never resets. */
  readonly resets: string | null;
}

export type MetadataValue = string | number | boolean | null;

/** A stored customer (`POST /v1/customers`, `GET /v1/customers/{id}`). */
export interface Customer {
  readonly id: string;
  readonly name: string | null;
  readonly email: string | null;
  readonly metadata: Readonly<Record<string, MetadataValue>>;
  readonly createdAt: string;
  readonly updatedAt: string;
}

/** The body of `POST /v1/customers`: only the fields given change. */
export interface CustomerUpsert {
  readonly id: string;
  readonly name?: string | null;
  readonly email?: string | null;
  /** Merged key by key; a null value removes the key. */
  readonly metadata?: Readonly<Record<string, MetadataValue>>;
}

/** The body of `POST /v1/context`. */
export interface ContextInput {
  readonly customer: CustomerUpsert;
  readonly features?: readonly string[] | undefined;
  readonly usage?: readonly string[] | undefined;
  readonly limits?: readonly string[] | undefined;
  readonly includePlans?: boolean | undefined;
  readonly includeSubscription?: boolean | undefined;
}

/** A product of the pushed configuration, as `GET /v1/plans` lists it. */
export interface Product {
  readonly key: string;
  readonly name?: string;
  readonly [field: string]: unknown;
}

/** A subscription record (`GET /v1/subscriptions`). */
export interface Subscription {
  readonly id: string;
  readonly customerId: string;
  readonly productKey: string;
  readonly status: string;
  readonly currentPeriodStart: string;
  readonly currentPeriodEnd: string;
  readonly cancelAtPeriodEnd?: boolean;
  readonly processor: string;
  readonly processorSubscriptionId: string;
}

/** The answer of `POST /v1/context`. */
export interface Context {
  readonly customer: Customer;
  readonly features: Readonly<Record<string, boolean>>;
  readonly usage: Readonly<Record<string, Balance>>;
  readonly limits: Readonly<Record<string, Limit>>;
  readonly plans?: readonly Product[];
  readonly subscription?: Subscription | null;
}

/** The body of `POST /v1/checkout`. */
export interface CheckoutInput {
  readonly customerId: string;
  readonly productKey: string;
  readonly successUrl: string;
  readonly cancelUrl: string;
}

/** The body of consume and refund. */
export interface UsageInput {
  readonly customerId: string;
  readonly key: string;
  readonly amount: number;
  readonly idempotencyKey?: string;
}

/** `events` of a webhook registration: `"*"`, a comma-separated list or an array of kinds. */
export type WebhookEvents = string | readonly string[];

/** The body of `POST /v1/webhooks`. */
export interface WebhookRegistration {
  readonly url: string;
  /** Registration key: (environment, url, key) names one endpoint. */
  readonly key: string;
  readonly events: WebhookEvents;
}

/** A registered webhook endpoint. */
export interface WebhookEndpoint {
  readonly id: string;
  readonly url: string;
  readonly key: string;
  readonly events: WebhookEvents;
  readonly status?: string;
  readonly [field: string]: unknown;
}

/** A registered endpoint with its signing secret (`whsec_…`), as registration answers it. */
export interface WebhookEndpointWithSecret extends WebhookEndpoint {
  readonly secret: string;
}

/** A forwarding entry of the configuration's `webhooks` section: a receiver in the app. */
export interface ForwardingEntry {
  readonly key: string;
  /** The receiver's path on the application's base URL, e.g. `/api/auth/tally`. */
  readonly path: string;
  readonly events: WebhookEvents;
  readonly integration?: string;
  readonly autoRegister?: boolean;
}

/** `GET /v1/sync/pull`: the pushed document as pushed, with its version. */
export interface PulledConfig {
  readonly config: {
    readonly webhooks?: {
      readonly devTunnel?: boolean;
      readonly forwarding?: readonly ForwardingEntry[];
    };
    readonly [section: string]: unknown;
  };
  readonly version: number;
  readonly pushedAt: string;
}

/** One page of a listing. */
export interface Page<T> {
  readonly data: readonly T[];
  readonly nextCursor: string | null;
}

/** `POST /v1/client-tokens`: what a page needs to read one customer with the client key. */
export interface ClientTokenInput {
  readonly customerId: string;
  /** 1 to 3600; default 900. */
  readonly ttlSeconds?: number;
}

/** A customer token: sent by the page as `x-tally-customer-token` beside the client key. */
export interface ClientToken {
  readonly token: string;
  readonly customerId: string;
  /** ISO 8601 UTC. */
  readonly expiresAt: string;
  readonly ttlSeconds: number;
}
