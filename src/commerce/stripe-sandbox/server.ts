/**
 * The sandbox's HTTP front: a `node:http` request handler that speaks Stripe's wire
 * protocol for `/v1/...` and serves the hosted checkout pages under `/checkout/...`.
 *
 * For an API request it reads the body (at most 1 MiB), checks `Authorization: Bearer
 * <secret key>`, replays or refuses an `Idempotency-Key` it has seen, catches up on time
 * (renewals and session expiries that fell due), runs the matched handler, answers JSON
 * with Stripe's headers (`Request-Id`, `Stripe-Version`, `Idempotent-Replayed`) and hands
 * the events the request raised to webhook delivery. Every failure is a Stripe-shaped
 * error; nothing thrown inside escapes to the server.
 */
import type http from 'node:http';
import Stripe from 'stripe';
import { renewDue } from './billing.js';
import { payCheckout, showCheckout, type PageAnswer } from './checkout-page.js';
import {
  StripeApiError,
  authenticationFailed,
  internalError,
  invalidParam,
  unrecognizedUrl,
} from './errors.js';
import { expandPaths, parseForm, type Params } from './form.js';
import { IdempotencyStore } from './idempotency.js';
import { expireDue } from './resources/checkout-sessions.js';
import type { Router } from './router.js';
import type { SandboxState } from './state.js';
import { randomToken } from './store.js';
import type { WebhookDeliveries } from './webhooks.js';

const BODY_BYTES_MAX = 1024 * 1024;

export interface SandboxParts {
  readonly state: SandboxState;
  readonly router: Router;
  readonly idempotency: IdempotencyStore;
  readonly deliveries: WebhookDeliveries;
  readonly secretKey: string;
}

interface Incoming {
  readonly method: string;
  readonly pathname: string;
  readonly query: string;
  readonly body: string;
  readonly headers: http.IncomingHttpHeaders;
}

class BodyTooLarge extends Error {}

function readBody(request: http.IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    request.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > BODY_BYTES_MAX) {
        reject(new BodyTooLarge());
        request.destroy();
        return;
      }
      chunks.push(chunk);
    });
    request.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    request.on('error', reject);
  });
}

function header(headers: http.IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** The API key of the request: `Bearer <key>`, or Basic auth with the key as user name. */
function presentedKey(headers: http.IncomingHttpHeaders): string | undefined {
  const value = header(headers, 'authorization');
  if (value === undefined) return undefined;
  const [scheme, credentials = ''] = value.trim().split(/\s+/, 2);
  if (scheme?.toLowerCase() === 'bearer') return credentials;
  if (scheme?.toLowerCase() === 'basic')
    return Buffer.from(credentials, 'base64').toString('utf8').split(':', 1)[0];
  return value;
}

interface ApiAnswer {
  readonly status: number;
  readonly body: string;
  readonly headers: Readonly<Record<string, string>>;
}

function sendJson(response: http.ServerResponse, answer: ApiAnswer): void {
  response.writeHead(answer.status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(answer.body),
    'stripe-version': Stripe.API_VERSION,
    'cache-control': 'no-cache, no-store',
    ...answer.headers,
  });
  response.end(answer.body);
}

function sendPage(response: http.ServerResponse, answer: PageAnswer): void {
  if (answer.location !== undefined) {
    response.writeHead(answer.status, { location: answer.location, 'content-length': 0 });
    response.end();
    return;
  }
  const html = answer.html ?? '';
  response.writeHead(answer.status, {
    'content-type': 'text/html; charset=utf-8',
    'content-length': Buffer.byteLength(html),
    'cache-control': 'no-store',
  });
  response.end(html);
}

function errorAnswer(error: unknown, requestId: string): ApiAnswer {
  const failure = error instanceof StripeApiError ? error : internalError();
  return {
    status: failure.status,
    body: JSON.stringify(failure.toJSON(), null, 2),
    headers: { 'request-id': requestId },
  };
}

/** Time moves on between requests: bill what fell due, expire stale sessions. */
function catchUp(state: SandboxState): void {
  state.events.request = { id: null, idempotencyKey: null };
  renewDue(state);
  expireDue(state);
}

