/**
 * The operator snapshot file: one self-checking file holding everything a data dir needs
 * to answer exactly what the server answered at the cut — API keys, every configuration
 * version, the audit chains, every customer's actor state (balances, lots, settings,
 * contracts) and the idempotency keys live at the cut.
 *
 * Layout: the 8-byte magic `TALLYSN1`, then frames, each `[u32 big-endian length][record]`
 * where a record is codec.ts's `[crc32][msgpack]`. The first frame is the header, the
 * last is the trailer, which carries the frame count and the SHA-256 of every byte before
 * it. So a truncated file (no trailer, or a short frame), a flipped bit (a record's CRC,
 * and the digest) and a file that is not a snapshot at all (magic) are each refused with
 * a message saying which, before anything is restored.
 *
 * CRCs and a digest show damage, not intent: anyone can recompute them after editing the
 * file. So the trailer also carries an HMAC-SHA256 of the same bytes, keyed by the data
 * dir's snapshot secret, which lives in the control store and never in a file: only a
 * reader given that secret can tell the file is the one the service wrote (format 2;
 * format 1 files have no MAC and can only be restored as unauthenticated).
 */
import { createHash, createHmac, timingSafeEqual, type Hash, type Hmac } from 'node:crypto';
import fs from 'node:fs';
import { checkRecord, decodeRecord, encodeRecord } from './codec.js';
import { SNAPSHOT_CHUNK_ITEMS } from './journal.js';

export const SNAPSHOT_MAGIC = Buffer.from('TALLYSN1', 'ascii');
export const SNAPSHOT_FILE_FORMAT = 3;
/**
 * Formats this build reads: 1 (no MAC), 2 (idempotency keys in their customers' items) and
 * 3 (keys in `idempotency` frames of their own).
 */
const SNAPSHOT_FILE_FORMATS_READ: readonly number[] = [1, 2, 3];
/** Bytes of a snapshot secret: an HMAC-SHA256 key of the hash's own size. */
export const SNAPSHOT_SECRET_BYTES = 32;
/** Largest frame we write or accept; a length beyond it means a corrupt file, not a big one. */
export const SNAPSHOT_FRAME_BYTES_MAX = 256 * 1024 * 1024;
/**
 * Customers per `customers` frame: a shard snapshot chunk's size, so a copy's groups serve both.
 */
export const SNAPSHOT_FRAME_CUSTOMERS = SNAPSHOT_CHUNK_ITEMS;
/**
 * Idempotency keys per `idempotency` frame at most, about (~60 bytes each, ~0.25 MiB a
 * frame); a shard writes one at the end of each slice of its copy too, so a frame holds a
 * slice's keys where a slice reads fewer.
 */
export const SNAPSHOT_FRAME_KEYS = 4096;

export interface SnapshotHeader {
  readonly k: 'header';
  readonly formatVersion: number;
  readonly id: string;
  readonly createdAtMs: number;
  /** Worker count of the data dir the snapshot was taken from (restore may choose another). */
  readonly workers: number;
  readonly environments: readonly string[];
  /** Per worker: the journal seq that holds the last event included in the cut. */
  readonly journalPositions: readonly number[];
  /** Latest configuration version per environment at the cut. */
  readonly configVersions: Readonly<Record<string, number>>;
  /** Last audit entry per chain (environments and the operator stream) at the cut. */
  readonly auditSeqs: Readonly<Record<string, number>>;
}

export type SnapshotFrame =
  | SnapshotHeader
  | { readonly k: 'keys'; readonly items: readonly unknown[] }
  | { readonly k: 'configs'; readonly environment: string; readonly entries: readonly unknown[] }
  /** Audit entries as stored (framed bytes), so the restored chain verifies exactly. */
  | {
      readonly k: 'audit';
      readonly stream: string;
      readonly entries: ReadonlyArray<readonly [number, Uint8Array]>;
    }
  | { readonly k: 'customers'; readonly items: readonly unknown[] }
  /**
   * Idempotency keys (format 3): [environment, customerId, [[scope digest, fingerprint,
   * atMs], …]] each, a customer's keys in one item or several.
   */
  | { readonly k: 'idempotency'; readonly items: readonly unknown[] }
  | SnapshotTrailer;

