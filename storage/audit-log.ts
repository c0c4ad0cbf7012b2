/**
 * The audit log: an append-only, hash-chained record of every administrative mutation,
 * one chain per environment, kept in the control store.
 *
 * Each entry carries the hash of the one before it, and its own hash covers its content
 * and that link (SHA-256 over a canonical JSON), so editing, removing or reordering any
 * stored entry breaks the chain from there on, which `verify` reports. Appends are
 * assigned their sequence number synchronously on the front end's single thread, so the
 * chain has exactly one writer per environment. An append resolves once durable.
 */
import { createHash } from 'node:crypto';
import { assert } from '../shared/assert.js';
import { decodeRecord, encodeRecord } from './codec.js';
import { durableVoid, type BinaryDb } from './lmdb-env.js';

export interface AuditInput {
  readonly action: string;
  readonly resourceType: string;
  readonly resourceId: string;
  /** The key's id, never the key. */
  readonly actor: string;
  readonly data: Readonly<Record<string, unknown>>;
}

export interface AuditEntry extends AuditInput {
  readonly id: string;
  readonly seq: number;
  readonly at: string;
  readonly prevHash: string;
  readonly hash: string;
}

export interface AuditPage {
  readonly data: readonly AuditEntry[];
  /** Continue with entries older than this sequence number, or null when none are left. */
  readonly nextBefore: number | null;
}

export type AuditVerification =
  | { readonly ok: true; readonly entries: number; readonly lastHash: string }
  | {
      readonly ok: false;
      readonly entries: number;
      readonly brokenAt: string;
      readonly reason: string;
    };

/** The link before the first entry of a chain. */
export const GENESIS_HASH = '0'.repeat(64);

/** Entries examined per listing page at most, so a rare filter cannot scan without bound. */
const SCAN_MAX = 10_000;

function hashOf(entry: Omit<AuditEntry, 'hash'>): string {
  const canonical = JSON.stringify([
    entry.id,
    entry.seq,
    entry.at,
    entry.action,
    entry.resourceType,
    entry.resourceId,
    entry.actor,
    entry.data,
    entry.prevHash,
  ]);
  return createHash('sha256').update(canonical).digest('hex');
}

export class AuditLog {
  private readonly last = new Map<string, { seq: number; hash: string }>();
  /** Per stream: entries stamped since a UTC midnight (entriesSince). */
  private readonly today = new Map<string, { dayStartMs: number; count: number }>();

  /**
   * `refs` (ref → [stream, seq]) records which entries arrived with a reference: those a
   * shard stored with its change too, so recovery appends only the ones the chain lacks.
   */
  constructor(
    private readonly db: BinaryDb,
    private readonly refs: BinaryDb | null = null,
  ) {}

  /** Whether an entry with this reference is in a chain. */
  hasRef(ref: string): boolean {
    return this.refs?.get(ref) !== undefined;
  }

  private tail(environment: string): { seq: number; hash: string } {
    let tail = this.last.get(environment);
    if (tail === undefined) {
      tail = { seq: 0, hash: GENESIS_HASH };
      for (const { value } of this.db.getRange({
        start: [environment, Number.MAX_SAFE_INTEGER],
        end: [environment, 0],
        reverse: true,
        limit: 1,
      })) {
        const entry = decode(value);
        tail = { seq: entry.seq, hash: entry.hash };
      }
      this.last.set(environment, tail);
    }
    return tail;
  }

  /** The sequence number of the chain's newest entry (0 when empty). */
  lastSeq(stream: string): number {
    return this.tail(stream).seq;
  }

  /** The stored bytes of entries 1..`upToSeq`, in order: a snapshot copies them verbatim. */
  *rawEntries(stream: string, upToSeq: number): Generator<[number, Buffer]> {
    for (const { key, value } of this.db.getRange({
      start: [stream, 0],
      end: [stream, upToSeq + 1],
    })) {
      yield [(key as [string, number])[1], value];
    }
  }

  /** Stores an entry's bytes as they were (restore); resolves once durable. */
  putRaw(stream: string, seq: number, bytes: Uint8Array): Promise<void> {
    this.last.delete(stream);
    return durableVoid(
      this.db.put([stream, seq], Buffer.from(bytes)),
      `audit ${stream} ${seq} restore`,
    );
  }

