/**
 * A shard: the customers one worker owns, and the write-ahead discipline around the
 * pure core.
 *
 * `handleBatch` decides every command of a batch against in-memory state and releases
 * the replies of its writes only when the journal record holding their events is
 * durable. Reads answer at once from memory and never wait for disk.
 *
 * Group commit, pipelined: up to APPENDS_IN_FLIGHT_MAX journal appends are on their way
 * to disk at once. Events decided in one batch go out as one record at the end of it
 * (lmdb-js puts every append of one event-loop turn into one transaction); past the cap
 * they wait in `pending` and go together as the next record once the oldest append is
 * durable. Appends complete in order, and replies are released in append order, so no
 * reply ever leaves before every event it may have observed is durable. Why more than
 * one: with one append in flight a request decided during a commit would wait for that
 * commit and then its own, and the disk would sit idle between them while the durable
 * callback travels back; the journal environment syncs outside LMDB's write lock
 * (overlappingSync), so the next transaction is written while the previous one syncs.
 * What that is worth depends on the load. Measured flat out, one in flight against four
 * (three alternated rounds each): unkeyed consumes at 50 connections 12-21% faster with
 * one (~16 consumes a commit against ~6, less CPU a consume on every thread), keyed ones
 * at 50 about as fast; at 256 connections unkeyed ones about as fast and keyed ones
 * slower (0.81-1.00x), so four stay. With overlappingSync off, per-batch commits saturate
 * LMDB's writer and double consume latency.
 * A write that produced no event (a rejection or an idempotent replay) waits with the
 * group it was decided in, because its answer was computed from state that may not be
 * durable yet. The journal and the clock are injected, so the seeded simulation runs
 * this exact code without threads or disk. What each op is (read or write, audited,
 * whether it changes the customer index, how its answer is rendered) comes from the op
 * table (ops.ts).
 */
import { assert } from '../shared/assert.js';
import { customerView, type CustomerView } from '../shared/customer-record.js';
import type { Environment } from '../shared/environment.js';
import type { WorkerQuotas } from '../shared/quotas.js';
import {
  compileConfig,
  EMPTY_CONFIG,
  type BillingConfig,
  type CompiledConfig,
} from './billing-config.js';
import {
  apply,
  execute,
  fromSnapshot,
  idempotencyScope,
  onlyAnswerChangedBy,
  query,
  toSnapshot,
  type Command,
  type CustomerSnapshot,
  type CustomerState,
  type Event,
  type IdempotencyRecord,
  type IdempotencySeen,
  type Admission,
  type Outcome,
  type ReadCommand,
  type Rejection,
  type WriteCommand,
} from './customer.js';
import {
  MemoryKeys,
  scopeDigest,
  type IdempotencyPut,
  type KeyAddress,
  type KeysAtCut,
  type StoredKeys,
  carriedKey,
} from './idempotency-keys.js';
import type { PublishedViews } from './has-view.js';
import { OPS, type OpRecord } from './ops.js';
import { captureBefore, noticesOf, type Notice } from './webhook-events.js';
import {
  REPLY_SLOTS,
  type AuditEffect,
  type Envelope,
  type PendingAudit,
  type ReplyOutcome,
  type ShardReply,
} from './protocol.js';

export { isRead } from './ops.js';

function hasAnyQuota(quotas: WorkerQuotas): boolean {
  return [quotas.customers, quotas.idempotencyKeys].some(
    (q) => q.test.share > 0 || q.live.share > 0,
  );
}

/** Whether a write with an idempotency key: one that wrote events stores its key. */
function isKeyed(command: WriteCommand): boolean {
  return (
    (command.op === 'consume' || command.op === 'refund') && command.idempotencyKey !== undefined
  );
}

/** A customer's row in the shard's customer index, written with the journal record. */
export interface CustomerIndexEntry {
  readonly environment: Environment;
  readonly id: string;
  readonly view: CustomerView;
}

export type { IdempotencyPut } from './idempotency-keys.js';

export interface ShardJournal {
  /**
   * Appends one record, the customer index rows it changes, the audit entries of the
   * audited writes in it and the webhook events of its changes (the outbox), atomically;
   * `durable` settles once all are on disk (rejects: the shard must crash). `keyed` counts
   * the idempotency keys its events hold (`carriedKey`; `keysOfEvents` reads them back).
   */
  append(
    events: readonly Event[],
    index: readonly CustomerIndexEntry[],
    audits: readonly PendingAudit[],
    keyed: number,
    notices: readonly Notice[],
  ): { readonly seq: number; readonly durable: Promise<void> };
}

