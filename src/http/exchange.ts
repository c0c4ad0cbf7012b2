/**
 * One HTTP exchange on uWebSockets.js: the response handle, whether the client went
 * away, and the only functions that write a reply.
 *
 * uWS invalidates `res` once the client aborts; every reply therefore checks `aborted`
 * first, and replies written outside the route handler's own stack frame are corked so
 * status, headers and body leave in one syscall.
 */
import type { HttpResponse } from 'uWebSockets.js';
import type { RateDecision } from '../auth/rate-limit.js';
import { ERRORS, errorBody, type ErrorCode, type ErrorParams } from '../errors.js';

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
  413: '413 Payload Too Large',
  429: '429 Too Many Requests',
  500: '500 Internal Server Error',
  503: '503 Service Unavailable',
};

export type Headers = ReadonlyArray<readonly [string, string]>;

export class Exchange {
  aborted = false;
  done = false;
  /** The rate-limit state of a keyed request: its three headers go on every reply. */
  rate: RateDecision | null = null;

  constructor(
    readonly res: HttpResponse,
    readonly method: string,
    readonly path: string,
  ) {
    res.onAborted(() => {
      this.aborted = true;
      this.onAbort?.();
    });
  }

  /** Set by a reply that holds resources while it streams (a file download). */
  onAbort: (() => void) | null = null;

  /** Writes a JSON reply; a no-op once the client has gone or a reply was sent. */
  send(status: number, body: string, headers: Headers = [], closeConnection = false): void {
    if (this.aborted || this.done) return;
    this.done = true;
    const res = this.res;
    res.cork(() => {
      // uWS writes "200 OK" itself when no status is given: one native call fewer.
      if (status !== 200) res.writeStatus(STATUS_TEXT[status] ?? String(status));
      res.writeHeader('content-type', 'application/json');
      const rate = this.rate;
      if (rate !== null) {
        res.writeHeader('x-ratelimit-limit', rate.limitText);
        res.writeHeader('x-ratelimit-remaining', String(rate.remaining));
        res.writeHeader('x-ratelimit-reset', rate.resetText);
      }
      for (const [name, value] of headers) res.writeHeader(name, value);
      res.end(body, closeConnection);
    });
  }

  fail(code: ErrorCode, params: ErrorParams = {}, headers: Headers = [], closeConnection = false): void {
    this.send(ERRORS[code].status, errorBody(code, params), headers, closeConnection);
  }

  json(status: number, value: unknown, headers: Headers = []): void {
    this.send(status, JSON.stringify(value), headers);
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
      process.stderr.write(
        `${JSON.stringify({ level: 'error', msg: 'request handler failed', method: this.method, path: this.path, error: String(error instanceof Error ? error.stack : error) })}\n`,
      );
      this.fail('internal');
    }
  }
}