  /**
   * Appends an entry, and its `ref` (if any) in the same transaction; resolves with it once
   * durable. Rejects only if the disk fails.
   */
  /**
   * Entries in `stream` stamped at or after `dayStartMs` (a UTC midnight), for a daily
   * quota: counted once from the chain's newest end, then kept up to date by `append`.
   */
  entriesSince(stream: string, dayStartMs: number): number {
    const known = this.today.get(stream);
    if (known !== undefined && known.dayStartMs === dayStartMs) return known.count;
    let count = 0;
    for (const { value } of this.db.getRange({
      start: [stream, Number.MAX_SAFE_INTEGER],
      end: [stream, 0],
      reverse: true,
    })) {
      if (Date.parse(decode(value).at) < dayStartMs) break;
      count++;
    }
    this.today.set(stream, { dayStartMs, count });
    return count;
  }

  async append(
    environment: string,
    input: AuditInput,
    nowMs: number,
    ref?: string,
  ): Promise<AuditEntry> {
    const tail = this.tail(environment);
    const seq = tail.seq + 1;
    const unhashed = {
      id: `aud_${environment}_${seq}`,
      seq,
      at: new Date(nowMs).toISOString(),
      ...input,
      prevHash: tail.hash,
    };
    const entry: AuditEntry = { ...unhashed, hash: hashOf(unhashed) };
    this.last.set(environment, { seq, hash: entry.hash });
    try {
      const written = durableVoid(
        this.db.put([environment, seq], encodeRecord(entry)),
        `audit ${entry.id} write`,
      );
      // Issued in the same turn as the entry: the control store commits both in one transaction.
      if (ref !== undefined && this.refs !== null)
        this.refs.put(ref, encodeRecord([environment, seq])).catch(() => undefined);
      await written;
      const today = this.today.get(environment);
      if (today !== undefined && nowMs >= today.dayStartMs) today.count++;
    } catch (error) {
      // The entry is not on disk: forget the tail so the next append links to what is.
      this.last.delete(environment);
      throw error;
    }
    return entry;
  }

  /** Newest first, optionally filtered; `before` continues a previous page. */
  page(
    environment: string,
    filter: { action?: string; resourceType?: string },
    limit: number,
    before: number | null,
  ): AuditPage {
    const data: AuditEntry[] = [];
    let scanned = 0;
    const start = [environment, before === null ? Number.MAX_SAFE_INTEGER : before - 1];
    for (const { value } of this.db.getRange({ start, end: [environment, 0], reverse: true })) {
      const entry = decode(value);
      // Past the scan bound, hand back what was found; the cursor resumes at this entry.
      if (++scanned > SCAN_MAX) return { data, nextBefore: entry.seq + 1 };
      if (filter.action !== undefined && entry.action !== filter.action) continue;
      if (filter.resourceType !== undefined && entry.resourceType !== filter.resourceType) continue;
      if (data.length === limit) return { data, nextBefore: data.at(-1)?.seq ?? null };
      data.push(entry);
    }
    return { data, nextBefore: null };
  }

  /** Walks the chain from the first entry, recomputing every hash and link. */
  verify(environment: string): AuditVerification {
    let prev = GENESIS_HASH;
    let expectedSeq = 1;
    let entries = 0;
    for (const { key, value } of this.db.getRange({
      start: [environment, 0],
      end: [environment, Number.MAX_SAFE_INTEGER],
    })) {
      const decoded = decodeRecord(value);
      const seq = (key as [string, number])[1];
      if (!decoded.ok)
        return {
          ok: false,
          entries,
          brokenAt: `aud_${environment}_${seq}`,
          reason: `stored record is unreadable (${decoded.reason})`,
        };
      const entry = decoded.value as AuditEntry;
      if (seq !== expectedSeq || entry.seq !== seq)
        return {
          ok: false,
          entries,
          brokenAt: entry.id,
          reason: `expected entry ${expectedSeq}, found ${seq}`,
        };
      if (entry.prevHash !== prev)
        return {
          ok: false,
          entries,
          brokenAt: entry.id,
          reason: 'link to the previous entry does not match',
        };
      const { hash, ...rest } = entry;
      if (hashOf(rest) !== hash)
        return {
          ok: false,
          entries,
          brokenAt: entry.id,
          reason: 'content does not match its hash',
        };
      prev = hash;
      expectedSeq++;
      entries++;
    }
    return { ok: true, entries, lastHash: prev };
  }
}

function decode(bytes: Buffer): AuditEntry {
  const decoded = decodeRecord(bytes);
  assert(decoded.ok, 'audit record readable');
  return decoded.value as AuditEntry;
}