export interface ShardOptions {
  readonly journal: ShardJournal;
  readonly clock: () => number;
  /** Receives each reply; the shell buffers them until `flush`. */
  readonly reply: (id: number, ...reply: ShardReply) => void;
  /** Called after a batch's immediate replies and after each group's release: send now. */
  readonly flush: () => void;
  /** Called when a journal write fails: the shell must crash the worker. */
  readonly fatal: (error: unknown) => void;
  /** This worker's shares of the operator's quotas (none: unlimited). */
  readonly quotas?: WorkerQuotas;
  /** The store of idempotency keys (none: keys in memory alone, for tests). */
  readonly storedKeys?: StoredKeys;
  /** Told of every `has` answered and every customer changed, for the front end's view. */
  readonly views?: PublishedViews;
}

/** Whether `command`, whose record is `op`, is a read (the op table says). */
function isReadOf(op: OpRecord, command: Command): command is ReadCommand {
  return op.access === 'read';
}

/** The reply a shard sends for `outcome` of an op: how it went, and its JSON. */
export function shardReplyOf(
  op: OpRecord,
  outcome: Outcome,
): { readonly outcome: ReplyOutcome; readonly body: string } {
  return { outcome: replyOutcomeOf(outcome), body: replyBodyOf(op, outcome) };
}

/** How an outcome goes back to the front end. */
function replyOutcomeOf(outcome: Outcome): ReplyOutcome {
  switch (outcome.kind) {
    case 'rejected':
      return 'rejected';
    case 'deleted':
      return 'deleted';
    case 'customer':
      return outcome.created ? 'created' : 'ok';
    default:
      return 'ok';
  }
}

/** The reply's JSON: the op's rendering of a success, or the rejection itself. */
function replyBodyOf(op: OpRecord, outcome: Outcome): string {
  return outcome.kind === 'rejected' ? JSON.stringify(outcome.rejection) : op.body(outcome);
}

/**
 * Journal appends one shard keeps on their way to disk. Two already overlap one
 * transaction's sync with the next one's writes; a few more absorb bursts without letting
 * a slow disk pile up an unbounded queue of tiny transactions (events then wait in
 * `pending` and share the next record).
 */
export const APPENDS_IN_FLIGHT_MAX = 4;

/** One journal append on its way to disk, and what its durability releases. */
interface Append {
  /** The journal seq of the record. */
  readonly seq: number;
  readonly replies: Array<number | string>;
  readonly waiters: Array<() => void>;
  durable: boolean;
}

export class Shard {
  /**
   * Customers by environment, then id. Two levels rather than one map keyed by
   * environment and id together: the key is then the id string the customer already
   * holds, not a second string per customer, and finding a customer builds no string.
   */
  private readonly customers: Readonly<Record<Environment, Map<string, CustomerState>>> = {
    test: new Map(),
    live: new Map(),
  };
  /** False once anything was replayed or decided: a snapshot must load before that. */
  private loadingSnapshot = true;
  private readonly configs = new Map<Environment, CompiledConfig>();
  /** Appends on their way to disk, oldest first. */
  private readonly inFlight: Append[] = [];
  /** Events decided since the last append started, and the write replies waiting on them. */
  private pendingEvents: Event[] = [];
  private pendingReplies: Array<number | string> = [];
  /** Customers created or re-profiled since the last append: their index rows go with it. */
  private pendingIndex = new Set<CustomerState>();
  /**
   * Audit entries of the pending events' audited writes, stored in the same record's transaction.
   */
  private pendingAudits: PendingAudit[] = [];
  /**
   * Idempotency keys the pending events hold (their record stores them). A count: the keys
   * themselves are in memory (`StoredKeys.remember`) and in the events, and a copy of each
   * kept until its record is appended would be one more object a key for the collector.
   */
  private pendingKeys = 0;
  /** The idempotency keys: recent ones in memory, the rest on disk. */
  private readonly keys: StoredKeys;
  /** Webhook events of the pending events' changes, stored in the same record's transaction. */
  private pendingNotices: Notice[] = [];
  private lastNowMs = 0;
  /** Seq of the newest append started, and of the newest one whose replies were released. */
  private appendedSeq = 0;
  private releasedSeq = 0;
  /** Journal records appended since the shard last snapshotted. */
  batchesSinceSnapshot = 0;
  /** Events in those records: what replay after the last snapshot would have to fold. */
  eventsSinceSnapshot = 0;
  /**
   * Idempotency keys stored per environment, for the quota: set at start from the table
   * (`countStoredKeys`, only when a quota is set), then counted up by each new key and
   * down as expired runs of keys are dropped.
   */
  private readonly idempotencyByEnvironment: Record<Environment, number> = { test: 0, live: 0 };
  /**
   * The quota check handed to `execute`; absent when no quota is set (nothing to pay per write).
   */
  private readonly admit: Admission | undefined;
  /** Callbacks waiting for the pending group's append. */
  private pendingWaiters: Array<() => void> = [];
  /**
   * Told of every write: `before` with a customer's state just before a write command is
   * decided against it, `created` with a customer a write has just created (an online
   * snapshot captures the pre-image of customers it has not copied yet and skips new ones).
   */
  writeObserver: {
    before(customer: CustomerState): void;
    created(customer: CustomerState): void;
  } | null = null;

