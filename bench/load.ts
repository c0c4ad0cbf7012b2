/**
 * One autocannon run against one server, reduced to the numbers the report needs.
 *
 * autocannon runs in this process (no worker threads): with 2 cores, the load generator
 * and the server under test each get about one, and that is part of what is measured.
 * Each connection gets its own pre-built slice of requests (see `sliceForConnections`);
 * autocannon's public `Client#setRequests` refuses to work with pipelining > 1, so the
 * slice is handed to the client's request iterator directly. That internal is checked
 * at runtime, so an autocannon upgrade that changes it fails loudly instead of silently
 * sending the wrong requests.
 */
import autocannon from 'autocannon';
import { LatencyHistogram } from './latency-histogram.js';

/** Per-request timeout. A request that takes this long is an error, not a slow sample. */
const REQUEST_TIMEOUT_SEC = 10;
/**
 * autocannon only ends a run on its sampling tick, so a run lasts `duration` rounded up
 * to this interval; 100 ms keeps short (tiny and warm-up) runs close to what was asked.
 */
const SAMPLE_INTERVAL_MS = 100;

export interface LoadShape {
  readonly connections: number;
  readonly pipelining: number;
  readonly durationSec: number;
}

export interface SegmentResult {
  readonly durationSec: number;
  readonly ok2xx: number;
  /**
   * Requests written that never got an answer, beyond the connections x pipelining that
   * may legitimately be in flight when the segment stops. autocannon reconnects silently
   * when the server closes a connection and counts neither the lost requests nor the
   * close as errors, so this is the only trace of a server dropping connections.
   */
  readonly dropped: number;
  readonly non2xx: number;
  /** Connection errors, including timeouts. */
  readonly errors: number;
  readonly timeouts: number;
  readonly statusCodes: Readonly<Record<string, number>>;
  readonly latency: LatencyHistogram;
}

interface RequestIteratorInternals {
  setRequests(requests: autocannon.Request[]): void;
}

function giveSlice(client: autocannon.Client, slice: autocannon.Request[]): void {
  const iterator = (client as unknown as { requestIterator?: Partial<RequestIteratorInternals> })
    .requestIterator;
  if (typeof iterator?.setRequests !== 'function') {
    throw new Error(
      'autocannon internals changed: Client.requestIterator.setRequests is missing ' +
        '(written against autocannon 9.0.0)',
    );
  }
  iterator.setRequests(slice);
}

function statusCounts(result: autocannon.Result): Record<string, number> {
  const stats =
    (result as unknown as { statusCodeStats?: Record<string, { count: number }> })
      .statusCodeStats ?? {};
  return Object.fromEntries(Object.entries(stats).map(([code, { count }]) => [code, count]));
}

/**
 * Runs one load segment against `baseUrl`. `slices` holds one request list per
 * connection (length must equal `shape.connections`). Rejects only if autocannon itself
 * fails (bad options, broken internals); request failures are counted, not thrown.
 */
export function runSegment(
  baseUrl: string,
  slices: readonly autocannon.Request[][],
  shape: LoadShape,
): Promise<SegmentResult> {
  if (slices.length !== shape.connections)
    throw new Error(`need ${shape.connections} request slices, got ${slices.length}`);
  const first = slices[0];
  if (first === undefined || first.length < shape.pipelining)
    throw new Error('each connection needs at least `pipelining` requests');
  const latency = new LatencyHistogram();
  let nextClient = 0;
  return new Promise<SegmentResult>((resolve, reject) => {
    const instance = autocannon(
      {
        url: baseUrl,
        connections: shape.connections,
        pipelining: shape.pipelining,
        duration: shape.durationSec,
        timeout: REQUEST_TIMEOUT_SEC,
        sampleInt: SAMPLE_INTERVAL_MS,
        // replaced per client below; keeps autocannon's per-client deep clone small
        requests: first.slice(0, shape.pipelining),
        setupClient: (client) => giveSlice(client, slices[nextClient++] ?? first),
      },
      (error, result) => {
        if (error) return reject(error instanceof Error ? error : new Error(String(error)));
        resolve({
          durationSec: result.duration,
          ok2xx: result['2xx'],
          dropped: Math.max(
            0,
            result.requests.sent - result.requests.total - shape.connections * shape.pipelining,
          ),
          non2xx: result.non2xx,
          errors: result.errors,
          timeouts: result.timeouts,
          statusCodes: statusCounts(result),
          latency,
        });
      },
    );
    instance.on('response', (_client, statusCode, _bytes, responseTimeMs) => {
      if (statusCode >= 200 && statusCode < 300) latency.record(responseTimeMs);
    });
  });
}
