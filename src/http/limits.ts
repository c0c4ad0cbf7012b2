/**
 * Limits of the HTTP edge, each with its reason. They bound what one request can make
 * the front end do before anything reaches a shard; hitting one answers a clear 4xx.
 */

/**
 * Deepest nesting of arrays and objects a JSON body may have. Tally's deepest document,
 * a billing configuration, nests six levels; every walk over a parsed body (Unicode
 * checks, exact-number checks, schema validation, MessagePack encoding in a shard) is
 * recursive, and a body nested thousands of levels deep would exhaust the stack.
 */
export const BODY_NESTING_MAX = 32;
