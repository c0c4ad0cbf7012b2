/**
 * What the benchmark sends: one scenario per Tally route worth pricing, each with the
 * bare endpoint it is compared against and the target it is held to.
 *
 * Every request is pre-built (autocannon's `requests` list, one entry per customer, no
 * per-request `setupRequest` closure), because building requests in JavaScript caps the
 * load generator well below the bare server. The bare server gets byte-for-byte the same
 * requests (same path, headers and body), only on another port, so the HTTP parsing cost
 * on both sides is equal.
 *
 * Each scenario names the Tally process it runs against (see tallies.ts): the bench's
 * usual Tally, rate limiting on with a limit no run can reach, a second one with rate
 * limiting off, which only `has-unlimited` uses to price the limiter on the `has` route,
 * or a third with three webhook endpoints registered, which only `consume-webhooks` uses
 * to price event fan-out on the durable path.
 */
import type autocannon from 'autocannon';

/** Customers the requests are spread over (`cust-0` … `cust-9999`). */
export const CUSTOMER_COUNT = 10_000;

/** The billing configuration pushed to Tally before measuring. */
export const BENCH_CONFIG = {
  entitlements: {
    sso: { type: 'feature' },
    audit_log: { type: 'feature' },
    exports: { type: 'feature' },
    seats: { type: 'limit' },
    api_calls: { type: 'meter', reset: 'month' },
    tokens: { type: 'meter', reset: 'day' },
  },
  products: {
    free: {
      name: 'Free',
      default: true,
      entitlements: {
        sso: true,
        exports: true,
        api_calls: { included: 1_000_000_000 },
        tokens: { included: 1_000_000 },
        seats: { included: 5 },
      },
    },
  },
} as const;

export interface BenchKeys {
  readonly server: string;
  readonly client: string;
}

/** Which Tally process a scenario measures; tallies.ts says how each is started. */
export type TallyInstance = 'rate-limited' | 'rate-limit-off' | 'webhooks';

export type Target =
  /** The median round ratio tally/bare; judged only at `atConnections` when given. */
  | { readonly kind: 'ratio'; readonly min: number; readonly atConnections?: number }
  /**
   * This scenario's Tally req/s ÷ another scenario's Tally req/s, both measured in this
   * run; only meaningful when the two are interleaved (`interleaveWith`), and `what`
   * says what the difference between them prices.
   */
  | {
      readonly kind: 'vsScenario';
      readonly scenario: string;
      readonly min: number;
      readonly what: string;
      /**
       * The two differ by the three `X-RateLimit-*` reply lines, which the load generator
       * parses too: measure a second bare server that sends them (bare-server.ts,
       * RATE_LIMIT_HEADERS) in the same segments and judge the ratio net of that cost.
       */
      readonly netOfRateLimitHeaders?: boolean;
    }
  /** Latency is only comparable at a fixed load shape (Little's law), so the target names it. */
  | {
      readonly kind: 'p99';
      readonly maxMs: number;
      readonly atConnections: number;
      readonly atPipelining: number;
    };

export interface Scenario {
  readonly name: string;
  readonly method: 'GET' | 'POST';
  /** Shown in the report; `{id}` stands for the customer id. */
  readonly path: string;
  readonly tally: TallyInstance;
  /**
   * Measure in the same alternating segments as this other scenario when both are
   * selected (same requests, same load shape, one shared bare ceiling), so a comparison
   * between their Tallies sees the same machine conditions.
   */
  readonly interleaveWith?: string;
  /** Fixed load shape for this scenario; otherwise the CLI's values apply. */
  readonly connections?: number;
  readonly pipelining?: number;
  readonly targets: readonly Target[];
  /** Only run with --full (or when named in --scenarios). */
  readonly fullOnly: boolean;
  readonly build: (customerId: string, keys: BenchKeys) => autocannon.Request;
}

function getRequest(path: string, key: string): autocannon.Request {
  return { method: 'GET', path, headers: { 'x-tally-key': key } };
}

/** The context request measured: 3 features, 2 meters, 1 limit, upserting the customer. */
function contextRequest(customerId: string, keys: BenchKeys): autocannon.Request {
  return {
    method: 'POST',
    path: '/v1/context',
    headers: { 'x-tally-key': keys.server, 'content-type': 'application/json' },
    body: JSON.stringify({
      customer: { id: customerId },
      features: ['sso', 'audit_log', 'exports'],
      usage: ['api_calls', 'tokens'],
      limits: ['seats'],
    }),
  };
}

