/**
 * One HTTP exchange on uWebSockets.js: the response handle, whether the client went
 * away, and the only functions that write a reply.
 *
 * uWS invalidates `res` once the client aborts; every reply therefore checks `aborted`
 * first, and replies written outside the route handler's own stack frame are corked so
 * status, headers and body leave in one syscall.
 *
 * Each exchange reports its end to the server's Observability (metrics, error and access
 * log lines) and carries a request id: the client's `x-request-id` when well formed,
 * else one made on first use. The id is echoed in `x-request-id` on every error answer
 * (4xx/5xx) and on every answer to a client that sent one; a plain successful answer to
 * a client that did not ask goes without, because each extra header costs measurable
 * throughput on the hot path (docs/performance.md).
 */
import type { HttpResponse } from 'uWebSockets.js';
import type { RateDecision } from '../auth/rate-limit.js';
import { ERRORS, errorBody, type ErrorCode, type ErrorParams } from '../errors.js';
import {
  jsonWithRateLimitValue,
  RATE_LIMIT_HEADER_NAME,
  rateLimitHeaderValue,
} from './rate-limit-header.js';
import type { Observability } from '../observability/observability.js';
import { isWellFormedRequestId } from '../observability/request-id.js';

const STATUS_TEXT: Record<number, string> = {
  200: '200 OK',
  201: '201 Created',
  202: '202 Accepted',
  204: '204 No Content',
  400: '400 Bad Request',
  401: '401 Unauthorized',
  403: '403 Forbidden',
  404: '404 Not Found',
  405: '405 Method Not Allowed',
  409: '409 Conflict',
  411: '411 Length Required',
  413: '413 Payload Too Large',
  429: '429 Too Many Requests',
  500: '500 Internal Server Error',
  503: '503 Service Unavailable',
};

export type Headers = ReadonlyArray<readonly [string, string]>;

const JSON_TYPE = 'application/json';

const ignoreBody = (): void => undefined;

export class Exchange {
  aborted = false;
  done = false;
  /** The rate-limit state of a keyed request: its three headers go on every reply. */
  rate: RateDecision | null = null;
  /**
   * The `access-control-allow-origin` value (with the lines that go with it) when the
   * page that sent this request may read its reply (src/auth/client-policy.ts); null
   * otherwise, and for every request that is not a browser's.
   */
  cors: string | null = null;
  /** Metrics series of the route that matched (HttpMetrics slot); -1 until one did. */
  slot = -1;
  /** Set once a handler failure was logged with its cause. */
  failureLogged = false;
  readonly startMs = performance.now();
  /** The client sent an `x-request-id` (well formed or not): every answer echoes ours. */
  private readonly echoRequestId: boolean;
  private requestIdText: string;

  /** `incomingRequestId`: the raw `x-request-id` header ('' when absent). */
  constructor(
    readonly res: HttpResponse,
    readonly method: string,
    readonly path: string,
    private readonly obs: Observability,
    incomingRequestId = '',
  ) {
    this.echoRequestId = incomingRequestId !== '';
    this.requestIdText =
      this.echoRequestId && isWellFormedRequestId(incomingRequestId) ? incomingRequestId : '';
  }

  private armed = false;

  /**
   * Watches for the client going away: called before the route handler returns whenever the
   * answer is not written yet (uWS needs it then). An answer written inside the handler, as
   * a `has` held in memory is, needs none, and saves registering a callback per request.
   */
  armAbort(): void {
    if (this.armed) return;
    this.armed = true;
    this.res.onAborted(() => {
      this.aborted = true;
      this.onAbort?.();
      // A streamed download cut short was already counted when its headers went out.
      if (!this.done) this.obs.aborted(this);
    });
  }

  /** Set by a reply that holds resources while it streams (a file download). */
  onAbort: (() => void) | null = null;

  /** This request's id (the client's, or one made now and kept). */
  get requestId(): string {
    if (this.requestIdText === '') this.requestIdText = this.obs.requestIds.next();
    return this.requestIdText;
  }

