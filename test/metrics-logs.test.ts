/**
 * Metrics and logs against a real server process (docs/operations.md, Metrics and
 * Logs): `GET /v1/admin/metrics` for the operator key only, in a valid Prometheus text
 * exposition (checked by a strict parser) whose counters move with the traffic; request
 * ids echoed by the documented rule; JSON log lines carrying request ids; and no key
 * secret anywhere in the output but the one bootstrap block the first start prints.
 */
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import {
  call,
  startServerProcess,
  waitForLogLine,
  type ServerProcess,
} from './support/server-process.js';
import {
  parsePrometheusText,
  sampleSum,
  sampleValue,
  type Family,
} from './support/prometheus-text.js';

const CONFIG = {
  entitlements: { sso: { type: 'feature' }, api_calls: { type: 'meter', reset: 'never' } },
  products: {
    free: { default: true, entitlements: { sso: true, api_calls: { included: 1_000_000 } } },
  },
};
const HAS = '/v1/entitlements/:key/has';
const KEY_SHAPED = /(?:sk|ck)_(?:test|live)_[A-Za-z0-9_-]{24,}|ak_[A-Za-z0-9_-]{24,}/;

let server: ServerProcess;

beforeAll(async () => {
  // Debug level: every request gets an access line. A snapshot after every journal record: snapshot
  // age is present.
  server = await startServerProcess({
    config: CONFIG,
    env: { TALLY_LOG_LEVEL: 'debug', TALLY_SNAPSHOT_EVERY_BATCHES: '1' },
  });
});

afterAll(async () => {
  await server?.stop();
});

async function scrape(key = server.keys.admin): Promise<Map<string, Family>> {
  const res = await fetch(`${server.base}/v1/admin/metrics`, {
    headers: { authorization: `Bearer ${key}` },
  });
  expect(res.status).toBe(200);
  return parsePrometheusText(await res.text());
}

const logLine = (predicate: (line: Record<string, unknown>) => boolean) =>
  waitForLogLine(server, predicate);

