/**
 * The front end's side of the actor shards: starts the worker threads, routes each
 * command to the worker that owns its customer, and batches.
 *
 * Commands submitted during one event-loop turn leave as one message per worker (at
 * most BATCH_COMMANDS_MAX each) when the turn ends; replies arrive batched the same
 * way. Each worker's queue is bounded: past WORKER_QUEUE_MAX commands in flight,
 * `submit` refuses and the caller answers 503. A worker that dies takes the process
 * with it — its unacknowledged commands are lost by design and everything
 * acknowledged is on disk for recovery.
 */
import { MessageChannel, Worker, type MessagePort } from 'node:worker_threads';
import { assert } from '../shared/assert.js';
import { logicalShardOf, workerOf } from '../shared/shard-hash.js';
import type { BillingConfig } from '../actors/billing-config.js';
import {
  BATCH_COMMANDS_MAX,
  FRONT_ENDS_MAX,
  IDEMPOTENCY_RUN_KEYS,
  SNAPSHOT_SLICE_WORK,
  LOGICAL_SHARDS,
  SHARD_OLD_GENERATION_MB,
  SHARD_YOUNG_GENERATION_MB,
  SNAPSHOT_EVERY_BATCHES,
  WORKER_QUEUE_MAX,
} from '../shared/limits.js';
import {
  COMMAND_SLOTS,
  pushCommand,
  REPLY_SLOTS,
  type AuditEffect,
  type Command,
  type ReplyOutcome,
  type ShardReply,
  type WireBatch,
  type Environment,
  type FromWorker,
  type AuditTag,
  type PendingAudit,
  type ShardLiveStats,
  type CutResult,
  type ToWorker,
  type WorkerStats,
} from '../actors/protocol.js';
import { HasView } from './has-view.js';
import { PendingReplies } from './pending-replies.js';
import { OutboxMarks } from '../storage/outbox.js';
import { viewStamps } from '../actors/has-view.js';
import { NO_QUOTAS, workerQuotas, type Quotas } from '../shared/quotas.js';
import type { ShardWorkerData } from '../actors/shard-worker.js';

/** Receives a command's reply (protocol.ts, ShardReply). */
export type ReplyHandler = (...reply: ShardReply) => void;

/** A worker's channel: the worker itself, or a port to it (a front end after the first). */
interface WorkerChannel {
  postMessage(message: ToWorker): void;
  on(event: 'message', listener: (message: FromWorker) => void): unknown;
}

interface Slot {
  readonly worker: WorkerChannel;
  outbox: WireBatch;
  inFlight: number;
  stats: WorkerStats | null;
}

export interface ShardPoolOptions {
  readonly dataDir: string;
  readonly workers: number;
  /** Commands queued or in flight per worker before `submit` refuses (default WORKER_QUEUE_MAX). */
  readonly queueMax?: number;
  /** Journal batches between a shard's automatic snapshots (default SNAPSHOT_EVERY_BATCHES). */
  readonly snapshotEveryBatches?: number;
  /** Work a shard does per slice of a snapshot copy (default SNAPSHOT_SLICE_WORK). */
  readonly snapshotSliceWork?: number;
  /** Idempotency keys a shard holds in memory before it seals a run (IDEMPOTENCY_RUN_KEYS). */
  readonly idempotencyRunKeys?: number;
  /**
   * Groups of runs a shard's new era of idempotency filters holds at most (default: each new
   * era sized by the keys' rate, IDEMPOTENCY_ERA_GROUPS to IDEMPOTENCY_ERA_GROUPS_MAX).
   */
  readonly idempotencyEraGroups?: number;
  /**
   * Called when a worker has rebuilt and stored the eras of idempotency filters a crash left
   * unstored (`groups` groups of runs, `ms` after it began to serve, as it did meanwhile).
   */
  readonly onErasRebuilt?: (index: number, groups: number, ms: number) => void;
  /** Called if a worker dies; the default ends the process (recovery repairs it). */
  readonly onWorkerDeath?: (index: number, reason: string) => void;
  /** The operator's per-environment quotas (default: none). */
  readonly quotas?: Quotas;
  /** Front-end threads (TALLY_FRONTENDS, default 1): each gets its own channel to each worker. */
  readonly frontEnds?: number;
}

/** What a front end after the first needs to reach every worker (`ShardPool.connect`). */
export interface FrontEndChannels {
  /** This front end's number, 1 for the second. */
  readonly frontEnd: number;
  /** Its channel to each worker, in worker order. */
  readonly ports: readonly MessagePort[];
  readonly queueMax: number;
}

