/**
 * API keys: format, hashed storage, verification and revocation (against a real
 * control store in a temp dir).
 */
import { describe, expect, it } from 'vitest';
import { ControlStore } from '../storage/control-store.js';
import { issueKey, KeyRing } from '../src/auth/keys.js';
import { storeFixture } from './support/store-fixture.js';

const { tempDir, openStore, closeStore } = storeFixture('tally-keys-', (dir) =>
  ControlStore.open(dir),
);

function ring(dir = tempDir()): { ring: KeyRing; store: ControlStore; dir: string } {
  const store = openStore(dir);
  return { ring: new KeyRing(store), store, dir };
}

describe('API keys', () => {
  it.each([
    ['server', 'test', /^sk_test_[A-Za-z0-9_-]{32}$/],
    ['server', 'live', /^sk_live_[A-Za-z0-9_-]{32}$/],
    ['client', 'test', /^ck_test_[A-Za-z0-9_-]{32}$/],
    ['client', 'live', /^ck_live_[A-Za-z0-9_-]{32}$/],
    ['admin', null, /^ak_[A-Za-z0-9_-]{32}$/],
  ] as const)('%s/%s keys have the documented format', (keyClass, environment, pattern) => {
    const { secret, record } = issueKey(keyClass, environment, 1);
    expect(secret).toMatch(pattern);
    expect(record.hashHex).toMatch(/^[0-9a-f]{64}$/);
    expect(JSON.stringify(record)).not.toContain(secret.slice(8));
  });

  it('verifies stored keys, refuses unknown, malformed and revoked ones', async () => {
    const { ring: keys, store, dir } = ring();
    const a = issueKey('server', 'test', 1);
    const b = issueKey('client', 'live', 1);
    await keys.add(a.record);
    await keys.add(b.record);
    expect(keys.verify(a.secret)?.id).toBe(a.record.id);
    expect(keys.verify(b.secret)?.environment).toBe('live');
    expect(keys.verify(`${a.secret}x`)).toBeNull();
    expect(keys.verify('sk_test_short')).toBeNull();
    expect(keys.verify('')).toBeNull();
    await keys.add({ ...a.record, revokedAtMs: 2 });
    expect(keys.verify(a.secret)).toBeNull();
    // A key verified (and so remembered) is refused by the first verify after its revocation.
    expect(keys.verify(b.secret)?.id).toBe(b.record.id);
    await keys.revoke(b.record.id, 3);
    expect(keys.verify(b.secret)).toBeNull();
    await keys.add({ ...b.record, revokedAtMs: null });
    // Persisted: a new ring over the same store sees the revocation and the other key.
    await closeStore(store);
    const reopened = ring(dir).ring;
    expect(reopened.verify(a.secret)).toBeNull();
    expect(reopened.verify(b.secret)?.id).toBe(b.record.id);
  });
});
