/**
 * A full disk, as an operator meets it: the data directory on a small filesystem (a
 * tmpfs this test mounts; root only) that a filler file fills. Below the reserve every
 * write is refused with 503 `storage_full` before anything changes, reads and /healthz
 * keep answering, writes resume by themselves when space returns, and not one
 * acknowledged write is lost, across a restart and across a journal write that failed
 * because the reserve was set to nothing.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';
import { sampleValue, parsePrometheusText } from './support/prometheus-text.js';

const CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'never' } },
  products: { free: { default: true, entitlements: { api_calls: { included: 1_000_000 } } } },
};
const MIB = 1024 * 1024;

/** Mounts a tmpfs of `mib` MiB; null where this process may not mount (not root, no tmpfs). */
function mountTmpfs(mib: number): string | null {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tally-fs-'));
  const ran = spawnSync('mount', ['-t', 'tmpfs', '-o', `size=${mib}m,mode=0700`, 'tmpfs', dir], {
    encoding: 'utf8',
  });
  if (ran.status === 0) return dir;
  fs.rmdirSync(dir);
  return null;
}
const mounts: string[] = [];
const probe = mountTmpfs(1);
if (probe !== null && spawnSync('umount', [probe]).status === 0) fs.rmdirSync(probe);
const canMount = probe !== null;
if (!canMount)
  process.stderr.write(
    'full-disk.test.ts: cannot mount a tmpfs here (needs root): the full-disk cases are skipped\n',
  );

const servers: ServerProcess[] = [];
afterAll(async () => {
  for (const server of servers) if (server.child.exitCode === null) await server.stop();
  // Each mount point is an empty directory again once unmounted.
  for (const dir of mounts) if (spawnSync('umount', ['-l', dir]).status === 0) fs.rmdirSync(dir);
});

/**
 * Fills `dir`'s filesystem until `leaveBytes` are free (or as near as the filesystem allows);
 * returns the filler's path.
 */
