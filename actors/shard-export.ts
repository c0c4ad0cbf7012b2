/**
 * A consistent copy of a shard's customers as of one point in its command stream (the
 * cut), made while the shard keeps serving. Both kinds of snapshot use it: the shard's
 * own periodic snapshot (which bounds replay) and its part of an operator's online
 * snapshot.
 *
 * At the cut it notes how many customers each of the shard's maps holds and starts an
 * iterator over each: nothing is listed or copied then, so a cut takes as long with a
 * million customers as with ten. A shard never removes a customer and a write changes
 * one in place, so a map only grows, at its end, and the first entries an iterator
 * yields, as many as the map held at the cut, are exactly the customers of the cut. It
 * then copies them a slice at a time between batches. A write that arrives for a
 * customer not yet copied first hands over its pre-image (`capture`), the state as of
 * the cut, so later writes never leak into the copy; customers created after the cut
 * (`created`) are not in it. Copies go to `sink` in groups of at most
 * SNAPSHOT_FRAME_CUSTOMERS, and the sink must encode them before it returns: `toSnapshot`
 * shares the live meter objects, so nothing of a copy may be held across a batch (a
 * pre-image is cloned for the same reason).
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
import { assert } from '../shared/assert.js';
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

/**
 * Customers a copy can be cut from: one of a shard's maps of customers (`Shard.customerMaps`),
 * which only ever grows at its end and never replaces a customer's object.
 */
export interface GrowingCustomers {
  /** Customers held now. */
  readonly size: number;
  /** The customers in the order they were added, going on over those added later. */
  values(): Iterator<CustomerState>;
}

/** One map of the cut: its iterator, and how many of the customers it yields are the cut's. */
interface CutPart {
  readonly values: Iterator<CustomerState>;
  left: number;
}

/**
 * Which mark of a customer a copy uses (`CustomerState.copyMark0`/`copyMark1`): a shard's
 * own snapshot and an operator's online one may copy at the same time, each in its lane;
 * a lane runs one copy at a time.
 */
export type CopyLane = 0 | 1;

/** The number of each lane's latest copy (a customer's mark equal to it: done with). */
const latestCopy: [number, number] = [0, 0];

export class ShardCopy {
  /**
   * The cut: per map, an iterator and how many customers it has left to yield that were
   * there at the cut. Which customers this copy is done with (copied, or newer than the
   * cut) is marked on the customers themselves: a set of them grew with the copy, and
   * each time it grew past a power of two it rehashed, holding the thread ~0.2 s at
   * 700,000 customers.
   */
  private readonly parts: CutPart[];
  private readonly lane: CopyLane;
  private readonly number: number;
  private readonly cutTotal: number;
  /** The part yielding next; every part has customers of the cut left until passed. */
  private part = 0;
  private chunk: CustomerSnapshot[] = [];
  private copiedCount = 0;
  private keyChunk: CustomerKeys[] = [];
  private keyChunkKeys = 0;

  /**
   * Takes the cut now (`keys`, when given, is the key store's cut taken at the same moment,
   * and `keys.sink` takes its frames).
   */
  constructor(
    customers: readonly GrowingCustomers[],
    private readonly sink: (items: CustomerSnapshot[]) => void,
    private readonly keys?: {
      readonly cut: KeysAtCut;
      readonly sink: (items: CustomerKeys[]) => void;
    },
    lane: CopyLane = 0,
  ) {
    this.lane = lane;
    this.number = ++latestCopy[lane];
    this.parts = customers
      .filter((map) => map.size > 0)
      .map((map) => ({ values: map.values(), left: map.size }));
    this.cutTotal = this.parts.reduce((sum, part) => sum + part.left, 0);
  }

  get total(): number {
    return this.cutTotal;
  }

  get done(): number {
    return this.copiedCount;
  }

  /**
   * The shard is about to change `customer`: copy its state as of the cut unless it is
   * copied already or newer than the cut (every other existing customer was at the cut).
   */
  capture(customer: CustomerState): void {
    if (this.doneWith(customer)) return;
    this.markDone(customer);
    this.add(toSnapshot(fromSnapshot(toSnapshot(customer))));
  }

  /** A write created `customer` after the cut: it is not part of this copy. */
  created(customer: CustomerState): void {
    this.markDone(customer);
  }

  private doneWith(customer: CustomerState): boolean {
    return (this.lane === 0 ? customer.copyMark0 : customer.copyMark1) === this.number;
  }

  private markDone(customer: CustomerState): void {
    if (this.lane === 0) customer.copyMark0 = this.number;
    else customer.copyMark1 = this.number;
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
    while (work < budget) {
      if (copiedOne && performance.now() >= untilMs) break;
      const customer = this.nextOfCut();
      if (customer === undefined) break;
      // Not written since the cut (a write would have copied it first): as of the cut.
      if (this.doneWith(customer)) continue;
      this.markDone(customer);
      work += copyWork(customer);
      this.add(toSnapshot(customer));
      copiedOne = true;
    }
    this.flush();
    if (this.part < this.parts.length) return false;
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

  /** The next customer of the cut in copy order, or undefined once every one was yielded. */
  private nextOfCut(): CustomerState | undefined {
    const part = this.parts[this.part];
    if (part === undefined) return undefined;
    const next = part.values.next();
    assert(next.done !== true, 'a map of customers lost a customer after the cut');
    if (--part.left === 0) this.part++;
    return next.value;
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
