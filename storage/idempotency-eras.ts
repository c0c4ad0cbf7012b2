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
 * an era drops its own filter from memory (it stays on disk in the group's record).
 *
 * An era's memory is one buffer, allocated when it opens: [lead | the era's filter | its
 * runs' filters], each run's filter carved from it as the run is sealed. When the era
 * closes, the buffer is stored whole as the era's **image**, one value, and the era's
 * filter and its runs' are read from then on where the image lies in LMDB's memory map:
 * file pages the kernel keeps in its page cache, not the worker's own memory. So the
 * worker's own memory holds the open era's buffer, whatever the number of keys kept.
 * lmdb-js answers a read of a value this large with a view of the memory map itself (it
 * copies smaller ones), which is why an image of MAP_FROM_BYTES or more is stored padded
 * to MAPPED_IMAGE_BYTES; a smaller one (a shard keying a few hundred writes a second or
 * fewer) is kept in memory. The lead puts the filter on a cache-line boundary in the map.
 * Once stored and mapped, the closed era's buffer is zeroed and reused by the next era.
 *
 * Table `idempotency-run-eras`, in an LMDB environment of its own (idempotency-runs.ts,
 * EraHome), or, as a release before stored them, in the shard's:
 *
 *   [first run seq, -2] → the image's bytes (raw; its checksums are in its head)
 *   [first run seq, -1] → frame([first run seq, last run seq, capacity, layout])
 *
 * where layout = [image bytes, the filter's bytes, [[run seq, offset, bytes], …], [CRC-32
 * of each IMAGE_CHECK_BYTES of the image, …]]. The image is written and synced first, its
 * head last, which makes it whole. A release before images stored the filter in chunks:
 *
 *   [first run seq, 0] → frame([first run seq, last run seq, capacity, chunks])
 *   [first run seq, i] → frame(bytes i-1 of the filter, 1 MiB each)
 *
 * which this release reads into memory (its runs' filters are in their own records). Such a
 * release takes an image's entries for an unfinished era's and removes them; its groups'
 * own filters answer for their keys meanwhile.
 *
 * An era without a stored head (the open one at a crash, or one a crash interrupted while
 * it was stored) is not needed after a restart: its groups' records hold their own filters,
 * so they are probed one by one, and new groups start a new era. Meanwhile an era is
 * rebuilt over them from their runs (`rebuiltEra`; KeyStore.rebuildEras) and stored as any
 * closed era; from then on it answers for them. Entries left without a head are removed
 * before that, or by the next drop of expired groups. A release that predates eras never
 * opens the table and reads every group by its own filter; should it add a run to a group
 * of a stored era (its batches differ in size), the era no longer answers for that group,
 * and the next start leaves the era out (its groups' own filters hold every key).
 */
import { crc32 } from 'node:zlib';
import { assert } from '../shared/assert.js';
import {
  IDEMPOTENCY_ERA_GROUPS,
  IDEMPOTENCY_ERA_GROUPS_MAX,
  IDEMPOTENCY_ERAS_PER_DAY,
} from '../shared/limits.js';
import type { RootDatabase } from 'lmdb';
import { decodeRecord, encodeRecord } from './codec.js';
import { ERA_FILTER_BITS_PER_KEY, KeyFilter, RUN_FILTER_BITS_PER_KEY } from './key-filter.js';
import { flushedWrite, type BinaryDb } from './lmdb-env.js';

/** Groups one era holds at most, unless the store is told otherwise (`KeyStore.eraGroups`). */
export const ERA_GROUPS = IDEMPOTENCY_ERA_GROUPS;
/** The most groups an era may be set to hold (4 × ERA_GROUPS: a filter of 256 MiB). */
export const ERA_GROUPS_MAX = IDEMPOTENCY_ERA_GROUPS_MAX;
/**
 * Keys one era's filter is sized for at most: 2^25, 64 MiB at 16 bits a key, sixteen groups
 * of sixteen runs of 131,072 keys; an era of more groups than ERA_GROUPS, as many times
 * more. A group too large for two in an era stands alone.
 */
export const ERA_MAX_KEYS = 1 << 25;

/**
 * The groups a new era holds where eras are sized by the keys' rate: enough for a day of
 * `keysPerDay` keys in groups of `groupCapacity` to fill about IDEMPOTENCY_ERAS_PER_DAY
 * eras, from ERA_GROUPS to ERA_GROUPS_MAX. A shard keying fast for a day otherwise keeps
 * dozens of eras of ERA_GROUPS, and each is one more probe, a cache and TLB miss, for
 * every new key (at 35,000 keys a second, ~90 eras by the day's end: ~23 µs a key, where
 * eras of 64 groups make it ~6). A larger era costs a larger buffer in memory while it is
 * open and a larger image at its close; a slower shard keeps eras of ERA_GROUPS.
 */
export function eraGroupsFor(keysPerDay: number, groupCapacity: number): number {
  const wanted = Math.ceil(keysPerDay / IDEMPOTENCY_ERAS_PER_DAY / Math.max(1, groupCapacity));
  if (!(wanted > ERA_GROUPS)) return ERA_GROUPS; // NaN (no rate known) too
  return Math.min(wanted, ERA_GROUPS_MAX);
}

/** The keys an era of `groups` groups is sized for at most. */
function eraMaxKeys(groups: number): number {
  return (ERA_MAX_KEYS / ERA_GROUPS) * groups;
}
/**
 * The smallest image read from the memory map: smaller eras (under ~2.8 million keys, 256
 * runs of under 11,000) stay in memory, so a store keeps at most ~100 MiB of them a day.
 */
export const MAP_FROM_BYTES = 8 << 20;
/**
 * The size an image read from the map is padded to at least. lmdb-js copies a value that
 * fits its read buffer, which grows to twice the largest value it copied, and copies every
 * value under 16 MiB: a value of 32 MiB or more is always answered from the map.
 */
export const MAPPED_IMAGE_BYTES = 32 << 20;
/** Bytes before the filter: LMDB puts a large value 24 bytes past a 64-byte boundary. */
const IMAGE_LEAD = 40;
/** Bytes per checksum of an image (a CRC-32 of 1 MiB takes well under 1 ms). */
const IMAGE_CHECK_BYTES = 1 << 20;

/** A run's filter carved from an era's memory: [filter, run seq, offset]. */
type Carved = [KeyFilter, number, number];

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
  /** Its head is on disk (an era is stored once, when it closes). */
  stored: boolean;
  /** Its buffer while its filters live in the worker's memory (null once on the map). */
  memory: Uint8Array | null;
  /** The image's size once it is stored (padded if it is to be read from the map). */
  readonly imageBytes: number;
  /** Where the next run's filter is carved from `memory`, and the filters carved so far. */
  carveAt: number;
  readonly carved: Carved[];
  /** Bytes of its image read from the memory map (0 while in memory). */
  mappedBytes: number;
  /** Run filters of a loaded era, by run seq (from its image); empty otherwise. */
  readonly runFilters: Map<number, KeyFilter>;
  /** Its memory is new: its pages are not yet in the worker's memory (`makeResident`). */
  untouched: boolean;
  /** The groups it holds at most. */
  readonly maxGroups: number;
  /**
   * Opened again at a start (`reopenedEra`): the last run its stored head covers, while
   * that head is still on disk; null otherwise.
   */
  storedLastRun: number | null;
}

/**
 * A new, open era for up to `maxGroups` groups of `groupCapacity` keys and their runs
 * (`groupRuns` each at most), or null if they should stand alone. Its image will be read
 * from the memory map if it takes `mapFrom` bytes or more; such an era's memory is `spare`
 * where that is large enough (the buffer of an era closed before, zeroed), else new (as a
 * smaller era's always is: it keeps its memory).
 */
export function openEra(
  first: number,
  groupCapacity: number,
  groupRuns: number,
  spare: Uint8Array | null,
  mapFrom = MAP_FROM_BYTES,
  maxGroups = ERA_GROUPS,
): Era | null {
  const maxKeys = eraMaxKeys(maxGroups);
  if (2 * groupCapacity > maxKeys) return null;
  const capacity = Math.min(maxGroups * groupCapacity, maxKeys);
  const maxRuns = maxGroups * groupRuns;
  // Each run's filter is whole blocks: one more block per run than its keys need, at most.
  const runBytes = KeyFilter.bytesFor(capacity, RUN_FILTER_BITS_PER_KEY) + 64 * maxRuns;
  return eraOver(first, capacity, runBytes, spare, mapFrom, maxGroups);
}

/** The most keys an era rebuilt over groups already sealed holds (`rebuiltEra`). */
export const REBUILT_ERA_MAX_KEYS = eraMaxKeys(ERA_GROUPS_MAX);

/**
 * A closed era over groups already sealed whose own era was never stored (it was open at a
 * crash), for their `keys` keys and their runs' filters, `runBytes` in all. Its filter is
 * sized for those keys alone (it takes no more, so 16 bits a key of them, not of an open
 * era's capacity), and its memory is laid out as an open era's: the caller adds every key
 * to its filter, carves each run's filter from it (`carveRunCopy`, `carveRunFilter`), then
 * stores it as any closed era (`storeEra`). `lastRun` is its last group's last run.
 */
export function rebuiltEra(
  first: number,
  lastRun: number,
  keys: number,
  runBytes: number,
  spare: Uint8Array | null,
  mapFrom = MAP_FROM_BYTES,
): Era {
  assert(keys <= REBUILT_ERA_MAX_KEYS, 'a rebuilt era holds at most as many keys as any era');
  const era = eraOver(first, Math.max(1, keys), runBytes, spare, mapFrom, ERA_GROUPS_MAX);
  era.lastRun = lastRun;
  era.reserved = era.capacity;
  return era;
}

/**
 * An era's memory and its filter: [lead | a filter for `capacity` keys | `runBytes` for its
 * runs' filters], padded where its image is to be read from the memory map (`openEra`).
 */
function eraOver(
  first: number,
  capacity: number,
  runBytes: number,
  spare: Uint8Array | null,
  mapFrom: number,
  maxGroups: number,
): Era {
  const filterBytes = KeyFilter.bytesFor(capacity, ERA_FILTER_BITS_PER_KEY);
  const needed = IMAGE_LEAD + filterBytes + runBytes;
  const imageBytes = needed >= mapFrom ? Math.max(needed, MAPPED_IMAGE_BYTES) : needed;
  const reuse =
    spare !== null && imageBytes >= MAPPED_IMAGE_BYTES && spare.byteLength >= imageBytes;
  const memory = reuse ? spare : new Uint8Array(imageBytes);
  return {
    first,
    lastRun: Number.POSITIVE_INFINITY,
    capacity,
    reserved: 0,
    groups: 0,
    filter: KeyFilter.over(memory.buffer, memory.byteOffset + IMAGE_LEAD, filterBytes),
    stored: false,
    memory,
    imageBytes,
    carveAt: IMAGE_LEAD + filterBytes,
    carved: [],
    mappedBytes: 0,
    runFilters: new Map(),
    untouched: memory !== spare,
    maxGroups,
    storedLastRun: null,
  };
}

/**
 * Touches every page of a new era's memory, a slice per turn, so the worker's memory takes
 * the whole buffer now rather than as its runs fill it (a flat curve, not a saw). Writing
 * each page's first byte back unchanged leaves the bits the era holds as they are.
 */
export async function makeResident(era: Era, pause: () => Promise<void>): Promise<void> {
  const memory = era.memory;
  era.untouched = false;
  if (memory === null) return;
  for (let at = 0; at < memory.byteLength; at += RESIDENT_SLICE_BYTES) {
    const end = Math.min(at + RESIDENT_SLICE_BYTES, memory.byteLength);
    for (let page = at; page < end; page += 4096) memory[page] = memory[page] as number;
    await pause();
  }
}

/**
 * Bytes made resident per turn: 64 pages, ~0.2 ms (a fresh page costs a fault and a zeroed
 * page: 4 MiB a turn held the shard's thread 3.4 ms, median, on an idle machine).
 */
const RESIDENT_SLICE_BYTES = 256 << 10;

/** Whether a group of `capacity` keys can join `era`. */
export function hasRoom(era: Era, capacity: number): boolean {
  return !era.stored && era.groups < era.maxGroups && era.reserved + capacity <= era.capacity;
}

/**
 * `era`, stored by a clean stop with room for more groups, open again at the start that
 * follows: a restart then adds no era, which every lookup that misses memory would probe
 * until the era expired (a day; a probe is a cache miss, ~0.075 µs a key each). The open
 * era holds its `groups` groups, which reserve `reserved` of its keys, and `maxGroups` at
 * most; its memory is a copy of its image (the filter and its runs' filters), the worker's
 * own again, as an open era's is. Its image and head stay on disk as they are until it is
 * stored again: its head still describes that image, so a crash before then loses nothing
 * (its groups joined since are outside it, as a crashed open era's). `storeEra` removes the
 * head before it writes the image again, so no head is ever over an image it does not
 * describe. Null where the image is not laid out as an open era's (its filter or its runs'
 * filters elsewhere than `eraOver` and `carve` put them): such an era stays closed.
 */
export function reopenedEra(
  era: Era,
  groups: number,
  reserved: number,
  maxGroups: number,
): Era | null {
  assert(era.stored && era.imageBytes > 0, 'an era is opened again from its stored image');
  const lead = era.filter.bytes;
  const imageAt = lead.byteOffset - IMAGE_LEAD;
  if (KeyFilter.bytesFor(era.capacity, ERA_FILTER_BITS_PER_KEY) !== era.filter.byteLength)
    return null;
  // Laid out as when it opened, at the image's own size (never padded again).
  const runBytes = era.imageBytes - IMAGE_LEAD - era.filter.byteLength;
  const open = eraOver(era.first, era.capacity, runBytes, null, Infinity, maxGroups);
  const memory = open.memory as Uint8Array;
  memory.set(new Uint8Array(lead.buffer, imageAt, era.imageBytes));
  // Its runs' filters were carved one after another as they were sealed: carved again in
  // the same order, each lands where the image has it (else the era stays closed).
  for (const [seq, filter] of era.runFilters) {
    const carved = carve(open, seq, filter.byteLength);
    const at = filter.bytes.byteOffset - imageAt;
    if (carved === null || carved.bytes.byteOffset - memory.byteOffset !== at) return null;
  }
  open.groups = groups;
  open.reserved = reserved;
  open.untouched = false; // copied: every page is in memory already
  open.storedLastRun = era.lastRun;
  return open;
}

/**
 * A filter for run `seq` of `keys` keys, carved from the open era's memory, or null where
 * it has no room (a run larger than its group's share): the run then has one of its own.
 */
export function carveRunFilter(era: Era, seq: number, keys: number): KeyFilter | null {
  return carve(era, seq, KeyFilter.bytesFor(keys, RUN_FILTER_BITS_PER_KEY));
}

/**
 * A copy of run `seq`'s own filter `own`, carved from a rebuilt era's memory (`rebuiltEra`),
 * or null where it has no room.
 */
export function carveRunCopy(era: Era, seq: number, own: KeyFilter): KeyFilter | null {
  const filter = carve(era, seq, own.byteLength);
  filter?.bytes.set(own.bytes);
  return filter;
}

function carve(era: Era, seq: number, bytes: number): KeyFilter | null {
  const memory = era.memory;
  if (memory === null || era.stored || era.carveAt + bytes > era.imageBytes) return null;
  const filter = KeyFilter.over(memory.buffer, memory.byteOffset + era.carveAt, bytes);
  era.carved.push([filter, seq, era.carveAt]);
  era.carveAt += bytes;
  return filter;
}

/** Whether `bytes`, read back, lie in the memory map (lmdb-js's view, not a copy). */
function onTheMap(bytes: Uint8Array | undefined, size: number): bytes is Uint8Array {
  return (
    bytes !== undefined &&
    bytes.byteLength === size &&
    size >= MAPPED_IMAGE_BYTES &&
    (bytes as { isGlobal?: boolean }).isGlobal !== true &&
    bytes.byteOffset % 4 === 0
  );
}

/**
 * Stores a closed era: its image (checksummed a slice per turn), then its head; each write
 * waits for disk. Then reads the image back from the memory map where it lies there, moves
 * the era's filters onto it and returns the era's memory, zeroed a slice per turn, for the
 * next era; null where the era stays in memory.
 */
export async function storeEra(
  root: RootDatabase,
  table: BinaryDb,
  era: Era,
  pause: () => Promise<void>,
): Promise<Uint8Array | null> {
  const memory = era.memory;
  if (memory === null) throw new Error('an era is stored from its memory');
  if (era.storedLastRun !== null) {
    // Opened again at a start: its head describes the image about to be replaced.
    const removed = table.remove([era.first, IMAGE_HEAD]);
    await flushedWrite(root, removed, 'the head of an idempotency era opened again');
    era.storedLastRun = null;
  }
  const image = Buffer.from(memory.buffer, memory.byteOffset, era.imageBytes);
  const checks: number[] = [];
  for (let at = 0; at < image.byteLength; at += IMAGE_CHECK_BYTES) {
    checks.push(crc32(image.subarray(at, at + IMAGE_CHECK_BYTES)));
    await pause();
  }
  await flushedWrite(root, table.put([era.first, IMAGE], image), 'an idempotency era image');
  const runs = era.carved.map(([filter, seq, offset]) => [seq, offset, filter.byteLength]);
  const layout = [era.imageBytes, era.filter.byteLength, runs, checks];
  const { first, lastRun, capacity } = era;
  const head = table.put([first, IMAGE_HEAD], encodeRecord([first, lastRun, capacity, layout]));
  await flushedWrite(root, head, 'an idempotency era');
  era.stored = true;
  const mapped = table.getBinaryFast([first, IMAGE]);
  if (!onTheMap(mapped, era.imageBytes)) return null;
  era.filter.moveTo(mapped.buffer, mapped.byteOffset + IMAGE_LEAD);
  for (const [filter, , offset] of era.carved)
    filter.moveTo(mapped.buffer, mapped.byteOffset + offset);
  era.memory = null;
  era.mappedBytes = era.imageBytes;
  era.carved.length = 0;
  for (let at = 0; at < memory.byteLength; at += IMAGE_CHECK_BYTES) {
    memory.fill(0, at, at + IMAGE_CHECK_BYTES);
    await pause();
  }
  return memory;
}

/** Keys of an era's image and of its head (an earlier release's heads are at 0). */
const IMAGE = -2;
const IMAGE_HEAD = -1;

/** The stored eras, oldest first, and the first run seqs of entries left without a head. */
export function loadEras(table: BinaryDb): { eras: Era[]; orphans: number[] } {
  const indices = new Map<number, number[]>();
  for (const [first, index] of table.getKeys({}) as Iterable<[number, number]>) {
    const known = indices.get(first);
    if (known === undefined) indices.set(first, [index]);
    else known.push(index);
  }
  const eras: Era[] = [];
  const orphans: number[] = [];
  for (const [first, found] of indices) {
    if (found.includes(IMAGE_HEAD)) eras.push(loadImage(table, first));
    else if (found.includes(0)) eras.push(loadChunks(table, first, found));
    else orphans.push(first);
  }
  return { eras, orphans };
}

function corruptEra(first: number): Error {
  return new Error(`idempotency era ${first} is corrupt; refusing to go on`);
}

/** The framed value at [first, index], decoded, or a thrown corrupt era. */
function readFramed(table: BinaryDb, first: number, index: number): unknown {
  const bytes = table.getBinary([first, index]);
  const decoded = bytes === undefined ? null : decodeRecord(bytes);
  if (decoded === null || !decoded.ok) throw corruptEra(first);
  return decoded.value;
}

/** An era an earlier release stored in chunks: its filter read into memory. */
function loadChunks(table: BinaryDb, first: number, found: readonly number[]): Era {
  const v = readFramed(table, first, 0);
  if (!Array.isArray(v) || v.length !== 4 || v[0] !== first || !v.every(Number.isInteger))
    throw corruptEra(first);
  const [, lastRun, capacity, chunks] = v as [number, number, number, number];
  const parts: Uint8Array[] = [];
  for (let i = 1; i <= chunks; i++) {
    if (!found.includes(i))
      throw new Error(`idempotency era ${first} is missing chunks; refusing to go on`);
    const part = readFramed(table, first, i);
    if (!(part instanceof Uint8Array)) throw corruptEra(first);
    parts.push(part);
  }
  return loadedEra(first, lastRun, capacity, KeyFilter.fromChunks(parts));
}

/**
 * An era read back at a start: closed and stored, its filter `filter`, its memory (where its
 * filters are copies, not the map's) and its runs' filters as its image gave them.
 */
function loadedEra(
  first: number,
  lastRun: number,
  capacity: number,
  filter: KeyFilter,
  image: { memory: Uint8Array | null; bytes: number; mapped: boolean } | null = null,
  runFilters = new Map<number, KeyFilter>(),
): Era {
  const imageBytes = image?.bytes ?? 0;
  return {
    first,
    lastRun,
    capacity,
    reserved: capacity,
    groups: 0,
    filter,
    stored: true,
    memory: image?.memory ?? null,
    imageBytes,
    carveAt: imageBytes,
    carved: [],
    mappedBytes: image?.mapped === true ? imageBytes : 0,
    runFilters,
    // Closed: it takes no more groups, however many it was opened for.
    maxGroups: ERA_GROUPS_MAX,
    untouched: false,
    storedLastRun: null,
  };
}

/** An era stored as an image: its filters read from the memory map (or a copy of it). */
function loadImage(table: BinaryDb, first: number): Era {
  const corrupt = (): Error => corruptEra(first);
  const head = readFramed(table, first, IMAGE_HEAD);
  if (!Array.isArray(head) || head.length !== 4 || head[0] !== first) throw corrupt();
  const [, lastRun, capacity, layout] = head as [number, unknown, unknown, unknown];
  if (!Number.isInteger(lastRun) || !Number.isInteger(capacity)) throw corrupt();
  if (!Array.isArray(layout) || layout.length !== 4) throw corrupt();
  const [imageBytes, filterBytes, runs, checks] = layout as [unknown, unknown, unknown, unknown];
  if (
    typeof imageBytes !== 'number' ||
    typeof filterBytes !== 'number' ||
    !Array.isArray(runs) ||
    !Array.isArray(checks)
  )
    throw corrupt();
  // lmdb-js's read buffer is reused and longer than the value: its `length` is the value's.
  const fast = table.getBinaryFast([first, IMAGE]);
  if (fast === undefined || fast.length !== imageBytes) throw corrupt();
  const read = fast.subarray(0, imageBytes);
  for (let i = 0, at = 0; at < imageBytes; i++, at += IMAGE_CHECK_BYTES)
    if (crc32(read.subarray(at, at + IMAGE_CHECK_BYTES)) !== checks[i]) throw corrupt();
  // Where lmdb-js copied the image into its read buffer, it is copied again, to keep.
  const mapped = onTheMap(fast, imageBytes);
  const image = mapped ? read : new Uint8Array(read);
  const at = (offset: number): number => image.byteOffset + offset;
  const blocks = (bytes: number): boolean => bytes > 0 && bytes % 64 === 0;
  if (!blocks(filterBytes) || IMAGE_LEAD + filterBytes > imageBytes) throw corrupt();
  const runFilters = new Map<number, KeyFilter>();
  for (const run of runs as unknown[]) {
    if (!Array.isArray(run) || !run.every((n) => Number.isInteger(n))) throw corrupt();
    const [seq, offset, bytes] = run as [number, number, number];
    const inImage = offset >= IMAGE_LEAD + filterBytes && offset + bytes <= imageBytes;
    if (!inImage || offset % 4 !== 0 || !blocks(bytes)) throw corrupt();
    runFilters.set(seq, KeyFilter.over(image.buffer, at(offset), bytes));
  }
  const filter = KeyFilter.over(image.buffer, at(IMAGE_LEAD), filterBytes);
  const kept = { memory: mapped ? null : image, bytes: imageBytes, mapped };
  return loadedEra(first, lastRun as number, capacity as number, filter, kept, runFilters);
}

/**
 * Issues the removal of every entry stored for the era that starts at `first` (a stored
 * era's, or what a crash left without a head), in the caller's transaction: the last
 * removal's promise, or null where the table holds none.
 */
export function removeEra(table: BinaryDb, first: number): Promise<unknown> | null {
  let last: Promise<unknown> | null = null;
  for (const key of table.getKeys({ start: [first], end: [first + 1] })) last = table.remove(key);
  return last;
}
