/**
 * A consistent copy of a shard's customers as of one point in its command stream (the
 * cut), made while the shard keeps serving. Both kinds of snapshot use it: the shard's
 * own periodic snapshot (which bounds replay) and its part of an operator's online
 * snapshot.
 *
 * At the cut it lists the customers. It then copies them a slice at a time between
 * batches. A write that arrives for a customer not yet copied first hands over its
 * pre-image (`capture`) — the state as of the cut — so later writes never leak into the
 * copy; customers created after the cut (`created`) are not in it. Copies go to `sink`
 * in groups of at most SNAPSHOT_FRAME_CUSTOMERS, and the sink must encode them before it
 * returns: `toSnapshot` shares the live meter objects, so nothing of a copy may be held
 * across a batch (a pre-image is cloned for the same reason).
 *
 * A slice is bounded by work, not by customers: each customer costs one unit plus one
 * per meter, lot, lot draw, limit and commerce record it carries (`copyWork`), so a slice
 * of a few large customers is as short as one of many small ones. An online snapshot's
 * copy also carries the shard's idempotency keys as of the cut (`keys`: the key store's
 * cut, read in key order once the customers are copied, a unit a key, and written as
 * frames of their own); the shard's own snapshot does not (the keys are in their own
 * tables, which the snapshot does not replace).
 */
import fs from 'node:fs';
import { fromSnapshot, toSnapshot, type CustomerSnapshot, type CustomerState } from './customer.js';
import type { CustomerKeys, KeysAtCut } from './idempotency-keys.js';
import {
  encodeFrame,
  SNAPSHOT_FRAME_CUSTOMERS,
  SNAPSHOT_FRAME_KEYS,
} from '../storage/snapshot-file.js';

/** What copying `customer` costs, in the units a slice budget counts. */
export function copyWork(customer: CustomerState): number {
  let work = 1 + (customer.limits?.size ?? 0);
  for (const meter of customer.meters.values())
    work += 1 + meter.lots.length + meter.lotDraws.length;
  const commerce = customer.commerce;
  if (commerce !== null)
    work += commerce.subscriptions.length + commerce.purchases.length + commerce.eventIds.length;
  return work;
}

/** Keys read from the key store's cut at a time, between looks at the clock. */
const KEY_READ = 256;

export class ShardCopy {
  /**
   * The customers present at the cut, in copy order. Which are copied already, and which
   * are newer than the cut, is kept in weak sets filled as the copy goes (a set of every
   * customer built at the cut would hold a large shard longer). Identity, not id: apply
   * mutates a customer in place.
   */
  private readonly order: CustomerState[];
  private readonly copied = new WeakSet<CustomerState>();
  private readonly newerThanCut = new WeakSet<CustomerState>();
  private next = 0;
  private chunk: CustomerSnapshot[] = [];
  private copiedCount = 0;
  private keyChunk: CustomerKeys[] = [];
  private keyChunkKeys = 0;

  /**
   * Takes the cut now (`keys`, when given, is the key store's cut taken at the same moment,
   * and `keys.sink` takes its frames).
   */
  constructor(
    customers: Iterable<CustomerState>,
    private readonly sink: (items: CustomerSnapshot[]) => void,
    private readonly keys?: {
      readonly cut: KeysAtCut;
      readonly sink: (items: CustomerKeys[]) => void;
    },
  ) {
    this.order = [...customers];
  }

  get total(): number {
    return this.order.length;
  }

  get done(): number {
    return this.copiedCount;
  }

  /**
   * The shard is about to change `customer`: copy its state as of the cut unless it is
   * copied already or newer than the cut (every other existing customer was at the cut).
   */
  capture(customer: CustomerState): void {
    if (this.newerThanCut.has(customer) || this.copied.has(customer)) return;
    this.copied.add(customer);
    this.add(toSnapshot(fromSnapshot(toSnapshot(customer))));
  }

  /** A write created `customer` after the cut: it is not part of this copy. */
  created(customer: CustomerState): void {
    this.newerThanCut.add(customer);
  }

  /**
   * Copies customers, then keys, until `budget` units of work (`copyWork`, a unit a key)
   * are spent or the clock (`performance.now()`) reaches `untilMs`, at least one customer
   * or a few keys either way; true once every customer and key of the cut is copied. The
   * units keep a slice short whatever the customers' size; the clock keeps it short where
   * a unit costs more than usual (the first snapshot after a start runs code V8 has not
   * optimized yet).
   */
  step(budget: number, untilMs = Number.POSITIVE_INFINITY): boolean {
    let work = 0;
    let copiedOne = false;
    for (; this.next < this.order.length && work < budget; this.next++) {
      if (copiedOne && performance.now() >= untilMs) break;
      const customer = this.order[this.next] as CustomerState;
      // Not written since the cut (a write would have copied it first): as of the cut.
      if (this.copied.has(customer)) continue;
      this.copied.add(customer);
      work += copyWork(customer);
      this.add(toSnapshot(customer));
      copiedOne = true;
    }
    this.flush();
    if (this.next < this.order.length) return false;
    const keys = this.keys;
    if (keys === undefined) return true;
    while (!keys.cut.done && work < budget) {
      if (copiedOne && performance.now() >= untilMs) break;
      const read = keys.cut.read(Math.min(KEY_READ, budget - work));
      for (const item of read) {
        this.keyChunk.push(item);
        this.keyChunkKeys += item[2].length;
        work += item[2].length;
      }
      if (this.keyChunkKeys >= SNAPSHOT_FRAME_KEYS) this.flushKeys();
      copiedOne = true;
    }
    // Written within the slice, as customers are: what it read dies young, not held across
    // batches into the old generation for a full collection to clear.
    this.flushKeys();
    return keys.cut.done;
  }

  private flushKeys(): void {
    if (this.keyChunk.length === 0) return;
    const items = this.keyChunk;
    this.keyChunk = [];
    this.keyChunkKeys = 0;
    this.keys?.sink(items);
  }

  private add(item: CustomerSnapshot): void {
    this.chunk.push(item);
    this.copiedCount++;
    if (this.chunk.length >= SNAPSHOT_FRAME_CUSTOMERS) this.flush();
  }

  private flush(): void {
    if (this.chunk.length === 0) return;
    const items = this.chunk;
    this.chunk = [];
    this.sink(items);
  }
}

/**
 * A shard's part file of an online snapshot: `customers` and `idempotency` frames,
 * length-prefixed.
 */
export class PartFile {
  private readonly fd: number;
  frames = 0;
  bytes = 0;

  /** Throws if the file cannot be created (or already exists). */
  constructor(path: string) {
    this.fd = fs.openSync(path, 'wx');
  }

  /** Writes one frame of customers (synchronously: the sink must be done on return). */
  write(items: CustomerSnapshot[]): void {
    this.#frame(encodeFrame({ k: 'customers', items }));
  }

  /** Writes one frame of idempotency keys (synchronously, as `write`). */
  writeKeys(items: CustomerKeys[]): void {
    this.#frame(encodeFrame({ k: 'idempotency', items }));
  }

  #frame(frame: Buffer): void {
    let offset = 0;
    while (offset < frame.length)
      offset += fs.writeSync(this.fd, frame, offset, frame.length - offset);
    this.frames++;
    this.bytes += frame.length;
  }

  close(): void {
    try {
      fs.closeSync(this.fd);
    } catch {
      /* already closed */
    }
  }
}
