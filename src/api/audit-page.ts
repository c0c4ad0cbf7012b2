/**
 * One page of an audit chain (an environment's log or the operator stream): newest first,
 * filtered by action and resource type, `limit` + opaque `cursor`. Shared by
 * `GET /v1/audit` and `GET /v1/admin/audit` so both page exactly alike; and the answer
 * to a verification that failed, shared by both verify routes.
 */
import type { AuditLog } from '../../storage/audit-log.js';
import type { Exchange } from '../http/exchange.js';
import { SideJobsBusyError } from '../side-jobs.js';
import { decodeCursor, encodeCursor, pageLimit } from './paging.js';
import type { AuditQuery } from './validation.js';

/** Answers the page (200), or 400 for a bad limit or cursor. */
export function auditPage(ex: Exchange, audit: AuditLog, stream: string, query: AuditQuery): void {
  const { action, resourceType, cursor } = query;
  const limit = pageLimit(ex, query.limit);
  if (limit === null) return;
  let before: number | null = null;
  if (cursor !== undefined) {
    before = decodeCursor(ex, cursor, ({ before: seq }) =>
      typeof seq === 'number' && Number.isSafeInteger(seq) && seq > 0 ? seq : null,
    );
    if (before === null) return;
  }
  const filter = {
    ...(action === undefined ? {} : { action }),
    ...(resourceType === undefined ? {} : { resourceType }),
  };
  const page = audit.page(stream, filter, limit, before);
  const nextCursor = page.nextBefore === null ? null : encodeCursor({ before: page.nextBefore });
  ex.json(200, { data: page.data, nextCursor });
}

/**
 * Answers a failed verification: 503 with Retry-After when the lane is full, else a bug (500,
 * logged).
 */
export function failVerify(ex: Exchange, error: unknown): void {
  if (error instanceof SideJobsBusyError) return ex.fail('verify_busy', {}, [['retry-after', '5']]);
  ex.failInternal(error);
}
