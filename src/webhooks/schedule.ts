/**
 * The retry schedule of webhook deliveries and the limits of the delivery thread, each with
 * its reason. docs/webhooks.md publishes the schedule.
 */

/**
 * Delay before each attempt of one delivery, from the moment the previous one failed (the
 * first is immediate): at once, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h — eight attempts
 * over about 27.6 hours, so a receiver down for a day still gets every event. After the
 * last, the endpoint is marked `failing`.
 */
export const RETRY_SCHEDULE_MS: readonly number[] = [
  0,
  5_000,
  5 * 60_000,
  30 * 60_000,
  2 * 3_600_000,
  5 * 3_600_000,
  10 * 3_600_000,
  10 * 3_600_000,
];

/**
 * Each delay is stretched or shrunk by up to this fraction at random, so that the retries of
 * many deliveries that failed together (a receiver's outage) do not all arrive together.
 */
export const RETRY_JITTER = 0.1;

/** An attempt that has not answered within 15 s failed (a timeout). */
export const DELIVERY_TIMEOUT_MS = 15_000;

/**
 * Attempts in flight to one endpoint: a slow receiver holds at most this many of the
 * thread's connections, so it never delays deliveries to the others.
 */
export const IN_FLIGHT_PER_ENDPOINT_MAX = 4;

/** Attempts in flight overall: bounds the thread's sockets and memory. */
export const IN_FLIGHT_TOTAL_MAX = 64;

/**
 * Queued deliveries of one endpoint held in memory; the rest stay on disk and are read as
 * these go. Bounds memory when a receiver is down for long under heavy traffic.
 */
export const QUEUE_WINDOW_PER_ENDPOINT = 1000;

/** Outbox rows taken per store per pass, and how often idle outboxes are looked at. */
export const OUTBOX_BATCH_MAX = 500;
export const OUTBOX_POLL_MS = 50;

/** Bytes of a receiver's answer read (and dropped) before the connection is closed. */
export const RESPONSE_BYTES_MAX = 64 * 1024;

/** The delay before attempt `attempt + 1` (attempt counts those made), jittered; null: none. */
export function retryDelayMs(
  schedule: readonly number[],
  attempt: number,
  random: () => number = Math.random,
): number | null {
  const base = schedule[attempt];
  if (base === undefined) return null;
  return Math.round(base * (1 + RETRY_JITTER * (2 * random() - 1)));
}

/** A schedule from TALLY_WEBHOOK_RETRY_SCHEDULE (`ms,ms,…`, first usually 0). Throws when bad. */
export function parseSchedule(raw: string): number[] {
  const delays = raw.split(',').map((part) => Number(part.trim()));
  if (delays.length === 0 || delays.some((ms) => !Number.isInteger(ms) || ms < 0))
    throw new Error(
      'TALLY_WEBHOOK_RETRY_SCHEDULE must be whole milliseconds separated by commas, ' +
        `got ${JSON.stringify(raw)}`,
    );
  return delays;
}
