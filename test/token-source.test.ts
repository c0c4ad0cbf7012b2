/**
 * customerTokenSource (tally/client, tally/better-auth/client): a page's customer token is
 * minted once, reused while fresh, minted again shortly before it expires, and concurrent
 * reads share one mint.
 */
import { customerTokenSource } from 'tally/client';
import { describe, expect, it } from 'vitest';

describe('customerTokenSource', () => {
  it('reuses a fresh token and mints again within refreshBeforeMs of expiry', async () => {
    let nowMs = Date.parse('2026-01-01T00:00:00Z');
    let mints = 0;
    const source = customerTokenSource(
      async () => {
        mints += 1;
        return { token: `ct_${mints}`, expiresAt: new Date(nowMs + 900_000).toISOString() };
      },
      { refreshBeforeMs: 60_000, now: () => nowMs },
    );
    const [a, b] = await Promise.all([source.get(), source.get()]);
    expect([a, b, mints]).toEqual(['ct_1', 'ct_1', 1]);
    nowMs += 839_000;
    expect(await source.get()).toBe('ct_1');
    nowMs += 2_000;
    expect(await source.get()).toBe('ct_2');
    source.clear();
    expect(await source.get()).toBe('ct_3');
  });

  it('a failed mint is not cached: the next read mints again', async () => {
    let fail = true;
    const source = customerTokenSource(async () => {
      if (fail) throw new Error('offline');
      return { token: 'ct_ok', expiresAt: new Date(Date.now() + 600_000).toISOString() };
    });
    await expect(source.get()).rejects.toThrow('offline');
    fail = false;
    expect(await source.get()).toBe('ct_ok');
    const broken = customerTokenSource(async () => ({ token: 'ct_x', expiresAt: 'soon' }));
    await expect(broken.get()).rejects.toThrow(/expiresAt/);
  });
});
