/**
 * ControlStore against a real LMDB environment: keys, versioned configs and metadata
 * persist across reopen; configs are per environment and latest-version-wins.
 */
import { join } from 'node:path';
import { describe, it, expect } from 'vitest';
import { ControlStore, type KeyRecord } from '../storage/control-store.js';
import { openDurableEnv } from '../storage/lmdb-env.js';
import { storeFixture } from './support/store-fixture.js';

const { tempDir, openStore, closeStore } = storeFixture('tally-control-', (dir) =>
  ControlStore.open(dir),
);

function key(id: string, overrides: Partial<KeyRecord> = {}): KeyRecord {
  return {
    id,
    prefix: `tk_${id}`,
    hashHex: 'ab'.repeat(32),
    environment: 'test',
    keyClass: 'server',
    createdAtMs: 1_700_000_000_000,
    revokedAtMs: null,
    ...overrides,
  };
}

describe('ControlStore', () => {
  it('persists keys across reopen, ordered by id, and replaces a key by id', async () => {
    const dataDir = tempDir();
    const store = openStore(dataDir);
    expect(store.listKeys()).toEqual([]);
    await store.putKey(key('k2', { environment: 'live', keyClass: 'client' }));
    await store.putKey(key('k1'));
    await store.putKey(key('admin', { environment: null, keyClass: 'admin' }));
    await store.putKey(key('k1', { revokedAtMs: 1_700_000_000_500 }));
    await closeStore(store);

    const reopened = openStore(dataDir);
    expect(reopened.listKeys()).toEqual([
      key('admin', { environment: null, keyClass: 'admin' }),
      key('k1', { revokedAtMs: 1_700_000_000_500 }),
      key('k2', { environment: 'live', keyClass: 'client' }),
    ]);
  });

  it('keeps every config version and returns the highest per environment', async () => {
    const dataDir = tempDir();
    const store = openStore(dataDir);
    expect(store.latestConfig('test')).toBeNull();
    expect(store.latestConfigVersion('test')).toBe(0);
    await store.putConfig('test', { version: 1, pushedAtMs: 10, config: { plan: 'a' } });
    await store.putConfig('test', {
      version: 2,
      pushedAtMs: 20,
      config: { plan: 'b', priceMinor: 5n },
    });
    await store.putConfig('live', { version: 9, pushedAtMs: 30, config: { plan: 'live' } });
    await store.putConfig('test', { version: 10, pushedAtMs: 40, config: { plan: 'c' } });
    await closeStore(store);

    const reopened = openStore(dataDir);
    expect(reopened.latestConfig('test')).toEqual({
      version: 10,
      pushedAtMs: 40,
      config: { plan: 'c' },
    });
    expect(reopened.latestConfig('live')).toEqual({
      version: 9,
      pushedAtMs: 30,
      config: { plan: 'live' },
    });
    expect([reopened.latestConfigVersion('test'), reopened.latestConfigVersion('live')]).toEqual([
      10, 9,
    ]);
    await closeStore(reopened);

    const env = openDurableEnv(join(dataDir, 'control'), ['configs']);
    expect(Array.from(env.dbs.configs.getKeys({}))).toEqual([
      ['live', 9],
      ['test', 1],
      ['test', 2],
      ['test', 10],
    ]);
    await env.root.close();
  });

  it("keeps environments apart: one environment never sees the other's config", async () => {
    const store = openStore(tempDir());
    await store.putConfig('live', { version: 3, pushedAtMs: 1, config: 'live-only' });
    expect(store.latestConfig('test')).toBeNull();
    await store.putConfig('test', { version: 1, pushedAtMs: 2, config: 'test-only' });
    expect(store.latestConfig('live')?.config).toBe('live-only');
    expect(store.latestConfig('test')?.config).toBe('test-only');
  });

  it('refuses to overwrite an existing config version', async () => {
    const store = openStore(tempDir());
    await store.putConfig('test', { version: 1, pushedAtMs: 1, config: 'first' });
    await expect(
      store.putConfig('test', { version: 1, pushedAtMs: 2, config: 'second' }),
    ).rejects.toThrow(/version 1 for test already exists/);
    expect(store.latestConfig('test')?.config).toBe('first');
  });

  it('persists metadata across reopen', async () => {
    const dataDir = tempDir();
    const store = openStore(dataDir);
    expect(store.getMeta('bootCount')).toBeUndefined();
    await store.putMeta('bootCount', 3n);
    await store.putMeta('owner', { shards: [0, 1] });
    await closeStore(store);
    const reopened = openStore(dataDir);
    expect(reopened.getMeta('bootCount')).toBe(3n);
    expect(reopened.getMeta('owner')).toEqual({ shards: [0, 1] });
  });

  it('throws on a corrupt stored key record', async () => {
    const dataDir = tempDir();
    const store = openStore(dataDir);
    await store.putKey(key('k1'));
    await closeStore(store);
    const env = openDurableEnv(join(dataDir, 'control'), ['keys']);
    env.dbs.keys.putSync('k1', Buffer.from('garbage bytes'));
    await env.root.close();
    expect(() => openStore(dataDir).listKeys()).toThrow(/key record k1 is corrupt/);
  });
});
