/**
 * Idempotency keys in memory, off the JavaScript heap: the keys a shard decided since its
 * last sealed run, until the next run that holds them is on disk (idempotency-runs.ts).
 *
 * A shard holds up to two batches of IDEMPOTENCY_RUN_KEYS keys here, long enough for
 * them to reach the old generation. Held as an object, a string and a map entry each,
 * every one of them is more for each major GC to mark, and once its batch is sealed
 * garbage the next collection must clear: the heap and the resident memory rise and fall
 * with every batch. So a key lives in a row of a typed array instead, 64 bytes, one cache
 * line:
 *
 * - its digest's and its fingerprint's characters, a byte each (both are ASCII and short:
 *   a digest is 22 characters, an amount's fingerprint a handful); texts that are not, or
 *   do not fit, go to a pool of UTF-16 code units the row points into;
 * - its customer as an index into the batch's customers (an id string and a map entry per
 *   customer, not per key), its environment, its time. The index is found when the batch is
 *   sealed (`indexCustomers`), not when a key is set: a lookup in a map of thousands of
 *   customers is several cache misses, ~0.5 µs of a keyed write's path, and a few dozen
 *   nanoseconds in sealing's loop over the batch. Until then the batch keeps each slot's id
 *   in one array (a reference a key: a caller that passes a customer's own id, as the shard
 *   does, adds no string a key);
 * - its two hashes (key-filter.ts: over customer, environment and digest), computed once per
 *   key: a slot's first hash places it in an open-addressing table (a digest many customers
 *   share, the same key text, spreads like any other), and sealing sets the filters' bits
 *   from both without hashing the key again.
 *
 * One line a key, not one in each of a dozen columns: keeping a key between a write's other
 * work, and sealing's reads of a batch in run order (a customer's keys lie anywhere in the
 * batch), each touch one line where columns touched one per field.
 *
 * `clear` empties a batch but keeps its arrays, so the store reuses a sealed batch's
 * arrays for the next one and this memory does not rise and fall with each run. `get` and
 * `keyAt` build the objects they return; a lookup that misses builds nothing.
 */
import { assert } from '../shared/assert.js';
import { packAsciiUnits } from './codec.js';
import { KEY_HASHES, keepReads } from './key-filter.js';

/** A stored key: the fingerprint (the amount) of the write that used it first, and when. */
export interface StoredKey {
  readonly fingerprint: string;
  readonly atMs: number;
}

/** Where a key is stored: its customer and the digest of its scope. */
export interface KeyAddress {
  readonly environment: 'test' | 'live';
  readonly customerId: string;
  readonly scopeDigest: string;
}

/** A key to store. */
export interface KeyPut extends KeyAddress, StoredKey {}

/**
 * An address with its key's two hashes (`keyHashes`, key-filter.ts), computed once when the
 * address is made: a keyed write's lookups read ahead, probe memory and the filters, and
 * keep the key, all with them. The hashes are of its own fields: a copy with another
 * customer, environment or digest must not carry them (its lookups would miss).
 */
export interface HashedAddress extends KeyAddress {
  readonly first: number;
  readonly second: number;
  /**
   * The key store's probe stamp at which every era's filter said no to this key (its
   * read-ahead probes them: idempotency-runs.ts), or absent: its lookup skips the eras'
   * groups while the stamp is current.
   */
  clearOfEras?: number;
}

/** Whether `a` and `b` are the same key's address (its customer, environment and digest). */
export function sameAddress(a: KeyAddress, b: KeyAddress): boolean {
  return (
    a.scopeDigest === b.scopeDigest &&
    a.customerId === b.customerId &&
    a.environment === b.environment
  );
}

/** The slots a batch of keys starts with unless told otherwise. */
const FIRST_SLOTS = 1024;
/**
 * A slot's row: 16 words, 64 bytes, one cache line. Words: the customer's index, the meta
 * word, the two hashes, the time (a float64 over words 4–5), then 40 bytes of text: the
 * digest's characters and the fingerprint's, one byte each, where both are ASCII and fit
 * (a digest takes 22, an amount's fingerprint ~2–13). A key whose texts do not fit keeps
 * them in the pool instead, and its row says where (words 6–9).
 */