  constructor(private readonly options: ShardOptions) {
    this.keys = options.storedKeys ?? new MemoryKeys();
    const quotas = options.quotas;
    if (quotas !== undefined && hasAnyQuota(quotas))
      this.admit = (command, customer, events) =>
        this.quotaRefusal(quotas, command, customer, events);
  }

  /** Idempotency keys held in memory (not yet sealed into a run on disk). */
  get idempotencyKeysInMemory(): number {
    return this.keys.inMemory;
  }

  /** Whether the shard keeps per-environment key counts (an idempotency-key quota is set). */
  get countsKeys(): boolean {
    const keys = this.options.quotas?.idempotencyKeys;
    return keys !== undefined && (keys.test.share > 0 || keys.live.share > 0);
  }

  /** Recovery, with a key quota set: the keys stored per environment when the shard starts. */
  countStoredKeys(counts: Readonly<Record<Environment, number>>): void {
    this.idempotencyByEnvironment.test = counts.test;
    this.idempotencyByEnvironment.live = counts.live;
  }

  /** Expired keys left the disk (whole runs of them): they no longer count. */
  keysDropped(counts: Readonly<Record<Environment, number>>): void {
    this.idempotencyByEnvironment.test -= counts.test;
    this.idempotencyByEnvironment.live -= counts.live;
  }

  /** An online snapshot's cut of the idempotency keys, read later a slice at a time. */
  keysAtCut(): KeysAtCut {
    return this.keys.cut();
  }

  /**
   * Refuses an accepted write that would take its environment past this worker's share of
   * a quota: a new customer, or a new idempotency key. Writes to existing customers and
   * keyed replays pass; so does everything while under the share.
   */
  private quotaRefusal(
    quotas: WorkerQuotas,
    command: WriteCommand,
    customer: CustomerState | undefined,
    events: readonly Event[],
  ): Rejection | null {
    const environment = command.environment;
    const customers = quotas.customers[environment];
    if (
      customer === undefined &&
      customers.share > 0 &&
      this.customers[environment].size >= customers.share
    ) {
      return { kind: 'quota_exceeded', quota: 'customers', environment, limit: customers.limit };
    }
    const keys = quotas.idempotencyKeys[environment];
    if (
      keys.share > 0 &&
      this.idempotencyByEnvironment[environment] >= keys.share &&
      events.length > 0 &&
      isKeyed(command)
    ) {
      return { kind: 'quota_exceeded', quota: 'idempotencyKeys', environment, limit: keys.limit };
    }
    return null;
  }

  /**
   * The admission of a write whose environment has used up its daily audit quota: one
   * that would change something, and so be audited, is refused (the other quotas apply too).
   */
  private auditQuotaAdmission(limit: number): Admission {
    return (command, customer, events) =>
      OPS[command.op].audit === null
        ? (this.admit?.(command, customer, events) ?? null)
        : {
            kind: 'quota_exceeded',
            quota: 'auditEntriesPerDay',
            environment: command.environment,
            limit,
          };
  }

  get customerCount(): number {
    return this.customers.test.size + this.customers.live.size;
  }

  /** Every customer, test environment first. */
  *allCustomers(): IterableIterator<CustomerState> {
    yield* this.customers.test.values();
    yield* this.customers.live.values();
  }

  /**
   * The maps of customers, test environment first, for a snapshot's cut (ShardCopy): a
   * shard never removes a customer from them and changes one in place, so each only grows,
   * at its end.
   */
  customerMaps(): readonly ReadonlyMap<string, CustomerState>[] {
    return [this.customers.test, this.customers.live];
  }

