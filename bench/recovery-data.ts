/**
 * Builds the data directory the recovery benchmark starts Tally on: many customers, a
 * long journal, and (optionally) a snapshot, all written by Tally's own code.
 *
 * Nothing is faked that recovery reads. The control store (keys, the worker count, the
 * pushed billing configuration) is written by the real server: it is started once on the
 * empty directory, given the configuration over HTTP and stopped. The shard data is
 * written by the real `Shard` (actors/shard.ts) driven with consume commands, so every
 * journaled event is one the core decided and every customer-index row is one the shard
 * produced; `ShardStore` (storage/journal.ts) frames and stores them, and snapshots are
 * taken with `Shard.snapshotItems` + `ShardStore.writeSnapshot` (a shard worker copies in
 * slices between batches instead; what is stored is the same). Each record holds
 * `eventsPerRecord` events, the size group commit gives a busy shard.
 *
 * The one liberty: the journal adapter tells the shard a record is durable as soon as it
 * is handed to LMDB, and the builder waits for the real fsyncs every few hundred records,
 * so that building ten million events costs hundreds of fsyncs rather than tens of
 * thousands. Only build speed depends on it; what ends up on disk is the same.
 *
 * The workload is a pure function of (customers, events). Events come in rounds of one
 * event per customer; in round `r` event `k` consumes from meter `r mod 3` of customer
 * `(j * stride_r + r) mod customers` (`j = k mod customers`; `stride_r` a prime, so each
 * round reaches every customer once, each round in another order), an amount of
 * `1 + k mod 997` thousandths. So every customer's events are spread through the whole
 * journal, consecutive events hit unrelated customers (no cache-friendly order, as with
 * many independent clients), every customer has all three meters once there are at least
 * three rounds, and a test can compute any customer's expected usage without trusting
 * Tally (`expectedConsumedMicros`).
 */
import { rm } from 'node:fs/promises';
import path from 'node:path';
import type { BillingConfig } from '../actors/billing-config.js';
import type { Event, WriteCommand } from '../actors/customer.js';
import { LOGICAL_SHARDS } from '../shared/limits.js';
import type { Envelope } from '../actors/protocol.js';
import { logicalShardOf, workerOf } from '../shared/shard-hash.js';
import { Shard, type CustomerIndexEntry } from '../actors/shard.js';
import { ShardStore } from '../storage/journal.js';
import { stopChild } from './children.js';
import { startTally, type TallyServer } from './tally-server.js';

/** Three meters (three reset kinds), a feature and a limit; the meters are what customers use. */
export const RECOVERY_CONFIG = {
  entitlements: {
    sso: { type: 'feature' },
    seats: { type: 'limit' },
    api_calls: { type: 'meter', reset: 'month' },
    tokens: { type: 'meter', reset: 'year' },
    storage_gb: { type: 'meter', reset: 'never' },
  },
  products: {
    free: {
      name: 'Free',
      default: true,
      entitlements: {
        sso: true,
        seats: { included: 5 },
        // Far above what any run consumes, so every consume is accepted and journaled.
        api_calls: { included: 1_000_000_000 },
        tokens: { included: 1_000_000_000 },
        storage_gb: { included: 1_000_000_000 },
      },
    },
  },
} as const satisfies BillingConfig;

export const RECOVERY_METERS = ['api_calls', 'tokens', 'storage_gb'] as const;

export interface Workload {
  readonly customers: number;
  readonly events: number;
}

export function customerIdOf(index: number): string {
  return `cust-${index}`;
}

/**
 * Multipliers that scatter a round's events over customers, one per round in turn: the
 * 1,000th, 10,000th, ... 10,000,000th primes, so each is coprime to any customer count
 * that is not a multiple of it (which `eventOf` refuses). `(k mod customers) × stride`
 * stays an exact integer (below 2^53) for up to CUSTOMERS_MAX customers.
 */
const STRIDES = [7_919, 104_729, 1_299_709, 15_485_863, 179_424_673] as const;
export const CUSTOMERS_MAX = 50_000_000;

