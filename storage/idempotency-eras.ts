/**
 * Eras of idempotency runs: up to ERA_GROUPS consecutive groups of runs behind one filter,
 * so a lookup that misses memory probes one filter per era, not one per group.
 *
 * Why: runs are sealed every IDEMPOTENCY_RUN_KEYS keys or every 30 s, and a group holds 16
 * of them, so a day of keyed writes keeps ~180 groups at any rate and ~400 at 10,000 a
 * second. At that rate a group's filter is megabytes, and probing it is a memory read the
 * CPU's caches miss (0.1–0.15 µs measured): a new key would cost 40–60 µs in probes alone by
 * the day's end. An era's filter holds every key of its groups at ERA_FILTER_BITS_PER_KEY
 * bits a key (~0.2% of absent keys answered maybe), so a day's lookups probe ~30 filters.
 * Where an era says maybe, the lookup probes its runs' own filters. A group closed inside
 * an era drops its own filter from memory (it stays on disk in the group's record), so
 * memory keeps 3 bytes a key: 2 in the eras' filters, 1 in the runs'.
 *
 * Sealing adds each key to the open era's filter with its group's and its run's. An era
 * closes when a new group cannot join it; its filter is then stored in
 * `idempotency-run-eras`, a chunk per turn, and last its head, which makes it whole:
 *
 *   [first run seq, 0] → frame([first run seq, last run seq, capacity, chunks])
 *   [first run seq, i] → frame(bytes i-1 of the filter, ERA_CHUNK_BYTES each)
 *
 * An era without a stored head (the open one at a stop, or one a crash interrupted) is not
 * needed after a restart: its groups' records hold their own filters, so they are probed
 * one by one until they expire, and new groups start a new era. Chunks left without a head
 * are removed by the next drop of expired groups. A release that predates eras never
 * opens the table and reads every group by its own filter; should it add a run to a group
 * of a stored era (its batches differ in size), the era no longer answers for that group,
 * and the next start leaves the era out (its groups' own filters hold every key).
 */
import type { RootDatabase } from 'lmdb';
import { decodeRecord, encodeRecord } from './codec.js';
import { ERA_FILTER_BITS_PER_KEY, KeyFilter } from './key-filter.js';
import { flushedWrite, type BinaryDb } from './lmdb-env.js';

/** Groups one era holds at most. */
export const ERA_GROUPS = 16;
/**
 * Keys one era's filter is sized for at most: 2^25, 64 MiB at 16 bits a key, sixteen groups
 * of sixteen runs of 131,072 keys. A group too large for two in an era stands alone.
 */
export const ERA_MAX_KEYS = 1 << 25;
/** Bytes of one stored chunk of an era's filter (a checksum of 1 MiB takes well under 1 ms). */
const ERA_CHUNK_BYTES = 1 << 20;

/** An era as lookups and sealing know it. */
export interface Era {
  /** The first run seq of its first group (its key in the table). */
  readonly first: number;
  /**
   * The last run seq its filter holds the keys of, once it is closed (its groups are the
   * ones that start between `first` and it).
   */
  lastRun: number;
  /** The keys its filter is sized for; each group that joins reserves its own capacity. */
  readonly capacity: number;
  reserved: number;
  groups: number;
  readonly filter: KeyFilter;
  /** Its head and chunks are on disk (an era is stored once, when it closes). */
  chunks: number | null;
}

/** A new, open era for groups of `groupCapacity` keys, or null if they should stand alone. */
export function openEra(first: number, groupCapacity: number): Era | null {
  if (2 * groupCapacity > ERA_MAX_KEYS) return null;
  const capacity = Math.min(ERA_GROUPS * groupCapacity, ERA_MAX_KEYS);
  const filter = KeyFilter.sized(capacity, ERA_FILTER_BITS_PER_KEY);
  return {
    first,
    lastRun: Number.POSITIVE_INFINITY,
    capacity,
    reserved: 0,
    groups: 0,
    filter,
    chunks: null,
  };
}

/** Whether a group of `capacity` keys can join `era`. */
export function hasRoom(era: Era, capacity: number): boolean {
  return era.chunks === null && era.groups < ERA_GROUPS && era.reserved + capacity <= era.capacity;
}

/** Stores a closed era's filter, a chunk per turn, then its head; each write waits for disk. */
export async function storeEra(
  root: RootDatabase,
  table: BinaryDb,
  era: Era,
  pause: () => Promise<void>,
): Promise<void> {
  const bytes = era.filter.bytes;
  const chunks = Math.ceil(bytes.byteLength / ERA_CHUNK_BYTES);
  for (let i = 0; i < chunks; i++) {
    const chunk = bytes.subarray(i * ERA_CHUNK_BYTES, (i + 1) * ERA_CHUNK_BYTES);
    const stored = table.put([era.first, i + 1], encodeRecord(chunk));
    await flushedWrite(root, stored, 'a chunk of an idempotency era');
    await pause();
  }
  const { first, lastRun, capacity } = era;
  const head = table.put([first, 0], encodeRecord([first, lastRun, capacity, chunks]));
  await flushedWrite(root, head, 'an idempotency era');
  era.chunks = chunks;
}

/** Issues the removal of a stored era's head and chunks (in the caller's transaction). */
export function removeEra(table: BinaryDb, era: Era): Promise<unknown> {
  let last: Promise<unknown> = Promise.resolve();
  for (let i = 0; i <= (era.chunks ?? -1); i++) last = table.remove([era.first, i]);
  return last;
}

/** The stored eras, oldest first, and the first run seqs of chunks left without a head. */
export function loadEras(table: BinaryDb): { eras: Era[]; orphans: number[] } {
  const eras: Era[] = [];
  const orphans = new Set<number>();
  let head: [number, number, number, number] | null = null;
  let parts: Uint8Array[] = [];
  const finish = (): void => {
    if (head === null) return;
    const [first, lastRun, capacity, chunks] = head;
    if (parts.length !== chunks)
      throw new Error(`idempotency era ${first} is missing chunks; refusing to go on`);
    const filter = KeyFilter.fromChunks(parts);
    eras.push({ first, lastRun, capacity, reserved: capacity, groups: 0, filter, chunks });
    head = null;
    parts = [];
  };
  for (const { key, value } of table.getRange({})) {
    const [first, index] = key as [number, number];
    const decoded = decodeRecord(value);
    const corrupt = (): Error =>
      new Error(`idempotency era ${first} is corrupt; refusing to go on`);
    if (!decoded.ok) throw corrupt();
    if (index === 0) {
      finish();
      const v = decoded.value;
      if (
        !Array.isArray(v) ||
        v.length !== 4 ||
        v[0] !== first ||
        !v.every((n) => Number.isInteger(n))
      )
        throw corrupt();
      head = v as [number, number, number, number];
    } else if (head !== null && head[0] === first) {
      if (!(decoded.value instanceof Uint8Array) || index !== parts.length + 1) throw corrupt();
      parts.push(decoded.value);
    } else orphans.add(first);
  }
  finish();
  return { eras, orphans: [...orphans] };
}

/** Issues the removal of every entry stored for the era that starts at `first`. */
export function removeOrphan(table: BinaryDb, first: number): Promise<unknown> {
  let last: Promise<unknown> = Promise.resolve();
  for (const key of table.getKeys({ start: [first], end: [first + 1] })) last = table.remove(key);
  return last;
}