  /** Every customer as its customer index entry (the index must match them after a drop). */
  *indexEntries(): IterableIterator<CustomerIndexEntry> {
    for (const c of this.allCustomers())
      yield { environment: c.environment, id: c.id, view: customerView(c) };
  }

  setConfig(environment: Environment, version: number, config: BillingConfig): void {
    const current = this.configs.get(environment);
    this.options.views?.configured(environment);
    if (current !== undefined && current.version >= version) return;
    this.configs.set(environment, compileConfig(config, version));
  }

  /** The clock never runs backwards inside a shard, even if the wall clock does. */
  private now(): number {
    this.lastNowMs = Math.max(this.lastNowMs, this.options.clock());
    return this.lastNowMs;
  }

  handleBatch(envelopes: readonly Envelope[]): void {
    this.loadingSnapshot = false;
    const nowMs = this.now();
    const addresses = this.keyAddressesOf(envelopes);
    for (let at = 0; at < envelopes.length; at++) {
      const { id, command, audit } = envelopes[at] as Envelope;
      const op = OPS[command.op];
      const customers = this.customers[command.environment];
      const config = this.configs.get(command.environment) ?? EMPTY_CONFIG;
      if (isReadOf(op, command)) {
        const outcome = query(customers.get(command.customerId), config, command, nowMs);
        if (outcome.kind === 'has' && this.options.views !== undefined)
          this.options.views.answered(
            command.environment,
            command.customerId,
            command.key,
            outcome.value,
            outcome.untilMs,
          );
        this.options.reply(id, replyOutcomeOf(outcome), replyBodyOf(op, outcome), 'none');
        continue;
      }
      const before = customers.get(command.customerId);
      if (before !== undefined && this.writeObserver !== null) this.writeObserver.before(before);
      const admit =
        audit?.auditQuotaReached === undefined
          ? this.admit
          : this.auditQuotaAdmission(audit.auditQuotaReached);
      const address = addresses === null ? null : (addresses[at] ?? null);
      const seen = address === null ? null : (this.keys.get(address) ?? null);
      // A keyed write's event holds its key: on disk exactly when the write is.
      const carry = address === null ? undefined : carriedKey(address, command);
      const captured = captureBefore(before, command);
      const execution = execute(before, config, command, nowMs, admit, seen, carry);
      const wrote = execution.events.length > 0;
      if (address !== null && carry !== undefined && wrote)
        this.rememberKey(address, seen, carry, nowMs, execution.customer?.id);
      if (wrote && execution.customer !== undefined)
        for (const notice of noticesOf({
          command,
          captured,
          customer: execution.customer,
          created: before === undefined,
          events: execution.events,
          outcome: execution.outcome,
          nowMs,
        }))
          this.pendingNotices.push(notice);
      if (execution.customer !== undefined) {
        customers.set(command.customerId, execution.customer);
        if (before === undefined && this.writeObserver !== null)
          this.writeObserver.created(execution.customer);
        if (before === undefined || (wrote && op.changesIndex))
          this.pendingIndex.add(execution.customer);
      }
      // Before any reply can leave: the front end's answers of this customer are sent again.
      if (wrote && this.options.views !== undefined)
        this.reanswerHas(
          command.environment,
          command.customerId,
          config,
          nowMs,
          onlyAnswerChangedBy(before !== undefined, execution.events),
        );
      for (const event of execution.events) this.pendingEvents.push(event);
      // An audited write that changed something stores its entry with the change.
      if (audit !== undefined && wrote && op.audit !== null) {
        const fields = op.audit(command);
        this.pendingAudits.push({
          ref: audit.ref,
          environment: command.environment,
          ...fields,
          actor: audit.actor,
          atMs: nowMs,
        });
      }
      const outcome = replyOutcomeOf(execution.outcome);
      const body = replyBodyOf(op, execution.outcome);
      const effect: AuditEffect = outcome === 'rejected' ? 'none' : wrote ? 'wrote' : 'unchanged';
      // The core says when a write command's answer is only a read (see Execution.isRead).
      if (execution.isRead === true) this.options.reply(id, outcome, body, effect);
      else this.pendingReplies.push(id, outcome, body, effect);
    }
    this.commitIfRoom();
    this.options.flush();
  }

