/**
 * A blocked Bloom filter over idempotency keys: one per era of groups of sealed runs, one per
 * group and a smaller one per run, so a lookup reads only the runs that may hold its key.
 *
 * Why blocked: every bit a key sets lies in one 512-bit block (one cache line), so a probe
 * costs one memory read, not one per bit. With FILTER_BITS_SET bits set per key, a filter
 * of FILTER_BITS_PER_KEY bits per key answers "maybe" for about 0.6% of the keys it never
 * held, one of RUN_FILTER_BITS_PER_KEY for about 3%, one of ERA_FILTER_BITS_PER_KEY for
 * about 0.2%.
 *
 * A key's two hashes come from `keyHashes`: the customer and environment hashed with
 * FNV-1a, mixed with 60 bits of the scope digest (itself 128 bits of SHA-256). The hashes
 * are written into `KEY_HASHES` rather than returned, so a lookup allocates nothing.
 */
import { assert } from '../shared/assert.js';

/** Bits per key of a group's filter (every lookup that misses memory probes each group's). */
export const FILTER_BITS_PER_KEY = 12;
/** Bits per key of a run's filter (probed only where its group's filter says maybe). */
export const RUN_FILTER_BITS_PER_KEY = 8;
/** Bits per key of an era's filter (many groups' keys: ~0.2% maybe for an absent key). */
export const ERA_FILTER_BITS_PER_KEY = 16;
const FILTER_BITS_SET = 8;
const BLOCK_WORDS = 16;

/** What the read-aheads read, folded together: a use of the reads, so none is dropped. */
let _readAheadSink = 0;

/**
 * Keeps `seen`, what a read-ahead read (`KeyFilter.readAhead`, and the held keys' table):
 * reads nothing uses could be dropped as unused, and their cache misses would come back.
 */
export function keepReads(seen: number): void {
  _readAheadSink ^= seen;
}

/** The two hashes of the key `keyHashes` was last called with. */
export const KEY_HASHES = new Int32Array(2);

/**
 * The value of each ASCII base64url character (the digest's alphabet); every other code
 * counts as 63 (`sextet`). A table: the branches over character ranges it replaces made
 * `keyHashes` twice as slow, and a keyed write calls it up to three times.
 */
const SEXTETS = new Uint8Array(128).fill(63);
for (const [first, last, value] of [
  ['A', 'Z', 0],
  ['a', 'z', 26],
  ['0', '9', 52],
] as const)
  for (let code = first.charCodeAt(0); code <= last.charCodeAt(0); code++)
    SEXTETS[code] = value + code - first.charCodeAt(0);
SEXTETS['-'.charCodeAt(0)] = 62;

function sextet(code: number): number {
  return code < 128 ? (SEXTETS[code] as number) : 63;
}

/** 30 bits of `digest` from character `from` on (5 characters; fewer if it is shorter). */
function digestBits(digest: string, from: number): number {
  let bits = 0;
  const end = Math.min(digest.length, from + 5);
  for (let i = from; i < end; i++) bits = (bits << 6) | sextet(digest.charCodeAt(i));
  return bits;
}

function mix(value: number): number {
  let h = value;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return h ^ (h >>> 16);
}

/** Sets KEY_HASHES to the hashes of the key [environment, customerId, scopeDigest]. */
export function keyHashes(environment: string, customerId: string, scopeDigest: string): void {
  let h = environment === 'live' ? 0x811c9dc5 : 0x050c5d1f;
  for (let i = 0; i < customerId.length; i++)
    h = Math.imul(h ^ customerId.charCodeAt(i), 0x01000193);
  KEY_HASHES[0] = mix(h ^ digestBits(scopeDigest, 0));
  KEY_HASHES[1] = mix(Math.imul(h, 0x9e3779b1) ^ digestBits(scopeDigest, 5));
}

export class KeyFilter {
  private constructor(
    private words: Int32Array,
    /** Whether its words are its own memory (else a part of an era's: idempotency-eras.ts). */
    private owned = true,
  ) {
    assert(words.length > 0 && words.length % BLOCK_WORDS === 0, 'a filter is whole blocks');
  }

  /** Bytes of a filter sized for `keys` keys at `bitsPerKey` bits each (whole blocks). */
  static bytesFor(keys: number, bitsPerKey: number): number {
    return Math.max(1, Math.ceil((keys * bitsPerKey) / (BLOCK_WORDS * 32))) * BLOCK_WORDS * 4;
  }