function consumeRequest(customerId: string, keys: BenchKeys): autocannon.Request {
  return {
    method: 'POST',
    path: '/v1/usage/api_calls/consume',
    headers: { 'x-tally-key': keys.server, 'content-type': 'application/json' },
    body: JSON.stringify({ customerId, amount: 1 }),
  };
}

/** The `has` request for one customer; also the rate-limit header probe in tally-server.ts. */
export function hasRequest(customerId: string, keys: BenchKeys): autocannon.Request {
  return getRequest(`/v1/entitlements/sso/has?customerId=${customerId}`, keys.client);
}

const HAS = {
  method: 'GET',
  path: '/v1/entitlements/sso/has?customerId={id}',
  build: hasRequest,
} as const;

const CONSUME = {
  method: 'POST',
  path: '/v1/usage/api_calls/consume {"customerId":"{id}","amount":1}',
  tally: 'rate-limited',
  build: consumeRequest,
} as const;

export const SCENARIOS: readonly Scenario[] = [
  {
    name: 'has',
    ...HAS,
    tally: 'rate-limited',
    targets: [
      { kind: 'ratio', min: 0.8, atConnections: 256 },
      { kind: 'p99', maxMs: 2, atConnections: 50, atPipelining: 1 },
      {
        kind: 'vsScenario',
        scenario: 'has-unlimited',
        min: 0.95,
        what: 'rate limiting on vs off',
        netOfRateLimitHeaders: true,
      },
    ],
    fullOnly: false,
  },
  /** The same requests as `has`, against the Tally with rate limiting off: the limiter's price. */
  {
    name: 'has-unlimited',
    ...HAS,
    tally: 'rate-limit-off',
    interleaveWith: 'has',
    targets: [],
    fullOnly: false,
  },
  {
    name: 'balance',
    method: 'GET',
    path: '/v1/usage/api_calls/balance?customerId={id}',
    tally: 'rate-limited',
    targets: [],
    fullOnly: false,
    build: (id, keys) => getRequest(`/v1/usage/api_calls/balance?customerId=${id}`, keys.server),
  },
  {
    name: 'consume',
    ...CONSUME,
    targets: [{ kind: 'ratio', min: 0.55, atConnections: 256 }],
    fullOnly: false,
  },
  /**
   * The same requests as `consume`, against a Tally with three test webhook endpoints (one
   * answering at once, one slow, one down): what event fan-out costs the durable path.
   * Every first consume of a customer creates it, so every customer's `customer.created`
   * event is fanned out to all three while the run goes on. Run it with
   * `--scenarios consume,consume-webhooks` (or `--full`).
   */
  {
    name: 'consume-webhooks',
    ...CONSUME,
    tally: 'webhooks',
    interleaveWith: 'consume',
    targets: [
      {
        kind: 'vsScenario',
        scenario: 'consume',
        min: 0.9,
        what: 'three webhook endpoints (one slow, one down) vs none',
      },
    ],
    fullOnly: true,
  },
  {
    name: 'context',
    method: 'POST',
    path: '/v1/context {"customer":{"id":"{id}"},"features":[3],"usage":[2],"limits":[1]}',
    tally: 'rate-limited',
    targets: [{ kind: 'ratio', min: 0.45, atConnections: 256 }],
    fullOnly: false,
    build: contextRequest,
  },
];

/** One request per customer, in customer order. */
export function buildRequests(scenario: Scenario, keys: BenchKeys): autocannon.Request[] {
  const requests: autocannon.Request[] = [];
  for (let i = 0; i < CUSTOMER_COUNT; i++) requests.push(scenario.build(`cust-${i}`, keys));
  return requests;
}

/**
 * Splits the requests into one disjoint slice per connection (customer i goes to
 * connection i mod n), so no two connections ever hit the same customer and a
 * connection's pipelined window holds distinct customers: the load is spread, not
 * hammering one actor. Each slice must hold at least `pipelining` customers.
 */
export function sliceForConnections(
  requests: readonly autocannon.Request[],
  connections: number,
): autocannon.Request[][] {
  const slices: autocannon.Request[][] = Array.from({ length: connections }, () => []);
  requests.forEach((request, i) => slices[i % connections]?.push(request));
  return slices;
}
