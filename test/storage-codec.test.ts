/**
 * The record frame: values (bigint included) survive a round trip with their types, and
 * every kind of damaged bytes is reported as a value, never thrown.
 */
import { crc32 } from 'node:zlib';
import { describe, it, expect } from 'vitest';
import { decodeRecord, encodeRecord, packr } from '../storage/codec.js';

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

  it('round-trips arrays of events (the journal record shape)', () => {
    const events = [{ type: 'usage', qty: 3n }, { type: 'grant', amountMinor: 10n }];
    expect(decodeRecord(encodeRecord(events))).toEqual({ ok: true, value: events });
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
    expect(decodeRecord(frame.subarray(0, frame.length - 1))).toEqual({ ok: false, reason: 'checksum' });
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
    expect(decodeRecord(padded.subarray(7, 7 + frame.length))).toEqual({ ok: true, value: [1n, 2, 'x'] });
  });
});

