/**
 * The fault simulator: the real `Shard` (actors/shard.ts) over the real shard store
 * (storage/journal.ts: append, replay with torn-tail handling, snapshots) over a
 * simulated LMDB environment (sim-lmdb.ts) whose commits and syncs a seeded random
 * schedule drives: syncs complete out of order, are slow (many steps pass), fail; commits
 * fail; the process is killed (page cache kept) or the machine loses power (unsynced
 * transactions lost or kept, the last record possibly torn) at any step, including during
 * recovery; snapshots are copied in slices while appends are in flight, as the worker
 * does. Recovery ends as the worker's does, with the recovery barrier: the shard serves
 * only once `ShardStore.syncRecovered` is durable, and the schedule may crash or fail it
 * meanwhile. The reference model (reference-model.ts) predicts every reply.
 *
 * Invariants, checked as they happen:
 * - every reply equals the model's, and each request gets exactly one;
 * - a write's reply leaves only when every journal record it may depend on is durable:
 *   the record its batch's events went into (or, for a batch held back behind the
 *   appends in flight, the record that carries it when it goes out), and every earlier
 *   record, including those recovery found only in the page cache after a kill -9; a
 *   write whose record was not even appended yet has no reply;
 * - write replies leave in append order (a sync completing early releases nothing ahead
 *   of an older record's replies);
 * - a journal append's `durable` promise resolves only once its record is durable;
 * - after every recovery, each acknowledged write is in the recovered state, and that
 *   state answers every read exactly as the model does after the writes up to the
 *   recovered record, i.e. acknowledged writes plus some of those in flight, nothing else;
 * - in the end, with every sync done, every write in flight is answered.
 *
 * Plain code, no test framework: `simulate` throws a `SimulationFailure` carrying the
 * seed, so vitest (test/durability-simulation.test.ts) and the long random run
 * (test/sim-main.ts, `npm run sim`) report alike. Async failures (a check inside a
 * promise callback, an unhandled rejection) are collected and reported the same way.
 */
import { renderReply } from '../../src/api/shard-reply.js';
import { isDeepStrictEqual } from 'node:util';
import type { BillingConfig } from '../../actors/billing-config.js';
import type { Command, CustomerSnapshot, Environment, Event } from '../../actors/customer.js';
import type { Envelope, PendingAudit } from '../../actors/protocol.js';
import { isRead, Shard, type CustomerIndexEntry } from '../../actors/shard.js';
import { keysOfEvents } from '../../actors/idempotency-keys.js';
import { ShardCopy } from '../../actors/shard-export.js';
import { encodeSnapshotChunk, indexRowOf, ShardStore, UNTYPED } from '../../storage/journal.js';
import { CONFIG, T0 } from './core-fixtures.js';
import { observingReads, parseReply, ReferenceModel, type Reply } from './reference-model.js';
import { SimDisk, type Txn, type WriteOp } from './sim-lmdb.js';
import type { Notice } from '../../actors/webhook-events.js';
import { OutboxMarker, OutboxMarks, readOutbox, type OutboxEvent } from '../../storage/outbox.js';

/** The seq of the first append whose rows reach `row` (appends in issue order), if any. */
function writerOf(
  issued: ReadonlyArray<{ readonly seq: number; readonly newestRow: number }>,
  row: number,
): number | undefined {
  let low = 0;
  let high = issued.length;
  while (low < high) {
    const middle = (low + high) >>> 1;
    if ((issued[middle] as { newestRow: number }).newestRow >= row) high = middle;
    else low = middle + 1;
  }
  return issued[low]?.seq;
}

/** Durable outbox marks that show every raise to `check` first. */
class CheckedMarks extends OutboxMarks {
  constructor(
    shared: SharedArrayBuffer,
    private readonly check: (row: number) => void,
  ) {
    super(shared);
  }

  override raise(index: number, seq: number): void {
    this.check(seq);
    super.raise(index, seq);
  }
}

export class SimulationFailure extends Error {
  constructor(
    readonly seed: number,
    message: string,
  ) {
    super(`simulation seed ${seed} failed (replay with SIM_SEED=${seed}): ${message}`);
  }
}

