/**
 * Per-route HTTP accounting for `GET /v1/admin/metrics`, cheap enough for the `has` hot
 * path (tens of thousands of requests a second on two cores).
 *
 * Each (route pattern, method) pair owns a series, found by index: the router's match
 * carries the route's position, so recording an answer is an array load, a short scan
 * over the latency bounds and three increments — no map lookup, no string building, no
 * allocation. Labels are fixed when the routers are built: the route **pattern**
 * (`/v1/entitlements/:key/has`), never the URL, and a request answered before any route
 * matched (401, 404, 429, …) is counted under `unmatched`, so no client can create a
 * series. The method label is one of a fixed list for the same reason.
 */
import { Histogram, type HistogramData } from '../../actors/histogram.js';

/** Latency buckets (milliseconds): `has` answers in ~0.1–1 ms, a durable write in a few. */
export const HTTP_LATENCY_BOUNDS_MS: readonly number[] = [
  0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000,
];

/** Statuses counted under their own label (every status Tally answers); any other is `other`. */
export const COUNTED_STATUSES: readonly number[] = [
  200, 201, 204, 400, 401, 403, 404, 405, 409, 413, 429, 500, 503,
];
const OTHER_STATUS = COUNTED_STATUSES.length;
const STATUS_SLOT = new Uint8Array(600).fill(OTHER_STATUS);
COUNTED_STATUSES.forEach((status, slot) => (STATUS_SLOT[status] = slot));

/** The status label of a slot of `HttpSeries.statuses`. */
export function statusLabel(slot: number): string {
  return slot < COUNTED_STATUSES.length ? String(COUNTED_STATUSES[slot]) : 'other';
}

/** Method labels: the client picks the method, so it must not pick a label value. */
export const METHOD_LABELS: readonly string[] = [
  'GET',
  'POST',
  'PUT',
  'PATCH',
  'DELETE',
  'HEAD',
  'OPTIONS',
  'other',
];

function methodLabel(method: string): string {
  return METHOD_LABELS.includes(method) ? method : 'other';
}

/** Answers given without a router match: labelled by what they are, never by the URL. */
export type FixedRoute =
  | 'unmatched'
  | '/healthz'
  | '/v1/schema/billing'
  | '/v1/processor/stripe/webhook';
const FIXED_ROUTES: readonly FixedRoute[] = [
  'unmatched',
  '/healthz',
  '/v1/schema/billing',
  '/v1/processor/stripe/webhook',
];

export interface HttpSeries {
  readonly route: string;
  readonly method: string;
  readonly latencyMs: Histogram;
  /** Answers per status: one slot per COUNTED_STATUSES entry, then `other`. */
  readonly statuses: Float64Array;
}

/** A front end's counts as they cross to another thread (the used series only). */
export interface HttpMetricsData {
  readonly series: ReadonlyArray<{
    readonly route: string;
    readonly method: string;
    readonly latencyMs: HistogramData;
    readonly statuses: readonly number[];
  }>;
  readonly aborted: number;
}

export class HttpMetrics {
  readonly series: HttpSeries[] = [];
  /** Requests whose client went away before the answer (no status, no latency). */
  aborted = 0;

  constructor() {
    for (const route of FIXED_ROUTES) for (const method of METHOD_LABELS) this.add(route, method);
  }

  private add(route: string, method: string): void {
    this.series.push({
      route,
      method,
      latencyMs: new Histogram(HTTP_LATENCY_BOUNDS_MS),
      statuses: new Float64Array(COUNTED_STATUSES.length + 1),
    });
  }

  /** The series of a fixed route for this method (any method string; unknown ones are `other`). */
  fixedSlot(route: FixedRoute, method: string): number {
    return (
      FIXED_ROUTES.indexOf(route) * METHOD_LABELS.length +
      METHOD_LABELS.indexOf(methodLabel(method))
    );
  }

  /**
   * Adds one series per route of a router, in the router's order; returns the slot of its
   * first route, so a match's `index` plus this base is the match's series.
   */
  register(routes: ReadonlyArray<{ readonly method: string; readonly pattern: string }>): number {
    const base = this.series.length;
    for (const { method, pattern } of routes) this.add(pattern, method);
    return base;
  }

  /** The used series and the aborted count, to send to another thread or add up. */
  data(): HttpMetricsData {
    return {
      series: this.series
        .filter((series) => series.latencyMs.count > 0)
        .map(({ route, method, latencyMs, statuses }) => ({
          route,
          method,
          latencyMs: latencyMs.data(),
          statuses: Array.from(statuses),
        })),
      aborted: this.aborted,
    };
  }

  /** Adds another front end's counts, series by series (route and method). */
  absorb(other: HttpMetricsData): void {
    for (const theirs of other.series) {
      let ours = this.series.find((s) => s.route === theirs.route && s.method === theirs.method);
      if (ours === undefined) {
        this.add(theirs.route, theirs.method);
        ours = this.series.at(-1) as HttpSeries;
      }
      ours.latencyMs.absorb(theirs.latencyMs);
      const statuses = ours.statuses;
      theirs.statuses.forEach(
        (count, slot) => (statuses[slot] = (statuses[slot] as number) + count),
      );
    }
    this.aborted += other.aborted;
  }

  /** Records one answer. `slot` must come from `fixedSlot` or `register` (else it throws). */
  observe(slot: number, status: number, durationMs: number): void {
    const series = this.series[slot] as HttpSeries;
    series.latencyMs.observe(durationMs);
    const statusSlot = status < 600 ? (STATUS_SLOT[status] as number) : OTHER_STATUS;
    series.statuses[statusSlot] = (series.statuses[statusSlot] as number) + 1;
  }
}
