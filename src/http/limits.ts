/**
 * Limits of the front end, each with its reason. Most bound what one request can make
 * the front end do before anything reaches a shard (hitting one answers a clear 4xx);
 * the rest bound its listings and its logs. Limits the core and the shards share live in
 * shared/limits.ts.
 */

/**
 * Deepest nesting of arrays and objects a JSON body may have. Tally's deepest document,
 * a billing configuration, nests six levels; every walk over a parsed body (Unicode
 * checks, exact-number checks, schema validation, MessagePack encoding in a shard) is
 * recursive, and a body nested thousands of levels deep would exhaust the stack.
 */
export const BODY_NESTING_MAX = 32;

/** Largest request body: configurations are the biggest documents and stay far below it. */
export const BODY_BYTES_MAX = 1024 * 1024;

/** Customer listings: default and largest page. */
export const LIST_LIMIT_DEFAULT = 20;
export const LIST_LIMIT_MAX = 100;

/**
 * Longest incoming `x-request-id` kept (a UUID is 36 characters, a W3C trace id 55); longer ones
 * are replaced.
 */
export const REQUEST_ID_LENGTH_MAX = 128;

/**
 * 5xx and handler-failure log lines per second; past it lines are counted, not written.
 * An overloaded shard answers thousands of 503s a second, and a log line per answer
 * would add serialisation and pipe writes exactly when the process has no time to spare.
 */
export const ERROR_LOG_LINES_PER_SECOND_MAX = 20;
