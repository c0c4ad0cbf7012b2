/**
 * The record frame: values (bigint included) survive a round trip with their types,
 * frames written in the earlier plain-map form still decode to the same values, and
 * every kind of damaged bytes is reported as a value, never thrown.
 */
import { crc32 } from 'node:zlib';
import fc from 'fast-check';
import { Packr } from 'msgpackr';
import { describe, it, expect } from 'vitest';
import {
  decodeRecord,
  encodeRecord,
  encodeRecordSliced,
  frameArray,
  packAsciiUnits,
  packNumber,
  packr,
  packText,
  PACKR_BUFFER_KEPT_BYTES,
  SLICED_RECORD_BYTES,
} from '../storage/codec.js';

/** How frames were encoded before msgpackr records (codec.ts): plain MessagePack maps. */
const mapsPackr = new Packr({
  useRecords: false,
  mapsAsObjects: true,
  int64AsType: 'bigint',
  useBigIntExtension: true,
  useToJSON: false,
  copyBuffers: true,
});

/** A journal record written by the plain-map codec, byte for byte (base64 of the frame). */
const MAPS_FRAME_BASE64 =
  'lgnTApPeAAqkdHlwZahjb25zdW1lZKtlbnZpcm9ubWVudKR0ZXN0qmN1c3RvbWVySWSmY3VzdC0xo2tlealhcGlfY2' +
  'FsbHOkYXRNc8tCebdtqoewAK1wZXJpb2RTdGFydE1zy0J5t22qgAAArmluY2x1ZGVkTWljcm9z0wAAAAAAFuNgqGxv' +
  'dERyYXdzkZKlbG90LTHTAAAAAAAAAECtb3ZlcmFnZU1pY3Jvc9MAAAAAAAAAAKtpZGVtcG90ZW5jed4AAqVzY29wZb' +
  'Rjb25zdW1lAGFwaV9jYWxscwBrMatmaW5nZXJwcmludKcxNTAwMDY03gAHpHR5cGWwbGltaXRTZXR0aW5nc1NldKtl' +
  'bnZpcm9ubWVudKRsaXZlqmN1c3RvbWVySWSmY3VzdC0yo2tleaVzZWF0c6RhdE1zy0J5t22qh8AAqXB1cmNoYXNlZG' +
  'S0YXV0b0V4cGFuc2lvbkVuYWJsZWTD3gAGpHR5cGWwY3VzdG9tZXJVcHNlcnRlZKtlbnZpcm9ubWVudKR0ZXN0qmN1' +
  'c3RvbWVySWSmY3VzdC0xo2tleaCkYXRNc8tCebdtqofQAKVwYXRjaN4AAqRuYW1lpEFjbWWobWV0YWRhdGHeAASkcG' +
  'xhbqRnb2xkpXNlYXRzQaN2aXDDpGdvbmXA';

/**
 * The events MAPS_FRAME_BASE64 holds (integers 65 and 100 are fixints there: record ids under
 * records).
 */
const MAPS_FRAME_EVENTS = [
  {
    type: 'consumed',
    environment: 'test',
    customerId: 'cust-1',
    key: 'api_calls',
    atMs: 1767225600123,
    periodStartMs: 1767225600000,
    includedMicros: 1500000n,
    lotDraws: [['lot-1', 64n]],
    overageMicros: 0n,
    idempotency: { scope: 'consume\u0000api_calls\u0000k1', fingerprint: '1500064' },
  },
  {
    type: 'limitSettingsSet',
    environment: 'live',
    customerId: 'cust-2',
    key: 'seats',
    atMs: 1767225600124,
    purchased: 100,
    autoExpansionEnabled: true,
  },
  {
    type: 'customerUpserted',
    environment: 'test',
    customerId: 'cust-1',
    key: '',
    atMs: 1767225600125,
    patch: { name: 'Acme', metadata: { plan: 'gold', seats: 65, vip: true, gone: null } },
  },
];

/**
 * Values stored state is made of, bigints of any width included (usage totals are
 * unbounded). Left out: -0 (decodes as 0) and a `__proto__` key, which msgpackr decodes
 * as `__proto_` in either form (its guard against prototype pollution).
 */
const storedValue = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: 'small' },
    fc.integer(),
    fc.integer({ min: 0, max: 255 }),
    fc.double({ noDefaultInfinity: true, noNaN: true }).filter((d) => !Object.is(d, -0)),
    fc.bigInt({ min: -(2n ** 63n), max: 2n ** 64n - 1n }),
    fc.bigInt({ min: -(2n ** 200n), max: 2n ** 200n }),
    fc.string(),
    fc.boolean(),
    fc.constant(null),
    fc.array(tie('value'), { maxLength: 6 }),
    fc.dictionary(
      fc.string({ maxLength: 6 }).filter((k) => k !== '__proto__'),
      tie('value'),
      { maxKeys: 6 },
    ),
  ),
})).value;

