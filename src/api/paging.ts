/**
 * Listing helpers shared by every paged route: the `limit` rule (default 20,
 * at most 100, anything else 400) and opaque cursors (base64url of a small JSON object
 * naming where to continue; anything that does not decode is "cursor is invalid").
 */
import { LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX } from '../http/limits.js';
import type { Exchange } from '../http/exchange.js';

/** The page size, or null after answering 400. `raw` passed the `^[0-9]+$` schema pattern. */
export function pageLimit(ex: Exchange, raw: string | undefined): number | null {
  const limit = raw === undefined ? LIST_LIMIT_DEFAULT : Number(raw);
  if (limit >= 1 && limit <= LIST_LIMIT_MAX) return limit;
  ex.fail('invalid_query', { detail: `limit must be a whole number from 1 to ${LIST_LIMIT_MAX}` });
  return null;
}

export function encodeCursor(position: Readonly<Record<string, unknown>>): string {
  return Buffer.from(JSON.stringify(position), 'utf8').toString('base64url');
}

/** The cursor's position object, or null (after answering 400) when it is not ours. */
export function decodeCursor<T>(
  ex: Exchange,
  cursor: string,
  read: (position: Record<string, unknown>) => T | null,
): T | null {
  let position: T | null = null;
  try {
    const value: unknown = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
    if (typeof value === 'object' && value !== null)
      position = read(value as Record<string, unknown>);
  } catch {
    position = null;
  }
  if (position === null) ex.fail('invalid_query', { detail: 'cursor is invalid' });
  return position;
}
