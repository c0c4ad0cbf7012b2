/**
 * The limits of the core and the shards, each with the reason it has the value it has.
 *
 * It lives in the leaf (no imports) because the HTTP edge, the pure actor core, the
 * shard shell and storage all enforce or use these numbers: the edge answers a clear
 * 4xx/503 when one is hit, and the core asserts the same bounds again. Limits of the
 * HTTP edge alone live in src/http/limits.ts.
 */

/** customerId, entitlement/product keys and idempotency keys: 1–255 characters. */
export const ID_LENGTH_MAX = 255;

/** Logical shards: customers hash onto these; workers own whole logical shards. */
export const LOGICAL_SHARDS = 256;

/**
 * Commands queued or in flight per worker before the edge answers 503; the bound must be
 * at least 10,000. At ~100k commands/s that is 0.1–0.2 s of work, enough to ride out an
 * fsync hiccup without letting memory grow without bound.
 */
export const WORKER_QUEUE_MAX = 16_384;

/**
 * Front-end threads at most (TALLY_FRONTENDS). A command's request id says which front end
 * sent it: its remainder modulo this number, so a worker replies on the right channel without
 * keeping anything per command.
 */
export const FRONT_ENDS_MAX = 16;

/** Commands handed to a worker in one message; bounds one postMessage and one decide loop. */
export const BATCH_COMMANDS_MAX = 1024;

/** Idempotency keys are kept at least this long: 24 h. */
export const IDEMPOTENCY_RETENTION_MS = 24 * 60 * 60 * 1000;

/**
 * Idempotency keys a shard worker holds in memory before it seals them into a run on
 * disk (storage/idempotency-runs.ts): a run is sealed once this many are waiting, or
 * IDEMPOTENCY_SEAL_INTERVAL_MS after the last one. A key in memory is a 64-byte row and
 * 8–16 bytes of table off the heap (storage/held-keys.ts), and a shard holds two batches
 * while one seals: 131,072 keys is ~20 MB per worker, a few seconds of keyed writes at
 * full speed. Larger runs did not raise keyed throughput (each seal is a larger burst of
 * work), so the default stays small. TALLY_IDEMPOTENCY_RUN_KEYS overrides.
 */
export const IDEMPOTENCY_RUN_KEYS = 131_072;

/**
 * Groups of 16 runs a new era of idempotency filters holds at least
 * (storage/idempotency-eras.ts), and at most. A new key's lookup probes one filter per era
 * retained, each a cache and TLB miss; an era of 16 groups holds up to 2^25 keys (16
 * groups of 16 runs of 131,072), and its buffer in memory, 3 bytes per key of its
 * capacity, takes up to 96 MiB. By default a shard sizes each new era by its keys' rate,
 * for about IDEMPOTENCY_ERAS_PER_DAY eras a day within those bounds;
 * TALLY_IDEMPOTENCY_ERA_GROUPS fixes the number instead.
 */
export const IDEMPOTENCY_ERA_GROUPS = 16;
export const IDEMPOTENCY_ERA_GROUPS_MAX = 64;

/**
 * The eras a day of keys should fill where eras are sized by the rate: a new key's lookup
 * at a day's end probes about this many era filters (~0.25 µs each at a day's scale), where
 * eras of 16 groups would make it ~90 at 35,000 keys a second. Eras grow past 16 groups from
 * ~9,300 keys a second on, and reach 64 at ~37,000.
 */
export const IDEMPOTENCY_ERAS_PER_DAY = 24;

/** The longest keys wait in memory before they are sealed into a run (if fewer arrive). */
export const IDEMPOTENCY_SEAL_INTERVAL_MS = 30_000;

/**
 * Payment-processor event ids a customer remembers as applied. Applying an older one
 * again is harmless (a subscription is reconciled to the processor's current object, a
 * purchase is recorded once by its id), so the bound only saves repeated work.
 */
export const PROCESSOR_EVENTS_PER_CUSTOMER_MAX = 1000;
/** Subscriptions and purchases a customer may hold; past this a new one is refused. */
export const COMMERCE_RECORDS_PER_CUSTOMER_MAX = 10_000;
/**
 * Refunds a customer may hold. Each refund returns money that is left, so a purchase takes
 * at most two (prorated, then full) and a subscription one (it is canceled): three per
 * record is never reached by honest use, and bounds the state if it were.
 */
export const REFUNDS_PER_CUSTOMER_MAX = 3 * COMMERCE_RECORDS_PER_CUSTOMER_MAX;
/**
 * Billed overage periods a customer remembers. A period's invoice is drafted once, at its
 * end; remembering the last few is enough to apply a redelivered `invoice.created` once
 * (the processor's invoice lines are checked as well).
 */