function fill(dir: string, leaveBytes: number): string {
  const filler = path.join(dir, 'filler');
  const { bavail, bsize } = fs.statfsSync(dir);
  const bytes = Math.max(0, bavail * bsize - leaveBytes);
  const fd = fs.openSync(filler, 'w');
  const chunk = Buffer.alloc(MIB);
  try {
    for (let written = 0; written < bytes; ) {
      written += fs.writeSync(fd, chunk, 0, Math.min(chunk.length, bytes - written));
    }
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOSPC') throw error;
  } finally {
    fs.closeSync(fd);
  }
  return filler;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

async function consumed(server: ServerProcess, customerId: string): Promise<number> {
  const res = await call(
    server.base,
    'GET',
    `/v1/usage/api_calls/balance?customerId=${customerId}`,
    { key: server.keys.test.client },
  );
  expect(res.status).toBe(200);
  return res.body.consumed as number;
}

describe.skipIf(!canMount)('a full disk', () => {
  it(
    'refuses writes with 503 storage_full, keeps serving reads, resumes by itself, loses ' +
      'nothing',
    async () => {
      const fsDir = mountTmpfs(64) as string;
      mounts.push(fsDir);
      const dataDir = path.join(fsDir, 'data');
      const env = { TALLY_STORAGE_RESERVE_MB: '16', TALLY_WORKERS: '1' };
      let server = await startServerProcess({ dataDir, config: CONFIG, env });
      servers.push(server);
      const sk = server.keys.test.server;
      const acked = new Map<string, number>();
      const consume = async (customerId: string): Promise<number> => {
        const res = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
          key: sk,
          body: { customerId, amount: 1 },
        });
        if (res.status === 200) acked.set(customerId, (acked.get(customerId) ?? 0) + 1);
        return res.status;
      };
      for (let i = 0; i < 50; i++) expect(await consume(`c${i % 10}`)).toBe(200);

      const filler = fill(fsDir, 8 * MIB);
      await sleep(1500); // the next poll sees it
      expect(await call(server.base, 'GET', '/healthz')).toMatchObject({
        status: 503,
        body: { ok: false, storage: 'full' },
      });
      const refused = await Promise.all(
        Array.from({ length: 16 }, (_, i) =>
          call(server.base, 'POST', '/v1/usage/api_calls/consume', {
            key: sk,
            body: { customerId: `c${i % 10}`, amount: 1 },
          }),
        ),
      );
      for (const res of refused) {
        expect(res).toMatchObject({
          status: 503,
          body: { code: 'storage_full', error: expect.stringMatching(/^storage full: /) },
        });
        expect(res.headers.get('retry-after')).toBe('5');
      }
      expect(
        (await call(server.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG })).status,
      ).toBe(503);
      expect(
        (
          await call(server.base, 'POST', '/v1/admin/keys', {
            key: server.keys.admin,
            body: { environment: 'test', class: 'client' },
          })
        ).status,
      ).toBe(503);
      // Reads are answered from memory, listings too.
      expect(await consumed(server, 'c0')).toBe(acked.get('c0'));
      expect((await call(server.base, 'GET', '/v1/customers', { key: sk })).status).toBe(200);
      const metrics = parsePrometheusText(
        await (
          await fetch(`${server.base}/v1/admin/metrics`, {
            headers: { 'x-tally-key': server.keys.admin },
          })
        ).text(),
      );
      expect(sampleValue(metrics, 'tally_storage_full', {})).toBe(1);
      expect(sampleValue(metrics, 'tally_storage_refused_total', {})).toBeGreaterThanOrEqual(18);

      fs.rmSync(filler);
      await sleep(1500);
      expect((await call(server.base, 'GET', '/healthz')).status).toBe(200);
      for (let i = 0; i < 20; i++) expect(await consume(`c${i % 10}`)).toBe(200);
      expect(server.output()).toMatch(/storage full: refusing writes/);
      expect(server.output()).toMatch(/storage has room again/);

      await server.stop();
      server = await startServerProcess({ dataDir, env, keys: server.keys });
      servers.push(server);
      for (const [customerId, count] of acked)
        expect(await consumed(server, customerId), customerId).toBe(count);
    },
  );

  it('starts on a full disk serving reads and refusing writes', async () => {
    const fsDir = mountTmpfs(64) as string;
    mounts.push(fsDir);
    const dataDir = path.join(fsDir, 'data');
    const env = { TALLY_STORAGE_RESERVE_MB: '16', TALLY_WORKERS: '1' };
    const first = await startServerProcess({ dataDir, config: CONFIG, env });
    servers.push(first);
    expect(
      (
        await call(first.base, 'POST', '/v1/usage/api_calls/consume', {
          key: first.keys.test.server,
          body: { customerId: 's', amount: 3 },
        })
      ).status,
    ).toBe(200);
    await first.stop();
    fill(fsDir, 8 * MIB);
    // Not through startServerProcess, which waits for /healthz 200: full, it answers 503.
    const { spawn } = await import('node:child_process');
    const { MAIN_JS, listeningPort } = await import('./support/server-process.js');
    const child = spawn(process.execPath, [MAIN_JS], {
      env: { ...process.env, ...env, PORT: '0', TALLY_DATA_DIR: dataDir },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (out += chunk.toString()));
    try {
      let port: number | null = null;
      for (let i = 0; i < 200 && port === null; i++, await sleep(50)) port = listeningPort(out);
      const base = `http://127.0.0.1:${port}`;
      let health = await call(base, 'GET', '/healthz');
      for (
        let i = 0;
        i < 100 && health.status === 503 && health.body.storage !== 'full';
        i++, await sleep(100)
      )
        health = await call(base, 'GET', '/healthz');
      expect(health).toMatchObject({ status: 503, body: { ok: false, storage: 'full' } });
      const read = await call(base, 'GET', '/v1/usage/api_calls/balance?customerId=s', {
        key: first.keys.test.client,
      });
      expect(read).toMatchObject({ status: 200, body: { consumed: 3 } });
      expect(
        (
          await call(base, 'POST', '/v1/usage/api_calls/consume', {
            key: first.keys.test.server,
            body: { customerId: 's', amount: 1 },
          })
        ).status,
      ).toBe(503);
      expect(child.exitCode).toBeNull();
    } finally {
      child.kill('SIGTERM');
    }
  });

  it('a journal write that fails anyway (no reserve) stops the process; every acknowledged ' +
    'write survives', async () => {
    const fsDir = mountTmpfs(64) as string;
    mounts.push(fsDir);
    const dataDir = path.join(fsDir, 'data');
    const env = { TALLY_STORAGE_RESERVE_MB: '0', TALLY_WORKERS: '1' };
    const server = await startServerProcess({ dataDir, config: CONFIG, env });
    servers.push(server);
    const exited = new Promise<number | null>((resolve) =>
      server.child.once('exit', (code) => resolve(code)),
    );
    const acked = new Map<string, number>();
    for (let i = 0; i < 20; i++) {
      expect(
        (
          await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
            key: server.keys.test.server,
            body: { customerId: `w0-${i}`, amount: 1 },
          })
        ).status,
      ).toBe(200);
      acked.set(`w0-${i}`, 1);
    }
    const filler = fill(fsDir, 0);
    const deadline = Date.now() + 20_000;
    let died = false;
    void exited.then(() => (died = true));
    // Concurrent writers with their own customers, until the journal runs out of room.
    await Promise.all(
      Array.from({ length: 8 }, async (_, w) => {
        for (let n = 0; !died && Date.now() < deadline; n++) {
          const customerId = `w${w}-${n % 50}`;
          const res = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
            key: server.keys.test.server,
            body: { customerId, amount: 1 },
          }).catch(() => null);
          if (res?.status === 200) acked.set(customerId, (acked.get(customerId) ?? 0) + 1);
        }
      }),
    );
    expect(died, 'the process stopped when a journal write failed').toBe(true);
    expect(await exited).toBe(70);
    fs.rmSync(filler);
    const restarted = await startServerProcess({ dataDir, env, keys: server.keys });
    servers.push(restarted);
    // Every acknowledged write survives; a write durable when the process died may have
    // lost only its reply: at most one per writer (8) is applied beyond the acknowledged.
    let beyond = 0;
    for (const [customerId, count] of acked) {
      const applied = await consumed(restarted, customerId);
      expect(applied, customerId).toBeGreaterThanOrEqual(count);
      beyond += applied - count;
    }
    expect(beyond).toBeLessThanOrEqual(8);
    // The customer list (the index, which recovery repairs after dropping records) holds
    // every acknowledged customer and none the journal does not: each listed one has usage.
    const listed = await listedCustomers(restarted);
    for (const customerId of acked.keys()) expect(listed.has(customerId), customerId).toBe(true);
    for (const customerId of listed)
      expect(await consumed(restarted, customerId), customerId).toBeGreaterThan(0);
  }, 60_000);
});

/** Every customer id the server lists in the test environment, page by page. */
async function listedCustomers(server: ServerProcess): Promise<Set<string>> {
  const ids = new Set<string>();
  let cursor: string | null = null;
  do {
    const page: {
      status: number;
      body: { data: Array<{ id: string }>; nextCursor: string | null };
    } = await call(
      server.base,
      'GET',
      `/v1/customers?limit=100${cursor === null ? '' : `&cursor=${cursor}`}`,
      {
        key: server.keys.test.server,
      },
    );
    expect(page.status).toBe(200);
    for (const customer of page.body.data) ids.add(customer.id);
    cursor = page.body.nextCursor;
  } while (cursor !== null);
  return ids;
}
