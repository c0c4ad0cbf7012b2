/**
 * The byte format of every record Tally stores: a checksummed MessagePack frame.
 *
 * LMDB itself never tears a committed value, but disks rot bits, and a record written by
 * a buggy or older build must be told apart from a good one before recovery trusts it. So
 * each value is framed as [u32 big-endian CRC-32 of the payload][MessagePack payload], and
 * decoding reports bad bytes as a value instead of throwing, so callers decide whether a
 * bad record is a droppable torn tail or a reason to refuse to start.
 *
 * The frame carries no length: a payload cut short fails its checksum and is reported as
 * 'checksum'; 'truncated' means there is not even a header plus one payload byte.
 */
import { crc32 } from 'node:zlib';
import { Packr } from 'msgpackr';
import { assert } from '../shared/assert.js';

/**
 * The one encoder for stored state. Options are chosen for durability first:
 * - useRecords: true — msgpackr's record extension: an object is written as a reference
 *   to a structure (its key list), which is defined inline the first time it occurs in
 *   the same frame. No structure table is shared between frames or stored anywhere
 *   (no `structures`, `saveStructures` or `sequential` option), so every frame still
 *   decodes on its own, by any msgpackr decoder, whatever else was written. Why: journal
 *   records and snapshot chunks repeat one object shape hundreds of times, so records
 *   are less than half the bytes of maps and decode several times faster (measured by
 *   `npm run bench:recovery`: decoding maps was most of replay time), because a record
 *   is read by generated code that builds the object in one go instead of adding one
 *   named property after another.
 *   Frames in the older plain-map form (`useRecords: false`) decode to the same
 *   values with this packr, and msgpackr decoders with either setting read both forms;
 *   test/storage-codec.test.ts pins an old frame's bytes. A records decoder tells the
 *   two apart safely: with records on, the encoder writes integers 64–127 as uint8
 *   rather than fixints, and a fixint in that range is only taken as a record reference
 *   if this very frame defined that structure, which an old frame never does.
 * - mapsAsObjects: true — maps (old frames) decode to plain objects, as they were written.
 * - int64AsType: 'bigint' — msgpackr writes every bigint as int64/uint64 and numbers as
 *   ints/floats, so decoding int64 as bigint gives back exactly the types written.
 * - useBigIntExtension: true — a bigint beyond 64 bits is written as msgpackr's bigint
 *   extension (type 0x42) instead of throwing. Usage totals are unbounded bigints of
 *   micro-units: a meter with overage enabled passes 2^64 micro-units (1.8 × 10^13 units)
 *   after a few dozen consumes of the largest amount, and without this the shard's
 *   snapshot threw and took the process down at every start. Every msgpackr decoder
 *   reads the extension; frames without such a bigint are byte for byte what they were.
 * - useToJSON: false — store an object's own fields, never the API shape a toJSON() gives.
 * - copyBuffers: true — a decoded Buffer must not alias the bytes it was read from.
 */
export const packr = new Packr({
  useRecords: true,
  mapsAsObjects: true,
  int64AsType: 'bigint',
  useBigIntExtension: true,
  useToJSON: false,
  copyBuffers: true,
});

const HEADER_BYTES = 4;

/**
 * The largest buffer the packr goes on writing small values into. The packr writes each
 * value after the last in a buffer of its own and, when one is full, allocates the next as
 * large as the last (four times the value when a value does not fit). One large record, a
 * run's key filter, left it allocating buffers of ~0.7 MB for the small records after it;
 * each lived until full (~0.15 s at a busy shard's rate), reached the old generation and
 * was freed only by a full collection: a keyed shard ran full collections ~1.5 times as
 * often. So a small value packed into a buffer larger than this gives the packr a small
 * buffer again; large values in a row (a snapshot's chunks) keep the large one.
 */
export const PACKR_BUFFER_KEPT_BYTES = 64 << 10;
/** The most bytes of a value that counts as small: one a kept buffer holds four of. */
const SMALL_VALUE_BYTES = PACKR_BUFFER_KEPT_BYTES / 4;
/** The buffer the packr is given back (its own first buffer's size). */
const PACKR_BUFFER_BYTES = 8 << 10;