export interface SnapshotTrailer {
  readonly k: 'end';
  /** Frames before the trailer, the header included. */
  readonly frames: number;
  readonly customers: number;
  /** SHA-256 (hex) of every byte before the trailer frame, the magic included. */
  readonly sha256: string;
  /** HMAC-SHA256 (hex) of the same bytes, keyed by the snapshot secret (format 2). */
  readonly mac?: string;
}

/** Encodes one frame with its length prefix. Throws for a frame over the limit (a bug). */
export function encodeFrame(frame: SnapshotFrame): Buffer {
  const record = encodeRecord(frame);
  if (record.length > SNAPSHOT_FRAME_BYTES_MAX)
    throw new Error(`snapshot frame of ${record.length} bytes exceeds the limit`);
  const prefix = Buffer.allocUnsafe(4);
  prefix.writeUInt32BE(record.length, 0);
  return Buffer.concat([prefix, record]);
}

/**
 * Writes a snapshot file front to back, hashing as it goes; `finish` appends the trailer
 * and fsyncs. Synchronous writes: it runs on a piscina thread or in the offline CLI.
 */
export class SnapshotWriter {
  private readonly hash: Hash = createHash('sha256');
  private readonly mac: Hmac;
  /** Of the whole file, trailer included: what `sha256sum` prints for it. */
  private readonly fileHash: Hash = createHash('sha256');
  private frames = 0;
  private customers = 0;
  bytes = 0;

  /**
   * `secret`: the data dir's snapshot secret (SNAPSHOT_SECRET_BYTES), which keys the trailer's MAC.
   */
  constructor(
    private readonly fd: number,
    secret: Uint8Array,
  ) {
    if (secret.length !== SNAPSHOT_SECRET_BYTES)
      throw new Error(`a snapshot secret has ${SNAPSHOT_SECRET_BYTES} bytes, got ${secret.length}`);
    this.mac = createHmac('sha256', secret);
    this.write(SNAPSHOT_MAGIC);
  }

  private write(bytes: Uint8Array): void {
    this.hash.update(bytes);
    this.mac.update(bytes);
    this.fileHash.update(bytes);
    let offset = 0;
    while (offset < bytes.length)
      offset += fs.writeSync(this.fd, bytes, offset, bytes.length - offset);
    this.bytes += bytes.length;
  }

  frame(frame: Exclude<SnapshotFrame, SnapshotTrailer>): void {
    this.write(encodeFrame(frame));
    this.frames++;
    if (frame.k === 'customers') this.customers += frame.items.length;
  }

  /**
   * Copies the frames another writer produced (a shard's part file, already
   * length-prefixed) in bounded reads. Throws if the file is not `bytes` long.
   */
  copyFrames(
    file: string,
    part: { readonly frames: number; readonly customers: number; readonly bytes: number },
  ): void {
    const fd = fs.openSync(file, 'r');
    try {
      const buffer = Buffer.allocUnsafe(4 * 1024 * 1024);
      let copied = 0;
      for (;;) {
        const read = fs.readSync(fd, buffer, 0, buffer.length, copied);
        if (read === 0) break;
        this.write(buffer.subarray(0, read));
        copied += read;
      }
      if (copied !== part.bytes)
        throw new Error(`snapshot part ${file} has ${copied} bytes, expected ${part.bytes}`);
    } finally {
      fs.closeSync(fd);
    }
    this.frames += part.frames;
    this.customers += part.customers;
  }

