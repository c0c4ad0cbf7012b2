/**
 * The CLI's pure helpers: the configuration diff `tally push` shows (what counts as a
 * change and what does not), the table and size formatting, and the progress bar (which
 * draws only on a terminal). The commands themselves are tested end to end in cli.test.ts.
 */
import { describe, expect, it } from 'vitest';
import {
  activity,
  isLoopback,
  plainHttpWarning,
  progressBar,
  withActivity,
} from '../src/cli/client.js';
import { changeCount, diffConfigs, formatDiff } from '../src/cli/config-diff.js';
import { formatBytes, formatDuration, formatTable } from '../src/cli/format.js';
import { PRODUCT_EXAMPLE_CONFIG } from './support/product-example.js';

/** The same value with every object's keys in reverse order. */
function reverseKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(reverseKeys);
  if (typeof value !== 'object' || value === null) return value;
  return Object.fromEntries(
    Object.entries(value)
      .reverse()
      .map(([key, item]) => [key, reverseKeys(item)]),
  );
}

describe('config diff', () => {
  it(
    'finds no change between a document and its reordered, ' + 're-serialised copy with a $schema',
    () => {
      const copy = {
        $schema: 'https://tally.dev/schemas/billing-config.json',
        ...(reverseKeys(structuredClone(PRODUCT_EXAMPLE_CONFIG)) as object),
      };
      expect(JSON.stringify(copy)).not.toContain(
        JSON.stringify(PRODUCT_EXAMPLE_CONFIG.products.free.entitlements),
      );
      const diff = diffConfigs(PRODUCT_EXAMPLE_CONFIG, copy);
      expect(changeCount(diff)).toBe(0);
      expect(formatDiff(diff)).toEqual([]);
    },
  );

  it('treats everything as added when nothing is deployed', () => {
    const diff = diffConfigs(null, PRODUCT_EXAMPLE_CONFIG);
    expect(diff.entitlements.added.map((item) => item.key)).toEqual(['sso', 'seats', 'api_calls']);
    expect(diff.products.added.map((item) => item.key)).toEqual(['free', 'pro', 'credits_5k']);
    expect(diff.other.map((change) => change.path)).toEqual(['webhooks']);
    expect(changeCount(diff)).toBe(7);
  });

  it(
    'lists changed leaves by path, quotes keys that are not plain words, and compares ' +
      'arrays whole',
    () => {
      const before = {
        entitlements: { 'a.b': { type: 'feature' } },
        products: { p: { name: 'P', entitlements: { 'a.b': true } } },
        webhooks: { devTunnel: true, forwarding: [{ key: 'app', path: '/x', events: '*' }] },
      };
      const after = {
        entitlements: { 'a.b': { type: 'feature', name: 'AB' } },
        products: { p: { name: 'P', entitlements: { 'a.b': { included: 2 } } } },
        webhooks: { devTunnel: true, forwarding: [{ key: 'app', path: '/y', events: '*' }] },
      };
      expect(formatDiff(diffConfigs(before, after))).toEqual([
        'Entitlements: 0 added, 0 removed, 1 changed',
        '  ~ a.b',
        '      name: (absent) → "AB"',
        'Products: 0 added, 0 removed, 1 changed',
        '  ~ p',
        '      entitlements["a.b"]: true → {"included":2}',
        'Other settings:',
        '  ~ webhooks.forwarding: [{"key":"app","path":"/x","events":"*"}] → ' +
          '[{"key":"app","path":"/y","events":"*"}]',
      ]);
    },
  );

  it('cuts long values and long change lists', () => {
    const many = Object.fromEntries(
      Array.from({ length: 25 }, (_, i) => [`e${i}`, { included: i }]),
    );
    const changed = Object.fromEntries(
      Array.from({ length: 25 }, (_, i) => [`e${i}`, { included: i + 1 }]),
    );
    const lines = formatDiff(
      diffConfigs(
        { products: { p: { entitlements: many } } },
        { products: { p: { entitlements: changed } } },
      ),
    );
    expect(lines).toHaveLength(2 + 20 + 1);
    expect(lines.at(-1)).toBe('      … and 5 more');
    const long = formatDiff(
      diffConfigs(
        { products: { p: { name: 'a' } } },
        { products: { p: { name: 'x'.repeat(200) } } },
      ),
    );
    expect(long[2]?.length).toBeLessThan(120);
    expect(long[2]).toMatch(/…$/);
  });
});

