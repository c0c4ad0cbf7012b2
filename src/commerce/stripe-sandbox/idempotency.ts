/**
 * Idempotent requests: `Idempotency-Key` on POST.
 *
 * The first request with a key runs and its answer (status and body) is saved; a later
 * request with the same key and the same method, path and parameters gets the saved
 * answer again, marked `Idempotent-Replayed: true`, without running. The same key with
 * different parameters is refused with Stripe's `idempotency_error`. As on Stripe, only
 * answers of requests that ran are saved (not those refused before running, such as a
 * bad key) and keys expire after 24 hours. The store is bounded: past its limit the
 * oldest key is forgotten. Keys are scoped to the API key.
 */
import { createHash } from 'node:crypto';
import { idempotencyMismatch, invalidParam } from './errors.js';

const KEY_LENGTH_MAX = 255;
const TTL_SECONDS = 24 * 60 * 60;

export interface SavedAnswer {
  readonly status: number;
  readonly body: string;
}

interface Entry extends SavedAnswer {
  readonly fingerprint: string;
  readonly savedAt: number;
}

export class IdempotencyStore {
  readonly #entries = new Map<string, Entry>();

  constructor(
    private readonly nowSeconds: () => number,
    private readonly limit = 10_000,
  ) {}

  /** What identifies "the same request": method, path and the raw parameters. */
  static fingerprint(method: string, path: string, query: string, body: string): string {
    return createHash('sha256').update(`${method} ${path}\n${query}\n${body}`).digest('hex');
  }

  /** The saved answer for a replay, undefined for a fresh key; throws on a mismatch. */
  lookup(apiKey: string, key: string, fingerprint: string): SavedAnswer | undefined {
    if (key.length > KEY_LENGTH_MAX) {
      throw invalidParam(
        'Idempotency-Key',
        `Idempotency-Key must be at most ${KEY_LENGTH_MAX} characters long.`,
      );
    }
    const slot = `${apiKey}\n${key}`;
    const entry = this.#entries.get(slot);
    if (entry === undefined) return undefined;
    if (this.nowSeconds() - entry.savedAt > TTL_SECONDS) {
      this.#entries.delete(slot);
      return undefined;
    }
    if (entry.fingerprint !== fingerprint) throw idempotencyMismatch(key);
    return entry;
  }

  save(apiKey: string, key: string, fingerprint: string, answer: SavedAnswer): void {
    const slot = `${apiKey}\n${key}`;
    this.#entries.delete(slot);
    if (this.#entries.size >= this.limit) {
      const oldest = this.#entries.keys().next();
      if (oldest.done !== true) this.#entries.delete(oldest.value);
    }
    this.#entries.set(slot, { ...answer, fingerprint, savedAt: this.nowSeconds() });
  }
}