  /** Writes a JSON reply; a no-op once the client has gone or a reply was sent. */
  send(status: number, body: string, headers: Headers = [], closeConnection = false): void {
    this.write(status, JSON_TYPE, body, headers, closeConnection);
  }

  /** Writes a reply of another content type (the Prometheus text exposition). */
  sendText(status: number, contentType: string, body: string): void {
    this.write(status, contentType, body, [], false);
  }

  private write(
    status: number,
    contentType: string,
    body: string,
    headers: Headers,
    closeConnection: boolean,
  ): void {
    if (this.aborted || this.done) return;
    this.done = true;
    const res = this.res;
    res.cork(() => {
      // uWS writes "200 OK" itself when no status is given: one native call fewer.
      if (status !== 200) res.writeStatus(STATUS_TEXT[status] ?? String(status));
      const rate = this.rate;
      // All three X-RateLimit-* lines in one call, without String(), and for a JSON reply in
      // the content type's call: see rate-limit-header.ts.
      // A 204 has no body, hence no content type and (RFC 9110 §8.6) no Content-Length.
      if (rate !== null && status !== 204 && contentType === JSON_TYPE) {
        res.writeHeader('content-type', jsonWithRateLimitValue(rate.lines, rate.remaining));
      } else {
        if (status !== 204) res.writeHeader('content-type', contentType);
        if (rate !== null)
          res.writeHeader(RATE_LIMIT_HEADER_NAME, rateLimitHeaderValue(rate.lines, rate.remaining));
      }
      if (status >= 400 || this.echoRequestId) res.writeHeader('x-request-id', this.requestId);
      if (this.cors !== null) res.writeHeader('access-control-allow-origin', this.cors);
      for (const [name, value] of headers) res.writeHeader(name, value);
      if (status === 204) res.endWithoutBody();
      else res.end(body, closeConnection);
    });
    this.obs.answered(this, status);
  }

  /**
   * Reports an answer whose status and headers were written outside `send` (a streamed
   * file) to metrics and logs; its latency is the time to its first byte.
   */
  streamStarted(status: number): void {
    this.obs.answered(this, status);
  }

  fail(
    code: ErrorCode,
    params: ErrorParams = {},
    headers: Headers = [],
    closeConnection = false,
  ): void {
    this.send(ERRORS[code].status, errorBody(code, params), headers, closeConnection);
  }

  /**
   * Answers with an error and closes the connection, so that no byte the client sent
   * after this request's head is ever parsed as another request. The answer goes out on
   * the next turn, not from the handler: uWS parses every request already received on a
   * connection before it acts on a close requested inside a handler, but it closes a
   * connection at once, without dispatching, when a request arrives while an answer is
   * still pending.
   */
  failAndClose(code: ErrorCode, params: ErrorParams = {}, headers: Headers = []): void {
    this.armAbort();
    this.res.onData(ignoreBody);
    setImmediate(() => this.fail(code, params, headers, true));
  }

  json(status: number, value: unknown, headers: Headers = []): void {
    this.send(status, JSON.stringify(value), headers);
  }

  /** An info line about what this request did (operator actions), with its request id. */
  logInfo(msg: string, fields: Record<string, unknown>): void {
    this.obs.log.info({ requestId: this.requestId, ...fields }, msg);
  }

  /** A warning about a side effect of this request that failed, with its request id. */
  logWarn(msg: string, fields: Record<string, unknown>): void {
    this.obs.log.warn({ requestId: this.requestId, ...fields }, msg);
  }

  /**
   * Runs a step of this exchange's handling. A throw here is a bug, not client input:
   * it is logged and answered 500, because an exception escaping into uWS's native
   * callback would take the whole service down with every other client's request.
   */
  guard(step: () => void): void {
    try {
      step();
    } catch (error) {
      this.failInternal(error);
    }
  }

  /**
   * Answers 500 for a failure that is a bug or a fault of the service (a rejected
   * promise of a store or a worker), and logs its cause with this request's id.
   */
  failInternal(error: unknown): void {
    this.obs.handlerFailed(this, error);
    this.failureLogged = true;
    this.fail('internal');
  }
}
