/**
 * What the benchmark sends: one scenario per Tally route worth pricing, each with the
 * bare endpoint it is compared against and the target it is held to.
 *
 * Every request is pre-built (autocannon's `requests` list, one entry per customer, no
 * per-request `setupRequest` closure), because building requests in JavaScript caps the
 * load generator well below the bare server. The bare server gets byte-for-byte the same
 * requests (same path, headers and body), only on another port, so the HTTP parsing cost
 * on both sides is equal.
 */
import type autocannon from 'autocannon';

/** Customers the requests are spread over (`cust-0` … `cust-9999`). */
export const CUSTOMER_COUNT = 10_000;

/** The billing configuration pushed to Tally before measuring. */
export const BENCH_CONFIG = {
  entitlements: {
    sso: { type: 'feature' },
    seats: { type: 'limit' },
    api_calls: { type: 'meter', reset: 'month' },
  },
  products: {
    free: {
      name: 'Free',
      default: true,
      entitlements: { sso: true, api_calls: { included: 1_000_000_000 }, seats: { included: 5 } },
    },
  },
} as const;

export interface BenchKeys {
  readonly server: string;
  readonly client: string;
}

export type Target =
  | { readonly kind: 'ratio'; readonly min: number }
  /** Latency is only comparable at a fixed load shape (Little's law), so the target names it. */
  | { readonly kind: 'p99'; readonly maxMs: number; readonly atConnections: number; readonly atPipelining: number };

export interface Scenario {
  readonly name: string;
  readonly method: 'GET' | 'POST';
  /** Shown in the report; `{id}` stands for the customer id. */
  readonly path: string;
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

function consumeRequest(customerId: string, keys: BenchKeys): autocannon.Request {
  return {
    method: 'POST',
    path: '/v1/usage/api_calls/consume',
    headers: { 'x-tally-key': keys.server, 'content-type': 'application/json' },
    body: JSON.stringify({ customerId, amount: 1 }),
  };
}

const CONSUME = {
  method: 'POST',
  path: '/v1/usage/api_calls/consume {"customerId":"{id}","amount":1}',
  build: consumeRequest,
} as const;

export const SCENARIOS: readonly Scenario[] = [
  {
    name: 'has',
    method: 'GET',
    path: '/v1/entitlements/sso/has?customerId={id}',
    targets: [
      { kind: 'ratio', min: 0.6 },
      { kind: 'p99', maxMs: 2, atConnections: 50, atPipelining: 1 },
    ],
    fullOnly: false,
    build: (id, keys) => getRequest(`/v1/entitlements/sso/has?customerId=${id}`, keys.client),
  },
  {
    name: 'balance',
    method: 'GET',
    path: '/v1/usage/api_calls/balance?customerId={id}',
    targets: [],
    fullOnly: false,
    build: (id, keys) => getRequest(`/v1/usage/api_calls/balance?customerId=${id}`, keys.server),
  },
  { name: 'consume', ...CONSUME, targets: [{ kind: 'ratio', min: 0.4 }], fullOnly: false },
  { name: 'consume-256', ...CONSUME, connections: 256, targets: [{ kind: 'ratio', min: 0.4 }], fullOnly: true },
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
export function sliceForConnections(requests: readonly autocannon.Request[], connections: number): autocannon.Request[][] {
  const slices: autocannon.Request[][] = Array.from({ length: connections }, () => []);
  requests.forEach((request, i) => slices[i % connections]?.push(request));
  return slices;
}
