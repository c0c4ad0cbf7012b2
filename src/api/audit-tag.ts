/**
 * The tag of an audited shard write: its actor and a fresh reference. The shard derives
 * the audit entry from the command (actors/ops.ts, the op table) and stores it in the
 * change's own transaction (if the write changes anything), so a crash before the entry
 * reaches the chain cannot lose it: the server appends it at the next start.
 *
 * References are a random per-process prefix and a counter: unique across restarts
 * without a crypto call per request.
 */
import { randomBytes } from 'node:crypto';
import type { AuditTag } from '../../actors/protocol.js';

const REF_PREFIX = `${randomBytes(9).toString('base64url')}.`;
let refCounter = 0;

/** A tag for a write made with the key `actor` (its id). */
export function newAuditTag(actor: string): AuditTag {
  return { ref: `${REF_PREFIX}${(refCounter++).toString(36)}`, actor };
}