export const OVERAGE_BILLS_PER_CUSTOMER_MAX = 64;

/** Purchased-credit lots per meter per customer; a grant beyond it is refused. */
export const LOTS_PER_METER_MAX = 10_000;

/** Largest `purchased` limit expansion: a whole number that stays exact in a double. */
export const PURCHASED_MAX = 1_000_000_000;

/** Journal batches between automatic snapshots of a shard (bounds replay time). */
export const SNAPSHOT_EVERY_BATCHES = 50_000;

/**
 * Work a shard does per slice of a snapshot copy (its own or an online one) before
 * batches get a turn, in units of one customer, meter, lot, lot draw, limit, commerce
 * record or idempotency key (actors/shard-export.ts, copyWork), so that no snapshot holds
 * a shard's requests up for more than a few milliseconds at a time, however large its
 * customers (TALLY_SNAPSHOT_SLICE overrides). Under a keyed soak on two shared cores,
 * slices of 1,000 units took 1.6–5.5 ms (copy and encoding, no GC pause among them); half
 * that keeps them at about 1–3 ms, for twice as many turns per snapshot.
 */
export const SNAPSHOT_SLICE_WORK = 500;

/**
 * The clock's bound on a slice's copying (ms; the copied customers' encoding follows it):
 * a slice ends at SNAPSHOT_SLICE_WORK units or this long, whichever comes first. Warm, 500
 * units take about a millisecond, copy and encoding together, so the units end a slice;
 * the first snapshot after a start runs code V8 has not optimized yet, where 500 units
 * held the thread 6.8 ms in a keyed soak, and the clock ends it instead.
 */
export const SNAPSHOT_SLICE_MS = 1.5;

/**
 * V8 young generation of a shard worker: V8 makes it three semi-spaces' worth, so this
 * means 16 MB semi-spaces. A scavenge copies whatever survives its semi-space: in a keyed
 * soak whose waiting idempotency keys were heap objects (they are in typed arrays since:
 * storage/held-keys.ts), 64 MB semi-spaces held a 20–50 ms pause in most 15-second
 * windows (up to 54 ms in three minutes); 16 MB ones kept 100 of 120 windows of a
 * 30-minute soak under 20 ms, at the same throughput. The larger size made recovery from
 * a snapshot ~10% faster (every object a snapshot loads survives) for ~16% more peak
 * memory; pauses under load weigh more.
 */
export const SHARD_YOUNG_GENERATION_MB = 48;

/**
 * V8 old generation limit of a shard worker: 10 GiB, where Node's default is ~4 GiB on a
 * machine of 16 GiB or more. It is a cap, not a target: V8 collects as often either way
 * while the heap is far below it. What it is set for is what V8 does with half of it. A
 * closed idempotency era's image is read from LMDB's memory map
 * (storage/idempotency-eras.ts), and the first read in a part of the map the thread has
 * no view of makes one, of up to 4 GiB (the map, or a 4 GiB window of a larger one). V8
 * counts the view as memory outside the heap until lmdb-js takes it back a moment later,
 * and where that memory grew by more than half this limit since the last full
 * collection, V8 collects all garbage, compacting, before the read returns. Measured with
 * a 3 GiB view and a 44 MiB heap: a 37–49 ms collection inside the read with the default
 * limit; with this one the read took 5 ms and started an incremental collection. Half of
 * 10 GiB covers a 4 GiB view and 1 GiB of other memory outside the heap.
 */
export const SHARD_OLD_GENERATION_MB = 10_240;

/**
 * Also snapshot a shard once this many events were journaled since its last snapshot:
 * replay time is per event, not per record (group commit packs 1–1,000 events into a
 * record). Replay runs at ~2.5–3 µs an event for a million customers here, so this bounds
 * replay to ~3 s, and recovery of 1M customers (snapshot + this tail) measured 7.3–7.6 s
 * (`npm run bench:recovery`). A sliced snapshot of 1M customers costs ~3–4 s of one
 * core's time, i.e. a few percent of a shard consuming 20k events/s.
 */
export const SNAPSHOT_EVERY_EVENTS = 1_000_000;

/** Also snapshot a shard that has journaled anything at least this often. */
export const SNAPSHOT_INTERVAL_MS = 10 * 60 * 1000;

/** Customer metadata: at most 50 keys of at most 40 characters, values ≤ 500. */
export const METADATA_KEYS_MAX = 50;
export const METADATA_KEY_LENGTH_MAX = 40;
export const METADATA_VALUE_LENGTH_MAX = 500;