export class ShardPool {
  private readonly slots: Slot[] = [];
  /** Requests waiting for a reply; their ids name this front end (see FRONT_ENDS_MAX). */
  private readonly pending: PendingReplies<ReplyHandler>;
  private readonly recoveredAudits: PendingAudit[] = [];
  /** Per worker, the other front ends' channels to it: index `frontEnd - 1`. */
  private readonly frontEndPorts: MessagePort[][] = [];
  /** Outstanding stats requests: request id → one result slot per worker. */
  private readonly statsRequests = new Map<
    number,
    { results: Array<ShardLiveStats | null>; left: number; done: (stats: ShardLiveStats[]) => void }
  >();
  private nextStatsRequest = 1;
  /** The online snapshot being cut, if any: one result slot per worker. */
  private cutting: {
    readonly snapshotId: string;
    readonly results: Array<CutResult | null>;
    readonly progress: Array<{ done: number; total: number }>;
    left: number;
    readonly onProgress: (done: number, total: number) => void;
    readonly settle: (error: Error | null, results: CutResult[]) => void;
  } | null = null;
  private flushScheduled = false;
  private stopping = false;

  private readonly queueMax: number;
  /** `has` answers the workers published, served without asking them (has-view.ts). */
  private readonly view: HasView;

  /** Each worker's stamp counters of the `has` view, shared with it. */
  private readonly stamps: Int32Array[];

  /**
   * The workers' durable outbox marks (storage/outbox.ts), shared with them and with the
   * webhook delivery thread, which reads each shard's outbox only up to its mark.
   */
  readonly outboxMarks: SharedArrayBuffer;

  private constructor(
    private readonly options: ShardPoolOptions,
    frontEnd = 0,
  ) {
    this.queueMax = options.queueMax ?? WORKER_QUEUE_MAX;
    this.pending = new PendingReplies(frontEnd);
    // Only the first front end holds the view (a later one asks the workers): no stamp
    // counters for the others.
    this.stamps = frontEnd === 0 ? Array.from({ length: options.workers }, () => viewStamps()) : [];
    this.outboxMarks = OutboxMarks.memory(options.workers);
    this.view = new HasView(this.stamps.length, Date.now, this.stamps);
  }

  /** Starts every worker; resolves once each has recovered and reported ready. */
  static async start(options: ShardPoolOptions): Promise<ShardPool> {
    const frontEnds = options.frontEnds ?? 1;
    assert(frontEnds >= 1 && frontEnds <= FRONT_ENDS_MAX, `${frontEnds} front ends`);
    const pool = new ShardPool(options);
    const ready: Promise<void>[] = [];
    for (let index = 0; index < options.workers; index++) ready.push(pool.spawn(index));
    await Promise.all(ready);
    return pool;
  }

  /**
   * The pool of a front end after the first: the workers' channels it was given, no workers of
   * its own; it submits commands and gets their replies (no `has` view, no control messages).
   */
  static connect(channels: FrontEndChannels): ShardPool {
    const pool = new ShardPool(
      { dataDir: '', workers: channels.ports.length, queueMax: channels.queueMax },
      channels.frontEnd,
    );
    channels.ports.forEach((port, index) => {
      const slot: Slot = { worker: port, outbox: [], inFlight: 0, stats: null };
      pool.slots.push(slot);
      port.on('message', (message: FromWorker) => {
        if (message.t === 'replies') pool.deliver(slot, message.replies);
        else assert(false, `worker ${index} sent ${message.t} to a second front end`);
      });
    });
    return pool;
  }

  /** The channels of front end `frontEnd` (1 for the second) to every worker, to hand over. */
  channelsOf(frontEnd: number): FrontEndChannels {
    return {
      frontEnd,
      ports: this.frontEndPorts.map((ports) => ports[frontEnd - 1] as MessagePort),
      queueMax: this.queueMax,
    };
  }