describe('formatting', () => {
  it('aligns table columns without trailing spaces', () => {
    expect(
      formatTable(
        ['ID', 'NAME'],
        [
          ['a', 'x'],
          ['long-id', '-'],
        ],
      ),
    ).toBe('ID       NAME\na        x\nlong-id  -');
  });

  it.each([
    [0, '0 B'],
    [1023, '1023 B'],
    [1536, '1.5 KiB'],
    [5 * 1024 ** 3, '5.0 GiB'],
  ])('formatBytes(%d) = %s', (bytes, text) => expect(formatBytes(bytes)).toBe(text));

  it.each([
    [0, '0s'],
    [59, '59s'],
    [3600, '1h 0m 0s'],
    [93_784, '1d 2h 3m 4s'],
  ])('formatDuration(%d) = %s', (sec, text) => expect(formatDuration(sec)).toBe(text));
});

describe('progress bar', () => {
  const fakeStream = (isTTY: boolean) => {
    const writes: string[] = [];
    const stream = {
      isTTY,
      write: (text: string) => writes.push(text),
    } as unknown as NodeJS.WriteStream;
    return { stream, writes };
  };

  it('draws on a terminal, ending with the full bar and a newline', () => {
    const { stream, writes } = fakeStream(true);
    const bar = progressBar('download', 2048, stream);
    bar.advance(1024);
    bar.advance(1024);
    bar.done();
    expect(writes[0]).toBe(`\rdownload [${'#'.repeat(12)}${'.'.repeat(12)}] 50% 1.0 KiB/2.0 KiB`);
    expect(writes.at(-2)).toBe(`\rdownload [${'#'.repeat(24)}] 100% 2.0 KiB/2.0 KiB`);
    expect(writes.at(-1)).toBe('\n');
  });

  it('counts bytes without a total, and draws nothing when not on a terminal', () => {
    const tty = fakeStream(true);
    const counting = progressBar('upload', null, tty.stream);
    counting.advance(10);
    counting.done();
    expect(tty.writes.at(-2)).toBe('\rupload 10 B');
    const pipe = fakeStream(false);
    const silent = progressBar('upload', 100, pipe.stream);
    silent.advance(100);
    silent.done();
    expect(pipe.writes).toEqual([]);
  });
});

describe('plain http warning', () => {
  it(
    'warns before a key goes over http:// to another machine, never for https:// or this ' +
      'machine',
    () => {
      const admin = 'ak_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa';
      expect(plainHttpWarning(new URL('http://billing.internal:8787'), admin)).toMatch(
        /^warning: sending the operator key over plain http:\/\/ to billing\.internal:8787/,
      );
      expect(plainHttpWarning(new URL('http://10.0.0.5'), 'sk_live_x')).toMatch(
        /sending an API key over plain http/,
      );
      for (const local of [
        'http://localhost:8787',
        'http://127.0.0.1:1',
        'http://127.3.2.1',
        'http://[::1]:8787',
        'http://[::ffff:127.0.0.1]',
        'https://billing.example.com',
      ]) {
        expect(plainHttpWarning(new URL(local), admin), local).toBeNull();
      }
      expect(isLoopback('128.0.0.1')).toBe(false);
      expect(isLoopback('127.0.0.1.example.com')).toBe(false);
    },
  );
});

describe('activity line', () => {
  const fakeStream = (isTTY: boolean) => {
    const writes: string[] = [];
    const stream = {
      isTTY,
      write: (text: string) => writes.push(text),
    } as unknown as NodeJS.WriteStream;
    return { stream, writes };
  };

  it(
    'shows the step on a terminal and clears it when the step ends, ' + 'even when it fails',
    async () => {
      const tty = fakeStream(true);
      expect(await withActivity('pushing billing.json', async () => 7, tty.stream)).toBe(7);
      expect(tty.writes).toEqual(['pushing billing.json…', '\r\x1b[K']);
      const failing = fakeStream(true);
      await expect(
        withActivity('pushing', () => Promise.reject(new Error('refused')), failing.stream),
      ).rejects.toThrow('refused');
      expect(failing.writes.at(-1)).toBe('\r\x1b[K');
    },
  );

  it('writes nothing when not on a terminal', () => {
    const pipe = fakeStream(false);
    activity('pushing', pipe.stream).end();
    expect(pipe.writes).toEqual([]);
  });
});