/** Counts of what a run exercised, so a test can tell a run that did little. */
export interface SimStats {
  steps: number;
  replies: number;
  writesAcked: number;
  appends: number;
  syncsOutOfOrder: number;
  syncFailures: number;
  commitFailures: number;
  processCrashes: number;
  machineCrashes: number;
  crashesDuringRecovery: number;
  tornTails: number;
  snapshots: number;
  /** Runs of idempotency keys sealed (storage/idempotency-runs.ts), and seals begun. */
  sealedRuns: number;
  /** Idempotency lookups answered from a sealed run rather than from memory. */
  keysFoundInRuns: number;
  sealsBegun: number;
  heldBackBatches: number;
  /** Recoveries whose barrier completed, so the shard went on to serve. */
  recoveryBarriers: number;
  /** Crashes while a recovered shard waited for its barrier (not serving yet). */
  crashesAwaitingBarrier: number;
  /** Webhook events written to the outbox, and times the durable outbox mark rose. */
  outboxEvents: number;
  outboxMarksRaised: number;
  /** Webhook events recovery removed with the records it dropped. */
  outboxEventsForgotten: number;
  /** Recoveries that checked the customer index against the recovered customers. */
  indexRepairs: number;
}

export interface SimOptions {
  /**
   * Negative control only: recover as a worker that skips the recovery barrier
   * (ShardStore.syncRecovered) and serves at once. The invariants must catch it.
   */
  readonly skipRecoveryBarrier?: boolean;
  /**
   * Negative control only, with skipRecoveryBarrier: also raise the durable outbox mark
   * without the barrier, so webhook events may leave before their records are on disk.
   */
  readonly markOutboxWithoutBarrier?: boolean;
}

/** mulberry32: small and deterministic. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const ENVIRONMENTS = ['test', 'live'] as const;
const CUSTOMERS = ['a', 'b', 'c', 'd'];
const METERS = ['api_calls', 'tokens', 'storage', 'exports'];
const CONFIG_B: BillingConfig = {
  entitlements: CONFIG.entitlements,
  products: {
    basic: {
      default: true,
      entitlements: {
        seats: { included: 2 },
        api_calls: { included: 20, overage: { unitAmount: 1 } },
        exports: { included: 5 },
      },
    },
  },
};

class Crash extends Error {}

function commandFor(rand: () => number, n: number): Command {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)] as T;
  const who = {
    environment: rand() < 0.8 ? ('test' as const) : ('live' as const),
    customerId: pick(CUSTOMERS),
  };
  const key = rand() < 0.95 ? pick(METERS) : pick(['seats', 'sso', 'nope']);
  const amountMicros = BigInt(1 + Math.floor(rand() * (rand() < 0.5 ? 5_000_000 : 60_000_000)));
  const idem = rand() < 0.4 ? { idempotencyKey: `k${Math.floor(rand() * 12)}` } : {};
  const r = rand();
  if (r < 0.34) return { op: 'consume', ...who, key, amountMicros, ...idem };
  if (r < 0.46) return { op: 'refund', ...who, key, amountMicros, ...idem };
  if (r < 0.5) return { op: 'usageSettings', ...who, key, overageEnabled: rand() < 0.6 };
  if (r < 0.56) return { op: 'grantLot', ...who, key, lotId: `lot${n % 5}`, amountMicros };
  if (r < 0.6)
    return {
      op: 'limitSettings',
      ...who,
      key: 'seats',
      ...(rand() < 0.7 ? { purchased: Math.floor(rand() * 4) } : {}),
      ...(rand() < 0.5 ? { autoExpansionEnabled: rand() < 0.5 } : {}),
    };
  if (r < 0.62)
    return {
      op: 'putContract',
      ...who,
      key: '',
      contract: {
        priceAmount: 100,
        priceInterval: 'month',
        entitlements: { [pick(METERS)]: { included: Math.floor(rand() * 50) } },
      },
    };
  if (r < 0.63) return { op: 'deleteContract', ...who, key: '' };
  if (r < 0.67)
    return {
      op: 'upsertCustomer',
      ...who,
      key: '',
      patch:
        rand() < 0.5
          ? { name: pick(['A', 'B']) }
          : { metadata: { tier: rand() < 0.3 ? null : pick(['x', 'y']) } },
    };
  if (r < 0.75)
    return {
      op: 'context',
      ...who,
      key: '',
      patch: rand() < 0.7 ? {} : { email: pick(['a@x.io', 'b@x.io']) },
      request: {
        features: ['sso'],
        usage: [key === 'nope' ? 'api_calls' : pick(METERS)],
        limits: ['seats'],
      },
    };
  return {
    op: pick(['has', 'balance', 'balance', 'limit', 'getContract'] as const),
    ...who,
    key: pick([...METERS, 'seats']),
  };
}

const show = (value: unknown): string =>
  JSON.stringify(value, (_k, v: unknown) => (typeof v === 'bigint' ? `${v}n` : v));

/** Where a write's reply must wait: a known record, or the next one appended after it. */
type Required = { readonly seq: number } | { readonly nextAfter: number };