describe('GET /v1/admin/metrics', () => {
  it(
    'answers the operator key (x-tally-key or Bearer) in the Prometheus text format; 403 ' +
      'for environment keys',
    async () => {
      for (const headers of [
        { 'x-tally-key': server.keys.admin },
        { authorization: `Bearer ${server.keys.admin}` },
      ]) {
        const res = await fetch(`${server.base}/v1/admin/metrics`, { headers });
        expect(res.status).toBe(200);
        expect(res.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8');
        const families = parsePrometheusText(await res.text());
        for (const family of families.keys()) expect(family).toMatch(/^tally_/);
      }
      for (const key of [
        server.keys.test.server,
        server.keys.test.client,
        server.keys.live.server,
      ]) {
        expect(
          (
            await call(server.base, 'GET', '/v1/admin/metrics', {
              headers: { authorization: `Bearer ${key}` },
            })
          ).status,
        ).toBe(403);
      }
      expect((await call(server.base, 'GET', '/v1/admin/metrics')).status).toBe(401);
    },
  );

  it(
    'counts requests per route pattern, method and status, with a consistent latency ' +
      'histogram',
    async () => {
      const before = await scrape();
      const n = 7;
      for (let i = 0; i < n; i++) {
        expect(
          (
            await call(server.base, 'GET', `/v1/entitlements/sso/has?customerId=m${i}`, {
              key: server.keys.test.client,
            })
          ).status,
        ).toBe(200);
      }
      expect(
        (
          await call(server.base, 'GET', '/v1/entitlements/nope/has?customerId=m', {
            key: server.keys.test.client,
          })
        ).status,
      ).toBe(404);
      const after = await scrape();
      const ok = { route: HAS, method: 'GET', status: '200' };
      expect(
        (sampleValue(after, 'tally_http_requests_total', ok) ?? 0) -
          (sampleValue(before, 'tally_http_requests_total', ok) ?? 0),
      ).toBe(n);
      expect(
        sampleValue(after, 'tally_http_requests_total', { ...ok, status: '404' }),
      ).toBeGreaterThanOrEqual(1);
      const count = (f: Map<string, Family>) =>
        sampleValue(f, 'tally_http_request_duration_seconds_count', {
          route: HAS,
          method: 'GET',
        }) ?? 0;
      expect(count(after) - count(before)).toBe(n + 1);
      expect(
        sampleValue(after, 'tally_http_request_duration_seconds_sum', {
          route: HAS,
          method: 'GET',
        }),
      ).toBeGreaterThan(0);
      // Buckets are cumulative and +Inf equals _count: the parser checks every histogram;
      // spot-check one.
      const buckets =
        after
          .get('tally_http_request_duration_seconds')
          ?.samples.filter((s) => s.name.endsWith('_bucket') && s.labels['route'] === HAS) ?? [];
      expect(buckets.at(-1)?.labels['le']).toBe('+Inf');
      expect(buckets.at(-1)?.value).toBe(count(after));
    },
  );

  it(
    'counts requests answered before routing under "unmatched", ' + 'never under their URL',
    async () => {
      const path = `/v1/no-such-route-${Date.now()}`;
      expect((await call(server.base, 'GET', path, { key: server.keys.test.server })).status).toBe(
        404,
      );
      expect(
        (
          await call(server.base, 'GET', '/v1/entitlements/sso/has?customerId=x', {
            key: 'sk_test_notakeynotakeynotakeynotakey00',
          })
        ).status,
      ).toBe(401);
      const text = await (
        await fetch(`${server.base}/v1/admin/metrics`, {
          headers: { 'x-tally-key': server.keys.admin },
        })
      ).text();
      const families = parsePrometheusText(text);
      expect(text).not.toContain(path);
      expect(
        sampleValue(families, 'tally_http_requests_total', {
          route: 'unmatched',
          method: 'GET',
          status: '404',
        }),
      ).toBeGreaterThanOrEqual(1);
      expect(
        sampleValue(families, 'tally_http_requests_total', {
          route: 'unmatched',
          method: 'GET',
          status: '401',
        }),
      ).toBeGreaterThanOrEqual(1);
    },
  );

  it(
    'reports shard metrics: queue depth, journal flush latency and group size, idempotency ' +
      'entries, snapshot age',
    async () => {
      const consumes = 5;
      for (let i = 0; i < consumes; i++) {
        const res = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
          key: server.keys.test.server,
          body: { customerId: `w${i}`, amount: 1, idempotencyKey: `idem-${i}` },
        });
        expect(res.status).toBe(200);
      }
      const families = await scrape();
      // The customers spread over the shards (one per worker; the count depends on the machine's
      // cores): every shard reports its own series, and the consumes show up in their sum.
      const shards = [
        ...new Set(families.get('tally_shard_queue_depth')?.samples.map((s) => s.labels['shard'])),
      ];
      expect(shards.length).toBeGreaterThanOrEqual(1);
      expect(shards).toContain('0');
      for (const shardId of shards) {
        const shard = { shard: shardId ?? '' };
        expect(sampleValue(families, 'tally_shard_queue_depth', shard)).toBe(0);
        const age = sampleValue(families, 'tally_shard_snapshot_age_seconds', shard);
        expect(age).toBeGreaterThanOrEqual(0);
        expect(age).toBeLessThan(60);
        // The snapshot's longest hold of the thread, and that less its waits for a core
        // (Linux): never more than the clock's.
        const held = sampleValue(families, 'tally_shard_snapshot_pause_max_seconds', shard);
        const work = sampleValue(families, 'tally_shard_snapshot_work_max_seconds', shard);
        expect(held).toBeGreaterThanOrEqual(0);
        expect(work).toBeGreaterThanOrEqual(0);
        expect(work).toBeLessThanOrEqual(held ?? 0);
        // The transaction that stored it is one of those stretches: never longer.
        const stored = sampleValue(families, 'tally_shard_snapshot_store_seconds', shard);
        const storedWork = sampleValue(families, 'tally_shard_snapshot_store_work_seconds', shard);
        expect(stored).toBeGreaterThan(0);
        expect(stored).toBeLessThanOrEqual(held ?? 0);
        expect(storedWork).toBeGreaterThanOrEqual(0);
        expect(storedWork).toBeLessThanOrEqual(Math.min(stored ?? 0, work ?? 0));
      }
      expect(
        sampleSum(families, 'tally_journal_flush_duration_seconds_count'),
      ).toBeGreaterThanOrEqual(consumes);
      expect(sampleSum(families, 'tally_journal_flush_duration_seconds_sum')).toBeGreaterThan(0);
      expect(sampleSum(families, 'tally_journal_batch_events_count')).toBeGreaterThanOrEqual(
        consumes,
      );
      expect(sampleSum(families, 'tally_journal_batch_events_sum')).toBeGreaterThanOrEqual(
        consumes,
      );
      expect(sampleSum(families, 'tally_shard_idempotency_entries')).toBeGreaterThanOrEqual(
        consumes,
      );
      expect(sampleSum(families, 'tally_shard_customers')).toBeGreaterThanOrEqual(consumes);
      // No era closed yet: every filter is in the workers' memory, none on the memory map.
      for (const shardId of shards) {
        const shard = { shard: shardId ?? '' };
        expect(sampleValue(families, 'tally_shard_idempotency_filter_mapped_bytes', shard)).toBe(0);
      }
      // Every thread's heap and GC pauses: the front end's (main), each worker's, the webhooks'.
      for (const shardId of shards)
        expect(
          sampleValue(families, 'tally_shard_heap_used_bytes', { shard: shardId ?? '' }),
        ).toBeGreaterThan(0);
      // The delivery thread sends its own once it started: scrape until it has.
      const gcThreads = async (): Promise<Array<string | undefined>> => {
        const samples = (await scrape()).get('tally_gc_pause_max_seconds')?.samples;
        return (samples ?? []).map((s) => s.labels['thread']).sort();
      };
      await vi.waitFor(async () => expect(await gcThreads()).toContain('webhooks'), {
        timeout: 10_000,
      });
      expect(await gcThreads()).toEqual(
        ['main', ...shards.map((s) => `shard-${s}`), 'webhooks'].sort(),
      );
      for (const name of [
        'tally_process_start_time_seconds',
        'tally_process_resident_memory_bytes',
        'tally_http_requests_aborted_total',
      ]) {
        expect(sampleValue(families, name), name).toBeGreaterThanOrEqual(0);
      }
    },
  );
});

