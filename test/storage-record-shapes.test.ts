/**
 * A ShardStore opened with record shapes checks every event, snapshot item and audit
 * entry it reads back, and refuses one of the wrong shape as corrupt; the shard worker's
 * shapes (the core's event and snapshot item, the protocol's audit entry) accept what the
 * shard writes.
 */
import { describe, expect, it } from 'vitest';
import { isCustomerSnapshot, isEvent } from '../actors/core/shapes.js';
import { newCustomer, toSnapshot, type Event } from '../actors/customer.js';
import { isPendingAudit, type PendingAudit } from '../actors/protocol.js';
import { ShardStore } from '../storage/journal.js';
import { storeFixture } from './support/store-fixture.js';

const SHAPES = { isEvent, isSnapshotItem: isCustomerSnapshot, isAudit: isPendingAudit };
const { tempDir, openStore, closeStore } = storeFixture('tally-shapes-', (dir) =>
  ShardStore.open(dir, SHAPES),
);
const untyped = storeFixture('tally-shapes-untyped-', (dir) => ShardStore.open(dir));

const EVENT: Event = {
  type: 'lotGranted',
  environment: 'test',
  customerId: 'c1',
  key: 'api_calls',
  atMs: 1,
  lotId: 'lot1',
  micros: 5n,
};
const AUDIT: PendingAudit = {
  ref: 'r1',
  environment: 'test',
  action: 'contract.delete',
  resourceType: 'contract',
  resourceId: 'c1',
  actor: 'key_1',
  data: {},
  atMs: 1,
};

describe('record shapes', () => {
  it('accepts the records the shard writes', async () => {
    const dir = tempDir();
    const store = openStore(dir);
    await store.append([EVENT], [], [AUDIT]).durable;
    await store.writeSnapshot(1, [toSnapshot(newCustomer('live', 'c2', 1))]);
    await store.append([EVENT]).durable;
    await closeStore(store);
    const reopened = openStore(dir);
    const replayed: unknown[] = [];
    reopened.replay(1, (_seq, events) => replayed.push(...events));
    expect(replayed).toEqual([EVENT]);
    expect(reopened.loadSnapshot()?.items.map((item) => item.id)).toEqual(['c2']);
    expect(reopened.pendingAudits()).toEqual([AUDIT]);
  });

  it('refuses an event, a snapshot item or an audit entry of the wrong shape', async () => {
    const dir = untyped.tempDir();
    const raw = untyped.openStore(dir);
    await raw.append([EVENT]).durable;
    const badAudit = { ref: 'r2', actor: 7 };
    await raw.append(
      [{ type: 'consumed', environment: 'staging', customerId: 'c1' }],
      [],
      [badAudit],
    ).durable;
    await raw.writeSnapshot(1, [{ id: 'c3' }]);
    await untyped.closeStore(raw);
    const typed = openStore(dir);
    expect(() => typed.replay(1, () => undefined)).toThrow(
      /journal is corrupt at seq 2 \(an event of the wrong shape\)/,
    );
    expect(() => typed.loadSnapshot()).toThrow(/chunk 1 holds an item of the wrong shape/);
    expect(() => typed.pendingAudits()).toThrow(/pending audit r2 is corrupt/);
  });
});
