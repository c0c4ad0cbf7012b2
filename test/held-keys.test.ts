/**
 * The idempotency keys a shard holds in memory (storage/held-keys.ts): typed arrays and an
 * open-addressing table, checked against a plain Map of the same keys.
 */
import { describe, expect, it } from 'vitest';
import { HeldKeys, type KeyAddress, type KeyPut } from '../storage/held-keys.js';
import { HASH_BUCKET_BITS, hashesInFilterOrder, runOrder } from '../storage/idempotency-runs.js';
import { KEY_HASHES, keyHashes } from '../storage/key-filter.js';

const PAUSE = async (): Promise<void> => undefined;

/** Held keys given each key's hashes as the store gives them (`keyHashes`). */
class Held extends HeldKeys {
  override get(address: KeyAddress): KeyPut | undefined {
    keyHashes(address.environment, address.customerId, address.scopeDigest);
    return super.get(address, KEY_HASHES[0] as number);
  }

  override set(put: KeyPut): void {
    keyHashes(put.environment, put.customerId, put.scopeDigest);
    super.set(put, KEY_HASHES[0] as number, KEY_HASHES[1] as number);
  }
}

/** The order a run is written in, as plain string comparisons. */
function runOrderOf(x: KeyPut, y: KeyPut): number {
  if (x.environment !== y.environment) return x.environment === 'live' ? -1 : 1;
  if (x.customerId !== y.customerId) return x.customerId < y.customerId ? -1 : 1;
  return x.scopeDigest < y.scopeDigest ? -1 : x.scopeDigest > y.scopeDigest ? 1 : 0;
}

function put(
  customerId: string,
  scopeDigest: string,
  fingerprint = '1000000',
  atMs = 1,
  environment: 'test' | 'live' = 'test',
): KeyPut {
  return { environment, customerId, scopeDigest, fingerprint, atMs };
}

const idOf = (key: KeyPut): string =>
  `${key.environment}\u0000${key.customerId}\u0000${key.scopeDigest}`;

/** A deterministic stream of pseudo-random numbers below `n`. */
function randoms(seed: number): (n: number) => number {
  let state = seed;
  return (n) => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state % n;
  };
}

