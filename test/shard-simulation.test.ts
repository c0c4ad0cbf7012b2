/**
 * The shard under a seeded simulation: random batches of commands against the real
 * `Shard` code, with a fake clock, a journal whose fsyncs the simulator controls, random
 * snapshots, and crashes that lose everything not yet durable. Checks that:
 *  - no write's reply is released before its journal record is durable (reads are
 *    answered at once);
 *  - recovery (snapshot + replay) rebuilds exactly the live state as of the last durable
 *    record;
 *  - a retried idempotent command after a restart is not applied again.
 * A failure prints the seed; SIM_SEED=<n> replays it.
 */
import { describe, expect, it } from 'vitest';
import type { Command, CustomerSnapshot, Event } from '../actors/customer.js';
import { parseAmount } from '../actors/fixed.js';
import { IDEMPOTENCY_RETENTION_MS } from '../shared/limits.js';
import type { Envelope } from '../actors/protocol.js';
import { Shard, type ShardJournal } from '../actors/shard.js';
import { CONFIG, T0, throughCodec } from './support/core-fixtures.js';

/** mulberry32: tiny, fast, good enough to drive a simulation deterministically. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface SimRecord {
  readonly seq: number;
  readonly events: readonly Event[];
  durable: boolean;
  readonly resolve: () => void;
}

/** An in-memory journal: appends are pending until the simulator syncs them. */
class SimDisk {
  records: SimRecord[] = [];
  snapshot: { seq: number; items: CustomerSnapshot[] } | null = null;
  /** Called after each append, so the simulator can note the state that record completes. */
  onAppend: (seq: number) => void = () => undefined;

  journal(): ShardJournal {
    return {
      append: (events) => {
        let resolve!: () => void;
        const durable = new Promise<void>((r) => (resolve = r));
        const seq = (this.records.at(-1)?.seq ?? this.snapshot?.seq ?? 0) + 1;
        this.records.push({ seq, events: throughCodec(events), durable: false, resolve });
        this.onAppend(seq);
        return { seq, durable };
      },
    };
  }

  /** fsync: everything appended so far becomes durable, in order. */
  sync(): void {
    for (const record of this.records) {
      if (!record.durable) {
        record.durable = true;
        record.resolve();
      }
    }
  }

  lastSeq(): number {
    return this.records.at(-1)?.seq ?? this.snapshot?.seq ?? 0;
  }

  lastDurableSeq(): number {
    return this.records.filter((r) => r.durable).at(-1)?.seq ?? this.snapshot?.seq ?? 0;
  }

  /** A machine crash: whatever was not synced is gone. */
  crash(): void {
    this.records = this.records.filter((r) => r.durable);
  }
}

const METERS = ['api_calls', 'tokens', 'storage', 'exports'];
const CUSTOMERS = ['a', 'b', 'c', 'd'];

function randomCommand(rand: () => number, n: number): Command {
  const pick = <T,>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)] as T;
  const base = { environment: pick(['test', 'live'] as const), customerId: pick(CUSTOMERS), key: pick(METERS) };
  const amount = parseAmount(Math.round(rand() * 150_000) / 1000);
  const amountMicros = amount.ok ? amount.micros : 1n;
  const idem = rand() < 0.5 ? { idempotencyKey: `k${Math.floor(rand() * 20)}` } : {};
  const r = rand();
  if (r < 0.35) return { op: 'consume', ...base, amountMicros, ...idem };
  if (r < 0.55) return { op: 'refund', ...base, amountMicros, ...idem };
  if (r < 0.62) return { op: 'usageSettings', ...base, overageEnabled: rand() < 0.5 };
  if (r < 0.7) return { op: 'grantLot', ...base, lotId: `lot${n % 7}`, amountMicros };
  if (r < 0.75) return { op: 'limitSettings', ...base, key: 'seats', purchased: Math.floor(rand() * 5) };
  if (r < 0.77) {
    return { op: 'putContract', ...base, key: '', contract: { priceAmount: 100, priceInterval: 'month', entitlements: { [base.key]: { included: Math.floor(rand() * 100) } } } };
  }
  if (r < 0.78) return { op: 'deleteContract', ...base, key: '' };
  return { op: pick(['has', 'balance'] as const), ...base };
}

function snapshotOf(shard: Shard): string {
  const items = shard.snapshotItems().sort((x, y) => (`${x.environment}/${x.id}` < `${y.environment}/${y.id}` ? -1 : 1));
  return JSON.stringify(items, (_k, v: unknown) => (typeof v === 'bigint' ? `${v}n` : v));
}

