/**
 * `tally/client`: a small typed HTTP client for Tally, for server-side code such as the
 * Better Auth plugin. It holds a server key, so it must never be bundled into browser
 * code. It depends on nothing but the platform's `fetch` and imports none of the service's
 * modules, so an application can use it without the service's own dependencies.
 *
 * Every method answers the parsed body of a 2xx answer. A non-2xx answer throws
 * `TallyApiError`, which keeps the status, the service's `code`, `error` message, the
 * whole body (a 429 `insufficient_balance` carries the balance fields) and the headers
 * (`Retry-After` of a rate limit). A request that gets no answer (connection refused,
 * timeout) throws `TallyConnectionError`.
 */
import type {
  Balance,
  CheckoutInput,
  ClientToken,
  ClientTokenInput,
  Context,
  ContextInput,
  Customer,
  CustomerUpsert,
  Limit,
  Page,
  Product,
  PulledConfig,
  Subscription,
  UsageInput,
  WebhookEndpoint,
  WebhookEndpointWithSecret,
  WebhookRegistration,
} from './types.js';

export type * from './types.js';
export {
  customerTokenSource,
  type MintedToken,
  type TokenSource,
  type TokenSourceOptions,
} from './token-source.js';

/** How long a request may take before it is abandoned, unless the options say otherwise. */
export const REQUEST_TIMEOUT_MS_DEFAULT = 10_000;

export interface TallyClientOptions {
  /** A server key (`sk_test_…` / `sk_live_…`); a client key can call only the reads. */
  readonly apiKey: string;
  /** The service's base URL, e.g. `http://localhost:8787` (a trailing slash is ignored). */
  readonly baseUrl: string;
  /** Milliseconds before a request is abandoned with `TallyConnectionError`. */
  readonly timeoutMs?: number;
  /** A fetch implementation; the global `fetch` by default. */
  readonly fetch?: typeof globalThis.fetch;
}

/** The service answered with a non-2xx status. */
export class TallyApiError extends Error {
  /** The catalog code (`insufficient_balance`, `rate_limited`, …), null if the body had none. */
  readonly code: string | null;

  constructor(
    readonly status: number,
    /** The parsed JSON body, or `{error: <status line>}` when the body was not JSON. */
    readonly body: Readonly<Record<string, unknown>>,
    readonly headers: Headers,
  ) {
    super(typeof body['error'] === 'string' ? body['error'] : `HTTP ${status}`);
    this.name = 'TallyApiError';
    this.code = typeof body['code'] === 'string' ? body['code'] : null;
  }
}

/** The request got no answer: the service is unreachable or took longer than the timeout. */
export class TallyConnectionError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'TallyConnectionError';
  }
}

const seg = encodeURIComponent;

/** A client of one Tally environment, authenticated with one key. */
export class TallyClient {
  readonly baseUrl: string;
  private readonly apiKey: string;
  private readonly timeoutMs: number;
  private readonly fetchImpl: typeof globalThis.fetch;

  /** Throws `TypeError` when the key is empty or the base URL is not http(s). */
  constructor(options: TallyClientOptions) {
    if (typeof options.apiKey !== 'string' || options.apiKey === '') {
      throw new TypeError('TallyClient: apiKey is required');
    }
    let url: URL;
    try {
      url = new URL(options.baseUrl);
    } catch {
      throw new TypeError(`TallyClient: baseUrl is not a URL: ${String(options.baseUrl)}`);
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') {
      throw new TypeError(`TallyClient: baseUrl must be http:// or https://, got ${url.href}`);
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, '');
    this.apiKey = options.apiKey;
    this.timeoutMs = options.timeoutMs ?? REQUEST_TIMEOUT_MS_DEFAULT;
    this.fetchImpl = options.fetch ?? globalThis.fetch;
  }

  /** Whether the customer has the entitlement (any type: see `/has`). */
  has(customerId: string, key: string): Promise<boolean> {
    return this.request('GET', `/v1/entitlements/${seg(key)}/has`, { query: { customerId } });
  }

  limit(customerId: string, key: string): Promise<Limit> {
    return this.request('GET', `/v1/entitlements/${seg(key)}/limit`, { query: { customerId } });
  }

  balance(customerId: string, key: string): Promise<Balance> {
    return this.request('GET', `/v1/usage/${seg(key)}/balance`, { query: { customerId } });
  }

  /** Draws usage; a short balance throws `TallyApiError` 429 `insufficient_balance`. */
  consume(input: UsageInput): Promise<Balance> {
    const { key, ...body } = input;
    return this.request('POST', `/v1/usage/${seg(key)}/consume`, { body });
  }

  refund(input: UsageInput): Promise<Balance> {
    const { key, ...body } = input;
    return this.request('POST', `/v1/usage/${seg(key)}/refund`, { body });
  }

