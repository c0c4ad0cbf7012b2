/**
 * Request ids: the caller's own `x-request-id` when it is well formed, otherwise one of
 * ours, so a log line, an error answer and the caller's own logs can be matched up.
 *
 * Ours are a per-process random prefix plus a counter in base 36 (`3f9a1c07-1k2`): unique
 * across restarts with overwhelming probability, and built only when something needs
 * the id (an error answer, a log line), never on a plain successful request. An incoming
 * id is accepted only if it is short and made of characters that are safe in a header
 * and a log line; anything else is replaced, not rejected, since a request id is a
 * courtesy, not input the request depends on.
 */
import { randomBytes } from 'node:crypto';
import { REQUEST_ID_LENGTH_MAX } from '../http/limits.js';
import { holdsKeyPrefix } from './log.js';

const WELL_FORMED = /^[A-Za-z0-9._:/+=@-]+$/;

/**
 * Whether an incoming id may be kept. One that holds anything key-shaped is replaced:
 * request ids are logged at info level and echoed, and a client that put a key there by
 * mistake must not find it in the logs.
 */
export function isWellFormedRequestId(value: string): boolean {
  return (
    value.length > 0 &&
    value.length <= REQUEST_ID_LENGTH_MAX &&
    WELL_FORMED.test(value) &&
    !holdsKeyPrefix(value)
  );
}

export class RequestIds {
  private readonly prefix = `${randomBytes(4).toString('hex')}-`;
  private counter = 0;

  next(): string {
    this.counter++;
    return this.prefix + this.counter.toString(36);
  }
}