describe('held idempotency keys', () => {
  it('finds each key by customer, environment and digest, and nothing else', () => {
    const held = new Held();
    held.set(put('c1', 'digest-a', '5', 10));
    held.set(put('c2', 'digest-a', '6', 11));
    held.set(put('c1', 'digest-a', '7', 12, 'live'));
    expect(held.size).toBe(3);
    expect(held.get(put('c1', 'digest-a'))).toEqual(put('c1', 'digest-a', '5', 10));
    expect(held.get(put('c2', 'digest-a'))).toEqual(put('c2', 'digest-a', '6', 11));
    expect(held.get(put('c1', 'digest-a', '', 0, 'live'))).toEqual(
      put('c1', 'digest-a', '7', 12, 'live'),
    );
    expect(held.get(put('c2', 'digest-a', '', 0, 'live'))).toBeUndefined();
    expect(held.get(put('c1', 'digest-b'))).toBeUndefined();
    expect(held.get(put('c3', 'digest-a'))).toBeUndefined();
    expect(held.get(put('c1', 'digest-'))).toBeUndefined();
  });

  it('keeps a key set again in its place, with the new fingerprint and time', () => {
    const held = new Held();
    held.set(put('c1', 'k', '123456', 1));
    held.set(put('c1', 'other', '9', 2));
    held.set(put('c1', 'k', '7', 3));
    expect(held.get(put('c1', 'k'))).toEqual(put('c1', 'k', '7', 3));
    held.set(put('c1', 'k', '12345678901234567890', 4));
    expect(held.get(put('c1', 'k'))).toEqual(put('c1', 'k', '12345678901234567890', 4));
    expect(held.get(put('c1', 'other'))).toEqual(put('c1', 'other', '9', 2));
    expect(held.size).toBe(2);
    expect([...held.values()].map((key) => key.scopeDigest)).toEqual(['k', 'other']);
  });

  it('agrees with a Map over many keys, growing, and after clear', () => {
    const held = new Held();
    const random = randoms(7);
    for (let round = 0; round < 2; round++) {
      const model = new Map<string, KeyPut>();
      const order: string[] = [];
      for (let i = 0; i < 20_000; i++) {
        const key = put(
          `cust-${random(300)}`,
          `d${random(2_000).toString(36)}\u00e9${'x'.repeat(random(3))}`,
          String(random(10 ** (1 + random(12)))),
          round * 100_000 + i,
          random(4) === 0 ? 'live' : 'test',
        );
        held.set(key);
        if (!model.has(idOf(key))) order.push(idOf(key));
        model.set(idOf(key), key);
      }
      expect(held.size).toBe(model.size);
      for (const key of model.values()) expect(held.get(key)).toEqual(key);
      expect([...held.values()].map(idOf)).toEqual(order);
      for (let i = 0; i < 2_000; i++) {
        const absent = put(`cust-${random(300)}`, `absent-${i}`);
        expect(held.get(absent)).toBeUndefined();
      }
      held.clear();
      expect(held.size).toBe(0);
      expect([...model.values()].some((key) => held.get(key) !== undefined)).toBe(false);
    }
  });

  it('sets a key its lookup just missed where the lookup ended, whatever came between', () => {
    // A keyed write looks its key up, then sets it: the set reuses the missed position
    // unless the table changed since (another key set, of a customer new or not; the
    // arrays grown; a clear). Batches start with room for one key, so the table is small
    // and rebuilt as it grows, and keys set between land where a lookup ended often.
    const random = randoms(11);
    const key = (): KeyPut =>
      put(`c-${random(3)}`, `d${random(60)}`, String(random(100)), random(1000));
    for (let batch = 0; batch < 400; batch++) {
      const held = new Held(1);
      const model = new Map<string, KeyPut>();
      for (let i = 0; i < 60; i++) {
        const first = key();
        expect(held.get(first)).toEqual(model.get(idOf(first)));
        const step = random(4);
        if (step === 1) {
          const other = key();
          held.set(other);
          model.set(idOf(other), other);
        } else if (step === 2 && random(10) === 0) {
          held.clear();
          model.clear();
        }
        if (step !== 3) {
          held.set(first);
          model.set(idOf(first), first);
        }
      }
      expect(held.size).toBe(model.size);
      for (const stored of model.values()) expect(held.get(stored)).toEqual(stored);
    }
  });

  it('keeps texts that fit its row there and the rest in its pool, alike to every reader', () => {
    const held = new Held(4);
    const digest = 'D'.repeat(22);
    // 40 bytes of text fit a row; one more, or a character beyond ASCII, goes to the pool.
    const keys = [
      put('c', digest, '9'.repeat(18)),
      put('c', `${digest}x`, '9'.repeat(18)),
      put('c', 'é', '5'),
      put('c', 'short', 'ü'),
      put('c', 'long', '7'.repeat(32)),
    ];
    for (const key of keys) held.set(key);
    const fixstr = (text: string): number[] => [0xa0 | text.length, ...Buffer.from(text)];
    const packed = keys.map((_, slot) => {
      const out = new Uint8Array(64);
      const end = held.packTexts(slot, out, 1);
      return end < 0 ? null : [...out.subarray(1, end)];
    });
    expect(packed).toEqual([
      [...fixstr(digest), ...fixstr('9'.repeat(18))],
      [...fixstr(`${digest}x`), ...fixstr('9'.repeat(18))],
      null,
      null,
      null,
    ]);
    expect(keys.map((key) => held.get(key))).toEqual(keys);
    // Set again: a fingerprint that no longer fits moves the key's texts to the pool, and back.
    held.set(put('c', digest, '€', 2));
    expect(held.get(put('c', digest))).toEqual(put('c', digest, '€', 2));
    expect(held.packTexts(0, new Uint8Array(64), 0)).toBe(-1);
    held.set(put('c', 'é', '6'.repeat(20), 3));
    expect(held.get(put('c', 'é'))).toEqual(put('c', 'é', '6'.repeat(20), 3));
    held.set(put('c', `${digest}x`, '1', 4));
    expect(held.get(put('c', `${digest}x`))).toEqual(put('c', `${digest}x`, '1', 4));
    expect([...held.values()].map((key) => key.scopeDigest)).toEqual(
      keys.map((key) => key.scopeDigest),
    );
    expect(held.get(put('c', 'D'.repeat(21)))).toBeUndefined();
  });

  it('orders a run live before test, then by customer id and digest, as strings', async () => {
    const held = new Held();
    const keys = [
      put('b', 'zz'),
      put('a', 'z'),
      put('a', 'Z'),
      put('a', 'z\u0000'),
      put('a', '\uffff'),
      put('a', 'é'),
      put('b', 'a', '1', 1, 'live'),
      put('a', 'y', '1', 1, 'live'),
      put('ab', ''),
      put('A', 'q'),
    ];
    for (const key of keys) held.set(key);
    expect(() => held.buckets).toThrow(/customers are ranked/);
    const order = await runOrder(held, PAUSE);
    expect([...order].map((slot) => held.keyAt(slot))).toEqual([...keys].sort(runOrderOf));
  });

  it("gives every key's hashes once, in the order of the filter blocks they land in", async () => {
    const held = new Held();
    const random = randoms(7);
    const keys = Array.from({ length: 5000 }, (_, i) =>
      put(`c-${random(300)}`, `d-${i}-${random(1e9)}`, '1', i, i % 3 === 0 ? 'live' : 'test'),
    );
    for (const key of keys) held.set(key);
    let turns = 0;
    const hashes = await hashesInFilterOrder(held, async () => {
      turns += 1;
    });
    expect(turns).toBeGreaterThan(0);
    const pairs = Array.from({ length: keys.length }, (_, i) => [
      hashes[2 * i] as number,
      hashes[2 * i + 1] as number,
    ]);
    // A filter's block is the first hash read unsigned, scaled: by its top bits (the
    // bucket), the pairs never go back.
    expect(HASH_BUCKET_BITS).toBeGreaterThanOrEqual(8);
    const bucket = (first: number): number => (first >>> 0) >>> (32 - HASH_BUCKET_BITS);
    for (let i = 1; i < pairs.length; i++)
      expect(bucket(pairs[i]?.[0] as number)).toBeGreaterThanOrEqual(
        bucket(pairs[i - 1]?.[0] as number),
      );
    // Hashes at both ends of the unsigned range (negative as int32) are among them.
    expect(pairs.some(([first]) => (first as number) < 0)).toBe(true);
    expect(pairs.some(([first]) => (first as number) > 0)).toBe(true);
    const expected = keys.map((key) => {
      keyHashes(key.environment, key.customerId, key.scopeDigest);
      return `${KEY_HASHES[0]},${KEY_HASHES[1]}`;
    });
    expect(pairs.map((pair) => pair.join(',')).sort()).toEqual(expected.sort());
  });

  it('numbers its customers when sealing asks, a slice at a time, keys set between', async () => {
    const held = new Held();
    const keys = ['b', 'a', 'b', 'c', 'a'].map((customer, i) => put(customer, `d${i}`));
    for (const key of keys.slice(0, 3)) held.set(key);
    // Lookups tell customers apart before any is numbered.
    expect(held.get(put('a', 'd1'))).toEqual(keys[1]);
    expect(held.get(put('b', 'd1'))).toBeUndefined();
    expect(held.indexCustomers(2)).toBe(false);
    for (const key of keys.slice(3)) held.set(key);
    expect(held.indexCustomers(2)).toBe(false);
    expect(held.indexCustomers(1)).toBe(true);
    expect(held.customerCount).toBe(3);
    const order = await runOrder(held, PAUSE);
    expect([...order].map((slot) => held.keyAt(slot))).toEqual([...keys].sort(runOrderOf));
    held.clear();
    held.set(put('z', 'd9'));
    expect(() => held.customerCount).toThrow(/every slot is indexed/);
    expect(held.indexCustomers(1)).toBe(true);
    expect(held.customerCount).toBe(1);
    expect(held.customerIdOf(0)).toBe('z');
  });

  it('orders many customers and one customer’s thousands of keys, a slice per turn', async () => {
    const held = new Held();
    const random = randoms(7);
    // 1,200 customers in no order (some outside ASCII, some sharing long prefixes) and one
    // customer with 3,000 keys: customers ranked in merged chunks, its bucket merged too.
    const ids = Array.from({ length: 1200 }, (_, i) =>
      i % 7 === 0
        ? `é${random(1e6)}`
        : i % 7 === 1
          ? `${'p'.repeat(40)}${random(1e6)}`
          : `c${random(1e6)}`,
    );
    const keys: KeyPut[] = [];
    for (let i = 0; i < 9000; i++) {
      const customerId = i % 3 === 0 ? 'busy' : (ids[random(ids.length)] as string);
      const environment = random(2) === 0 ? 'live' : 'test';
      keys.push(put(customerId, `d${random(1e9)}-${i}`, '1', i, environment));
    }
    for (const key of keys) held.set(key);
    let turns = 0;
    const order = await runOrder(held, async () => {
      turns += 1;
    });
    expect([...order].map((slot) => held.keyAt(slot))).toEqual([...keys].sort(runOrderOf));
    // 9,000 keys and ~1,200 customers: more than a turn per 512 sorted, none in one go.
    expect(turns).toBeGreaterThan(9000 / 512);
  });

  it('spreads one digest shared by many customers (the same key text)', () => {
    const held = new Held();
    const customers = 20_000;
    for (let i = 0; i < customers; i++) held.set(put(`customer-${i}`, 'request-1', String(i), i));
    let found = 0;
    for (let i = 0; i < customers; i++)
      if (held.get(put(`customer-${i}`, 'request-1'))?.fingerprint === String(i)) found += 1;
    expect(found).toBe(customers);
    // Hashed without the customer, all of them would be one cluster a lookup walks.
    expect(held.longestCluster()).toBeLessThan(100);
  });

  it('keeps its arrays through clear, grows by half when full, and says what it costs', () => {
    const held = new Held(100);
    expect(held.capacity).toBe(100);
    const bytes = held.byteLength;
    // Rows (64 bytes a slot), the pool's first 64 code units and a table of 256 entries.
    expect(bytes).toBe(100 * 64 + 64 * 2 + 256 * 4);
    for (let i = 0; i < 100; i++) held.set(put('c', `k${i}`));
    expect(held.capacity).toBe(100);
    held.set(put('c', 'one more'));
    expect(held.capacity).toBe(150);
    expect(held.byteLength).toBeGreaterThan(bytes);
    const grownBytes = held.byteLength;
    held.clear();
    expect(held.capacity).toBe(150);
    expect(held.byteLength).toBe(grownBytes);
    for (let i = 0; i < 150; i++) held.set(put('d', `k${i}`));
    expect(held.capacity).toBe(150);
    for (let i = 0; i < 150; i++) expect(held.get(put('d', `k${i}`))?.scopeDigest).toBe(`k${i}`);
  });

  it('keeps each key’s hashes, and tells keys apart whose hashes are the same', () => {
    const held = new HeldKeys(4);
    const keys = Array.from({ length: 40 }, (_, i) =>
      put(`c${i % 3}`, `d${i % 7}`, String(i), i, i % 2 === 0 ? 'live' : 'test'),
    ).filter((key, i, all) => all.findIndex((other) => idOf(other) === idOf(key)) === i);
    // Every key with the same two hashes: one cluster, told apart by their texts alone.
    for (const key of keys) held.set(key, 12345, -6789);
    expect(held.size).toBe(keys.length);
    for (const key of keys) expect(held.get(key, 12345)).toEqual(key);
    expect(held.get(put('c9', 'd0'), 12345)).toBeUndefined();
    expect(held.get(put('c0', 'd0', '1', 1, 'test'), 12346)).toBeUndefined();
    for (let slot = 0; slot < held.size; slot++) {
      held.hashKey(slot);
      expect([...KEY_HASHES]).toEqual([12345, -6789]);
    }
    const hashed = new Held();
    for (const key of keys) hashed.set(key);
    for (let slot = 0; slot < hashed.size; slot++) {
      const key = hashed.keyAt(slot);
      hashed.hashKey(slot);
      const kept = [...KEY_HASHES];
      keyHashes(key.environment, key.customerId, key.scopeDigest);
      expect(kept).toEqual([...KEY_HASHES]);
    }
  });

  it('reads ahead the table position of each key, and nothing of an empty table', () => {
    const held = new HeldKeys(16);
    const hashes = new Int32Array([3, 0, 9, 0, 3 + 64, 0]);
    expect(held.readAhead(hashes, 3)).toBe(0);
    held.set(put('c', 'a'), 3, 1); // slot 0 at position 3: table entry 1
    held.set(put('c', 'b'), 9, 2); // slot 1 at position 9: table entry 2
    expect(held.readAhead(hashes, 1)).toBe(1);
    expect(held.readAhead(hashes, 2)).toBe(3);
    // The table has 32 positions: 3 + 64 is position 3 too.
    expect(held.readAhead(hashes.subarray(4), 1)).toBe(1);
    expect(held.readAhead(new Int32Array([5, 0]), 1)).toBe(0);
  });

  it('starts from no room at all', () => {
    const held = new Held(0);
    held.set(put('c', 'k'));
    expect(held.get(put('c', 'k'))?.scopeDigest).toBe('k');
  });

  it('does not let a cleared batch leak an old fingerprint into a reused slot', () => {
    const held = new Held();
    held.set(put('c1', 'k1', '123456789'));
    held.clear();
    held.set(put('c2', 'k2', '5'));
    held.set(put('c2', 'k2', '66'));
    expect(held.get(put('c2', 'k2'))?.fingerprint).toBe('66');
    expect(held.get(put('c1', 'k1'))).toBeUndefined();
  });

  it('gives back texts of every length, short and long, one after another', () => {
    const held = new Held(4);
    const texts = ['', 'a', 'é€', 'x'.repeat(64), 'y'.repeat(65), '\u{1F600}'.repeat(200), 'zz'];
    texts.forEach((text, i) => held.set(put(`c${i}`, `d${text}`, text, i)));
    const back = texts.map((text, i) => held.get(put(`c${i}`, `d${text}`)));
    expect(back.map((key) => key?.fingerprint)).toEqual(texts);
    expect(back.map((key) => key?.scopeDigest)).toEqual(texts.map((text) => `d${text}`));
    expect([...held.values()].map((key) => key.fingerprint)).toEqual(texts);
  });
});