async function simulate(seed: number, steps: number): Promise<void> {
  const rand = rng(seed);
  const disk = new SimDisk();
  let nowMs = T0;
  let nextId = 1;
  const writeIds = new Set<number>();
  const replies = new Map<number, string>();
  const stateAfterSeq = new Map<number, string>([[0, '[]']]);
  /** Model of the idempotency cache: scope → when its entry was written (by decision time). */
  const idempotencyModel = new Map<string, { command: Command; atMs: number }>();
  const decidedAt = new Map<number, number>();
  /** Write id → last journal seq once its batch was decided (see the write-ahead check). */
  const requiredSeq = new Map<number, number>();
  const decide = (batch: Envelope[]): void => {
    shard.handleBatch(batch);
    const seq = disk.lastSeq();
    for (const { id } of batch) if (writeIds.has(id) && !replies.has(id)) requiredSeq.set(id, seq);
  };
  const sent = new Map<number, Command>();

  const boot = (): Shard => {
    const shard = new Shard({
      journal: disk.journal(),
      clock: () => nowMs,
      reply: (id, outcome, body) => {
        // The write-ahead rule, checked at the moment a reply leaves the shard: every record
        // that existed once the write's batch was decided (the state it saw, and the record
        // its own events went into) is durable. Later records may still be in flight.
        if (writeIds.has(id)) {
          const required = requiredSeq.get(id) ?? disk.lastSeq();
          expect(disk.records.every((r) => r.durable || r.seq > required), `reply ${id} before record ${required} was durable`).toBe(true);
        }
        replies.set(id, body);
        const command = sent.get(id);
        if (outcome === 'ok' && command !== undefined && 'idempotencyKey' in command) {
          const scope = `${command.environment}/${command.customerId}/${command.op}/${command.key}/${String(command.idempotencyKey)}`;
          const atMs = decidedAt.get(id) ?? 0;
          const entry = idempotencyModel.get(scope);
          if (entry === undefined || entry.atMs <= atMs - IDEMPOTENCY_RETENTION_MS) idempotencyModel.set(scope, { command, atMs });
        }
      },
      flush: () => undefined,
      fatal: (error) => {
        throw error;
      },
    });
    shard.setConfig('test', 1, CONFIG);
    shard.setConfig('live', 1, CONFIG);
    if (disk.snapshot !== null) shard.loadSnapshot(disk.snapshot.items);
    for (const record of disk.records) if (record.seq > (disk.snapshot?.seq ?? 0)) shard.replay(record.events);
    return shard;
  };

  let shard = boot();
  // An append carries every event decided so far (group commit), so the live state at
  // that moment is exactly what recovery must rebuild from records up to it.
  disk.onAppend = (seq) => stateAfterSeq.set(seq, snapshotOf(shard));
  for (let step = 0; step < steps; step++) {
    const roll = rand();
    nowMs += rand() < 0.05 ? Math.floor(rand() * 20 * 86_400_000) : Math.floor(rand() * 1000);
    if (roll < 0.6) {
      const envelopes: Envelope[] = [];
      const size = 1 + Math.floor(rand() * 8);
      for (let i = 0; i < size; i++) {
        const command = randomCommand(rand, step);
        const id = nextId++;
        sent.set(id, command);
        decidedAt.set(id, nowMs);
        if (command.op !== 'has' && command.op !== 'balance') writeIds.add(id);
        envelopes.push({ id, command });
      }
      decide(envelopes);
    } else if (roll < 0.8) {
      disk.sync();
      await new Promise((resolve) => setImmediate(resolve));
    } else if (roll < 0.85) {
      disk.sync();
      await new Promise((resolve) => setImmediate(resolve));
      // Snapshot only a quiescent shard: everything decided is in a durable record.
      if (disk.records.every((r) => r.durable) && !shard.hasPendingEvents) {
        const seq = disk.lastDurableSeq();
        disk.snapshot = { seq, items: throughCodec(shard.snapshotItems()) };
        disk.records = disk.records.filter((r) => r.seq > seq);
      }
    } else if (roll < 0.92) {
      disk.crash();
      shard = boot();
      const recoveredSeq = disk.lastDurableSeq();
      expect(snapshotOf(shard)).toBe(stateAfterSeq.get(recoveredSeq));
      // Retrying acknowledged idempotent commands (within the 24 h retention) changes nothing.
      const before = snapshotOf(shard);
      const retries = [...idempotencyModel.values()]
        .filter((acked) => acked.atMs > nowMs - IDEMPOTENCY_RETENTION_MS + 1000)
        .slice(-5)
        .map(({ command }) => ({ id: nextId++, command }));
      for (const r of retries) writeIds.add(r.id);
      nowMs += 1;
      decide(retries);
      expect(disk.records.filter((r) => !r.durable).map((r) => r.events), JSON.stringify(retries, (_k, v: unknown) => (typeof v === "bigint" ? `${v}n` : v))).toHaveLength(0);
      expect(snapshotOf(shard)).toBe(before);
    }
    // The running count (metrics read it) never drifts from the customers' caches, through
    // writes, replays after crashes and snapshot loads.
    expect(shard.idempotencyEntries).toBe(idempotencyEntriesByWalk(shard));
  }
}