interface Expectation {
  readonly command: Command;
  readonly expected: Reply;
  /** Acknowledges a write (a context that changed nothing is a read). */
  readonly ackWrite: boolean;
  readonly required: Required | null;
}

/**
 * Runs one seeded simulation of `steps` steps. Resolves with what it exercised; rejects
 * with a SimulationFailure naming the seed.
 */
export async function simulate(
  seed: number,
  steps: number,
  options: SimOptions = {},
): Promise<SimStats> {
  const violations: string[] = [];
  const onUnhandled = (reason: unknown): void => {
    violations.push(
      `unhandled ` +
        `rejection: ${reason instanceof Error ? (reason.stack ?? reason.message) : String(reason)}`,
    );
  };
  process.on('unhandledRejection', onUnhandled);
  try {
    return await run(seed, steps, violations, options);
  } catch (error) {
    if (error instanceof SimulationFailure) throw error;
    throw new SimulationFailure(
      seed,
      error instanceof Error ? (error.stack ?? error.message) : String(error),
    );
  } finally {
    process.off('unhandledRejection', onUnhandled);
  }
}

async function run(
  seed: number,
  steps: number,
  violations: string[],
  options: SimOptions,
): Promise<SimStats> {
  const rand = rng(seed);
  const stats: SimStats = {
    steps: 0,
    replies: 0,
    writesAcked: 0,
    appends: 0,
    syncsOutOfOrder: 0,
    syncFailures: 0,
    commitFailures: 0,
    processCrashes: 0,
    machineCrashes: 0,
    crashesDuringRecovery: 0,
    tornTails: 0,
    snapshots: 0,
    sealedRuns: 0,
    keysFoundInRuns: 0,
    sealsBegun: 0,
    heldBackBatches: 0,
    recoveryBarriers: 0,
    crashesAwaitingBarrier: 0,
    outboxEvents: 0,
    outboxMarksRaised: 0,
    outboxEventsForgotten: 0,
    indexRepairs: 0,
  };
  const log: string[] = [];
  const fail = (message: string): never => {
    throw new SimulationFailure(
      seed,
      `${message}\nlast steps:\n  ${log.slice(-Number(process.env.SIM_LOG ?? 25)).join('\n  ')}`,
    );
  };
  const checkViolations = (): void => {
    if (violations.length > 0) fail(violations.join('\n'));
  };

  const disk = new SimDisk();
  let now = T0;
  let nextId = 1;
  let configVersion = 1;
  const configs: Record<Environment, BillingConfig> = { test: CONFIG, live: CONFIG };
  let model = new ReferenceModel();
  /** The model as of each journal record: exactly the writes decided before its append. */
  const modelAt = new Map<number, ReferenceModel>([[0, model.clone()]]);
  /** Journal record → the write that stores it ('base': on disk since the last power cut). */
  const recordOp = new Map<number, WriteOp | 'base'>();
  /** Each webhook event written: its journal record's seq and that record's write. */
  const eventRecord = new Map<string, { readonly seq: number; op: WriteOp | 'base' }>();
  let nextEventId = 1;
  /** Acknowledged writes: the record each depended on. */
  const acked = new Map<number, { seq: number; command: Command }>();

  /** One incarnation of the process. */
  interface World {
    readonly store: ShardStore;
    readonly shard: Shard;
    /** The shard's durable outbox mark, as the worker raises it. */
    readonly outboxMarker: OutboxMarker;
    dead: boolean;
    /** Recovery's barrier is durable: the shard serves (the worker has reported ready). */
    ready: boolean;
    /** The last record recovery found; the ones up to it came from the disk. */
    recoveredSeq: number;
    /** The newest outbox row recovery found. */
    recoveredRow: number;
    /** The record the latest write reply depended on. */
    lastAckedSeq: number;
    /** Seqs appended by this incarnation, in order. */
    readonly appended: number[];
    readonly expecting: Map<number, Expectation>;
    copy: { readonly copy: ShardCopy; readonly seq: number; readonly chunks: Buffer[] } | null;
    /** Sealing the idempotency keys in memory into a run, as the worker's upkeep does. */
    sealing: boolean;
  }
  let world: World | null = null;

  /** Write replies released while a batch is being decided (see the reply callback). */
  let deciding: Array<[number, Expectation]> | null = null;

  /** The write-ahead rule for one acknowledged write, at the moment its reply leaves. */
  const checkAck = (id: number, expectation: Expectation, required: Required): void => {
    const w = world as World;
    let seq: number;
    if ('seq' in required) seq = required.seq;
    else {
      const next = w.appended.find((s) => s > required.nextAfter);
      if (next === undefined) {
        violations.push(
          `reply to write ${id} ${show(expectation.command)} before its batch's record ` +
            `was even appended (held back behind the appends in flight)`,
        );
        return;
      }
      seq = next;
    }
    // Every record up to it, including those recovery found only in the page cache after
    // a kill -9 (the recovery barrier must have synced them before the shard served).
    for (let s = seq; s >= 1; s--) {
      if (!recordOp.has(s) || recordDurable(s)) continue;
      const recovered =
        s <= w.recoveredSeq ? `, recovered from the page cache and never synced` : '';
      violations.push(
        `reply to write ${id} ${show(expectation.command)} while journal record ${s} ` +
          `(of ${seq} it depends on${recovered}) is not durable`,
      );
      return;
    }
    // The shard releases replies in append order: never one depending on an older
    // record after one depending on a newer.
    if (seq < w.lastAckedSeq)
      violations.push(
        `reply to write ${id} (record ${seq}) after a reply that depended on ` +
          `record ${w.lastAckedSeq}: out of append order`,
      );
    w.lastAckedSeq = seq;
    stats.writesAcked++;
    acked.set(id, { seq, command: expectation.command });
  };

  const recordDurable = (seq: number): boolean => {
    const op = recordOp.get(seq);
    return op !== undefined && disk.isDurable(op);
  };

  const boot = (): World => {
    // Its records carry their keys, read back at start, as the worker's store does.
    const store = ShardStore.overEnv(disk.env(), {
      ...UNTYPED,
      keysOf: (events) => keysOfEvents(events as Event[]),
    });
    // The delivery thread's view of the outbox: it reads only up to the durable mark.
    const issuedRows: Array<{ readonly seq: number; readonly newestRow: number }> = [];
    const marker = new OutboxMarker(
      new CheckedMarks(OutboxMarks.memory(1), (row) => {
        if (self.dead) return;
        stats.outboxMarksRaised++;
        // Every record whose rows the mark now covers, and every record before it, is on
        // disk (rows recovery found are covered by its barrier: the mark rises after it).
        const upTo = row <= self.recoveredRow ? self.recoveredSeq : writerOf(issuedRows, row);
        if (upTo === undefined) {
          violations.push(`outbox mark raised to row ${row}, which no append wrote`);
          return;
        }
        for (let s = upTo; s >= 1; s--)
          if (recordOp.has(s) && !recordDurable(s))
            violations.push(
              `outbox mark raised to row ${row} while journal record ${s} is not durable: ` +
                `a webhook could leave before its change is on disk`,
            );
      }),
      0,
    );
    const appended: number[] = [];
    const expecting = new Map<number, Expectation>();
    const self: World = {
      store,
      shard: null as unknown as Shard,
      outboxMarker: marker,
      dead: false,
      ready: false,
      recoveredSeq: 0,
      recoveredRow: 0,
      lastAckedSeq: 0,
      appended,
      expecting,
      copy: null,
      sealing: false,
    };
    const shard = new Shard({
      journal: {
        append: (
          events: readonly Event[],
          index: readonly CustomerIndexEntry[],
          audits: readonly PendingAudit[],
          keyed: number,
          notices: readonly Notice[],
        ) => {
          const seq = store.lastSeq + 1;
          const outbox = notices.map(
            (notice, k): OutboxEvent => ({
              id: `evt_${nextEventId++}`,
              type: notice.type,
              environment: notice.environment,
              customerId: notice.customerId,
              createdAtMs: notice.atMs,
              data: { seq, k },
            }),
          );
          const result = store.append(
            events,
            index.map((e) => ({
              environment: e.environment,
              id: e.id,
              json: indexRowOf(e.view),
            })),
            audits,
            [],
            outbox,
          );
          // As the worker does: the record carries the keys, kept until they are sealed.
          if (keyed > 0) store.idempotency.carried(result.seq);
          const op = disk.lastJournalPut(result.seq);
          recordOp.set(result.seq, op);
          for (const event of outbox) eventRecord.set(event.id, { seq: result.seq, op });
          stats.outboxEvents += outbox.length;
          issuedRows.push({ seq: result.seq, newestRow: store.outboxSeq });
          marker.issued(result.durable, store.outboxSeq);
          appended.push(result.seq);
          modelAt.set(result.seq, model.clone());
          stats.appends++;
          result.durable.then(
            () => {
              if (!self.dead && !recordDurable(result.seq))
                violations.push(
                  `journal append ${result.seq}: durable resolved before its record was synced`,
                );
            },
            () => undefined,
          );
          return result;
        },
      },
      clock: () => now,
      reply: (id, outcome, reply) => {
        if (self.dead) return; // the process has exited: nothing leaves any more
        const expectation = expecting.get(id);
        if (expectation === undefined) {
          violations.push(
            `reply to request ${id}, which is not awaiting one (a second reply, or never sent)`,
          );
          return;
        }
        expecting.delete(id);
        stats.replies++;
        const rendered = renderReply(outcome, reply);
        const actual = parseReply(rendered.status, rendered.body);
        if (!isDeepStrictEqual(actual, expectation.expected)) {
          violations.push(
            `reply to ${id} ${show(expectation.command)}: got ${show(actual)}, the model ` +
              `says ${show(expectation.expected)}`,
          );
        }
        if (!expectation.ackWrite) return;
        // Decided in the batch being handled right now: which record it waits for is known
        // when handleBatch returns (nothing syncs in between), so the check waits for that.
        if (deciding !== null) deciding.push([id, expectation]);
        else checkAck(id, expectation, expectation.required as Required);
      },
      flush: () => undefined,
      fatal: () => {
        self.dead = true;
      },
      storedKeys: store.idempotency,
    });
    (self as { shard: Shard }).shard = shard;
    for (const environment of ENVIRONMENTS)
      shard.setConfig(environment, configVersion, configs[environment]);
    return self;
  };

  /**
   * Recovery as the worker does it (actors/shard-worker.ts, recover): snapshot, replay,
   * then the recovery barrier, the same store call; the shard serves only once that write
   * is durable. May be cut short by a crash at a random point; the barrier's commit and
   * sync are left to the schedule, which may also crash or fail them meanwhile.
   */
  const recover = (crashAt: number | null): World => {
    const w = boot();
    let point = 0;
    const maybeCrash = (): void => {
      if (crashAt !== null && point++ === crashAt) throw new Crash();
    };
    const snapshot = w.store.readSnapshot((items) => {
      maybeCrash();
      w.shard.loadSnapshot(items as CustomerSnapshot[]);
    });
    const result = w.store.replay(snapshot?.seq ?? 0, (_seq, events) => {
      maybeCrash();
      w.shard.replay(events as Event[]);
    });
    if (result.droppedTail) stats.tornTails++;
    stats.outboxEventsForgotten += result.forgottenEvents;
    maybeCrash();
    // As the worker does: an index that may hold rows of dropped records is checked, and
    // the shard serves only once that is on disk too (a failure stops it).
    let repaired: Promise<unknown> = Promise.resolve();
    if (w.store.indexRepairPending) {
      stats.indexRepairs++;
      repaired = w.store.repairIndex(w.shard.indexEntries());
      repaired.catch(() => undefined);
    }
    maybeCrash();
    w.recoveredSeq = w.store.lastSeq;
    w.recoveredRow = w.store.outboxSeq;
    // No webhook event outlives its record: every row left names a record recovery kept.
    for (const { event } of readOutbox(disk.env().dbs.outbox, 0, Number.MAX_SAFE_INTEGER)) {
      const record = eventRecord.get(event.id);
      if (record === undefined) continue;
      if (record.seq > w.store.lastSeq || recordOp.get(record.seq) !== record.op)
        violations.push(
          `after recovery (journal up to ${w.store.lastSeq}) the outbox still holds event ` +
            `${event.id} of journal record ${record.seq}, which recovery dropped`,
        );
    }
    if (options.skipRecoveryBarrier === true) {
      w.ready = true;
      if (options.markOutboxWithoutBarrier === true) w.outboxMarker.recovered(w.store.outboxSeq);
      return w;
    }
    Promise.all([w.store.syncRecovered(), repaired]).then(
      () => {
        if (w.dead) return;
        w.ready = true;
        w.outboxMarker.recovered(w.store.outboxSeq);
        checkIndex(w);
        stats.recoveryBarriers++;
      },
      () => {
        // The worker crashes on a failed barrier or repair, as on any failed write.
        w.dead = true;
      },
    );
    return w;
  };

  /** Once serving, the customer index holds exactly the shard's customers, as they are. */
  const checkIndex = (w: World): void => {
    const expected = new Map<string, string>();
    for (const entry of w.shard.indexEntries())
      expected.set(`${entry.environment}/${entry.id}`, JSON.stringify(entry.view));
    for (const { key, value } of disk.env().dbs.customers.getRange({})) {
      const name = (key as string[]).join('/');
      const row = (value as Buffer).toString('utf8');
      if (expected.get(name) !== row)
        violations.push(
          `after recovery the customer index row of ${name} is ${row}, the shard holds ` +
            `${expected.get(name) ?? 'no such customer'}`,
        );
      expected.delete(name);
    }
    for (const name of expected.keys())
      violations.push(`after recovery the customer index has no row of ${name}`);
  };

  const crashAndRecover = (): void => {
    if (world !== null) stats.keysFoundInRuns += world.store.idempotency.foundInRuns;
    let machine = disk.txns.some((t) => t.failed) || rand() < 0.5;
    if (world !== null && !world.dead && !world.ready) stats.crashesAwaitingBarrier++;
    if (world !== null) world.dead = true;
    for (;;) {
      if (machine) {
        log.push(disk.machineCrash(rand));
        stats.machineCrashes++;
        // What survived a power cut is on disk.
        for (const [seq, op] of recordOp)
          if (op === 'base' || disk.isDurable(op)) recordOp.set(seq, 'base');
        for (const record of eventRecord.values())
          if (record.op !== 'base' && disk.isDurable(record.op)) record.op = 'base';
      } else {
        disk.processCrash();
        stats.processCrashes++;
        log.push('process crash');
      }
      const crashAt = rand() < 0.3 ? Math.floor(rand() * 6) : null;
      try {
        world = recover(crashAt);
        break;
      } catch (error) {
        if (!(error instanceof Crash))
          fail(`recovery failed: ${error instanceof Error ? error.stack : String(error)}`);
        stats.crashesDuringRecovery++;
        log.push(`crash during recovery at point ${crashAt}`);
        machine = rand() < 0.5;
      }
    }
    const w = world as World;
    const recovered = w.store.lastSeq;
    log.push(`recovered to record ${recovered}`);
    for (const seq of [...recordOp.keys()]) if (seq > recovered) recordOp.delete(seq);
    for (const [id, { seq, command }] of acked) {
      if (seq > recovered)
        fail(
          `acknowledged write ${id} ${show(command)} (record ${seq}) lost: recovery ended ` +
            `at record ${recovered}`,
        );
    }
    const expected = modelAt.get(recovered);
    if (expected === undefined)
      fail(`recovered to record ${recovered}, which the simulation never appended`);
    for (const seq of [...modelAt.keys()]) if (seq > recovered) modelAt.delete(seq);
    model = (expected as ReferenceModel).clone();
    compareAll(w, 'after recovery');
  };

  /** Every read of every customer, on the shard and on the model. */
  const compareAll = (w: World, when: string): void => {
    for (const environment of ENVIRONMENTS) {
      const reads = observingReads(configs[environment], [environment], CUSTOMERS);
      const envelopes = reads.map((command) => ({ id: nextId++, command }));
      for (const { id, command } of envelopes)
        w.expecting.set(id, {
          command,
          expected: model.exec(configs[environment], command, now),
          ackWrite: false,
          required: null,
        });
      w.shard.handleBatch(envelopes);
      const unanswered = envelopes.filter(({ id }) => w.expecting.has(id));
      if (unanswered.length > 0)
        fail(`${when}: reads not answered at once: ${show(unanswered.map((e) => e.command))}`);
      checkViolations();
    }
  };

  const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

  world = recover(null);
  for (let step = 0; step < steps; step++) {
    stats.steps++;
    const w = world as World;
    now += rand() < 0.04 ? Math.floor(rand() * 10 * 86_400_000) : Math.floor(rand() * 500);
    if (w.dead) {
      log.push(`step ${step}: the process died (fatal journal error); restart`);
      crashAndRecover();
      continue;
    }
    const roll = rand();
    // Until its barrier is durable a recovered shard serves nothing: a batch, a snapshot
    // or a configuration change waits; commits, syncs and crashes go on.
    const waits = !w.ready && (roll < 0.38 || (roll >= 0.85 && roll < 0.905));
    if (waits) {
      log.push(`step ${step}: not ready (recovery barrier not durable yet)`);
    } else if (roll < 0.38) {
      const envelopes: Envelope[] = [];
      const size = 1 + Math.floor(rand() * 6);
      for (let i = 0; i < size; i++) {
        const command = commandFor(rand, step);
        const id = nextId++;
        const expected = model.exec(configs[command.environment], command, now);
        const ackWrite = !isRead(command) && !(command.op === 'context' && expected.status === 200);
        w.expecting.set(id, { command, expected, ackWrite, required: null });
        envelopes.push({ id, command });
      }
      const lastBefore = w.store.lastSeq;
      const appendedBefore = w.appended.length;
      deciding = [];
      w.shard.handleBatch(envelopes);
      const releasedAtOnce = deciding;
      deciding = null;
      // The record this batch's writes wait for: the one its events went into, or, held
      // back behind the appends in flight, the next one appended; without events, the
      // newest record, whose state they may have seen.
      let required: Required;
      if (w.appended.length > appendedBefore)
        required = { seq: w.appended[appendedBefore] as number };
      else if (w.shard.hasPendingEvents) {
        required = { nextAfter: lastBefore };
        stats.heldBackBatches++;
      } else required = { seq: lastBefore };
      for (const e of envelopes) {
        const x = w.expecting.get(e.id);
        if (x !== undefined) w.expecting.set(e.id, { ...x, required });
        if (isRead(e.command) && x !== undefined)
          fail(`read ${e.id} ${show(e.command)} was not answered at once`);
      }
      for (const [id, x] of releasedAtOnce) checkAck(id, x, required);
      log.push(
        `step ${step}: batch of ${size} (lastSeq ${lastBefore} → ${w.store.lastSeq}, ` +
          `required ${show(required)})`,
      );
    } else if (roll < 0.6) {
      const failCommit = disk.open.length > 0 && rand() < 0.01;
      if (failCommit) stats.commitFailures++;
      const txn = disk.commit(failCommit);
      const outcome = failCommit
        ? 'failed commit'
        : txn === null
          ? 'nothing to commit'
          : `committed txn ${txn.id}`;
      log.push(`step ${step}: ${outcome}`);
    } else if (roll < 0.85) {
      const unsynced = disk.unsynced();
      if (unsynced.length > 0) {
        const index = rand() < 0.6 ? 0 : Math.floor(rand() * unsynced.length);
        if (index > 0) stats.syncsOutOfOrder++;
        // Only a sync someone waits for may fail: the process learns of it and dies. Nobody
        // waits for a removal's or a synchronous write's (recovery's).
        const observed = (unsynced[index] as (typeof unsynced)[number]).ops.some(
          (op) => op.epoch === disk.epoch && op.kind !== 'remove' && op.synchronous !== true,
        );
        // Nor one a later sync already covered: its pages are on disk (failing it would
        // leave durable records not durable while no waiter learns of it).
        const failSync = observed && rand() < 0.015 && !disk.covered(unsynced[index] as Txn);
        if (failSync) stats.syncFailures++;
        disk.sync(unsynced[index] as (typeof unsynced)[number], failSync);
        log.push(
          `step ${step}: ${failSync ? 'failed sync of' : 'synced'} ` +
            `txn ${(unsynced[index] as { id: number }).id}`,
        );
      }
    } else if (roll < 0.9) {
      // Snapshot as the worker does: a cut when nothing is pending (appends may be in
      // flight), copied in slices between batches, stored in one transaction.
      if (w.copy === null && !w.shard.hasPendingEvents) {
        const seq = w.store.lastSeq;
        const chunks: Buffer[] = [];
        const copy = new ShardCopy(w.shard.customerMaps(), (items) =>
          chunks.push(encodeSnapshotChunk(items)),
        );
        w.copy = { copy, seq, chunks };
        w.shard.writeObserver = { before: (c) => copy.capture(c), created: (c) => copy.created(c) };
        log.push(
          `step ${step}: snapshot cut at record ${seq} ` +
            `(${w.appended.filter((s) => !recordDurable(s)).length} appends not durable)`,
        );
      }
    } else if (roll < 0.905) {
      const environment = rand() < 0.5 ? 'test' : 'live';
      configs[environment] = rand() < 0.5 ? CONFIG : CONFIG_B;
      w.shard.setConfig(environment, ++configVersion, configs[environment]);
      log.push(`step ${step}: config of ${environment} changed`);
    } else if (roll < 0.93) {
      // Seal the keys in memory into a run, as the worker's upkeep does: a slice per turn,
      // its commits and syncs driven by the schedule like every other write; a failed write
      // kills the process, as it kills the worker.
      const waiting = w.store.idempotency.unsealed;
      if (w.ready && !w.sealing && waiting > 0) {
        w.sealing = true;
        stats.sealsBegun++;
        w.store.idempotency
          .seal({
            pause: settle,
            keysDurable: () => new Promise((resolve) => w.shard.whenDurable(resolve)),
          })
          .then(
            () => {
              w.sealing = false;
              stats.sealedRuns++;
            },
            () => {
              w.dead = true;
            },
          );
        log.push(`step ${step}: sealing ${waiting} keys`);
      }
    } else if (roll < 0.95) {
      crashAndRecover();
    }
    // A snapshot in progress copies a slice between batches, as the worker's does.
    const current = world as World;
    if (current === w && !w.dead && w.copy !== null && rand() < 0.4 && w.copy.copy.step(1)) {
      const { seq, chunks, copy } = w.copy;
      w.copy = null;
      w.shard.writeObserver = null;
      stats.snapshots++;
      w.store.writeSnapshotChunks(seq, chunks, copy.done).then(
        () => undefined,
        () => {
          w.dead = true;
        },
      );
      log.push(`step ${step}: snapshot at record ${seq} written`);
    }
    await settle();
    checkViolations();
  }

  // The end: commit and sync everything; every write in flight must be answered.
  const w = world as World;
  for (
    let i = 0;
    i < 50 &&
    !w.dead &&
    (disk.open.length > 0 || disk.unsynced().length > 0 || w.expecting.size > 0);
    i++
  ) {
    disk.commit();
    for (const txn of disk.unsynced()) disk.sync(txn);
    await settle();
  }
  checkViolations();
  if (!w.dead && w.expecting.size > 0)
    fail(
      `never answered once everything was ` +
        `synced: ${show([...w.expecting.values()].map((x) => x.command))}`,
    );
  // And a last power cut: everything acknowledged must come back.
  crashAndRecover();
  checkViolations();
  return stats;
}