const sample = {
  customerId: 'cus_1',
  amountMinor: 12_345n,
  negative: -(2n ** 63n),
  unsignedMax: 2n ** 64n - 1n,
  plainNumber: 7,
  bigNumber: 2 ** 40,
  ratio: 0.25,
  nested: { list: [1, 'two', null, true, { three: 3n }] },
};

describe('codec', () => {
  it('round-trips plain objects, arrays and bigints with their types', () => {
    const decoded = decodeRecord(encodeRecord(sample));
    expect(decoded).toEqual({ ok: true, value: sample });
    if (!decoded.ok) return;
    const value = decoded.value as typeof sample;
    expect(typeof value.amountMinor).toBe('bigint');
    expect(typeof value.plainNumber).toBe('number');
    expect(typeof value.bigNumber).toBe('number');
  });

  it("round-trips bigints wider than 64 bits (a meter's overage total can outgrow int64)", () => {
    const totals = {
      overageMicros: 25_000_000_000_000_000_000n,
      deficit: -(2n ** 70n) - 3n,
      edge: 2n ** 64n,
    };
    expect(decodeRecord(encodeRecord(totals))).toEqual({ ok: true, value: totals });
  });

  it('packs small records into a small buffer again after large ones', () => {
    // A run's filter: the packr grows its buffer to four times the value to hold it.
    const filter = Buffer.from(new Uint8Array(300_000).map((_, i) => i % 251));
    const large = { count: 3, filter };
    expect(decodeRecord(encodeRecord(large))).toEqual({ ok: true, value: large });
    // The buffer the packr writes the next value into (packr.pack itself never resets it).
    const grown = packr.pack(1).buffer;
    expect(grown.byteLength).toBeGreaterThan(PACKR_BUFFER_KEPT_BYTES);
    // Large values in a row, a snapshot's chunks, keep writing into it.
    expect(decodeRecord(encodeRecord(large))).toEqual({ ok: true, value: large });
    expect(packr.pack(1).buffer).toBe(grown);
    // The first small record after them gives the packr a small buffer: a large one is
    // allocated again each time the last fills, and each outlives the young generation.
    for (let i = 0; i < 100; i++) encodeRecord([{ type: 'usage', qty: BigInt(i) }]);
    expect(packr.pack(1).buffer.byteLength).toBeLessThanOrEqual(PACKR_BUFFER_KEPT_BYTES);
    const small = [{ type: 'grant', amountMinor: 10n }];
    expect(decodeRecord(encodeRecord(small))).toEqual({ ok: true, value: small });
  });

  it('round-trips arrays of events (the journal record shape)', () => {
    const events = [
      { type: 'usage', qty: 3n },
      { type: 'grant', amountMinor: 10n },
    ];
    expect(decodeRecord(encodeRecord(events))).toEqual({ ok: true, value: events });
  });

  it('decodes a frame written with plain maps (before records) to the same values', () => {
    const frame = Buffer.from(MAPS_FRAME_BASE64, 'base64');
    expect(frame.subarray(4)).toEqual(mapsPackr.pack(MAPS_FRAME_EVENTS));
    // After a records frame, so any structure state left in the decoder would show.
    expect(decodeRecord(encodeRecord(MAPS_FRAME_EVENTS)).ok).toBe(true);
    expect(decodeRecord(frame)).toEqual({ ok: true, value: MAPS_FRAME_EVENTS });
  });

  it('writes records: a repeated object shape is stored once per frame', () => {
    const events = Array.from({ length: 100 }, (_, i) => ({
      type: 'consumed',
      customerId: `c${i}`,
      includedMicros: BigInt(i),
    }));
    const frame = encodeRecord(events);
    expect(frame.length).toBeLessThan(mapsPackr.pack(events).length / 2);
    expect(decodeRecord(frame)).toEqual({ ok: true, value: events });
  });

  it('round-trips more object shapes in one frame than msgpackr has record ids (64)', () => {
    const items = Array.from({ length: 300 }, (_, i) => ({
      id: i,
      [`k${i % 150}`]: { [`m${i % 97}`]: i, n: 64 + (i % 64) },
    }));
    expect(decodeRecord(encodeRecord(items))).toEqual({ ok: true, value: items });
  });

  it('property: any stored value round-trips, and decodes the same from a plain-map frame', () => {
    fc.assert(
      fc.property(fc.array(storedValue, { maxLength: 8 }), (values) => {
        expect(decodeRecord(encodeRecord(values))).toEqual({ ok: true, value: values });
        const payload = mapsPackr.pack(values);
        const frame = Buffer.alloc(4 + payload.length);
        frame.writeUInt32BE(crc32(payload), 0);
        payload.copy(frame, 4);
        expect(decodeRecord(frame)).toEqual({ ok: true, value: values });
        expect(mapsPackr.unpack(encodeRecord(values).subarray(4))).toEqual(values);
      }),
      { numRuns: 500 },
    );
  });

  it('frames many bytes a slice per turn, byte for byte as encodeRecord does', async () => {
    // Every bin header size (8, 16 and 32-bit lengths), an empty value, and several slices.
    for (const length of [0, 200, 70_000, 3 * SLICED_RECORD_BYTES + 5]) {
      const bytes = new Uint8Array(length);
      for (let i = 0; i < length; i++) bytes[i] = (i * 131 + 7) & 0xff;
      let pauses = 0;
      const sliced = await encodeRecordSliced([17, 2_097_152], bytes, async () => {
        pauses += 1;
      });
      expect(sliced.equals(encodeRecord([17, 2_097_152, bytes]))).toBe(true);
      expect(pauses).toBe(Math.ceil(length / SLICED_RECORD_BYTES));
      const decoded = decodeRecord(sliced);
      expect(decoded.ok && (decoded.value as unknown[])[2]).toEqual(Buffer.from(bytes));
    }
  });

  it('frames as [u32 BE crc32][msgpack]', () => {
    const frame = encodeRecord({ a: 1 });
    expect(frame.subarray(4)).toEqual(packr.pack({ a: 1 }));
  });

  it('reports a flipped payload byte as a checksum failure', () => {
    const frame = encodeRecord(sample);
    for (const index of [0, 4, frame.length - 1]) {
      const damaged = Buffer.from(frame);
      damaged[index] = (damaged[index] ?? 0) ^ 0x01;
      expect(decodeRecord(damaged)).toEqual({ ok: false, reason: 'checksum' });
    }
  });

  it('reports truncated buffers', () => {
    const frame = encodeRecord(sample);
    expect(decodeRecord(frame.subarray(0, 0))).toEqual({ ok: false, reason: 'truncated' });
    expect(decodeRecord(frame.subarray(0, 3))).toEqual({ ok: false, reason: 'truncated' });
    expect(decodeRecord(frame.subarray(0, 4))).toEqual({ ok: false, reason: 'truncated' });
    // A cut payload fails its checksum (the frame has no length field).
    expect(decodeRecord(frame.subarray(0, frame.length - 1))).toEqual({
      ok: false,
      reason: 'checksum',
    });
  });

  it('reports garbage without throwing', () => {
    const garbage = Buffer.from('this is not a tally record at all');
    expect(decodeRecord(garbage).ok).toBe(false);
    expect(decodeRecord(new Uint8Array(64)).ok).toBe(false);
  });

  it('reports bytes with a valid checksum that do not decode as "decode"', () => {
    const payload = Buffer.concat([packr.pack(1), Buffer.from([0x01])]); // trailing byte
    const frame = Buffer.alloc(4 + payload.length);
    frame.writeUInt32BE(crc32(payload), 0);
    payload.copy(frame, 4);
    expect(decodeRecord(frame)).toEqual({ ok: false, reason: 'decode' });
  });

  it('accepts a Uint8Array view at an offset', () => {
    const frame = encodeRecord([1n, 2, 'x']);
    const padded = new Uint8Array(frame.length + 10);
    padded.set(frame, 7);
    expect(decodeRecord(padded.subarray(7, 7 + frame.length))).toEqual({
      ok: true,
      value: [1n, 2, 'x'],
    });
  });
});