function run(
  parts: SandboxParts,
  incoming: Incoming,
  requestId: string,
  idempotencyKey: string | null,
): ApiAnswer {
  const { state, router } = parts;
  const match = router.match(incoming.method, incoming.pathname);
  if (match === undefined) throw unrecognizedUrl(incoming.method, incoming.pathname);
  const query = parseForm(incoming.query);
  const body = incoming.method === 'POST' ? parseForm(incoming.body) : {};
  const params: Params = { ...query, ...body };
  catchUp(state);
  state.events.request = { id: requestId, idempotencyKey };
  const result = match.handler({ state, params, path: match.path, expand: expandPaths(params) });
  const headers: Record<string, string> = {
    'request-id': requestId,
    ...(idempotencyKey === null ? {} : { 'idempotency-key': idempotencyKey }),
  };
  return { status: 200, body: JSON.stringify(result, null, 2), headers };
}

/** Answers one `/v1/...` request. */
function answerApi(parts: SandboxParts, incoming: Incoming): ApiAnswer {
  const requestId = `req_${randomToken(14)}`;
  try {
    const key = presentedKey(incoming.headers);
    if (key !== parts.secretKey) throw authenticationFailed(key === '' ? undefined : key);
    if (header(incoming.headers, 'stripe-account') !== undefined)
      throw invalidParam(
        'Stripe-Account',
        'The Stripe sandbox does not model Connect: requests cannot act on behalf of ' +
          'another account.',
      );
    const idempotencyKey =
      incoming.method === 'POST' ? (header(incoming.headers, 'idempotency-key') ?? null) : null;
    if (idempotencyKey === null) return run(parts, incoming, requestId, null);
    if (idempotencyKey === '')
      throw invalidParam('Idempotency-Key', 'Idempotency-Key must not be empty.');
    const fingerprint = IdempotencyStore.fingerprint(
      incoming.method,
      incoming.pathname,
      incoming.query,
      incoming.body,
    );
    const saved = parts.idempotency.lookup(key, idempotencyKey, fingerprint);
    if (saved !== undefined) {
      return {
        status: saved.status,
        body: saved.body,
        headers: {
          'request-id': requestId,
          'idempotency-key': idempotencyKey,
          'idempotent-replayed': 'true',
        },
      };
    }
    const answer = run(parts, incoming, requestId, idempotencyKey);
    parts.idempotency.save(key, idempotencyKey, fingerprint, answer);
    return answer;
  } catch (error) {
    return errorAnswer(error, requestId);
  } finally {
    parts.state.events.request = { id: null, idempotencyKey: null };
    parts.deliveries.dispatch(parts.state.events.drain());
  }
}

/** Answers one `/checkout/...` page request, or undefined when the path is not a page. */
function answerPage(parts: SandboxParts, incoming: Incoming): PageAnswer | undefined {
  const segments = incoming.pathname.split('/').filter((s) => s !== '');
  let id: string;
  try {
    id = decodeURIComponent(segments[1] ?? '');
  } catch {
    return undefined;
  }
  try {
    catchUp(parts.state);
    if (segments.length === 2 && incoming.method === 'GET') return showCheckout(parts.state, id);
    if (segments.length === 3 && segments[2] === 'pay' && incoming.method === 'POST')
      return payCheckout(parts.state, id, incoming.body);
    return undefined;
  } finally {
    parts.deliveries.dispatch(parts.state.events.drain());
  }
}

async function respond(
  parts: SandboxParts,
  request: http.IncomingMessage,
  response: http.ServerResponse,
): Promise<void> {
  const url = new URL(request.url ?? '/', 'http://sandbox.invalid');
  let body = '';
  try {
    body = await readBody(request);
  } catch (error) {
    if (error instanceof BodyTooLarge)
      sendJson(
        response,
        errorAnswer(
          invalidParam('body', 'The request body is larger than 1 MiB.'),
          `req_${randomToken(14)}`,
        ),
      );
    return;
  }
  const incoming: Incoming = {
    method: request.method ?? 'GET',
    pathname: url.pathname,
    query: url.search.slice(1),
    body,
    headers: request.headers,
  };
  if (url.pathname.startsWith('/checkout/')) {
    const page = answerPage(parts, incoming);
    if (page !== undefined) return sendPage(response, page);
  }
  if (url.pathname.startsWith('/v1/')) return sendJson(response, answerApi(parts, incoming));
  sendJson(
    response,
    errorAnswer(unrecognizedUrl(incoming.method, url.pathname), `req_${randomToken(14)}`),
  );
}

/** The `node:http` request listener of a sandbox. */
export function requestListener(parts: () => SandboxParts | undefined): http.RequestListener {
  return (request, response) => {
    const current = parts();
    if (current === undefined) {
      response.writeHead(503).end();
      return;
    }
    respond(current, request, response).catch(() => {
      if (!response.headersSent)
        sendJson(response, errorAnswer(internalError(), `req_${randomToken(14)}`));
      else response.destroy();
    });
  };
}