  private spawn(index: number): Promise<void> {
    const ends = Array.from(
      { length: (this.options.frontEnds ?? 1) - 1 },
      () => new MessageChannel(),
    );
    this.frontEndPorts.push(ends.map((channel) => channel.port2));
    const workerData: ShardWorkerData = {
      viewStamps: this.stamps[index] as Int32Array,
      outboxMarks: this.outboxMarks,
      frontEnds: ends.map((channel) => channel.port1),
      dataDir: this.options.dataDir,
      workerIndex: index,
      snapshotEveryBatches: this.options.snapshotEveryBatches ?? SNAPSHOT_EVERY_BATCHES,
      snapshotSliceWork: this.options.snapshotSliceWork ?? SNAPSHOT_SLICE_WORK,
      idempotencyRunKeys: this.options.idempotencyRunKeys ?? IDEMPOTENCY_RUN_KEYS,
      idempotencyEraGroups: this.options.idempotencyEraGroups ?? null,
      quotas: workerQuotas(this.options.quotas ?? NO_QUOTAS, index, this.options.workers),
    };
    const worker = new Worker(new URL('../actors/shard-worker.js', import.meta.url), {
      workerData,
      transferList: [...workerData.frontEnds],
      resourceLimits: {
        maxYoungGenerationSizeMb: SHARD_YOUNG_GENERATION_MB,
        maxOldGenerationSizeMb: SHARD_OLD_GENERATION_MB,
      },
    });
    const slot: Slot = { worker, outbox: [], inFlight: 0, stats: null };
    this.slots.push(slot);
    return new Promise((resolve, reject) => {
      worker.on('message', (message: FromWorker) => {
        if (message.t === 'ready') {
          slot.stats = message.stats;
          for (const audit of message.pendingAudits) this.recoveredAudits.push(audit);
          resolve();
        } else if (message.t === 'replies') {
          // View changes first: a write's reply must never leave before its customer's drop.
          if (message.view.length > 0) this.view.apply(index, message.view);
          this.deliver(slot, message.replies);
        } else if (message.t === 'stats') {
          this.statsArrived(index, message.requestId, message.stats);
        } else if (
          message.t === 'cutProgress' ||
          message.t === 'cutDone' ||
          message.t === 'cutFailed'
        ) {
          this.cutReport(index, message);
        } else if (message.t === 'erasRebuilt') {
          this.options.onErasRebuilt?.(index, message.groups, message.ms);
        }
      });
      worker.on('error', (error) => {
        reject(error);
        this.died(index, String(error.stack ?? error));
      });
      worker.on('exit', (code) => {
        reject(new Error(`shard worker ${index} exited with ${code} before it was ready`));
        if (!this.stopping) this.died(index, `exit code ${code}`);
      });
    });
  }

  private died(index: number, reason: string): void {
    if (this.stopping) return;
    if (this.options.onWorkerDeath !== undefined) {
      this.options.onWorkerDeath(index, reason);
      return;
    }
    process.stderr.write(
      `${JSON.stringify({ level: 'fatal', msg: 'shard worker died', worker: index, reason })}\n`,
    );
    process.exit(70);
  }

  get workerCount(): number {
    return this.slots.length;
  }

  workerStats(): Array<WorkerStats | null> {
    return this.slots.map((slot) => slot.stats);
  }

  /** Commands queued or in flight per worker, now. */
  queueDepths(): number[] {
    return this.slots.map((slot) => slot.inFlight);
  }

  /**
   * Asks every worker for its counters. The request queues behind the batches already
   * sent, so a busy worker answers late but never blocks anything.
   */
  liveStats(): Promise<ShardLiveStats[]> {
    const requestId = this.nextStatsRequest++;
    return new Promise((resolve) => {
      this.statsRequests.set(requestId, {
        results: this.slots.map(() => null),
        left: this.slots.length,
        done: resolve,
      });
      for (const slot of this.slots) this.post(slot, { t: 'stats', requestId });
    });
  }

  private statsArrived(index: number, requestId: number, stats: ShardLiveStats): void {
    const request = this.statsRequests.get(requestId);
    if (request === undefined) return;
    request.results[index] = stats;
    if (--request.left > 0) return;
    this.statsRequests.delete(requestId);
    request.done(request.results as ShardLiveStats[]);
  }

  /**
   * Takes an online snapshot's cut on every worker at one point of the command stream:
   * everything submitted before this call is in it (the queued batches are sent first),
   * nothing submitted after. Each worker writes its part to `partPathOf(index)`; resolves
   * with every part once all are written and durable, rejects if any worker fails.
   * One cut at a time (programmer error otherwise).
   */
  cut(
    snapshotId: string,
    partPathOf: (index: number) => string,
    onProgress: (done: number, total: number) => void,
  ): Promise<CutResult[]> {
    if (this.cutting !== null) throw new Error('a snapshot cut is already in progress');
    this.flush();
    return new Promise((resolve, reject) => {
      this.cutting = {
        snapshotId,
        results: this.slots.map(() => null),
        progress: this.slots.map(() => ({ done: 0, total: 0 })),
        left: this.slots.length,
        onProgress,
        settle: (error, results) => {
          this.cutting = null;
          if (error === null) resolve(results);
          else reject(error);
        },
      };
      this.slots.forEach((slot, index) =>
        this.post(slot, { t: 'cut', snapshotId, partPath: partPathOf(index) }),
      );
    });
  }

  private cutReport(
    index: number,
    message: Extract<FromWorker, { t: 'cutProgress' | 'cutDone' | 'cutFailed' }>,
  ): void {
    const cut = this.cutting;
    if (cut === null || cut.snapshotId !== message.snapshotId) return;
    if (message.t === 'cutFailed') {
      cut.settle(new Error(`shard ${index}: ${message.error}`), []);
      return;
    }
    if (message.t === 'cutProgress') {
      cut.progress[index] = { done: message.done, total: message.total };
    } else {
      cut.results[index] = message.result;
      cut.progress[index] = { done: message.result.customers, total: message.result.customers };
      cut.left--;
    }
    cut.onProgress(
      cut.progress.reduce((sum, p) => sum + p.done, 0),
      cut.progress.reduce((sum, p) => sum + p.total, 0),
    );
    if (cut.left === 0) cut.settle(null, cut.results as CutResult[]);
  }