describe('request ids and log lines', () => {
  it(
    'echoes x-request-id on errors and to clients that sent one, ' + 'not on a plain success',
    async () => {
      const has = '/v1/entitlements/sso/has?customerId=r';
      const plain = await call(server.base, 'GET', has, { key: server.keys.test.client });
      expect(plain.status).toBe(200);
      expect(plain.headers.get('x-request-id')).toBeNull();
      const asked = await call(server.base, 'GET', has, {
        key: server.keys.test.client,
        headers: { 'x-request-id': 'trace-42.a:b' },
      });
      expect(asked.headers.get('x-request-id')).toBe('trace-42.a:b');
      const malformed = await call(server.base, 'GET', has, {
        key: server.keys.test.client,
        headers: { 'x-request-id': 'x'.repeat(200) },
      });
      expect(malformed.headers.get('x-request-id')).toMatch(/^[0-9a-f]{8}-[0-9a-z]+$/);
      const missing = await call(server.base, 'GET', has);
      expect(missing.status).toBe(401);
      expect(missing.headers.get('x-request-id')).toMatch(/^[0-9a-f]{8}-[0-9a-z]+$/);
    },
  );

  it('writes a JSON access line (debug) with the request id of a 404', async () => {
    const res = await call(server.base, 'GET', '/v1/missing-thing', {
      key: server.keys.test.server,
    });
    expect(res.status).toBe(404);
    const id = res.headers.get('x-request-id');
    const line = await logLine((l) => l['requestId'] === id);
    expect(line).toMatchObject({
      level: 'debug',
      msg: 'request',
      method: 'GET',
      route: 'unmatched',
      path: '/v1/missing-thing',
      status: 404,
    });
    expect(typeof line['time']).toBe('string');
    expect(typeof line['durationMs']).toBe('number');
  });

  it(
    'logs operator actions with key ids, and no key secret appears anywhere but the ' +
      'bootstrap block',
    async () => {
      const admin = server.keys.admin;
      const created = await call(server.base, 'POST', '/v1/admin/keys', {
        key: admin,
        body: { environment: 'live', class: 'server' },
      });
      expect(created.status).toBe(201);
      const secret = created.body.key as string;
      // Use every kind of key, in both headers, on keyed routes; put a key-shaped string in a path
      // too.
      for (const key of [
        secret,
        server.keys.test.server,
        server.keys.test.client,
        server.keys.live.client,
      ]) {
        await call(server.base, 'GET', '/v1/entitlements/sso/has?customerId=s', { key });
        await call(server.base, 'GET', '/v1/entitlements/sso/has?customerId=s', {
          headers: { authorization: `Bearer ${key}` },
        });
        await call(server.base, 'GET', `/v1/entitlements/${key}/has?customerId=s`, { key });
        // Percent-encoded in a path, and sent as a request id (which errors log at info).
        const encoded = [...key]
          .map((c) => `%${c.charCodeAt(0).toString(16).padStart(2, '0')}`)
          .join('');
        await call(server.base, 'GET', `/v1/entitlements/${encoded}/has?customerId=s`, { key });
        await call(
          server.base,
          'GET',
          `/v1/entitlements/${key.replace(/_/g, '%5F')}/has?customerId=s`,
          { key },
        );
        const asId = await call(server.base, 'GET', '/v1/missing-thing', {
          key,
          headers: { 'x-request-id': key },
        });
        expect(asId.headers.get('x-request-id')).not.toBe(key);
      }
      await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
        key: secret,
        body: { customerId: 's', amount: 1 },
      });
      const revoked = await call(
        server.base,
        'DELETE',
        `/v1/admin/keys/${created.body.id as string}`,
        { key: admin },
      );
      expect(revoked.status).toBe(200);
      const rotated = await call(server.base, 'POST', '/v1/admin/keys/rotate-admin', {
        key: admin,
      });
      expect(rotated.status).toBe(201);
      const newAdmin = rotated.body.key as string;
      await call(server.base, 'GET', '/v1/admin/metrics', { key: newAdmin });

      const createdLine = await logLine(
        (l) => l['msg'] === 'operator action' && l['action'] === 'key.create',
      );
      expect(createdLine).toMatchObject({
        level: 'info',
        resourceType: 'key',
        resourceId: created.body.id,
        environment: 'live',
      });
      expect(createdLine['actor']).toMatch(/^key_/);
      expect(createdLine['requestId']).toEqual(expect.any(String));
      await logLine(
        (l) =>
          l['msg'] === 'operator action' &&
          l['action'] === 'key.revoke' &&
          l['resourceId'] === created.body.id,
      );
      await logLine(
        (l) =>
          l['msg'] === 'operator action' &&
          l['action'] === 'key.rotate' &&
          l['resourceId'] === rotated.body.id,
      );
      // The last request's access line is out: everything before it is too.
      await logLine(
        (l) => l['msg'] === 'request' && l['route'] === '/v1/admin/metrics' && l['status'] === 200,
      );

      const output = server.output();
      const start = output.indexOf('Tally created its first API keys');
      expect(start).toBeGreaterThanOrEqual(0);
      const end = output.indexOf('\n}\n', start) + 3;
      const block = output.slice(start, end);
      expect(block).toContain(server.keys.admin);
      const rest = output.slice(0, start) + output.slice(end);
      expect(rest.indexOf('Tally created its first API keys')).toBe(-1);
      expect(rest).not.toMatch(KEY_SHAPED);
      for (const known of [
        secret,
        newAdmin,
        server.keys.admin,
        server.keys.test.server,
        server.keys.test.client,
        server.keys.live.server,
        server.keys.live.client,
      ]) {
        expect(rest).not.toContain(known);
        // Nor its random part, in any encoding of the prefix.
        expect(rest).not.toContain(known.slice(-24));
      }
      // Everything outside the block is JSON lines.
      for (const line of rest.split('\n').filter((l) => l.trim() !== ''))
        expect(() => JSON.parse(line), line).not.toThrow();
    },
  );
});
