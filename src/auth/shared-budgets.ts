/**
 * Per-key rate-limit windows in memory shared by every front-end thread (TALLY_FRONTENDS), so
 * that a key's budget is one budget whichever thread its requests land on.
 *
 * One cell of three 32-bit words per key: a lock, the window (whole minutes since the epoch)
 * and the count in it. A count is taken under the cell's lock (a compare-and-swap spin: the
 * critical section is a handful of loads and stores), which orders the plain reads and writes
 * inside it between threads. Cells are given out by the first front end, which owns the keys,
 * in the order it first sees each key; the others learn them with the keys.
 */
import { assert } from '../../shared/assert.js';

/** Keys with a shared budget; past this many, a key's budget is kept per thread. */
export const SHARED_BUDGET_KEYS = 65_536;

const WORDS = 3;
const LOCK = 0;
const MINUTE = 1;
const COUNT = 2;

export class SharedBudgets {
  private readonly cells: Int32Array;
  private readonly slots = new Map<string, number>();

  constructor(readonly buffer: SharedArrayBuffer = newBuffer()) {
    this.cells = new Int32Array(buffer);
  }

  /** The key's cell, given out now if it has none and there is room (first front end only). */
  assign(keyId: string): number {
    let slot = this.slots.get(keyId);
    if (slot === undefined && this.slots.size < SHARED_BUDGET_KEYS) {
      slot = this.slots.size;
      this.slots.set(keyId, slot);
    }
    return slot ?? -1;
  }

  /** The key's cell, or -1 when it has none (it is then counted per thread). */
  slotOf(keyId: string): number {
    return this.slots.get(keyId) ?? -1;
  }

  /** Every key's cell, to send to the other front ends. */
  assignments(): Array<[string, number]> {
    return [...this.slots];
  }

  /** Takes the first front end's assignments (a front end after the first). */
  learn(assignments: ReadonlyArray<readonly [string, number]>): void {
    for (const [keyId, slot] of assignments) {
      assert(slot >= 0 && slot < SHARED_BUDGET_KEYS, `budget cell ${slot}`);
      this.slots.set(keyId, slot);
    }
  }

  /** Counts one request in the cell's window `minute`; returns the window's count with it. */
  count(slot: number, minute: number): number {
    const cells = this.cells;
    const at = slot * WORDS;
    while (Atomics.compareExchange(cells, at + LOCK, 0, 1) !== 0);
    if (cells[at + MINUTE] !== minute) {
      cells[at + MINUTE] = minute;
      cells[at + COUNT] = 0;
    }
    const count = (cells[at + COUNT] as number) + 1;
    cells[at + COUNT] = count;
    Atomics.store(cells, at + LOCK, 0);
    return count;
  }
}

function newBuffer(): SharedArrayBuffer {
  return new SharedArrayBuffer(SHARED_BUDGET_KEYS * WORDS * Int32Array.BYTES_PER_ELEMENT);
}
