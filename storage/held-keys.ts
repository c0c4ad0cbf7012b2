/**
 * Idempotency keys in memory, off the JavaScript heap: the keys a shard decided since its
 * last sealed run, until the next run that holds them is on disk (idempotency-runs.ts).
 *
 * A shard holds up to two batches of IDEMPOTENCY_RUN_KEYS keys here, long enough for
 * them to reach the old generation. Held as an object, a string and a map entry each,
 * every one of them is more for each major GC to mark, and once its batch is sealed
 * garbage the next collection must clear: the heap and the resident memory rise and fall
 * with every batch. So a key lives in typed arrays instead:
 *
 * - its digest's and its fingerprint's characters in one pool of UTF-16 code units, where
 *   the slot's columns say where each starts and how long it is;
 * - its customer as an index into the batch's customers (an id string and a map entry per
 *   customer, not per key), its environment, its time;
 * - its two hashes (key-filter.ts: over customer, environment and digest), computed once per
 *   key: a slot's first hash places it in an open-addressing table (a digest many customers
 *   share, the same key text, spreads like any other), and sealing sets the filters' bits
 *   from both without hashing the key again.
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
/** Code units of the pool per slot (a digest takes 22 and an amount's fingerprint ~2–10). */
const UNITS_PER_SLOT = 30;
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
  /** Each customer's place in id order, once `rankCustomer` has given every one its own. */
  #rank = new Int32Array(0);
  #ranked = 0;
  #customer: Int32Array;
  /** 1 for live, 0 for test. */
  #live: Uint8Array;
  #atMs: Float64Array;
  /** Where the slot's digest starts in the pool, and its length. */
  #digestStart: Int32Array;
  #digestLength: Int32Array;
  /** Where the slot's fingerprint starts in the pool, and its length. */
  #fingerprintStart: Int32Array;
  #fingerprintLength: Int32Array;
  /** The key's two hashes (`keyHashes`). */
  #first: Int32Array;
  #second: Int32Array;
  #pool: Uint16Array;
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
    this.#customer = new Int32Array(slots);
    this.#live = new Uint8Array(slots);
    this.#atMs = new Float64Array(slots);
    this.#digestStart = new Int32Array(slots);
    this.#digestLength = new Int32Array(slots);
    this.#fingerprintStart = new Int32Array(slots);
    this.#fingerprintLength = new Int32Array(slots);
    this.#first = new Int32Array(slots);
    this.#second = new Int32Array(slots);
    this.#pool = new Uint16Array(UNITS_PER_SLOT * slots);
    this.#table = new Int32Array(tableSizeFor(slots));
  }

  /** Keys it holds before its arrays grow. */
  get capacity(): number {
    return this.#atMs.length;
  }

  /** Bytes its arrays take (what the batch costs, whatever it holds now). */
  get byteLength(): number {
    return (
      this.#customer.byteLength +
      this.#live.byteLength +
      this.#atMs.byteLength +
      this.#digestStart.byteLength +
      this.#digestLength.byteLength +
      this.#fingerprintStart.byteLength +
      this.#fingerprintLength.byteLength +
      this.#first.byteLength +
      this.#second.byteLength +
      this.#pool.byteLength +
      this.#table.byteLength
    );
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
      this.#atMs[found] = put.atMs;
      return;
    }
    const grew = this.size === this.#atMs.length;
    if (grew) this.#grow();
    const slot = this.size++;
    let customer = this.#customerIndex.get(put.customerId);
    if (customer === undefined) {
      customer = this.#customers.length;
      this.#customers.push(put.customerId);
      this.#customerIndex.set(put.customerId, customer);
    }
    this.#customer[slot] = customer;
    this.#live[slot] = put.environment === 'live' ? 1 : 0;
    this.#atMs[slot] = put.atMs;
    this.#digestStart[slot] = this.#store(put.scopeDigest);
    this.#digestLength[slot] = put.scopeDigest.length;
    this.#fingerprintStart[slot] = this.#store(put.fingerprint);
    this.#fingerprintLength[slot] = put.fingerprint.length;
    this.#first[slot] = first;
    this.#second[slot] = second;
    if (reuse && !grew) this.#table[missedAt] = slot + 1;
    else this.#place(slot);
  }

  /** Empties the batch, keeping its arrays for the next one. */
  clear(): void {
    this.#missed = null;
    this.#customerIndex = new Map();
    this.#customers = [];
    this.#ranked = 0;
    this.#table.fill(0);
    this.#poolEnd = 0;
    this.size = 0;
  }

  /** Every key, in the order each was first set. */
  *values(): IterableIterator<KeyPut> {
    for (let slot = 0; slot < this.size; slot++) yield this.keyAt(slot);
  }

  /** Customers the batch holds keys of (the ids of both environments count once). */
  get customerCount(): number {
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
    const rank = this.#rank[this.#customer[slot] as number] as number;
    return this.#live[slot] === 1 ? rank : this.#customers.length + rank;
  }

  /** Buckets of `bucketOf`: two per customer (live and test). */
  get buckets(): number {
    assert(
      this.#ranked === this.#customers.length,
      'buckets are counted once customers are ranked',
    );
    return 2 * this.#customers.length;
  }

  /**
   * The order a run is written in, as the keys' environments (live first), customer ids and
   * digests compare as strings. Every customer must have its place (`rankCustomer`).
   */
  readonly compare = (a: number, b: number): number => {
    const live = (this.#live[b] as number) - (this.#live[a] as number);
    if (live !== 0) return live;
    const customerA = this.#customer[a] as number;
    const customerB = this.#customer[b] as number;
    if (customerA !== customerB)
      return (this.#rank[customerA] as number) - (this.#rank[customerB] as number);
    const pool = this.#pool;
    const startA = this.#digestStart[a] as number;
    const startB = this.#digestStart[b] as number;
    const lengthA = this.#digestLength[a] as number;
    const lengthB = this.#digestLength[b] as number;
    const common = Math.min(lengthA, lengthB);
    for (let i = 0; i < common; i++) {
      const unit = (pool[startA + i] as number) - (pool[startB + i] as number);
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
    return this.#customers[this.#customer[slot] as number] as string;
  }

  isLive(slot: number): boolean {
    return this.#live[slot] === 1;
  }

  atMsOf(slot: number): number {
    return this.#atMs[slot] as number;
  }

  digestOf(slot: number): string {
    return this.#text(this.#digestStart[slot] as number, this.#digestLength[slot] as number);
  }

  fingerprintOf(slot: number): string {
    return this.#text(
      this.#fingerprintStart[slot] as number,
      this.#fingerprintLength[slot] as number,
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

  /** Sets KEY_HASHES to the slot's key's hashes (key-filter.ts), as `set` was given them. */
  hashKey(slot: number): void {
    KEY_HASHES[0] = this.#first[slot] as number;
    KEY_HASHES[1] = this.#second[slot] as number;
  }

  /**
   * Writes the slot's digest, then its fingerprint, into `out` from `at` as MessagePack
   * strings (byte for byte as any MessagePack encoder writes them: a fixstr of ASCII) and
   * returns where they end; -1, having written nothing of use, if either is not short
   * ASCII (32 code units or more, or one of 0x80 or over), which the caller packs itself.
   * `out` needs room for 64 bytes from `at`.
   */
  packTexts(slot: number, out: Uint8Array, at: number): number {
    const end = packAsciiUnits(
      this.#pool,
      this.#digestStart[slot] as number,
      this.#digestLength[slot] as number,
      out,
      at,
    );
    if (end < 0) return -1;
    return packAsciiUnits(
      this.#pool,
      this.#fingerprintStart[slot] as number,
      this.#fingerprintLength[slot] as number,
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
      if (this.#first[slot] === first && this.#is(slot, address)) return slot;
    }
  }

  /** Whether `slot` holds the key at `address`. */
  #is(slot: number, address: KeyAddress): boolean {
    if (
      this.#live[slot] !== (address.environment === 'live' ? 1 : 0) ||
      this.#customers[this.#customer[slot] as number] !== address.customerId
    )
      return false;
    const digest = address.scopeDigest;
    if (this.#digestLength[slot] !== digest.length) return false;
    const start = this.#digestStart[slot] as number;
    for (let i = 0; i < digest.length; i++)
      if (this.#pool[start + i] !== digest.charCodeAt(i)) return false;
    return true;
  }

  /** Puts `slot` in the table (known absent). */
  #place(slot: number): void {
    const table = this.#table;
    const mask = table.length - 1;
    let at = (this.#first[slot] as number) & mask;
    for (; table[at] !== 0; at = (at + 1) & mask);
    table[at] = slot + 1;
  }

  /** A key set again (its retention passed) keeps its place, with the new fingerprint. */
  #setFingerprint(slot: number, fingerprint: string): void {
    if ((this.#fingerprintLength[slot] as number) >= fingerprint.length) {
      const start = this.#fingerprintStart[slot] as number;
      for (let i = 0; i < fingerprint.length; i++)
        this.#pool[start + i] = fingerprint.charCodeAt(i);
    } else this.#fingerprintStart[slot] = this.#store(fingerprint);
    this.#fingerprintLength[slot] = fingerprint.length;
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

  /**
   * The text of `length` code units from `start`. They are copied into a plain array kept
   * for that length: `String.fromCharCode` over a typed array's view took three times as
   * long (the view is an object of its own), and sealing builds two texts a key.
   */
  #text(start: number, length: number): string {
    if (length > REUSED_TEXT_UNITS) {
      const view = this.#pool.subarray(start, start + length);
      return String.fromCharCode.apply(null, view as unknown as number[]);
    }
    let units = textUnits[length];
    if (units === undefined) units = textUnits[length] = new Array<number>(length).fill(0);
    for (let i = 0; i < length; i++) units[i] = this.#pool[start + i] as number;
    return String.fromCharCode.apply(null, units);
  }

  /** Grows every column by GROWTH and rebuilds the table to fit. */
  #grow(): void {
    const slots = Math.max(FEWEST_GROWN_SLOTS, Math.ceil(GROWTH * this.#atMs.length));
    this.#customer = grown(this.#customer, new Int32Array(slots));
    this.#live = grown(this.#live, new Uint8Array(slots));
    this.#atMs = grown(this.#atMs, new Float64Array(slots));
    this.#digestStart = grown(this.#digestStart, new Int32Array(slots));
    this.#digestLength = grown(this.#digestLength, new Int32Array(slots));
    this.#fingerprintStart = grown(this.#fingerprintStart, new Int32Array(slots));
    this.#fingerprintLength = grown(this.#fingerprintLength, new Int32Array(slots));
    this.#first = grown(this.#first, new Int32Array(slots));
    this.#second = grown(this.#second, new Int32Array(slots));
    if (this.#table.length < tableSizeFor(slots)) {
      this.#table = new Int32Array(tableSizeFor(slots));
      for (let slot = 0; slot < this.size; slot++) this.#place(slot);
    }
  }
}

function grown<T extends Int32Array | Uint8Array | Float64Array>(from: T, to: T): T {
  to.set(from);
  return to;
}
