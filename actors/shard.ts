/**
 * A shard: the customers one worker owns, and the write-ahead discipline around the
 * pure core.
 *
 * `handleBatch` decides every command of a batch against in-memory state, appends the
 * batch's events to the journal as one record, and releases the replies of its writes
 * only when that record is durable. Reads answer at once from memory and never wait
 * for disk. A write that produced no event (a rejection or an idempotent replay) still
 * waits for the journal writes before it, because its answer was computed from state
 * that may not be durable yet. The journal and the clock are injected, so the seeded
 * simulation runs this exact code without threads or disk.
 */
import { assert } from './assert.js';
import { compileConfig, EMPTY_CONFIG, type BillingConfig, type CompiledConfig } from './billing-config.js';
import {
  apply,
  execute,
  fromSnapshot,
  query,
  toSnapshot,
  type Command,
  type CustomerSnapshot,
  type CustomerState,
  type Environment,
  type Event,
  type ReadCommand,
} from './customer.js';
import type { Envelope } from './protocol.js';
import { renderOutcome } from './render.js';

export interface ShardJournal {
  /** Appends one record; `durable` settles once it is on disk (rejects: the shard must crash). */
  append(events: readonly Event[]): { readonly seq: number; readonly durable: Promise<void> };
}

export interface ShardOptions {
  readonly journal: ShardJournal;
  readonly clock: () => number;
  /** Receives each rendered reply; the worker shell coalesces them into one message a turn. */
  readonly reply: (id: number, status: number, body: string) => void;
  /** Called when a journal write fails: the shell must crash the worker. */
  readonly fatal: (error: unknown) => void;
}

export function customerKeyOf(environment: Environment, customerId: string): string {
  return `${environment}\u0000${customerId}`;
}

function isRead(command: Command): command is ReadCommand {
  return command.op === 'has' || command.op === 'limit' || command.op === 'balance';
}

export class Shard {
  readonly customers = new Map<string, CustomerState>();
  private readonly configs = new Map<Environment, CompiledConfig>();
  private lastDurable: Promise<void> = Promise.resolve();
  private lastNowMs = 0;
  /** Journal records appended since the shard last snapshotted. */
  batchesSinceSnapshot = 0;

  constructor(private readonly options: ShardOptions) {}

  setConfig(environment: Environment, version: number, config: BillingConfig): void {
    const current = this.configs.get(environment);
    if (current !== undefined && current.version >= version) return;
    this.configs.set(environment, compileConfig(config, version));
  }

  configVersion(environment: Environment): number {
    return this.configs.get(environment)?.version ?? 0;
  }

  /** The clock never runs backwards inside a shard, even if the wall clock does. */
  private now(): number {
    this.lastNowMs = Math.max(this.lastNowMs, this.options.clock());
    return this.lastNowMs;
  }

  handleBatch(envelopes: readonly Envelope[]): void {
    const nowMs = this.now();
    const events: Event[] = [];
    const held: Array<number | string> = [];
    for (const { id, command } of envelopes) {
      const key = customerKeyOf(command.environment, command.customerId);
      const config = this.configs.get(command.environment) ?? EMPTY_CONFIG;
      if (isRead(command)) {
        const rendered = renderOutcome(query(this.customers.get(key), config, command, nowMs));
        this.options.reply(id, rendered.status, rendered.body);
        continue;
      }
      const execution = execute(this.customers.get(key), config, command, nowMs);
      if (execution.customer !== undefined) this.customers.set(key, execution.customer);
      for (const event of execution.events) events.push(event);
      const rendered = renderOutcome(execution.outcome);
      held.push(id, rendered.status, rendered.body);
    }
    if (held.length === 0) return;
    if (events.length > 0) {
      this.lastDurable = this.options.journal.append(events).durable;
      this.batchesSinceSnapshot++;
    }
    this.lastDurable.then(() => this.release(held), this.options.fatal);
  }

  private release(held: ReadonlyArray<number | string>): void {
    for (let i = 0; i < held.length; i += 3) {
      this.options.reply(held[i] as number, held[i + 1] as number, held[i + 2] as string);
    }
  }

  /** Recovery: folds journaled events into state; never decides, never journals. */
  replay(events: readonly Event[]): void {
    for (const event of events) {
      const key = customerKeyOf(event.environment, event.customerId);
      this.customers.set(key, apply(this.customers.get(key), event));
      this.lastNowMs = Math.max(this.lastNowMs, event.atMs);
    }
  }

  snapshotItems(): CustomerSnapshot[] {
    const items: CustomerSnapshot[] = [];
    for (const customer of this.customers.values()) items.push(toSnapshot(customer));
    return items;
  }

  loadSnapshot(items: readonly CustomerSnapshot[]): void {
    assert(this.customers.size === 0, 'snapshot loads into an empty shard');
    for (const item of items) {
      const customer = fromSnapshot(item);
      this.customers.set(customerKeyOf(customer.environment, customer.id), customer);
      for (const meter of customer.meters.values()) this.lastNowMs = Math.max(this.lastNowMs, meter.periodStartMs);
    }
  }
}