  /**
   * Where the idempotency key of each write in the batch is kept (null for a command without
   * one), or null when none has a key; the store is told them all before any is decided
   * (`StoredKeys.readAhead`). A key's address depends on its command alone.
   */
  private keyAddressesOf(envelopes: readonly Envelope[]): Array<KeyAddress | null> | null {
    let addresses: Array<KeyAddress | null> | null = null;
    for (let at = 0; at < envelopes.length; at++) {
      const { command } = envelopes[at] as Envelope;
      if (isReadOf(OPS[command.op], command)) continue;
      const scope = idempotencyScope(command);
      if (scope === null) continue;
      addresses ??= new Array<KeyAddress | null>(envelopes.length).fill(null);
      addresses[at] = this.keys.address(
        command.environment,
        command.customerId,
        scopeDigest(scope),
      );
    }
    if (addresses !== null) this.keys.readAhead?.(addresses);
    return addresses;
  }

  /**
   * Publishes the customer's held `has` answers again, as its state now reads, unless the
   * write can change only the answer to `onlyKey` and none to it is held (PublishedViews).
   */
  private reanswerHas(
    environment: Environment,
    customerId: string,
    config: CompiledConfig,
    nowMs: number,
    onlyKey: string | null,
  ): void {
    const customer = this.customers[environment].get(customerId);
    this.options.views?.changed(
      environment,
      customerId,
      (key) => {
        const outcome = query(customer, config, { op: 'has', environment, customerId, key }, nowMs);
        return outcome.kind === 'has' ? outcome : null;
      },
      onlyKey,
    );
  }

  /**
   * Keeps the key of a keyed write that wrote events (at `atMs`, its events' time): in
   * memory now, on disk with the record whose event holds it (`carry`). A key not
   * found before is one more stored. It names its customer by `customerId`, the id as the
   * customer's state holds it when there is one: the keys in memory keep a reference to
   * their customer's id until sealed, and that one string lives anyway (the command's
   * copy would be one more string a key).
   */
  private rememberKey(
    address: KeyAddress,
    seen: IdempotencySeen | null,
    carry: IdempotencyRecord,
    atMs: number,
    customerId = address.customerId,
  ): void {
    assert(customerId === address.customerId, "a key's customer is its address's");
    const put: IdempotencyPut = {
      environment: address.environment,
      customerId,
      scopeDigest: address.scopeDigest,
      fingerprint: carry.fingerprint,
      atMs,
    };
    this.keys.remember(put);
    this.pendingKeys += 1;
    if (seen === null) this.idempotencyByEnvironment[address.environment] += 1;
  }

  /** Events decided but not yet handed to the journal (a snapshot must wait for none). */
  get hasPendingEvents(): boolean {
    return this.pendingEvents.length > 0;
  }

  /**
   * Calls `callback` once every event decided so far is durable: at once if nothing is
   * pending or in flight, else when the append that carries the last of them completes.
   */
  whenDurable(callback: () => void): void {
    const last = this.inFlight.at(-1);
    if (this.pendingEvents.length > 0) this.pendingWaiters.push(callback);
    else if (last !== undefined) last.waiters.push(callback);
    else callback();
  }

  /**
   * Starts the next group's append, unless APPENDS_IN_FLIGHT_MAX are in flight (the
   * group then waits for the oldest to complete) or nothing is pending (a batch of reads).
   * A group without events (rejections, replays) waits for the newest append in
   * flight, whose state its answers may have seen, or is released at once when nothing
   * is in flight.
   */
  private commitIfRoom(): void {
    assert(
      this.inFlight.length <= APPENDS_IN_FLIGHT_MAX,
      `${this.inFlight.length} appends in flight`,
    );
    if (this.inFlight.length === APPENDS_IN_FLIGHT_MAX) return;
    if (
      this.pendingEvents.length === 0 &&
      this.pendingReplies.length === 0 &&
      this.pendingWaiters.length === 0 &&
      this.pendingIndex.size === 0
    )
      return;
    const events = this.pendingEvents;
    const replies = this.pendingReplies;
    const waiters = this.pendingWaiters;
    const index = [...this.pendingIndex].map(
      (c): CustomerIndexEntry => ({ environment: c.environment, id: c.id, view: customerView(c) }),
    );
    const audits = this.pendingAudits;
    const keyed = this.pendingKeys;
    const notices = this.pendingNotices;
    this.pendingAudits = [];
    this.pendingKeys = 0;
    this.pendingNotices = [];
    this.pendingEvents = [];
    this.pendingReplies = [];
    this.pendingWaiters = [];
    this.pendingIndex = new Set();
    assert(replies.length % REPLY_SLOTS === 0, 'pending replies are whole');
    if (events.length === 0) {
      // Only a write with events creates or re-profiles a customer, or stores an audit entry.
      assert(
        index.length === 0 && audits.length === 0 && keyed === 0 && notices.length === 0,
        'a group without events changes no index row and stores no audit entry, key or event',
      );
      this.holdOrRelease(replies, waiters);
      return;
    }
    this.startAppend(events, index, audits, keyed, notices, replies, waiters);
  }