function idempotencyEntriesByWalk(shard: Shard): number {
  let entries = 0;
  for (const customer of shard.allCustomers()) entries += customer.idempotency?.size ?? 0;
  return entries;
}

describe('shard simulation', () => {
  const seeds = process.env['SIM_SEED'] !== undefined ? [Number(process.env['SIM_SEED'])] : Array.from({ length: 40 }, (_, i) => 1000 + i * 7919);
  it.each(seeds)('seed %i', async (seed) => {
    try {
      await simulate(seed, 400);
    } catch (error) {
      process.stderr.write(`shard simulation failed; replay with SIM_SEED=${seed}\n`);
      throw error;
    }
  });
});

describe('shard replies', () => {
  it('answers a context that changed nothing at once, and one that created the customer only when durable', async () => {
    const disk = new SimDisk();
    const replies: number[] = [];
    const shard = new Shard({ journal: disk.journal(), clock: () => T0, reply: (id) => replies.push(id), flush: () => undefined, fatal: (e) => { throw e; } });
    shard.setConfig('test', 1, CONFIG);
    const context = { op: 'context', environment: 'test', customerId: 'ctx', key: '', patch: {}, request: { features: ['sso'], usage: [], limits: [] } } as const;
    shard.handleBatch([{ id: 1, command: context }]);
    expect(replies).toEqual([]); // it created the customer: a journal write is pending
    shard.handleBatch([{ id: 2, command: context }]);
    expect(replies).toEqual([2]); // nothing changed: a read, answered without waiting
    disk.sync();
    await new Promise((resolve) => setImmediate(resolve));
    expect(replies).toEqual([2, 1]);
  });
});

describe('audited writes', () => {
  it("hand their audit entry to the journal with the change, and only when something changed", () => {
    const appended: unknown[][] = [];
    const journal: ShardJournal = {
      append: (_events, _index, audits) => {
        appended.push([...audits]);
        return { seq: appended.length, durable: new Promise<void>(() => undefined) };
      },
    };
    const shard = new Shard({ journal, clock: () => T0, reply: () => undefined, flush: () => undefined, fatal: (e) => { throw e; } });
    shard.setConfig('test', 1, CONFIG);
    const upsert = { op: 'upsertCustomer', environment: 'test', customerId: 'aud', key: '', patch: { name: 'A' } } as const;
    shard.handleBatch([{ id: 1, command: upsert, audit: { ref: 'r1', actor: 'key_1' } }]);
    expect(appended).toEqual([
      [{ ref: 'r1', environment: 'test', action: 'customer.upsert', resourceType: 'customer', resourceId: 'aud', actor: 'key_1', data: { name: 'A' }, atMs: T0 }],
    ]);
    // The same profile again changes nothing: no record, so no stored entry.
    shard.handleBatch([{ id: 2, command: upsert, audit: { ref: 'r2', actor: 'key_1' } }]);
    expect(appended).toHaveLength(1);
  });
});

describe('shard recovery', () => {
  const newShard = (disk = new SimDisk()): Shard => {
    const shard = new Shard({ journal: disk.journal(), clock: () => T0, reply: () => undefined, flush: () => undefined, fatal: (e) => { throw e; } });
    shard.setConfig('test', 1, CONFIG);
    shard.setConfig('live', 1, CONFIG);
    return shard;
  };
  const consume = (environment: 'test' | 'live', customerId: string): Envelope['command'] => ({
    op: 'consume', environment, customerId, key: 'api_calls', amountMicros: 1_000_000n,
  });
  const sortedItems = (shard: Shard): CustomerSnapshot[] =>
    shard.snapshotItems().sort((x, y) => (`${x.environment}/${x.id}` < `${y.environment}/${y.id}` ? -1 : 1));

  it('loads a snapshot chunk by chunk, refuses a customer twice, and refuses a snapshot after replay', () => {
    const live = newShard();
    live.handleBatch(['a', 'b', 'c', 'd'].map((id, i) => ({ id: i, command: consume(i % 2 === 0 ? 'test' : 'live', id) })));
    const items = structuredClone(live.snapshotItems());
    expect(items).toHaveLength(4);

    const chunked = newShard();
    chunked.loadSnapshot(items.slice(0, 3));
    chunked.loadSnapshot(items.slice(3));
    expect(chunked.customerCount).toBe(4);
    expect(sortedItems(chunked)).toEqual(sortedItems(live));

    const twice = newShard();
    twice.loadSnapshot(items.slice(0, 2));
    expect(() => twice.loadSnapshot(items.slice(1, 3))).toThrow(/twice/);

    const replayed = newShard();
    replayed.replay([]);
    expect(() => replayed.loadSnapshot(items)).toThrow(/before anything is replayed/);
  });
});