const ROW_WORDS = 16;
const ROW_BYTES = 4 * ROW_WORDS;
const CUSTOMER = 0;
const META = 1;
const FIRST = 2;
const SECOND = 3;
/** The time's index in a float64 view of the rows: words 4–5. */
const AT_MS = 2;
const DIGEST_START = 6;
const DIGEST_LENGTH = 7;
const FINGERPRINT_START = 8;
const FINGERPRINT_LENGTH = 9;
const TEXT_OFFSET = 24;
const TEXT_BYTES = ROW_BYTES - TEXT_OFFSET;
/** The meta word: bit 0 live, bit 1 texts in the row, then both lengths when they are. */
const LIVE_BIT = 1;
const IN_ROW_BIT = 2;
const DIGEST_LENGTH_SHIFT = 8;
const FINGERPRINT_LENGTH_SHIFT = 16;
/** Code units the pool starts with: only texts that do not fit a row go there. */
const FIRST_POOL_UNITS = 64;
/** How much an array grows when it is full, and the fewest slots it grows to. */
const GROWTH = 1.5;
const FEWEST_GROWN_SLOTS = 16;
/** The longest text built through an array kept for its length (`#text`). */
const REUSED_TEXT_UNITS = 64;
/** Those arrays by length, shared by every batch (one thread uses them, one call at a time). */
const textUnits: number[][] = [];

/** The table's size for `slots` keys: a power of two, at least twice as many. */
function tableSizeFor(slots: number): number {
  return 2 ** Math.ceil(Math.log2(2 * Math.max(1, slots)));
}

export class HeldKeys {
  /** Each customer's index in `#customers` (ids of both environments share one). */
  #customerIndex = new Map<string, number>();
  #customers: string[] = [];
  /** Each slot's customer id, as `set` was given it. */
  #ids: string[] = [];
  /** Slots from the first whose customer has its index in their row (`indexCustomers`). */
  #indexed = 0;
  /** Each customer's place in id order, once `rankCustomer` has given every one its own. */
  #rank = new Int32Array(0);
  #ranked = 0;
  /** The slots' rows (ROW_WORDS words each), and views of the same memory. */
  #rows: Int32Array;
  #times: Float64Array;
  #bytes: Uint8Array;
  /** Code units of the texts that do not fit their row. */
  #pool = new Uint16Array(FIRST_POOL_UNITS);
  #poolEnd = 0;
  /** Slot + 1 at each hash position, 0 where empty; a power of two, at least twice the slots. */
  #table: Int32Array;
  size = 0;
  /**
   * The last lookup that missed: its address and the empty position it ended at, where
   * `set` of that address puts the key without a second lookup (a keyed write looks its
   * key up, then sets it). Any change to the table forgets it.
   */
  #missed: KeyAddress | null = null;
  #missedAt = 0;

  /**
   * Room for `slots` keys before any array grows (the store sizes a batch for the keys
   * a run is sealed at, and a little over: keys keep coming while the previous run seals).
   */
  constructor(slots = FIRST_SLOTS) {
    this.#rows = new Int32Array(ROW_WORDS * slots);
    this.#times = new Float64Array(this.#rows.buffer);
    this.#bytes = new Uint8Array(this.#rows.buffer);
    this.#table = new Int32Array(tableSizeFor(slots));
  }

  /** Keys it holds before its arrays grow. */
  get capacity(): number {
    return this.#rows.length / ROW_WORDS;
  }

  /** Bytes its arrays take (what the batch costs, whatever it holds now). */
  get byteLength(): number {
    return this.#rows.byteLength + this.#pool.byteLength + this.#table.byteLength;
  }

  /** The key at `address`, whose first hash (`keyHashes`) is `first`, or undefined. */
  get(address: KeyAddress, first: number): KeyPut | undefined {
    const slot = this.#find(address, first);
    return slot < 0 ? undefined : this.keyAt(slot);
  }