  /**
   * Queues a command for its customer's worker; false when that worker's queue is full.
   * `audit`: an audited write's tag; the shard stores its entry with the change (protocol.ts).
   */
  submit(command: Command, onReply: ReplyHandler, audit: AuditTag | null = null): boolean {
    const slot = this.slots[this.workerIndexOf(command.environment, command.customerId)];
    if (slot === undefined || slot.inFlight >= this.queueMax) return false;
    const id = this.pending.add(onReply);
    slot.inFlight++;
    pushCommand(slot.outbox, id, command, audit);
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(() => this.flush());
    }
    return true;
  }

  /**
   * The customer's answer to `has` of `key` as its worker published it, if the front end holds
   * one that is still current; undefined: submit the read.
   */
  heldHas(environment: Environment, customerId: string, key: string): boolean | undefined {
    return this.view.answer(environment, customerId, key);
  }

  /** `has` reads answered from the view since start, and customers it holds answers of now. */
  viewStats(): { hits: number; customers: number } {
    return { hits: this.view.hits, customers: this.view.customers };
  }

  private workerIndexOf(environment: Environment, customerId: string): number {
    return workerOf(logicalShardOf(environment, customerId, LOGICAL_SHARDS), this.slots.length);
  }

  /**
   * The audit entries the shards had stored at start but the chain may lack (a crash came
   * between the change and its entry). The server appends the missing ones before serving.
   */
  takeRecoveredAudits(): PendingAudit[] {
    return this.recoveredAudits.splice(0);
  }

  /** Tells the shard holding `customerId` that these audit entries are durable in the chain. */
  auditsRecorded(environment: Environment, customerId: string, refs: readonly string[]): void {
    const slot = this.slots[this.workerIndexOf(environment, customerId)];
    if (slot !== undefined && refs.length > 0) this.post(slot, { t: 'auditsRecorded', refs });
  }

  /** Sends the commands queued this turn now (a front end that is stopping). */
  flushNow(): void {
    this.flush();
  }

  private flush(): void {
    this.flushScheduled = false;
    for (const slot of this.slots) {
      const outbox = slot.outbox;
      if (outbox.length === 0) continue;
      slot.outbox = [];
      const slotsMax = BATCH_COMMANDS_MAX * COMMAND_SLOTS;
      for (let start = 0; start < outbox.length; start += slotsMax) {
        const wire =
          start === 0 && outbox.length <= slotsMax ? outbox : outbox.slice(start, start + slotsMax);
        this.post(slot, { t: 'batch', wire });
      }
    }
  }

  private post(slot: Slot, message: ToWorker): void {
    slot.worker.postMessage(message);
  }

  /**
   * Hands each reply to its request's handler. Every submitted command is answered
   * exactly once by the worker it was sent to, so a reply for an id not pending (an
   * unknown or repeated one) is a broken invariant: assertion failure, never skipped.
   */
  private deliver(slot: Slot, replies: ReadonlyArray<number | string>): void {
    assert(replies.length % REPLY_SLOTS === 0, `a reply batch of ${replies.length} slots`);
    for (let i = 0; i < replies.length; i += REPLY_SLOTS) {
      const id = replies[i] as number;
      const handler = this.pending.take(id);
      assert(handler !== undefined, `reply for request ${id}, which is not pending`);
      assert(slot.inFlight > 0, `reply for request ${id} from a worker with nothing in flight`);
      slot.inFlight--;
      handler(
        replies[i + 1] as ReplyOutcome,
        replies[i + 2] as string,
        replies[i + 3] as AuditEffect,
      );
    }
  }

  /** Hands a configuration version to every worker; later batches see it. */
  broadcastConfig(environment: Environment, version: number, config: BillingConfig): void {
    this.view.configSent(environment);
    for (const slot of this.slots) this.post(slot, { t: 'config', environment, version, config });
  }

  /** Lets queued work finish, then stops every worker and closes its journal. */
  async stop(): Promise<void> {
    this.stopping = true;
    this.flush();
    await Promise.all(
      this.slots.map(
        (slot) =>
          new Promise<void>((resolve) => {
            slot.worker.on('message', (message: FromWorker) => {
              if (message.t === 'stopped')
                void (slot.worker as Worker).terminate().then(() => resolve());
            });
            this.post(slot, { t: 'stop' });
          }),
      ),
    );
  }
}
