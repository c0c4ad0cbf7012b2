/**
 * The front end's requests waiting for a worker's reply, each in a slot its id names.
 *
 * Not a Map from request id to handler. Ids only grow and each entry leaves soon after it
 * came, so V8 keeps rebuilding such a Map's table; a table it has outgrown still points at
 * the entries it held and at the table that replaced it. Once one of those tables has
 * reached the old generation (a stall with many requests waiting can put one there), each later
 * table and every request it held survive the young collections until the next full one,
 * and so on for good: in keyed soaks the front end's young collections went from
 * promoting ~3 KB to ~1 MB each, doubling in steps as the table grew, and the thread ran a
 * full collection every few seconds. Slots of an array are written in place and keep nothing
 * once cleared.
 *
 * An id is `(generation × SLOTS_MAX + slot) × FRONT_ENDS_MAX + frontEnd`: its remainder by
 * FRONT_ENDS_MAX names the front end (the worker routes the reply by it), the slot finds
 * the handler, and the slot's generation, counted up each time the slot is taken, tells a
 * repeated or unknown id from the request the slot holds now.
 */
import { assert } from '../shared/assert.js';
import { FRONT_ENDS_MAX } from '../shared/limits.js';

/** Requests one front end may have waiting at once (far above workers × queue bound). */
export const SLOTS_MAX = 2 ** 21;
/** Generations a slot counts through before it starts again (ids stay below 2^51). */
const GENERATIONS = 2 ** 26;

export class PendingReplies<Handler> {
  readonly #handlers: Array<Handler | null> = [];
  readonly #generations: number[] = [];
  readonly #free: number[] = [];
  #size = 0;

  constructor(private readonly frontEnd: number) {
    assert(
      Number.isInteger(frontEnd) && frontEnd >= 0 && frontEnd < FRONT_ENDS_MAX,
      `front end ${frontEnd}`,
    );
  }

  /** Requests waiting now. */
  get size(): number {
    return this.#size;
  }

  /** Holds `handler` and returns the id its reply will carry. */
  add(handler: Handler): number {
    let slot = this.#free.pop();
    if (slot === undefined) {
      slot = this.#handlers.length;
      assert(slot < SLOTS_MAX, `more than ${SLOTS_MAX} requests waiting for replies`);
      this.#handlers.push(null);
      this.#generations.push(0);
    }
    const generation = ((this.#generations[slot] as number) + 1) % GENERATIONS;
    this.#generations[slot] = generation;
    this.#handlers[slot] = handler;
    this.#size++;
    return (generation * SLOTS_MAX + slot) * FRONT_ENDS_MAX + this.frontEnd;
  }

  /** The handler waiting for `id`, no longer held; undefined when no request waits for it. */
  take(id: number): Handler | undefined {
    if (!Number.isSafeInteger(id) || id < 0 || id % FRONT_ENDS_MAX !== this.frontEnd) {
      return undefined;
    }
    const named = Math.floor(id / FRONT_ENDS_MAX);
    const slot = named % SLOTS_MAX;
    const handler = this.#handlers[slot];
    if (handler === undefined || handler === null) return undefined;
    if (this.#generations[slot] !== Math.floor(named / SLOTS_MAX)) return undefined;
    this.#handlers[slot] = null;
    this.#free.push(slot);
    this.#size--;
    return handler;
  }
}