  /** An empty filter sized for `keys` keys at `bitsPerKey` bits each. */
  static sized(keys: number, bitsPerKey = FILTER_BITS_PER_KEY): KeyFilter {
    return new KeyFilter(new Int32Array(KeyFilter.bytesFor(keys, bitsPerKey) / 4));
  }

  /** A filter over `bytes` of `buffer` from `offset` (not copied: zero for an empty one). */
  static over(buffer: ArrayBufferLike, offset: number, bytes: number): KeyFilter {
    return new KeyFilter(new Int32Array(buffer, offset, bytes / 4), false);
  }

  /**
   * Moves the filter onto the same bytes elsewhere (its era's image on the memory map): the
   * words at `offset` of `buffer` must equal its own.
   */
  moveTo(buffer: ArrayBufferLike, offset: number): void {
    this.words = new Int32Array(buffer, offset, this.words.length);
    this.owned = false;
  }

  /** A filter stored by `bytes` (a copy: the bytes may be a reused read buffer). */
  static fromBytes(bytes: Uint8Array): KeyFilter {
    assert(bytes.byteLength % (BLOCK_WORDS * 4) === 0, 'a stored filter is whole blocks');
    const words = new Int32Array(bytes.byteLength / 4);
    new Uint8Array(words.buffer).set(bytes);
    return new KeyFilter(words);
  }

  /** A filter stored in `chunks`, in order (copied). */
  static fromChunks(chunks: readonly Uint8Array[]): KeyFilter {
    const total = chunks.reduce((sum, chunk) => sum + chunk.byteLength, 0);
    assert(total % (BLOCK_WORDS * 4) === 0, 'a stored filter is whole blocks');
    const words = new Int32Array(total / 4);
    const view = new Uint8Array(words.buffer);
    let at = 0;
    for (const chunk of chunks) {
      view.set(chunk, at);
      at += chunk.byteLength;
    }
    return new KeyFilter(words);
  }

  /** The filter's bytes, to store. */
  get bytes(): Uint8Array {
    return new Uint8Array(this.words.buffer, this.words.byteOffset, this.words.byteLength);
  }

  /** The filter's size in bytes. */
  get byteLength(): number {
    return this.words.byteLength;
  }

  /** Bytes of its own memory (0 for a part of an era's memory or of the memory map). */
  get ownedBytes(): number {
    return this.owned ? this.words.byteLength : 0;
  }

  /**
   * Reads the block of each of `count` keys whose hashes `hashes` holds in pairs (as
   * KEY_HASHES holds one), all in one tight loop: a key's block is a cache miss in a
   * filter of megabytes, and issued one after another with no work between, the misses
   * overlap, where `add` or `mayContain` between other work each waits for its own.
   * Returns the OR of the word holding each key's first bit (also kept: `keepReads`).
   * `from` is the pair to start at (a part of a longer list).
   */
  readAhead(hashes: Int32Array, count: number, from = 0): number {
    const words = this.words;
    let seen = 0;
    for (let i = from; i < from + count; i++) {
      const base = this.block(hashes[2 * i] as number);
      seen |= words[base + (((hashes[2 * i + 1] as number) & 511) >>> 5)] as number;
    }
    keepReads(seen);
    return seen;
  }

  /** Adds the key KEY_HASHES holds. */
  add(): void {
    const base = this.block();
    const h = KEY_HASHES[1] as number;
    const step = (h >>> 9) | 1;
    for (let i = 0, bit = h & 511; i < FILTER_BITS_SET; i++, bit = (bit + step) & 511) {
      const at = base + (bit >>> 5);
      this.words[at] = (this.words[at] as number) | (1 << (bit & 31));
    }
  }

  /** Whether the key KEY_HASHES holds may have been added (false: it never was). */
  mayContain(): boolean {
    const base = this.block();
    const h = KEY_HASHES[1] as number;
    const step = (h >>> 9) | 1;
    for (let i = 0, bit = h & 511; i < FILTER_BITS_SET; i++, bit = (bit + step) & 511)
      if (((this.words[base + (bit >>> 5)] as number) & (1 << (bit & 31))) === 0) return false;
    return true;
  }

  /** Where the block of a key whose first hash is `first` starts. */
  private block(first = KEY_HASHES[0] as number): number {
    const blocks = this.words.length / BLOCK_WORDS;
    return Math.floor((first >>> 0) * (blocks / 4294967296)) * BLOCK_WORDS;
  }
}
