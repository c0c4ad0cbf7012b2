/**
 * Unit tests of the shard's reply discipline, audit hand-off and snapshot loading, over a
 * minimal in-memory journal whose syncs the test triggers. The seeded fault simulation
 * of the shard (out-of-order and failing syncs, crashes, recovery, checked against the
 * reference model) is test/durability-simulation.test.ts.
 */
import { describe, expect, it } from 'vitest';
import type { CustomerSnapshot, Event } from '../actors/customer.js';
import type { Envelope } from '../actors/protocol.js';
import { Shard, type ShardJournal } from '../actors/shard.js';
import { CONFIG, T0, throughCodec } from './support/core-fixtures.js';

interface SimRecord {
  readonly seq: number;
  readonly events: readonly Event[];
  durable: boolean;
  readonly resolve: () => void;
}

/** An in-memory journal: appends are pending until the test syncs them. */
class SimDisk {
  records: SimRecord[] = [];

  journal(): ShardJournal {
    return {
      append: (events) => {
        let resolve!: () => void;
        const durable = new Promise<void>((r) => (resolve = r));
        const seq = (this.records.at(-1)?.seq ?? 0) + 1;
        this.records.push({ seq, events: throughCodec(events), durable: false, resolve });
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
}

describe('shard replies', () => {
  it(
    'answers a context that changed nothing at once, and one that created the customer only ' +
      'when durable',
    async () => {
      const disk = new SimDisk();
      const replies: number[] = [];
      const shard = new Shard({
        journal: disk.journal(),
        clock: () => T0,
        reply: (id) => replies.push(id),
        flush: () => undefined,
        fatal: (e) => {
          throw e;
        },
      });
      shard.setConfig('test', 1, CONFIG);
      const context = {
        op: 'context',
        environment: 'test',
        customerId: 'ctx',
        key: '',
        patch: {},
        request: { features: ['sso'], usage: [], limits: [] },
      } as const;
      shard.handleBatch([{ id: 1, command: context }]);
      expect(replies).toEqual([]); // it created the customer: a journal write is pending
      shard.handleBatch([{ id: 2, command: context }]);
      expect(replies).toEqual([2]); // nothing changed: a read, answered without waiting
      disk.sync();
      await new Promise((resolve) => setImmediate(resolve));
      expect(replies).toEqual([2, 1]);
    },
  );
});

describe('audited writes', () => {
  it(
    'hand their audit entry to the journal with the change, ' + 'and only when something changed',
    () => {
      const appended: unknown[][] = [];
      const journal: ShardJournal = {
        append: (_events, _index, audits) => {
          appended.push([...audits]);
          return { seq: appended.length, durable: new Promise<void>(() => undefined) };
        },
      };
      const shard = new Shard({
        journal,
        clock: () => T0,
        reply: () => undefined,
        flush: () => undefined,
        fatal: (e) => {
          throw e;
        },
      });
      shard.setConfig('test', 1, CONFIG);
      const upsert = {
        op: 'upsertCustomer',
        environment: 'test',
        customerId: 'aud',
        key: '',
        patch: { name: 'A' },
      } as const;
      shard.handleBatch([{ id: 1, command: upsert, audit: { ref: 'r1', actor: 'key_1' } }]);
      expect(appended).toEqual([
        [
          {
            ref: 'r1',
            environment: 'test',
            action: 'customer.upsert',
            resourceType: 'customer',
            resourceId: 'aud',
            actor: 'key_1',
            data: { name: 'A' },
            atMs: T0,
          },
        ],
      ]);
      // The same profile again changes nothing: no record, so no stored entry.
      shard.handleBatch([{ id: 2, command: upsert, audit: { ref: 'r2', actor: 'key_1' } }]);
      expect(appended).toHaveLength(1);
    },
  );
});

describe('shard recovery', () => {
  const newShard = (disk = new SimDisk()): Shard => {
    const shard = new Shard({
      journal: disk.journal(),
      clock: () => T0,
      reply: () => undefined,
      flush: () => undefined,
      fatal: (e) => {
        throw e;
      },
    });
    shard.setConfig('test', 1, CONFIG);
    shard.setConfig('live', 1, CONFIG);
    return shard;
  };
  const consume = (environment: 'test' | 'live', customerId: string): Envelope['command'] => ({
    op: 'consume',
    environment,
    customerId,
    key: 'api_calls',
    amountMicros: 1_000_000n,
  });
  const sortedItems = (shard: Shard): CustomerSnapshot[] =>
    shard
      .snapshotItems()
      .sort((x, y) => (`${x.environment}/${x.id}` < `${y.environment}/${y.id}` ? -1 : 1));

  it(
    'loads a snapshot chunk by chunk, refuses a customer twice, and refuses a snapshot ' +
      'after replay',
    () => {
      const live = newShard();
      live.handleBatch(
        ['a', 'b', 'c', 'd'].map((id, i) => ({
          id: i,
          command: consume(i % 2 === 0 ? 'test' : 'live', id),
        })),
      );
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
    },
  );
});