  /** A group without events: its answers wait for the newest append in flight, if any. */
  private holdOrRelease(replies: Array<number | string>, waiters: Array<() => void>): void {
    const last = this.inFlight.at(-1);
    if (last === undefined) {
      this.release(replies);
      for (const waiter of waiters) waiter();
      return;
    }
    for (const item of replies) last.replies.push(item);
    for (const waiter of waiters) last.waiters.push(waiter);
  }

  private startAppend(
    events: readonly Event[],
    index: readonly CustomerIndexEntry[],
    audits: readonly PendingAudit[],
    keyed: number,
    notices: readonly Notice[],
    replies: Array<number | string>,
    waiters: Array<() => void>,
  ): void {
    const { seq, durable } = this.options.journal.append(events, index, audits, keyed, notices);
    assert(seq > this.appendedSeq, `journal seq ${seq} after ${this.appendedSeq}`);
    this.appendedSeq = seq;
    const append: Append = { seq, replies, waiters, durable: false };
    this.inFlight.push(append);
    this.batchesSinceSnapshot++;
    this.eventsSinceSnapshot += events.length;
    durable.then(() => {
      assert(
        !append.durable && this.inFlight.includes(append),
        `append ${seq} became durable twice or after release`,
      );
      append.durable = true;
      this.releaseDurable();
      this.commitIfRoom();
      this.options.flush();
    }, this.options.fatal);
  }

  /** Releases, oldest first, every append that is durable and has no older one still pending. */
  private releaseDurable(): void {
    for (let head = this.inFlight[0]; head?.durable; head = this.inFlight[0]) {
      this.inFlight.shift();
      // Releasing in append order: every record older than this one is durable and released.
      assert(head.seq > this.releasedSeq, `append ${head.seq} released after ${this.releasedSeq}`);
      this.releasedSeq = head.seq;
      this.release(head.replies);
      for (const waiter of head.waiters) waiter();
    }
  }

  private release(held: ReadonlyArray<number | string>): void {
    assert(held.length % REPLY_SLOTS === 0, 'held replies are whole');
    for (let i = 0; i < held.length; i += REPLY_SLOTS) {
      this.options.reply(
        held[i] as number,
        held[i + 1] as ReplyOutcome,
        held[i + 2] as string,
        held[i + 3] as AuditEffect,
      );
    }
  }

  /** Recovery: folds journaled events into state; never decides, never journals. */
  replay(events: readonly Event[]): void {
    this.loadingSnapshot = false;
    for (const event of events) {
      const customers = this.customers[event.environment];
      assert(customers !== undefined, `event for unknown environment ${String(event.environment)}`);
      const before = customers.get(event.customerId);
      // apply changes a known customer in place, so only a new one needs storing.
      const after = apply(before, event);
      if (before === undefined) customers.set(after.id, after);
      if (event.atMs > this.lastNowMs) this.lastNowMs = event.atMs;
    }
  }

  snapshotItems(): CustomerSnapshot[] {
    return Array.from(this.allCustomers(), (customer) => toSnapshot(customer));
  }

  /**
   * Recovery: adds snapshot items (a whole snapshot, or one chunk of it at a time) to the
   * shard, before anything is replayed or decided. A customer present twice is a broken
   * snapshot: assertion failure.
   */
  loadSnapshot(items: readonly CustomerSnapshot[]): void {
    assert(this.loadingSnapshot, 'a snapshot loads before anything is replayed or decided');
    for (const item of items) {
      const customer = fromSnapshot(item);
      const customers = this.customers[customer.environment];
      const sizeBefore = customers.size; // cheaper than has() then set(): one hash lookup
      customers.set(customer.id, customer);
      assert(
        customers.size === sizeBefore + 1,
        `snapshot holds customer ${customer.environment}/${customer.id} twice`,
      );
      for (const meter of customer.meters.values())
        if (meter.periodStartMs > this.lastNowMs) this.lastNowMs = meter.periodStartMs;
    }
  }
}