/** `value` packed; the bytes stay valid until the caller drops them (see above). */
function pack(value: unknown): Uint8Array {
  const payload: Uint8Array = packr.pack(value);
  if (payload.length <= SMALL_VALUE_BYTES && payload.buffer.byteLength > PACKR_BUFFER_KEPT_BYTES)
    packr.useBuffer(Buffer.allocUnsafeSlow(PACKR_BUFFER_BYTES));
  return payload;
}

export type DecodeFailure = 'truncated' | 'checksum' | 'decode';
export type DecodeResult =
  | { readonly ok: true; readonly value: unknown }
  | { readonly ok: false; readonly reason: DecodeFailure };

/**
 * Frames `value` as [crc32][msgpack]. Throws only for values this packr cannot hold
 * (a symbol, say): that is a programmer error, not a storage failure.
 */
export function encodeRecord(value: unknown): Buffer {
  const payload = pack(value);
  const frame = Buffer.allocUnsafe(HEADER_BYTES + payload.length);
  frame.writeUInt32BE(crc32(payload), 0);
  frame.set(payload, HEADER_BYTES);
  return frame;
}

/** Bytes `encodeRecordSliced` copies and checksums per turn (~0.1–0.3 ms). */
export const SLICED_RECORD_BYTES = 256 << 10;

/**
 * Frames `[...head, bytes]` exactly as `encodeRecord` does, but copies and checksums
 * `bytes` a slice per turn (`pause` between slices): a group's key filter (3 MiB at the
 * default run size) encoded at once held the thread for 3.5–8 ms, in slices 0.1–0.3 ms
 * each. `head` holds up to 14 small values; `bytes` must not change until it resolves.
 */
export async function encodeRecordSliced(
  head: readonly unknown[],
  bytes: Uint8Array,
  pause: () => Promise<void>,
): Promise<Buffer> {
  const packed = pack(head);
  assert(head.length < 15 && packed[0] === 0x90 + head.length, 'a sliced record is a short array');
  const n = bytes.byteLength;
  // MessagePack's bin header, the smallest that holds the length (as the packr writes it).
  const bin =
    n < 0x100
      ? [0xc4, n]
      : n < 0x10000
        ? [0xc5, n >>> 8, n & 0xff]
        : [0xc6, n >>> 24, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff];
  const start = HEADER_BYTES + packed.length + bin.length;
  const frame = Buffer.allocUnsafe(start + n);
  frame.set(packed, HEADER_BYTES);
  frame[HEADER_BYTES] = 0x90 + head.length + 1;
  frame.set(bin, HEADER_BYTES + packed.length);
  let crc = crc32(frame.subarray(HEADER_BYTES, start));
  for (let at = 0; at < n; at += SLICED_RECORD_BYTES) {
    const slice = bytes.subarray(at, Math.min(n, at + SLICED_RECORD_BYTES));
    frame.set(slice, start + at);
    crc = crc32(slice, crc);
    await pause();
  }
  frame.writeUInt32BE(crc >>> 0, 0);
  return frame;
}

/*
 * A frame built from its values' parts, byte for byte as `encodeRecord` frames the list of
 * them (a run's blocks of idempotency keys are built so, from arrays, without an object or
 * string a key): `packText`, `packAsciiUnits` and `packNumber` write the values of a
 * MessagePack array into a buffer, `frameArray` frames them.
 */

/**
 * `length` code units of `units` (UTF-16, or bytes of ASCII text) from `start` as the packr
 * writes a string, if they are short ASCII (under 32, each under 0x80: a fixstr) — into
 * `out` from `at`; returns the end, or -1 (`out` then holds nothing of use) for any other
 * text. Room: 32 bytes.
 */
export function packAsciiUnits(
  units: Uint16Array | Uint8Array,
  start: number,
  length: number,
  out: Uint8Array,
  at: number,
): number {
  if (length >= 32) return -1;
  out[at] = 0xa0 | length;
  for (let i = 0; i < length; i++) {
    const unit = units[start + i] as number;
    if (unit >= 0x80) return -1;
    out[at + 1 + i] = unit;
  }
  return at + 1 + length;
}

/**
 * `text` as the packr writes it, into `out` from `at`; the end. Room: 5 + 3 bytes a unit.
 * Short ASCII (a fixstr) is copied a code unit at a time: a call into `Buffer.write` per
 * text cost more than the copy.
 */