  /** Appends the trailer and fsyncs; answers the trailer and the whole file's SHA-256. */
  finish(): { trailer: SnapshotTrailer; fileSha256: string } {
    const trailer: SnapshotTrailer = {
      k: 'end',
      frames: this.frames,
      customers: this.customers,
      sha256: this.hash.digest('hex'),
      mac: this.mac.digest('hex'),
    };
    const bytes = encodeFrame(trailer);
    this.fileHash.update(bytes);
    let offset = 0;
    while (offset < bytes.length)
      offset += fs.writeSync(this.fd, bytes, offset, bytes.length - offset);
    this.bytes += bytes.length;
    fs.fsyncSync(this.fd);
    return { trailer, fileSha256: this.fileHash.digest('hex') };
  }
}

export class SnapshotFileError extends Error {}

/** Intact, but not provably written by the service that holds the secret. */
export class SnapshotNotAuthenticError extends SnapshotFileError {}

/** A frame between a snapshot file's header and its trailer. */
export type SnapshotBodyFrame = Exclude<SnapshotFrame, SnapshotHeader | SnapshotTrailer>;

/** What reading a whole snapshot file ends with. */
export interface SnapshotRead {
  readonly header: SnapshotHeader;
  readonly trailer: SnapshotTrailer;
}

/**
 * Reads a snapshot file frame by frame (synchronously, in bounded reads), verifying the
 * magic, each frame's length and CRC, the header's format, the trailer's count and
 * digest, and that nothing follows the trailer. Calls `onFrame` for every frame between
 * header and trailer. Throws SnapshotFileError naming the first problem found; frames
 * before it have already been handed to `onFrame`, so a caller that writes state must run
 * a verifying pass first (`verifySnapshotFile`).
 */
export function readSnapshotFile(
  file: string,
  onFrame: ((frame: SnapshotBodyFrame) => void) | null,
  onProgress?: (bytesRead: number, bytesTotal: number) => void,
  secret: Uint8Array | null = null,
): SnapshotRead {
  const frames = snapshotFrames(file, onProgress, secret, onFrame !== null);
  for (;;) {
    const next = frames.next();
    if (next.done === true) return next.value;
    onFrame?.(next.value);
  }
}

/**
 * `readSnapshotFile` as a generator: yields each frame between header and trailer (none
 * unless `decode`: frames are then only checksummed) and returns the header and trailer,
 * so a caller may await between frames. The file is closed when the generator ends,
 * throws, or is given up (`return`).
 */
export function* snapshotFrames(
  file: string,
  onProgress?: (bytesRead: number, bytesTotal: number) => void,
  secret: Uint8Array | null = null,
  decode = true,
): Generator<SnapshotBodyFrame, SnapshotRead, undefined> {
  const fd = fs.openSync(file, 'r');
  try {
    const size = fs.fstatSync(fd).size;
    const hash = new DigestPair(secret);
    let position = 0;
    const readExactly = (length: number, what: string): Buffer => {
      if (position + length > size)
        throw new SnapshotFileError(
          `snapshot file is truncated: ${what} at byte ${position} runs past the end ` +
            `(${size} bytes)`,
        );
      const buffer = Buffer.allocUnsafe(length);
      let done = 0;
      while (done < length) done += fs.readSync(fd, buffer, done, length - done, position + done);
      position += length;
      return buffer;
    };
    const magic = readExactly(SNAPSHOT_MAGIC.length, 'the magic');
    if (!magic.equals(SNAPSHOT_MAGIC))
      throw new SnapshotFileError('not a Tally snapshot file (bad magic)');
    hash.update(magic);
    let header: SnapshotHeader | null = null;
    let frames = 0;
    for (;;) {
      if (position === size)
        throw new SnapshotFileError('snapshot file is truncated: it ends before its trailer');
      const prefix = readExactly(4, 'a frame length');
      const length = prefix.readUInt32BE(0);
      if (length === 0 || length > SNAPSHOT_FRAME_BYTES_MAX)
        throw new SnapshotFileError(
          `snapshot file is corrupt: frame ${frames + 1} has length ${length}`,
        );
      const record = readExactly(length, `frame ${frames + 1}`);
      // Without a consumer, frames between header and trailer are only checksummed.
      if (!decode && frames > 0 && position < size) {
        const checked = checkRecord(record);
        if (!checked.ok)
          throw new SnapshotFileError(
            `snapshot file is corrupt: frame ${frames + 1} failed verification (${checked.reason})`,
          );
        hash.update(prefix);
        hash.update(record);
        frames++;
        onProgress?.(position, size);
        continue;
      }
      const decoded = decodeRecord(record);
      if (!decoded.ok)
        throw new SnapshotFileError(
          `snapshot file is corrupt: frame ${frames + 1} failed verification (${decoded.reason})`,
        );
      const frame = decoded.value as SnapshotFrame;
      if (frame.k === 'end') {
        const digest = hash.sha256();
        if (frame.sha256 !== digest)
          throw new SnapshotFileError(
            'snapshot file is corrupt: its SHA-256 does not match the trailer',
          );
        if (secret !== null) checkMac(frame, hash.mac());
        if (frame.frames !== frames)
          throw new SnapshotFileError(
            `snapshot file is corrupt: trailer counts ${frame.frames} frames, found ${frames}`,
          );
        if (position !== size)
          throw new SnapshotFileError(
            `snapshot file has ${size - position} unexpected bytes after its trailer`,
          );
        if (header === null) throw new SnapshotFileError('snapshot file has no header');
        return { header, trailer: frame };
      }
      hash.update(prefix);
      hash.update(record);
      frames++;
      if (frames === 1) {
        header = checkHeader(frame);
      } else if (frame.k === 'header') {
        throw new SnapshotFileError('snapshot file is corrupt: a second header');
      } else {
        yield frame;
      }
      onProgress?.(position, size);
    }
  } finally {
    fs.closeSync(fd);
  }
}

