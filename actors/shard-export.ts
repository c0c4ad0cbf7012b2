/**
 * A shard's part of an online snapshot: a consistent copy of every customer as of one
 * point in the shard's command stream (the cut), written while the shard keeps serving.
 *
 * At the cut it notes which customers exist. It then copies them a slice at a time
 * between batches. A write that arrives for a customer not yet copied first hands its
 * pre-image (`capture`) — the state as of the cut — so later writes never leak into the
 * copy; customers created after the cut are not in it. The frames go to a part file that
 * the front end splices into the snapshot file (storage/snapshot-file.ts).
 *
 * Copies are made with `toSnapshot` and encoded before the slice ends: `toSnapshot`
 * shares the live meter objects, so nothing of it may be held across a batch. A
 * pre-image is cloned first for the same reason.
 */
import fs from 'node:fs';
import { fromSnapshot, toSnapshot, type CustomerSnapshot, type CustomerState } from './customer.js';
import { encodeFrame, SNAPSHOT_FRAME_CUSTOMERS } from '../storage/snapshot-file.js';

export interface ExportResult {
  readonly frames: number;
  readonly customers: number;
  readonly bytes: number;
}

export class ShardExport {
  /** Customers present at the cut and not yet copied (by identity: apply mutates in place). */
  private readonly remaining: Set<CustomerState>;
  private readonly order: CustomerState[];
  private next = 0;
  private chunk: CustomerSnapshot[] = [];
  private readonly fd: number;
  private frames = 0;
  private copied = 0;
  private bytes = 0;

  /** Takes the cut now. Throws if the part file cannot be created. */
  constructor(partPath: string, customers: Iterable<CustomerState>) {
    this.order = [...customers];
    this.remaining = new Set(this.order);
    this.fd = fs.openSync(partPath, 'wx');
  }

  get total(): number {
    return this.order.length;
  }

  get done(): number {
    return this.copied;
  }

  /** The shard is about to change `customer`: copy its state as of the cut if not yet copied. */
  capture(customer: CustomerState): void {
    if (!this.remaining.delete(customer)) return;
    this.add(toSnapshot(fromSnapshot(toSnapshot(customer))));
  }

  /** Copies up to `budget` customers; true once every customer of the cut is copied. */
  step(budget: number): boolean {
    const end = Math.min(this.order.length, this.next + budget);
    for (; this.next < end; this.next++) {
      const customer = this.order[this.next] as CustomerState;
      // Not yet written since the cut (a write would have captured it first): as of the cut.
      if (this.remaining.delete(customer)) this.add(toSnapshot(customer));
    }
    this.flushChunk();
    return this.next === this.order.length;
  }

  private add(item: CustomerSnapshot): void {
    this.chunk.push(item);
    this.copied++;
    if (this.chunk.length >= SNAPSHOT_FRAME_CUSTOMERS) this.flushChunk();
  }

  private flushChunk(): void {
    if (this.chunk.length === 0) return;
    const frame = encodeFrame({ k: 'customers', items: this.chunk });
    this.chunk = [];
    let offset = 0;
    while (offset < frame.length) offset += fs.writeSync(this.fd, frame, offset, frame.length - offset);
    this.frames++;
    this.bytes += frame.length;
  }

  /** Writes what is left and closes the part file. */
  finish(): ExportResult {
    this.flushChunk();
    fs.closeSync(this.fd);
    return { frames: this.frames, customers: this.copied, bytes: this.bytes };
  }

  /** Gives up (e.g. a write failed): closes the file; the caller removes it. */
  abandon(): void {
    try {
      fs.closeSync(this.fd);
    } catch {
      /* already closed */
    }
  }
}