  /** Creates the customer or updates the fields given. */
  upsertCustomer(input: CustomerUpsert): Promise<Customer> {
    return this.request('POST', '/v1/customers', { body: input });
  }

  getCustomer(id: string): Promise<Customer> {
    return this.request('GET', `/v1/customers/${seg(id)}`);
  }

  /** Upserts the customer and answers the named entitlements in one call. */
  context(input: ContextInput): Promise<Context> {
    return this.request('POST', '/v1/context', { body: input });
  }

  /** Opens a hosted checkout and answers its URL. */
  checkout(input: CheckoutInput): Promise<{ readonly url: string }> {
    return this.request('POST', '/v1/checkout', { body: input });
  }

  /** The configuration last pushed to the key's environment; 404 `config_not_found` before. */
  pull(): Promise<PulledConfig> {
    return this.request('GET', '/v1/sync/pull');
  }

  plans(): Promise<{ readonly data: readonly Product[] }> {
    return this.request('GET', '/v1/plans');
  }

  subscriptions(customerId: string, page: PageQuery = {}): Promise<Page<Subscription>> {
    return this.request('GET', '/v1/subscriptions', { query: { customerId, ...page } });
  }

  /**
   * Mints a short-lived token that lets a page read `customerId` (has, limit, balance)
   * with the environment's client key; mint a new one before `expiresAt`.
   */
  createClientToken(input: ClientTokenInput): Promise<ClientToken> {
    return this.request('POST', '/v1/client-tokens', { body: input });
  }

  /** Outbound webhook endpoints of the key's environment. */
  readonly webhooks = {
    /** Registers an endpoint, or answers the one already registered for (url, key). */
    register: (input: WebhookRegistration): Promise<WebhookEndpointWithSecret> =>
      this.request('POST', '/v1/webhooks', { body: input }),
    list: (): Promise<Page<WebhookEndpoint>> => this.request('GET', '/v1/webhooks'),
    get: (id: string): Promise<WebhookEndpoint> => this.request('GET', `/v1/webhooks/${seg(id)}`),
    delete: (id: string): Promise<void> => this.request('DELETE', `/v1/webhooks/${seg(id)}`),
  };

  /**
   * Sends one request with the key and answers the parsed JSON body (undefined for an
   * empty body). Throws `TallyApiError` for a non-2xx answer and `TallyConnectionError`
   * when no complete answer arrives within the timeout.
   */
  async request<T>(
    method: 'GET' | 'POST' | 'PUT' | 'DELETE',
    path: string,
    options: { query?: Readonly<Record<string, string | number | undefined>>; body?: unknown } = {},
  ): Promise<T> {
    const url = this.baseUrl + path + queryString(options.query);
    const headers: Record<string, string> = { 'x-tally-key': this.apiKey };
    if (options.body !== undefined) headers['content-type'] = 'application/json';
    let response: Response;
    let text: string;
    try {
      response = await this.fetchImpl(url, {
        method,
        headers,
        signal: AbortSignal.timeout(this.timeoutMs),
        ...(options.body === undefined ? {} : { body: JSON.stringify(options.body) }),
      });
      text = await response.text();
    } catch (error) {
      throw new TallyConnectionError(`${method} ${path}: ${describeFailure(error)}`, {
        cause: error,
      });
    }
    const parsed = parseJson(text);
    if (!response.ok) {
      const body: Record<string, unknown> =
        typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed)
          ? (parsed as Record<string, unknown>)
          : { error: `HTTP ${response.status} ${response.statusText}`.trim() };
      throw new TallyApiError(response.status, body, response.headers);
    }
    return parsed as T;
  }
}

export type PageQuery = {
  readonly limit?: number;
  readonly cursor?: string;
};

function queryString(query: Readonly<Record<string, string | number | undefined>> | undefined) {
  if (query === undefined) return '';
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined) params.set(name, String(value));
  }
  const text = params.toString();
  return text === '' ? '' : `?${text}`;
}

function parseJson(text: string): unknown {
  if (text === '') return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** fetch hides the socket error in `cause`: ECONNREFUSED says more than "fetch failed". */
function describeFailure(error: unknown): string {
  if (error instanceof Error && error.name === 'TimeoutError') return 'no answer in time';
  const cause =
    error instanceof Error
      ? (error.cause as { code?: unknown; message?: unknown } | undefined)
      : undefined;
  if (typeof cause?.code === 'string') return `cannot reach Tally (${cause.code})`;
  if (typeof cause?.message === 'string' && cause.message !== '') {
    return `cannot reach Tally (${cause.message})`;
  }
  return error instanceof Error ? error.message : String(error);
}
