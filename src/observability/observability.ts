/**
 * What every HTTP exchange reports when it ends: its metrics series, and the log lines
 * an operator needs — each 5xx (rate-limited), and at `debug` one access line per
 * request. One instance per server, handed to each Exchange.
 *
 * The cost on a plain successful request is one `performance.now()` at each end and
 * `HttpMetrics.observe`; the logger is consulted only for a 5xx, an abort, or when the
 * level is `debug` (decided once, at start).
 */
import { ERROR_LOG_LINES_PER_SECOND_MAX } from '../http/limits.js';
import { HttpMetrics } from './http-metrics.js';
import { redactPath, type Logger } from './log.js';
import { RequestIds } from './request-id.js';

/** What the observer needs to know about an exchange (the Exchange class, structurally). */
export interface ObservedExchange {
  readonly method: string;
  readonly path: string;
  readonly startMs: number;
  readonly requestId: string;
  /** Metrics series: set once a route is known; -1 means `unmatched`. */
  readonly slot: number;
  /** True once a handler failure was logged with its cause (no second line for its 500). */
  readonly failureLogged: boolean;
}

export class Observability {
  readonly metrics = new HttpMetrics();
  readonly requestIds = new RequestIds();
  /** Access lines are written only at debug or trace; decided once, at start. */
  private readonly accessLog: boolean;
  private errorWindowSec = 0;
  private errorLinesInWindow = 0;
  private suppressedInWindow = 0;
  /** Error lines not written because of ERROR_LOG_LINES_PER_SECOND_MAX, since start. */
  suppressedTotal = 0;

  constructor(readonly log: Logger) {
    this.accessLog = log.isLevelEnabled('debug');
  }

  /** The series an exchange is counted under (unmatched ones by method). */
  slotOf(ex: ObservedExchange): number {
    return ex.slot >= 0 ? ex.slot : this.metrics.fixedSlot('unmatched', ex.method);
  }

  routeOf(ex: ObservedExchange): string {
    return this.metrics.series[this.slotOf(ex)]?.route ?? 'unmatched';
  }

  /** Called once per exchange, right after its answer was written. */
  answered(ex: ObservedExchange, status: number): void {
    const durationMs = performance.now() - ex.startMs;
    const slot = this.slotOf(ex);
    this.metrics.observe(slot, status, durationMs);
    if (status >= 500 && !ex.failureLogged && this.mayLogError()) {
      const fields = this.fields(ex, slot, status, durationMs);
      if (status === 503) this.log.warn(fields, 'request refused: service unavailable');
      else this.log.error(fields, 'request failed');
    } else if (this.accessLog) {
      this.log.debug(this.fields(ex, slot, status, durationMs), 'request');
    }
  }

  /** Called when the client went away before its answer. */
  aborted(ex: ObservedExchange): void {
    this.metrics.aborted++;
    if (this.accessLog)
      this.log.debug(
        { requestId: ex.requestId, method: ex.method, route: this.routeOf(ex) },
        'request aborted by client',
      );
  }

  /** A handler threw: a bug. Logged with its stack, within the error line budget. */
  handlerFailed(ex: ObservedExchange, error: unknown): void {
    if (!this.mayLogError()) return;
    this.log.error(
      {
        requestId: ex.requestId,
        method: ex.method,
        route: this.routeOf(ex),
        status: 500,
        err: error,
      },
      'request handler failed',
    );
  }

  private fields(
    ex: ObservedExchange,
    slot: number,
    status: number,
    durationMs: number,
  ): Record<string, unknown> {
    return {
      requestId: ex.requestId,
      method: ex.method,
      route: this.metrics.series[slot]?.route,
      path: redactPath(ex.path),
      status,
      durationMs: Math.round(durationMs * 1000) / 1000,
    };
  }

  /**
   * At most ERROR_LOG_LINES_PER_SECOND_MAX error lines a second; the rest are counted and summed up
   * later.
   */
  private mayLogError(): boolean {
    const sec = Math.floor(Date.now() / 1000);
    if (sec !== this.errorWindowSec) {
      if (this.suppressedInWindow > 0)
        this.log.warn(
          { suppressed: this.suppressedInWindow, perSecondMax: ERROR_LOG_LINES_PER_SECOND_MAX },
          'error log lines suppressed',
        );
      this.errorWindowSec = sec;
      this.errorLinesInWindow = 0;
      this.suppressedInWindow = 0;
    }
    if (this.errorLinesInWindow >= ERROR_LOG_LINES_PER_SECOND_MAX) {
      this.suppressedInWindow++;
      this.suppressedTotal++;
      return false;
    }
    this.errorLinesInWindow++;
    return true;
  }
}