  /** Sets `put`, whose hashes (`keyHashes`) are `first` and `second`. */
  set(put: KeyPut, first: number, second: number): void {
    const missed = this.#missed;
    const reuse = missed !== null && sameAddress(missed, put);
    const found = reuse ? -1 : this.#find(put, first);
    const missedAt = this.#missedAt;
    this.#missed = null;
    if (found >= 0) {
      this.#setFingerprint(found, put.fingerprint);
      this.#times[found * (ROW_WORDS / 2) + AT_MS] = put.atMs;
      return;
    }
    const grew = this.size === this.capacity;
    if (grew) this.#grow();
    const slot = this.size++;
    this.#ids[slot] = put.customerId;
    const rows = this.#rows;
    const row = slot * ROW_WORDS;
    rows[row + FIRST] = first;
    rows[row + SECOND] = second;
    this.#times[slot * (ROW_WORDS / 2) + AT_MS] = put.atMs;
    this.#writeTexts(
      slot,
      put.environment === 'live' ? LIVE_BIT : 0,
      put.scopeDigest,
      put.fingerprint,
    );
    if (reuse && !grew) this.#table[missedAt] = slot + 1;
    else this.#place(slot);
  }

  /** Empties the batch, keeping its arrays for the next one. */
  clear(): void {
    this.#missed = null;
    this.#customerIndex = new Map();
    this.#customers = [];
    this.#indexed = 0;
    this.#ranked = 0;
    this.#table.fill(0);
    this.#poolEnd = 0;
    this.size = 0;
  }

  /** Every key, in the order each was first set. */
  *values(): IterableIterator<KeyPut> {
    for (let slot = 0; slot < this.size; slot++) yield this.keyAt(slot);
  }

  /**
   * Gives up to `count` more slots their customer's index (the customers are numbered in
   * the order their first keys were set). Returns whether every slot has one. Sealing
   * indexes a batch a slice per turn before it orders it (`runOrder`).
   */
  indexCustomers(count: number): boolean {
    const end = Math.min(this.size, this.#indexed + count);
    const rows = this.#rows;
    for (let slot = this.#indexed; slot < end; slot++) {
      const id = this.#ids[slot] as string;
      let customer = this.#customerIndex.get(id);
      if (customer === undefined) {
        customer = this.#customers.length;
        this.#customers.push(id);
        this.#customerIndex.set(id, customer);
      }
      rows[slot * ROW_WORDS + CUSTOMER] = customer;
    }
    this.#indexed = end;
    return end === this.size;
  }

  /**
   * Customers the batch holds keys of (the ids of both environments count once), once
   * every slot is indexed (`indexCustomers`).
   */
  get customerCount(): number {
    assert(this.#indexed === this.size, 'customers are counted once every slot is indexed');
    return this.#customers.length;
  }

  /** Up to `count` customers from `from` on, in the order of their ids. */
  sortedCustomers(from: number, count: number): Int32Array {
    const customers = new Int32Array(Math.max(0, Math.min(count, this.#customers.length - from)));
    for (let i = 0; i < customers.length; i++) customers[i] = from + i;
    return customers.sort(this.compareCustomers);
  }

  /** The order of customer ids: code unit by code unit, as strings compare (none are equal). */
  readonly compareCustomers = (a: number, b: number): number =>
    (this.#customers[a] as string) < (this.#customers[b] as string) ? -1 : 1;

  /**
   * Gives `customer` the next place in id order. Called once for every customer, in the
   * order of `compareCustomers`, before the keys are sorted: keys then compare customers
   * by place, not by id (comparing ids as strings per pair of keys would cost ~0.9 µs a
   * key of a 131,072-key batch over 10,000 customers; ranking them first, ~0.03).
   */
  rankCustomer(customer: number): void {
    if (this.#ranked === 0 && this.#rank.length < this.#customers.length)
      this.#rank = new Int32Array(Math.ceil(GROWTH * this.#customers.length));
    this.#rank[customer] = this.#ranked++;
  }

  /**
   * The bucket of `slot` in the order a run is written in: live before test, then by
   * customer id (a customer's place). Every customer must have its place (`rankCustomer`).
   */
  bucketOf(slot: number): number {
    const row = slot * ROW_WORDS;
    const rank = this.#rank[this.#rows[row + CUSTOMER] as number] as number;
    return this.isLive(slot) ? rank : this.#customers.length + rank;
  }

  /** Buckets of `bucketOf`: two per customer (live and test). */
  get buckets(): number {
    assert(
      this.#indexed === this.size && this.#ranked === this.#customers.length,
      'buckets are counted once customers are ranked',
    );
    return 2 * this.#customers.length;
  }

  /**
   * The order a run is written in, as the keys' environments (live first), customer ids and
   * digests compare as strings. Every customer must have its place (`rankCustomer`).
   */
  readonly compare = (a: number, b: number): number => {
    const rows = this.#rows;
    const rowA = a * ROW_WORDS;
    const rowB = b * ROW_WORDS;
    const metaA = rows[rowA + META] as number;
    const metaB = rows[rowB + META] as number;
    const live = (metaB & LIVE_BIT) - (metaA & LIVE_BIT);
    if (live !== 0) return live;
    const customerA = rows[rowA + CUSTOMER] as number;
    const customerB = rows[rowB + CUSTOMER] as number;
    if (customerA !== customerB)
      return (this.#rank[customerA] as number) - (this.#rank[customerB] as number);
    const lengthA = this.#digestLength(a);
    const lengthB = this.#digestLength(b);
    const common = Math.min(lengthA, lengthB);
    if ((metaA & metaB & IN_ROW_BIT) !== 0) {
      const bytes = this.#bytes;
      const startA = a * ROW_BYTES + TEXT_OFFSET;
      const startB = b * ROW_BYTES + TEXT_OFFSET;
      for (let i = 0; i < common; i++) {
        const unit = (bytes[startA + i] as number) - (bytes[startB + i] as number);
        if (unit !== 0) return unit;
      }
    } else
      for (let i = 0; i < common; i++) {
        const unit = this.#digestUnit(a, i) - this.#digestUnit(b, i);
        if (unit !== 0) return unit;
      }
    return lengthA - lengthB;
  };

  /** The key in `slot`, as an object of its own. */
  keyAt(slot: number): KeyPut {
    return {
      environment: this.isLive(slot) ? 'live' : 'test',
      customerId: this.customerIdOf(slot),
      scopeDigest: this.digestOf(slot),
      fingerprint: this.fingerprintOf(slot),
      atMs: this.atMsOf(slot),
    };
  }

  /**
   * The slot's customer id. This and the reads after it make `keyAt`'s object; sealing
   * writes a run's blocks from them (idempotency-runs.ts) without making one.
   */
  customerIdOf(slot: number): string {
    return this.#ids[slot] as string;
  }

  isLive(slot: number): boolean {
    return ((this.#rows[slot * ROW_WORDS + META] as number) & LIVE_BIT) !== 0;
  }

  atMsOf(slot: number): number {
    return this.#times[slot * (ROW_WORDS / 2) + AT_MS] as number;
  }

  digestOf(slot: number): string {
    const row = slot * ROW_WORDS;
    const meta = this.#rows[row + META] as number;
    if ((meta & IN_ROW_BIT) !== 0)
      return this.#rowText(slot * ROW_BYTES + TEXT_OFFSET, (meta >>> DIGEST_LENGTH_SHIFT) & 0xff);
    return this.#text(
      this.#rows[row + DIGEST_START] as number,
      this.#rows[row + DIGEST_LENGTH] as number,
    );
  }

  fingerprintOf(slot: number): string {
    const row = slot * ROW_WORDS;
    const meta = this.#rows[row + META] as number;
    if ((meta & IN_ROW_BIT) !== 0) {
      const digestLength = (meta >>> DIGEST_LENGTH_SHIFT) & 0xff;
      return this.#rowText(
        slot * ROW_BYTES + TEXT_OFFSET + digestLength,
        (meta >>> FINGERPRINT_LENGTH_SHIFT) & 0xff,
      );
    }
    return this.#text(
      this.#rows[row + FINGERPRINT_START] as number,
      this.#rows[row + FINGERPRINT_LENGTH] as number,
    );
  }

  /**
   * Reads the table's position of each of `count` keys whose hashes `hashes` holds in pairs
   * (as KEY_HASHES holds one), in one loop: a position is a cache miss in a table of
   * megabytes, and read one after another the misses overlap (`KeyFilter.readAhead`).
   * Returns the OR of what it read (also kept: `keepReads`).
   */
  readAhead(hashes: Int32Array, count: number): number {
    const table = this.#table;
    const mask = table.length - 1;
    let seen = 0;
    for (let i = 0; i < count; i++) seen |= table[(hashes[2 * i] as number) & mask] as number;
    keepReads(seen);
    return seen;
  }

  /**
   * Reads the row of each slot of `slots` from `from` to `to`, in one loop: a row read in a
   * run's order (by customer and digest) is a cache miss in rows of megabytes, and read one
   * after another the misses overlap. Returns the OR of what it read (also kept: `keepReads`).
   */
  readRowsAhead(slots: Int32Array, from: number, to: number): number {
    const rows = this.#rows;
    let seen = 0;
    for (let i = from; i < to; i++) seen |= rows[(slots[i] as number) * ROW_WORDS + META] as number;
    keepReads(seen);
    return seen;
  }

  /** Sets KEY_HASHES to the slot's key's hashes (key-filter.ts), as `set` was given them. */
  hashKey(slot: number): void {
    const row = slot * ROW_WORDS;
    KEY_HASHES[0] = this.#rows[row + FIRST] as number;
    KEY_HASHES[1] = this.#rows[row + SECOND] as number;
  }

  /**
   * Writes the slot's digest, then its fingerprint, into `out` from `at` as MessagePack
   * strings (byte for byte as any MessagePack encoder writes them: a fixstr of ASCII) and
   * returns where they end; -1, having written nothing of use, if either is not short
   * ASCII (32 code units or more, or one of 0x80 or over), which the caller packs itself.
   * `out` needs room for 64 bytes from `at`.
   */
  packTexts(slot: number, out: Uint8Array, at: number): number {
    const row = slot * ROW_WORDS;
    const meta = this.#rows[row + META] as number;
    if ((meta & IN_ROW_BIT) !== 0) {
      const from = slot * ROW_BYTES + TEXT_OFFSET;
      const digestLength = (meta >>> DIGEST_LENGTH_SHIFT) & 0xff;
      const end = packAsciiUnits(this.#bytes, from, digestLength, out, at);
      if (end < 0) return -1;
      const fingerprintLength = (meta >>> FINGERPRINT_LENGTH_SHIFT) & 0xff;
      return packAsciiUnits(this.#bytes, from + digestLength, fingerprintLength, out, end);
    }
    const end = packAsciiUnits(
      this.#pool,
      this.#rows[row + DIGEST_START] as number,
      this.#rows[row + DIGEST_LENGTH] as number,
      out,
      at,
    );
    if (end < 0) return -1;
    return packAsciiUnits(
      this.#pool,
      this.#rows[row + FINGERPRINT_START] as number,
      this.#rows[row + FINGERPRINT_LENGTH] as number,
      out,
      end,
    );
  }

  /** The longest run of occupied table positions: the most a lookup can walk. */
  longestCluster(): number {
    let longest = 0;
    let run = 0;
    // Twice over the table, so a cluster that wraps around its end counts whole.
    for (let i = 0; i < 2 * this.#table.length; i++) {
      run = this.#table[i & (this.#table.length - 1)] === 0 ? 0 : run + 1;
      longest = Math.max(longest, run);
    }
    return Math.min(longest, this.size);
  }

  /**
   * The slot holding `address`, whose first hash is `first`, or -1. A miss mostly ends at
   * the first position (the table is at most half full) and reads nothing of the key.
   */
  #find(address: KeyAddress, first: number): number {
    const table = this.#table;
    const mask = table.length - 1;
    for (let at = first & mask; ; at = (at + 1) & mask) {
      const entry = table[at] as number;
      if (entry === 0) {
        this.#missed = address;
        this.#missedAt = at;
        return -1;
      }
      const slot = entry - 1;
      if (this.#rows[slot * ROW_WORDS + FIRST] === first && this.#is(slot, address)) return slot;
    }
  }

  /** Whether `slot` holds the key at `address`. */
  #is(slot: number, address: KeyAddress): boolean {
    if (
      this.isLive(slot) !== (address.environment === 'live') ||
      this.customerIdOf(slot) !== address.customerId
    )
      return false;
    const digest = address.scopeDigest;
    if (this.#digestLength(slot) !== digest.length) return false;
    for (let i = 0; i < digest.length; i++)
      if (this.#digestUnit(slot, i) !== digest.charCodeAt(i)) return false;
    return true;
  }

  #digestLength(slot: number): number {
    const row = slot * ROW_WORDS;
    const meta = this.#rows[row + META] as number;
    return (meta & IN_ROW_BIT) !== 0
      ? (meta >>> DIGEST_LENGTH_SHIFT) & 0xff
      : (this.#rows[row + DIGEST_LENGTH] as number);
  }

  /** Code unit `i` of the slot's digest. */
  #digestUnit(slot: number, i: number): number {
    const row = slot * ROW_WORDS;
    return ((this.#rows[row + META] as number) & IN_ROW_BIT) !== 0
      ? (this.#bytes[slot * ROW_BYTES + TEXT_OFFSET + i] as number)
      : (this.#pool[(this.#rows[row + DIGEST_START] as number) + i] as number);
  }

  /** Puts `slot` in the table (known absent). */
  #place(slot: number): void {
    const table = this.#table;
    const mask = table.length - 1;
    let at = (this.#rows[slot * ROW_WORDS + FIRST] as number) & mask;
    for (; table[at] !== 0; at = (at + 1) & mask);
    table[at] = slot + 1;
  }

  /**
   * Writes the slot's texts and its meta word (`environment`: the live bit or 0): into its
   * row where both are ASCII and fit, else into the pool.
   */
  #writeTexts(slot: number, environment: number, digest: string, fingerprint: string): void {
    const row = slot * ROW_WORDS;
    if (digest.length + fingerprint.length <= TEXT_BYTES) {
      const bytes = this.#bytes;
      let at = slot * ROW_BYTES + TEXT_OFFSET;
      let units = 0;
      for (let i = 0; i < digest.length; i++, at++) {
        const unit = digest.charCodeAt(i);
        units |= unit;
        bytes[at] = unit;
      }
      for (let i = 0; i < fingerprint.length; i++, at++) {
        const unit = fingerprint.charCodeAt(i);
        units |= unit;
        bytes[at] = unit;
      }
      if (units < 0x80) {
        this.#rows[row + META] =
          environment |
          IN_ROW_BIT |
          (digest.length << DIGEST_LENGTH_SHIFT) |
          (fingerprint.length << FINGERPRINT_LENGTH_SHIFT);
        return;
      }
    }
    this.#rows[row + META] = environment;
    this.#rows[row + DIGEST_START] = this.#store(digest);
    this.#rows[row + DIGEST_LENGTH] = digest.length;
    this.#rows[row + FINGERPRINT_START] = this.#store(fingerprint);
    this.#rows[row + FINGERPRINT_LENGTH] = fingerprint.length;
  }

  /** A key set again (its retention passed) keeps its place, with the new fingerprint. */
  #setFingerprint(slot: number, fingerprint: string): void {
    const row = slot * ROW_WORDS;
    const meta = this.#rows[row + META] as number;
    if ((meta & IN_ROW_BIT) !== 0) {
      this.#writeTexts(slot, meta & LIVE_BIT, this.digestOf(slot), fingerprint);
      return;
    }
    if ((this.#rows[row + FINGERPRINT_LENGTH] as number) >= fingerprint.length) {
      const start = this.#rows[row + FINGERPRINT_START] as number;
      for (let i = 0; i < fingerprint.length; i++)
        this.#pool[start + i] = fingerprint.charCodeAt(i);
    } else this.#rows[row + FINGERPRINT_START] = this.#store(fingerprint);
    this.#rows[row + FINGERPRINT_LENGTH] = fingerprint.length;
  }

  /** Appends `text`'s code units to the pool; returns where they start. */
  #store(text: string): number {
    const start = this.#poolEnd;
    if (start + text.length > this.#pool.length) {
      const pool = new Uint16Array(
        Math.max(Math.ceil(GROWTH * this.#pool.length), start + text.length),
      );
      pool.set(this.#pool.subarray(0, start));
      this.#pool = pool;
    }
    for (let i = 0; i < text.length; i++) this.#pool[start + i] = text.charCodeAt(i);
    this.#poolEnd = start + text.length;
    return start;
  }

  /** The text of `length` code units from `start` of the pool (`textOf`). */
  #text(start: number, length: number): string {
    return textOf(this.#pool, start, length);
  }

  /** The text of `length` bytes (ASCII) of the rows from byte `start` (`textOf`). */
  #rowText(start: number, length: number): string {
    return textOf(this.#bytes, start, length);
  }

  /** Grows the rows by GROWTH and rebuilds the table to fit. */
  #grow(): void {
    const slots = Math.max(FEWEST_GROWN_SLOTS, Math.ceil(GROWTH * this.capacity));
    const rows = new Int32Array(ROW_WORDS * slots);
    rows.set(this.#rows);
    this.#rows = rows;
    this.#times = new Float64Array(rows.buffer);
    this.#bytes = new Uint8Array(rows.buffer);
    if (this.#table.length < tableSizeFor(slots)) {
      this.#table = new Int32Array(tableSizeFor(slots));
      for (let slot = 0; slot < this.size; slot++) this.#place(slot);
    }
  }
}

/**
 * The text of `length` code units of `units` from `start`. Short ones are copied into a
 * plain array kept for that length (`textUnits`): `String.fromCharCode` over a typed
 * array's view took three times as long (the view is an object of its own), and sealing
 * builds two texts a key.
 */
function textOf(units: Uint16Array | Uint8Array, start: number, length: number): string {
  if (length > REUSED_TEXT_UNITS) {
    const view = units.subarray(start, start + length);
    return String.fromCharCode.apply(null, view as unknown as number[]);
  }
  let kept = textUnits[length];
  if (kept === undefined) kept = textUnits[length] = new Array<number>(length).fill(0);
  for (let i = 0; i < length; i++) kept[i] = units[start + i] as number;
  return String.fromCharCode.apply(null, kept);
}
