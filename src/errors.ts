/**
 * The error catalog: every error Tally answers, with its HTTP status and message.
 *
 * One place so that messages stay consistent, the error table of docs/api.md can be checked
 * against it (test/errors-catalog.test.ts), and nothing answers an ad-hoc error. The
 * shards' rejections are rendered with it too (src/api/shard-reply.ts). Every body is
 * `{"error": message, "code": key}`, the key being the entry's name here, so a program
 * can branch on `code` while a person reads `error`; some add the balance fields (429
 * insufficient balance, 409 refund too large).
 */

export interface CatalogEntry {
  readonly status: number;
  /** What a caller sees; `{name}` placeholders are filled from the error's params. */
  readonly message: string;
  /** When it happens, for the error table of docs/api.md. */
  readonly when: string;
}

export const ERRORS = {
  key_missing: {
    status: 401,
    message: 'x-tally-key header is required',
    when: 'no API key on a keyed route',
  },
  key_invalid: {
    status: 401,
    message: 'API key is invalid or revoked',
    when: 'unknown, malformed or revoked key',
  },
  server_key_required: {
    status: 403,
    message: 'this endpoint requires a server key',
    when: 'client key on a server-only route',
  },
  environment_key_required: {
    status: 403,
    message: 'the operator key cannot be used on environment routes',
    when: 'operator key (ak_) on an environment route',
  },
  operator_key_required: {
    status: 403,
    message: 'this endpoint requires the operator key',
    when: 'environment key (sk_/ck_) on an operator route (/v1/admin/...)',
  },
  relay_test_only: {
    status: 403,
    message:
      'the dev relay forwards test-environment events only: use a test server key (sk_test_…)',
    when: 'a live key, or a client key, on the dev relay (GET /v1/listen)',
  },
  relay_disabled: {
    status: 403,
    message: 'the dev relay is off: the test configuration sets webhooks.devTunnel to false',
    when: 'GET /v1/listen while the test configuration turns the relay off',
  },
  invalid_json: {
    status: 400,
    message: 'request body is not valid JSON',
    when: 'malformed JSON body',
  },
  invalid_framing: {
    status: 400,
    message: 'ambiguous message framing: {detail}',
    when:
      'several Content-Length headers, Content-Length with Transfer-Encoding, or a ' +
      'Content-Length that is not a number (the connection is closed)',
  },
  body_too_deep: {
    status: 400,
    message: 'request body nests arrays and objects deeper than {max} levels',
    when: 'a JSON body nested deeper than the limit',
  },
  content_type: {
    status: 400,
    message: 'content-type must be application/json',
    when: 'body sent with another content type',
  },
  invalid_request: {
    status: 400,
    message: '{detail}',
    when: 'a field is missing, of the wrong type or out of range; the message names the field',
  },
  invalid_query: {
    status: 400,
    message: '{detail}',
    when: 'bad query string or path (e.g. bad percent-encoding); names the parameter',
  },
  wrong_entitlement_type: {
    status: 400,
    message: '{key} is a {actual}, not a {expected}',
    when: 'a feature on /limit, a limit on /usage, ...',
  },
  idempotency_key_reused: {
    status: 400,
    message: 'idempotencyKey was reused with different parameters',
    when: 'same idempotency key, different amount',
  },
  expansion_not_allowed: {
    status: 400,
    message: "{field}: limit expansion is not allowed for {key} on the customer's plan",
    when: 'purchased > 0 or autoExpansionEnabled where expansion is not allowed',
  },
  overage_not_allowed: {
    status: 400,
    message: "overageEnabled: overage is not allowed for {key} on the customer's plan",
    when: 'overage enabled where the plan allows none',
  },
  too_many_lots: {
    status: 400,
    message: 'too many credit lots on {key}',
    when: 'a meter already holds the maximum number of lots',
  },
  invalid_signature: {
    status: 400,
    message: 'webhook signature is invalid: {detail}',
    when:
      'a processor webhook whose Stripe-Signature does not match its raw body, or is stale; ' +
      'nothing changes',
  },
  webhook_url_not_allowed: {
    status: 400,
    message: 'webhook url not allowed: {detail}',
    when:
      'a live endpoint that is not https, or a url whose host resolves to a loopback, ' +
      'private, link-local or otherwise non-public address',
  },
  product_not_purchasable: {
    status: 400,
    message: 'product {productKey} has no price',
    when: 'checkout of a free product',
  },
  invalid_config: {
    status: 400,
    message: '{detail}',
    when: 'a pushed configuration breaks the schema or a rule; lists every violation',
  },
  entitlement_not_found: {
    status: 404,
    message: 'entitlement {key} not found',
    when: "key not in the environment's configuration",
  },
  customer_not_found: {
    status: 404,
    message: 'customer {id} not found',
    when: 'GET of a customer the environment does not have',
  },
  contract_not_found: {
    status: 404,
    message: 'customer {customerId} has no contract',
    when: 'GET or DELETE of a contract that does not exist',
  },
  config_not_found: {
    status: 404,
    message: 'no billing configuration has been pushed to this environment',
    when: 'pull before any push',
  },
  not_configured: {
    status: 404,
    message:
      'no billing configuration has been pushed to the {environment} environment: push ' +
      'one with POST /v1/sync/push',
    when:
      'an entitlement route (has, limit, balance, consume, refund, settings, context) in an ' +
      'environment no configuration was pushed to',
  },
  product_not_found: {
    status: 404,
    message: 'product {productKey} not found',
    when: "checkout of a product the environment's configuration does not have",
  },
  key_not_found: {
    status: 404,
    message: 'key {id} not found',
    when: 'revoking a key id that does not exist',
  },
  webhook_not_found: {
    status: 404,
    message: 'webhook endpoint {id} not found',
    when: "an endpoint id the key's environment does not have",
  },
  snapshot_not_found: {
    status: 404,
    message: 'snapshot {id} not found',
    when: 'an unknown snapshot id',
  },
  route_not_found: { status: 404, message: 'no route {method} {path}', when: 'unknown path' },
  method_not_allowed: {
    status: 405,
    message: '{method} is not allowed on {path}',
    when: 'known path, wrong method (with Allow)',
  },
  refund_exceeds_usage: {
    status: 409,
    message: 'amount exceeds the refundable usage of {key}',
    when: 'usage refund beyond recorded usage of the current period',
  },
  subscription_exists: {
    status: 409,
    message:
      'customer {customerId} already has an active subscription: change its plan with ' +
      'POST /v1/subscriptions/change',
    when: 'checkout of a recurring product by a customer with an active subscription',
  },
  too_many_webhooks: {
    status: 409,
    message: 'an environment holds at most {max} webhook endpoints; delete one first',
    when: 'registering an endpoint beyond the limit',
  },
  webhook_status_conflict: {
    status: 409,
    message: 'webhook endpoint {id} is {status}',
    when:
      'approving an endpoint not pending approval, or enabling one that is not failing or ' +
      'disabled',
  },
  key_already_revoked: {
    status: 409,
    message: 'key {id} was already revoked at {revokedAt}',
    when: 'revoking a key that is already revoked; nothing changes',
  },
  operator_key_not_revocable: {
    status: 409,
    message: 'the operator key cannot be revoked; rotate it with POST /v1/admin/keys/rotate-admin',
    when: 'revoking the operator key by id',
  },
  snapshot_in_progress: {
    status: 409,
    message: 'a snapshot is already running; wait for it to finish',
    when: 'POST /v1/admin/snapshots while another is running',
  },
  snapshot_not_ready: {
    status: 409,
    message: 'snapshot {id} is {status}, not complete',
    when: 'download or delete of a snapshot that is running (or failed, for download)',
  },
  body_too_large: {
    status: 413,
    message: 'request body exceeds 1048576 bytes',
    when: 'declared or received body over 1 MiB',
  },
  length_required: {
    status: 411,
    message: 'a request body must be sent with Content-Length ({detail})',
    when: 'a body sent with Transfer-Encoding, chunked or not (the connection is closed)',
  },
  quota_exceeded: {
    status: 429,
    message: 'quota exceeded: {detail}',
    when:
      'the environment reached an operator-set quota (customers, idempotency keys, audit ' +
      'entries per day); not retried by waiting a minute',
  },
  rate_limited: {
    status: 429,
    message: 'rate limit exceeded: {limit} requests per minute for this key',
    when: 'the key used up its one-minute window (with Retry-After)',
  },
  insufficient_balance: {
    status: 429,
    message: 'insufficient balance for {key}',
    when: 'consume beyond balance with overage off; body carries the balance fields',
  },
  overloaded: {
    status: 503,
    message: 'shard queue is full, retry later',
    when: "a worker's queue is full (with Retry-After)",
  },
  verify_busy: {
    status: 503,
    message: 'too many audit verifications are queued, retry shortly',
    when: 'the audit verification lane is full (with Retry-After)',
  },
  storage_full: {
    status: 503,
    message: 'storage full: {detail}',
    when:
      "the data directory's free space is below the reserve: writes are refused, reads are " +
      'served (with Retry-After)',
  },
  not_ready: {
    status: 503,
    message: 'service is starting, retry shortly',
    when: 'recovery has not finished (with Retry-After)',
  },
  processor_event_failed: {
    status: 500,
    message: 'processor event {id} could not be applied; it will be delivered again',
    when: 'a webhook event whose change could not be made durable (the processor retries it)',
  },
  processor_error: {
    status: 502,
    message: 'payment processor error: {detail}',
    when:
      'the payment processor refused or failed a call (push, checkout); nothing changed in ' +
      'Tally',
  },
  internal: { status: 500, message: 'internal error', when: 'a bug; never for client input' },
} as const satisfies Record<string, CatalogEntry>;

export type ErrorCode = keyof typeof ERRORS;

export type ErrorParams = Readonly<Record<string, string | number>>;

/** Fills the message template; unknown placeholders are left visible (a bug to see, not hide). */
export function errorMessage(code: ErrorCode, params: ErrorParams = {}): string {
  return ERRORS[code].message.replace(/\{(\w+)\}/g, (whole, name: string) => {
    const value = params[name];
    return value === undefined ? whole : String(value);
  });
}

/** The JSON body for an error, optionally with extra fields (balance fields on 409/429). */
export function errorBody(code: ErrorCode, params: ErrorParams = {}, extra?: object): string {
  return JSON.stringify({ error: errorMessage(code, params), code, ...extra });
}