/** Event `k` of the workload: whom it charges, which meter, how many micro-units. */
export function eventOf(
  k: number,
  customers: number,
): { customer: number; meter: number; amountMicros: bigint } {
  const round = Math.floor(k / customers);
  const stride = STRIDES[round % STRIDES.length] ?? 1;
  if (customers % stride === 0 || customers > CUSTOMERS_MAX)
    throw new Error(
      `customer count must be at most ${CUSTOMERS_MAX} and not a multiple of ${stride}`,
    );
  return {
    customer: ((k % customers) * stride + round) % customers,
    meter: round % RECOVERY_METERS.length,
    amountMicros: BigInt(1 + (k % 997)) * 1000n,
  };
}

/**
 * What each of `customers` has consumed of each meter after the whole workload, computed
 * from the schedule alone (never from Tally). One pass over the events.
 */
export function expectedConsumedMicros(
  workload: Workload,
  customers: readonly number[],
): Map<number, bigint[]> {
  const sums = new Map(customers.map((c) => [c, RECOVERY_METERS.map(() => 0n)]));
  for (let k = 0; k < workload.events; k++) {
    const event = eventOf(k, workload.customers);
    const customer = sums.get(event.customer);
    if (customer !== undefined)
      customer[event.meter] = (customer[event.meter] ?? 0n) + event.amountMicros;
  }
  return sums;
}

export interface BuildOptions extends Workload {
  readonly dataDir: string;
  /** TALLY_WORKERS the data dir is created with (it decides which shard holds whom). */
  readonly workers: number;
  readonly eventsPerRecord: number;
  /**
   * Events journaled after the last snapshot; null: no snapshot at all, every event is in
   * the journal (the worst case recovery can meet).
   */
  readonly tailEvents: number | null;
  /** Compiled server (`dist/src/main.js`), started once to create the control store. */
  readonly mainScript: string;
  readonly log?: (line: string) => void;
}

export interface BuiltDataDir {
  readonly dataDir: string;
  /** The test environment's server key (bootstrap-keys.json of this data dir). */
  readonly serverKey: string;
  readonly records: number;
  /** Highest journal seq each shard covers, and its snapshot's seq (0: none). */
  readonly shards: ReadonlyArray<{ readonly lastSeq: number; readonly snapshotSeq: number }>;
  readonly buildMs: number;
  /** Longest time taking the snapshot held a shard's thread (null: no snapshot). */
  readonly snapshotBlockedMs: number | null;
}

/** Records handed to LMDB before the builder waits for them to be durable. */
const RECORDS_PER_FLUSH = 512;

/** One shard worker's half of the builder: the real Shard over the real ShardStore. */
class ShardBuilder {
  readonly store: ShardStore;
  readonly shard: Shard;
  #durable: Promise<void>[] = [];
  records = 0;

  constructor(dataDir: string, workerIndex: number, version: number) {
    this.store = ShardStore.open(path.join(dataDir, `shard-${workerIndex}`));
    this.shard = new Shard({
      journal: { append: (events, index) => this.#append(events, index) },
      clock: Date.now,
      reply: () => undefined,
      flush: () => undefined,
      fatal: (error) => {
        throw error;
      },
    });
    this.shard.setConfig('test', version, RECOVERY_CONFIG);
  }

  /** As shard-worker.ts appends (same index rows); durable is awaited in `flush` instead. */
  #append(
    events: readonly Event[],
    index: readonly CustomerIndexEntry[],
  ): { seq: number; durable: Promise<void> } {
    const rows = index.map((entry) => ({
      environment: entry.environment,
      id: entry.id,
      json: Buffer.from(JSON.stringify(entry.view)),
    }));
    const appended = this.store.append(events, rows);
    this.#durable.push(appended.durable);
    this.records++;
    return { seq: appended.seq, durable: Promise.resolve() };
  }

  get unflushed(): number {
    return this.#durable.length;
  }

  async flush(): Promise<void> {
    const durable = this.#durable;
    this.#durable = [];
    await Promise.all(durable);
  }

  /**
   * What shard-worker.ts's maybeSnapshot stores, taken in one go rather than in slices.
   * Returns how long it held the thread (collecting and encoding every customer), what a
   * one-go snapshot would cost a shard worker.
   */
  async snapshot(): Promise<number> {
    await this.flush();
    if (this.shard.hasPendingEvents) throw new Error('snapshot with events pending');
    const startedMs = performance.now();
    const written = this.store.writeSnapshot(this.store.lastSeq, this.shard.snapshotItems());
    const blockedMs = performance.now() - startedMs;
    await written;
    return blockedMs;
  }
}