export function packText(text: string, out: Buffer, at: number): number {
  const length = text.length;
  if (length < 32) {
    let i = 0;
    for (; i < length; i++) {
      const unit = text.charCodeAt(i);
      if (unit >= 0x80) break;
      out[at + 1 + i] = unit;
    }
    if (i === length) {
      out[at] = 0xa0 | length;
      return at + 1 + length;
    }
  }
  const packed = pack(text);
  out.set(packed, at);
  return at + packed.length;
}

/** `value` as the packr writes it (a float64 beyond 32-bit integers); the end. Room: 9. */
export function packNumber(value: number, out: Buffer, at: number): number {
  if (value >>> 0 !== value && value >> 0 !== value) {
    out[at] = 0xcb;
    out.writeDoubleBE(value, at + 1);
    return at + 9;
  }
  const packed = pack(value);
  out.set(packed, at);
  return at + packed.length;
}

/** The frame of an array of `elements` values whose bytes are `body` up to `end`. */
export function frameArray(elements: number, body: Uint8Array, end: number): Buffer {
  const head = elements < 16 ? 1 : elements < 0x10000 ? 3 : 5;
  const frame = Buffer.allocUnsafe(HEADER_BYTES + head + end);
  if (head === 1) frame[HEADER_BYTES] = 0x90 | elements;
  else if (head === 3) {
    frame[HEADER_BYTES] = 0xdc;
    frame.writeUInt16BE(elements, HEADER_BYTES + 1);
  } else {
    frame[HEADER_BYTES] = 0xdd;
    frame.writeUInt32BE(elements, HEADER_BYTES + 1);
  }
  frame.set(body.subarray(0, end), HEADER_BYTES + head);
  frame.writeUInt32BE(crc32(frame.subarray(HEADER_BYTES)), 0);
  return frame;
}

/**
 * Checks a frame's checksum without decoding it (verifying a large file cheaply); the
 * payload may still fail to decode later. Never throws.
 */
export function checkRecord(
  bytes: Uint8Array,
): { readonly ok: true } | { readonly ok: false; readonly reason: DecodeFailure } {
  if (bytes.length <= HEADER_BYTES) return { ok: false, reason: 'truncated' };
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return crc32(bytes.subarray(HEADER_BYTES)) === view.getUint32(0, false)
    ? { ok: true }
    : { ok: false, reason: 'checksum' };
}

/** Verifies and decodes a frame. Never throws: bad bytes come back as `{ ok: false }`. */
export function decodeRecord(bytes: Uint8Array): DecodeResult {
  if (bytes.length <= HEADER_BYTES) return { ok: false, reason: 'truncated' };
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const payload = bytes.subarray(HEADER_BYTES);
  if (crc32(payload) !== view.getUint32(0, false)) return { ok: false, reason: 'checksum' };
  try {
    return { ok: true, value: packr.unpack(payload) };
  } catch {
    // The checksum matched, so these bytes were written as they are; they are simply not a
    // value this build can decode (another format, or trailing bytes).
    return { ok: false, reason: 'decode' };
  }
}

/**
 * The field a stored row (a pending audit entry, a shard's outbox row) names the journal
 * record written with it in, so that recovery drops the row with the record. Not part of
 * the row's value: `withoutJournalRecord` takes it off on read.
 */
const JOURNAL_RECORD_FIELD = 'journalRecord';

/** `value` framed with the seq of the journal record it is written with. */
export function encodeWithJournalRecord(value: object, journalRecord: number): Buffer {
  return encodeRecord({ ...value, [JOURNAL_RECORD_FIELD]: journalRecord });
}

/** A decoded row's value without the journal record it names. */
export function withoutJournalRecord<T>(value: T): T {
  const { [JOURNAL_RECORD_FIELD]: _record, ...rest } = value as T & Record<string, unknown>;
  return rest as T;
}

/** The journal record a stored row names, or undefined (none named, or not decodable). */
export function journalRecordOf(bytes: Uint8Array): number | undefined {
  const decoded = decodeRecord(bytes);
  const record = decoded.ok
    ? (decoded.value as Record<string, unknown> | null)?.[JOURNAL_RECORD_FIELD]
    : undefined;
  return typeof record === 'number' ? record : undefined;
}