describe('frames built from their values’ parts', () => {
  it('are byte for byte what encodeRecord writes for the same list', () => {
    const texts = ['', 'a', 'x'.repeat(31), 'x'.repeat(32), 'é', '🙂', 'y'.repeat(300)];
    const numbers = [0, 5, 31, 64, 127, 128, 255, 65_535, 65_536, 2 ** 32 - 1, 2 ** 32, -1, -40];
    const more = [1.5, -(2 ** 31), -(2 ** 31) - 1, 1_767_225_600_123, Number.MAX_SAFE_INTEGER];
    for (const count of [3, 15, 16, 70_000]) {
      const values: Array<string | number> = [];
      const body = Buffer.alloc(count * 320);
      let end = 0;
      for (let i = 0; i < count; i++) {
        if (i % 2 === 0) {
          const text = texts[i % texts.length] as string;
          values.push(text);
          const units = Uint16Array.from(text, (c) => c.charCodeAt(0));
          const fast =
            text.length === units.length ? packAsciiUnits(units, 0, units.length, body, end) : -1;
          end = fast >= 0 ? fast : packText(text, body, end);
        } else {
          const all = [...numbers, ...more];
          const value = all[i % all.length] as number;
          values.push(value);
          end = packNumber(value, body, end);
        }
      }
      expect(Buffer.compare(frameArray(count, body, end), encodeRecord(values))).toBe(0);
    }
  });
});