function checkHeader(frame: SnapshotFrame): SnapshotHeader {
  if (frame.k !== 'header')
    throw new SnapshotFileError('snapshot file is corrupt: it does not start with a header');
  if (!SNAPSHOT_FILE_FORMATS_READ.includes(frame.formatVersion)) {
    throw new SnapshotFileError(
      `snapshot file format ${String(frame.formatVersion)} is not supported (this build ` +
        `reads ${SNAPSHOT_FILE_FORMATS_READ.join(', ')}): restore it with a newer release`,
    );
  }
  return frame;
}

/** The file's SHA-256 and, with a secret, its HMAC, fed the same bytes. */
class DigestPair {
  private readonly hash = createHash('sha256');
  private readonly hmac: Hmac | null;

  constructor(secret: Uint8Array | null) {
    this.hmac = secret === null ? null : createHmac('sha256', secret);
  }

  update(bytes: Uint8Array): void {
    this.hash.update(bytes);
    this.hmac?.update(bytes);
  }

  sha256(): string {
    return this.hash.digest('hex');
  }

  mac(): Buffer {
    if (this.hmac === null) throw new Error('no secret to compute a MAC with');
    return this.hmac.digest();
  }
}

/** Throws SnapshotNotAuthenticError unless the trailer's MAC is the one `expected` gives. */
function checkMac(trailer: SnapshotTrailer, expected: Buffer): void {
  if (trailer.mac === undefined) {
    throw new SnapshotNotAuthenticError(
      'snapshot file carries no MAC (it was written before snapshots were authenticated), ' +
        'so it cannot be authenticated',
    );
  }
  const given = Buffer.from(trailer.mac, 'hex');
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
    throw new SnapshotNotAuthenticError(
      'snapshot file is not authentic: its MAC does not verify with this snapshot secret ' +
        '(the file was edited, or it comes from another data dir)',
    );
  }
}

/**
 * Reads the whole file without keeping anything: throws SnapshotFileError if it is not
 * intact, and SnapshotNotAuthenticError if `secret` is given and its MAC does not verify.
 */
export function verifySnapshotFile(
  file: string,
  onProgress?: (bytesRead: number, bytesTotal: number) => void,
  secret: Uint8Array | null = null,
): SnapshotRead {
  return readSnapshotFile(file, null, onProgress, secret);
}
