/**
 * The op → event table (actors/webhook-events.ts), driven through the real shard with an
 * in-memory journal: which writes emit which events, table-driven, and that the events ride
 * on the very append that journals their change (none on a refused or repeated write).
 */
import { describe, expect, it } from 'vitest';
import { compileConfig } from '../actors/billing-config.js';
import type { Event, WriteCommand } from '../actors/customer.js';
import { Shard, type ShardJournal } from '../actors/shard.js';
import { EVENTS_OF_OP, type Notice } from '../actors/webhook-events.js';
import { EVENT_KINDS } from '../shared/event-kinds.js';
import { CONFIG, T0 } from './support/core-fixtures.js';

interface Appended {
  readonly events: readonly Event[];
  readonly notices: readonly Notice[];
}

/** A shard over an in-memory journal whose appends are durable at once. */
function shard() {
  const appends: Appended[] = [];
  const journal: ShardJournal = {
    append: (events, _index, _audits, notices) => {
      appends.push({ events, notices });
      return { seq: appends.length, durable: Promise.resolve() };
    },
  };
  const s = new Shard({
    journal,
    clock: () => T0,
    reply: () => undefined,
    flush: () => undefined,
    fatal: (error) => {
      throw error;
    },
  });
  s.setConfig('test', 1, CONFIG);
  let id = 0;
  /** The append the command caused, if any. */
  const run = (command: WriteCommand): Appended | undefined => {
    const before = appends.length;
    s.handleBatch([{ id: id++, command }]);
    return appends.length > before ? appends.at(-1) : undefined;
  };
  return { run, appends };
}

const at = { environment: 'test', customerId: 'c1' } as const;
const types = (appended: Appended | undefined) => appended?.notices.map((n) => n.type) ?? [];

describe('the op → event table', () => {
  it('names only known kinds', () => {
    for (const rule of Object.values(EVENTS_OF_OP))
      for (const kind of rule?.kinds ?? []) expect(EVENT_KINDS).toContain(kind);
    expect(compileConfig(CONFIG, 1).entitlements.size).toBeGreaterThan(0);
  });

  it.each([
    [
      'an upsert that creates the customer',
      [{ op: 'upsertCustomer', ...at, key: '', patch: { name: 'A' } }],
      ['customer.created'],
    ],
    [
      'an upsert that changes the profile',
      [
        { op: 'upsertCustomer', ...at, key: '', patch: { name: 'A' } },
        { op: 'upsertCustomer', ...at, key: '', patch: { name: 'B' } },
      ],
      ['customer.updated'],
    ],
    [
      'an upsert repeating the profile',
      [
        { op: 'upsertCustomer', ...at, key: '', patch: { name: 'A' } },
        { op: 'upsertCustomer', ...at, key: '', patch: { name: 'A' } },
      ],
      [],
    ],
    [
      'a consume that creates the customer',
      [{ op: 'consume', ...at, key: 'tokens', amountMicros: 1_000_000n }],
      ['customer.created'],
    ],
    [
      'a consume that empties the balance',
      [
        { op: 'consume', ...at, key: 'tokens', amountMicros: 999_000_000n },
        { op: 'consume', ...at, key: 'tokens', amountMicros: 1_000_000n },
      ],
      ['usage.exhausted'],
    ],
    [
      'a consume drawn from overage alone',
      [
        { op: 'usageSettings', ...at, key: 'api_calls', overageEnabled: true },
        { op: 'consume', ...at, key: 'api_calls', amountMicros: 100_000_000n },
        { op: 'consume', ...at, key: 'api_calls', amountMicros: 5_000_000n },
      ],
      [],
    ],
    [
      'a settings change',
      [
        { op: 'upsertCustomer', ...at, key: '', patch: { name: 'A' } },
        { op: 'usageSettings', ...at, key: 'api_calls', overageEnabled: true },
      ],
      [],
    ],
  ] as Array<[string, WriteCommand[], string[]]>)('%s', (_what, commands, expected) => {
    const { run } = shard();
    let last: Appended | undefined;
    for (const command of commands) last = run(command);
    expect(types(last)).toEqual(expected);
  });

  it('a refused consume emits nothing, and the emptying one emits once', () => {
    const { run, appends } = shard();
    run({ op: 'consume', ...at, key: 'tokens', amountMicros: 1000_000_000n });
    const refused = run({ op: 'consume', ...at, key: 'tokens', amountMicros: 1_000_000n });
    expect(refused).toBeUndefined();
    expect(types(appends.at(-1))).toEqual(['customer.created', 'usage.exhausted']);
    const exhausted = appends.at(-1)?.notices[1];
    expect(exhausted).toMatchObject({
      environment: 'test',
      customerId: 'c1',
      atMs: T0,
      data: { customerId: 'c1', key: 'tokens', balance: { balance: 0, consumed: 1000 } },
    });
  });

  it('the events ride on the append that journals their change', () => {
    const { run } = shard();
    const appended = run({ op: 'upsertCustomer', ...at, key: '', patch: { name: 'A' } });
    expect(appended?.events.map((e) => e.type)).toEqual(['customerUpserted']);
    expect(appended?.notices).toHaveLength(1);
  });
});