function consume(k: number, customers: number): WriteCommand {
  const event = eventOf(k, customers);
  return {
    op: 'consume',
    environment: 'test',
    customerId: customerIdOf(event.customer),
    key: RECOVERY_METERS[event.meter] ?? 'api_calls',
    amountMicros: event.amountMicros,
  };
}

/** Starts the real server once on the empty dir: keys, worker count, pushed configuration. */
async function createControlStore(
  options: BuildOptions,
): Promise<{ server: TallyServer; version: number }> {
  const server = await startTally(
    options.mainScript,
    'tally-setup',
    options.dataDir,
    { TALLY_WORKERS: String(options.workers) },
    RECOVERY_CONFIG,
  );
  await stopChild(server.child.process);
  if (server.child.process.exitCode !== 0)
    throw new Error(
      `setup server exited with ${server.child.process.exitCode}\n${server.child.outputTail()}`,
    );
  return { server, version: 1 };
}

/**
 * Creates `options.dataDir` (which must not exist or be empty) holding the workload.
 * Throws if the setup server fails or any write fails; the caller removes the directory.
 */
export async function buildDataDir(options: BuildOptions): Promise<BuiltDataDir> {
  const startedMs = Date.now();
  const log = options.log ?? (() => undefined);
  const { server, version } = await createControlStore(options);
  const builders = Array.from(
    { length: options.workers },
    (_, i) => new ShardBuilder(options.dataDir, i, version),
  );
  const pending: Envelope[][] = builders.map(() => []);
  const snapshotAt =
    options.tailEvents === null ? -1 : Math.max(0, options.events - options.tailEvents);
  const handOver = async (worker: number): Promise<void> => {
    const builder = builders[worker];
    const batch = pending[worker];
    if (builder === undefined || batch === undefined || batch.length === 0) return;
    pending[worker] = [];
    builder.shard.handleBatch(batch);
    // Let the shard see its (already "durable") append complete, so the next batch is
    // its own record rather than joining this one.
    await Promise.resolve();
    if (builder.unflushed >= RECORDS_PER_FLUSH) await builder.flush();
  };
  const progressEvery = Math.max(1, Math.floor(options.events / 10));
  let snapshotBlockedMs: number | null = null;
  const snapshot = async (): Promise<void> => {
    for (let w = 0; w < builders.length; w++) await handOver(w);
    const blocked: number[] = [];
    // one at a time, as separate threads would
    for (const builder of builders) blocked.push(await builder.snapshot());
    snapshotBlockedMs = Math.max(...blocked);
    log(`snapshot written; it held a shard's thread for up to ${snapshotBlockedMs.toFixed(0)} ms`);
  };
  for (let k = 0; k < options.events; k++) {
    if (k === snapshotAt) await snapshot();
    const command = consume(k, options.customers);
    const worker = workerOf(
      logicalShardOf(command.environment, command.customerId, LOGICAL_SHARDS),
      options.workers,
    );
    const batch = pending[worker];
    if (batch === undefined) throw new Error(`no builder for worker ${worker}`);
    batch.push({ id: k, command });
    if (batch.length >= options.eventsPerRecord) await handOver(worker);
    if ((k + 1) % progressEvery === 0)
      log(`${k + 1} events journaled (${Math.round((Date.now() - startedMs) / 1000)} s)`);
  }
  for (let w = 0; w < builders.length; w++) await handOver(w);
  if (snapshotAt === options.events) await snapshot();
  await Promise.all(builders.map((b) => b.flush()));
  const shards = builders.map((b) => ({
    lastSeq: b.store.lastSeq,
    snapshotSeq: b.store.stats().snapshotSeq,
  }));
  for (const builder of builders) {
    const stored = builder.shard.customerCount;
    if (stored > options.customers)
      throw new Error(`shard holds ${stored} customers of ${options.customers}`);
  }
  await Promise.all(builders.map((b) => b.store.close()));
  return {
    dataDir: options.dataDir,
    serverKey: server.keys.server,
    records: builders.reduce((sum, b) => sum + b.records, 0),
    shards,
    buildMs: Date.now() - startedMs,
    snapshotBlockedMs,
  };
}

export async function removeDataDir(dataDir: string): Promise<void> {
  await rm(dataDir, { recursive: true, force: true });
}
