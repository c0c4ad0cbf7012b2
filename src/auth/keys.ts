/**
 * API keys: generation, hashing and verification.
 *
 * Keys look like `sk_test_<32 url-safe chars>` (server/client × test/live) or
 * `ak_<32>` (the operator key, which belongs to no environment). Only their SHA-256
 * is stored; verification hashes the presented key and looks the digest up. No
 * comparison ever runs over a stored key's secret, so the time an answer takes cannot
 * tell a guesser how much of a real key it got right, which is what a constant-time
 * comparison is for: the map compares digests, and a digest reveals nothing of a key
 * that matches it in part. Revocation takes effect on the next request.
 */
import { createHash, hash, randomBytes } from 'node:crypto';
import type { Environment } from '../../actors/protocol.js';
import type { ControlStore, KeyRecord } from '../../storage/control-store.js';

export type KeyClass = KeyRecord['keyClass'];

const KEY_PATTERN = /^(?:(sk|ck)_(test|live)_|ak_)[A-Za-z0-9_-]{24,128}$/;
const CLASS_PREFIX: Record<KeyClass, string> = { server: 'sk', client: 'ck', admin: 'ak' };

export interface IssuedKey {
  readonly secret: string;
  readonly record: KeyRecord;
}

function sha256(text: string): Buffer {
  return createHash('sha256').update(text).digest();
}

/** Creates a key (not yet stored): 24 random bytes → 32 url-safe characters. */
export function issueKey(
  keyClass: KeyClass,
  environment: Environment | null,
  nowMs: number,
): IssuedKey {
  const random = randomBytes(24).toString('base64url');
  const prefix =
    keyClass === 'admin' ? 'ak_' : `${CLASS_PREFIX[keyClass]}_${environment ?? 'test'}_`;
  const secret = prefix + random;
  const record: KeyRecord = {
    id: `key_${randomBytes(8).toString('hex')}`,
    prefix: secret.slice(0, prefix.length + 4),
    hashHex: sha256(secret).toString('hex'),
    environment: keyClass === 'admin' ? null : environment,
    keyClass,
    createdAtMs: nowMs,
    revokedAtMs: null,
  };
  return { secret, record };
}

/**
 * The in-memory key table of the front end, backed by the control store, by SHA-256
 * digest as a 32-character latin1 string (one character per byte): one-shot
 * `crypto.hash` straight to a string is the cheapest way to hash a presented key on the
 * hot path (a Buffer costs three times as much), and latin1 the cheapest encoding of it.
 * No `timingSafeEqual` runs after the lookup: it would only compare the digest just found
 * with itself, and cost a Buffer per request.
 */
/** Keys the ring remembers as verified (see `verify`); all are forgotten when it fills. */
const VERIFIED_MAX = 4_096;

export class KeyRing {
  private readonly byHash = new Map<string, KeyRecord>();
  /**
   * Live keys as presented, once verified: a SHA-256 per request was the largest part of a
   * `has` answered from memory. Emptied whenever any key is added or revoked, so a revoked
   * key is refused by the very next request, as before.
   */
  private readonly verified = new Map<string, KeyRecord>();

  /**
   * Called with every key after each add or revoke, before it resolves: the first front end
   * hands the keys to the others here, so a key revoked is refused by all of them once the
   * revocation is answered.
   */
  afterChange: ((records: KeyRecord[]) => Promise<void>) | null = null;

  constructor(private readonly store: Pick<ControlStore, 'listKeys' | 'putKey'>) {
    for (const record of store.listKeys()) this.index(record);
  }

  /** Replaces every key with `records` (a front end after the first, told by the first). */
  replaceAll(records: readonly KeyRecord[]): void {
    this.byHash.clear();
    this.verified.clear();
    for (const record of records) this.index(record);
  }

  private index(record: KeyRecord): void {
    this.verified.clear();
    this.byHash.set(Buffer.from(record.hashHex, 'hex').toString('latin1'), record);
  }

  get size(): number {
    return this.byHash.size;
  }

  /** Stores the key durably before it can be used. */
  async add(record: KeyRecord): Promise<void> {
    await this.store.putKey(record);
    this.index(record);
    await this.afterChange?.(this.list());
  }

  /** Every key (live and revoked), oldest first. */
  list(): KeyRecord[] {
    return [...this.byHash.values()].sort(
      (a, b) => a.createdAtMs - b.createdAtMs || (a.id < b.id ? -1 : 1),
    );
  }

  find(id: string): KeyRecord | undefined {
    for (const record of this.byHash.values()) if (record.id === id) return record;
    return undefined;
  }

  /**
   * Marks the key revoked, durably, and only then stops accepting it: the next request
   * with it answers 401. Resolves with the revoked record (the same one if it already
   * was revoked); rejects if the disk write fails, in which case the key still works.
   */
  async revoke(id: string, nowMs: number): Promise<KeyRecord | undefined> {
    const current = this.find(id);
    if (current === undefined || current.revokedAtMs !== null) return current;
    const revoked: KeyRecord = { ...current, revokedAtMs: nowMs };
    await this.store.putKey(revoked);
    this.index(revoked);
    await this.afterChange?.(this.list());
    return revoked;
  }

  /**
   * The live record for a presented key, or null for anything unknown, malformed or
   * revoked. Never throws for client input.
   */
  verify(presented: string): KeyRecord | null {
    const known = this.verified.get(presented);
    if (known !== undefined) return known;
    if (!KEY_PATTERN.test(presented)) return null;
    // 'binary' is Node's name for latin1 in `crypto.hash`.
    const record = this.byHash.get(hash('sha256', presented, 'binary'));
    if (record === undefined || record.revokedAtMs !== null) return null;
    if (this.verified.size >= VERIFIED_MAX) this.verified.clear();
    this.verified.set(presented, record);
    return record;
  }
}

/**
 * The token of `Authorization: Bearer <token>`; the scheme name is case-insensitive (RFC 9110
 * §11.1). '' when the header is absent or another scheme.
 */
export function bearerToken(header: string): string {
  return header.length > 7 && header.slice(0, 7).toLowerCase() === 'bearer '
    ? header.slice(7).trim()
    : '';
}
