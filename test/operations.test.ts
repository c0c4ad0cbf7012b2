/**
 * Operational behaviour of the real server process: backpressure (503 with Retry-After, a request
 * id and a warning log line), periodic snapshots that recovery uses, the exclusive port, and the
 * refusal to run on uWS's slow fallback.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { idempotencyEraGroupsProblem } from '../src/server.js';
import { ShardStore } from '../storage/journal.js';
import { openDurableEnv } from '../storage/lmdb-env.js';
import { runProcess } from './support/run-process.js';
import {
  call,
  MAIN_JS,
  startServerProcess,
  tempDataDir,
  waitForLogLine,
} from './support/server-process.js';

const CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'never' } },
  products: { free: { default: true, entitlements: { api_calls: { included: 1_000_000 } } } },
};

function runToExit(env: Record<string, string>): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [MAIN_JS], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (c: Buffer) => (output += c.toString()));
    child.stderr.on('data', (c: Buffer) => (output += c.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
  });
}

describe('operations', () => {
  it('answers 503 with Retry-After when a worker queue is full, and recovers', async () => {
    const server = await startServerProcess({ env: { TALLY_QUEUE_MAX: '2' } });
    try {
      const sk = server.keys.test.server;
      await call(server.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG });
      const results = await Promise.all(
        Array.from({ length: 64 }, (_, i) =>
          call(server.base, 'POST', '/v1/usage/api_calls/consume', {
            key: sk,
            body: { customerId: `q${i}`, amount: 1 },
          }),
        ),
      );
      const overloaded = results.filter((r) => r.status === 503);
      expect(overloaded.length).toBeGreaterThan(0);
      expect(overloaded[0]?.body).toEqual({
        error: 'shard queue is full, retry later',
        code: 'overloaded',
      });
      expect(overloaded[0]?.headers.get('retry-after')).toBe('1');
      expect(results.every((r) => r.status === 200 || r.status === 503)).toBe(true);
      // Each 503 carries a request id, and the log has a warning line naming one of them (lines are
      // budgeted per second).
      const ids = new Set(overloaded.map((r) => r.headers.get('x-request-id')));
      expect(ids.has(null)).toBe(false);
      const warned = await waitForLogLine(
        server,
        (line) =>
          line['level'] === 'warn' &&
          line['status'] === 503 &&
          ids.has(line['requestId'] as string),
      );
      expect(warned).toMatchObject({ method: 'POST', route: '/v1/usage/:key/consume' });
      // A refused command was never applied; an accepted one was.
      for (const [i, r] of results.entries()) {
        const balance = await call(
          server.base,
          'GET',
          `/v1/usage/api_calls/balance?customerId=q${i}`,
          { key: sk },
        );
        expect(balance.body.consumed).toBe(r.status === 200 ? 1 : 0);
      }
    } finally {
      await server.stop();
    }
  });

  it(
    'snapshots periodically, prunes the journal, ' + 'and recovers from snapshot + journal',
    async () => {
      const dataDir = tempDataDir('tally-snap');
      const env = { TALLY_SNAPSHOT_EVERY_BATCHES: '10', TALLY_WORKERS: '1' };
      const first = await startServerProcess({ dataDir, env });
      const sk = first.keys.test.server;
      await call(first.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG });
      for (let i = 0; i < 37; i++) {
        const res = await call(first.base, 'POST', '/v1/usage/api_calls/consume', {
          key: sk,
          body: { customerId: `s${i % 4}`, amount: 0.5 },
        });
        expect(res.status).toBe(200);
      }
      expect(await first.stop()).toBe(0);

      const store = ShardStore.open(path.join(dataDir, 'shard-0'));
      const snapshot = store.loadSnapshot();
      let replayed = 0;
      store.replay(snapshot?.seq ?? 0, () => replayed++);
      await store.close();
      expect(snapshot?.seq).toBeGreaterThanOrEqual(30);
      expect(replayed).toBeLessThan(10);

      const second = await startServerProcess({ dataDir, env });
      try {
        const expected = [5, 4.5, 4.5, 4.5]; // 37 consumes of 0.5 dealt over 4 customers
        for (let c = 0; c < 4; c++) {
          const res = await call(
            second.base,
            'GET',
            `/v1/usage/api_calls/balance?customerId=s${c}`,
            {
              key: sk,
            },
          );
          expect(res.body.consumed).toBe(expected[c]);
        }
      } finally {
        await second.stop();
      }
    },
  );

  it('snapshots and recovers a meter whose overage outgrew 64 bits of micro-units', async () => {
    // 25 consumes of the largest amount put 2.5 x 10^19 micro-units in overage, past
    // 2^64: a snapshot must store it, and recovery must read it back.
    const dataDir = tempDataDir('tally-huge');
    const env = { TALLY_SNAPSHOT_EVERY_BATCHES: '10', TALLY_WORKERS: '1' };
    const config = {
      entitlements: { tokens: { type: 'meter', reset: 'never' } },
      products: {
        free: {
          default: true,
          entitlements: { tokens: { included: 10, overage: { unitAmount: 1 } } },
        },
      },
    };
    const first = await startServerProcess({ dataDir, env, config });
    const sk = first.keys.test.server;
    expect(
      (
        await call(first.base, 'POST', '/v1/usage/tokens/settings', {
          key: sk,
          body: { customerId: 'big', overageEnabled: true },
        })
      ).status,
    ).toBe(200);
    for (let i = 0; i < 25; i++) {
      expect(
        (
          await call(first.base, 'POST', '/v1/usage/tokens/consume', {
            key: sk,
            body: { customerId: 'big', amount: 1e12 },
          })
        ).status,
      ).toBe(200);
    }
    for (let i = 0; i < 15; i++) {
      expect(
        (
          await call(first.base, 'POST', '/v1/usage/tokens/consume', {
            key: sk,
            body: { customerId: 'big', amount: 1 },
          })
        ).status,
      ).toBe(200);
    }
    expect(await first.stop()).toBe(0);

    const store = ShardStore.open(path.join(dataDir, 'shard-0'));
    const snapshot = store.loadSnapshot();
    await store.close();
    expect(snapshot?.seq).toBeGreaterThanOrEqual(30);

    const second = await startServerProcess({ dataDir, env });
    try {
      const balance = await call(second.base, 'GET', '/v1/usage/tokens/balance?customerId=big', {
        key: sk,
      });
      expect(balance.body).toMatchObject({
        consumed: 25_000_000_000_015,
        overage: 25_000_000_000_005,
      });
    } finally {
      await second.stop();
    }
  });

  it('drops a torn last journal record at start and keeps everything acknowledged', async () => {
    const dataDir = tempDataDir('tally-torn');
    const env = { TALLY_WORKERS: '1' };
    const first = await startServerProcess({ dataDir, env });
    const sk = first.keys.test.server;
    await call(first.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG });
    for (let i = 0; i < 5; i++) {
      expect(
        (
          await call(first.base, 'POST', '/v1/usage/api_calls/consume', {
            key: sk,
            body: { customerId: 'torn', amount: 2 },
          })
        ).status,
      ).toBe(200);
    }
    await first.stop();

    // A record that never finished: garbage under the next seq, as a torn write leaves it.
    const shardEnv = openDurableEnv(path.join(dataDir, 'shard-0'), ['journal', 'snapshot', 'meta']);
    const last = [...shardEnv.dbs.journal.getKeys({ reverse: true, limit: 1 })][0] as number;
    await shardEnv.dbs.journal.put(last + 1, Buffer.from([0xde, 0xad, 0xbe, 0xef, 0x01]));
    await shardEnv.root.close();

    const second = await startServerProcess({ dataDir, env });
    try {
      // The ready line is written asynchronously: wait for it rather than read the output once.
      await waitForLogLine(
        second,
        (line) =>
          line['msg'] === 'ready' && JSON.stringify(line).includes('"droppedTornTail":true'),
      );
      const balance = await call(
        second.base,
        'GET',
        '/v1/usage/api_calls/balance?customerId=torn',
        { key: sk },
      );
      expect(balance.body.consumed).toBe(10);
      const next = await call(second.base, 'POST', '/v1/usage/api_calls/consume', {
        key: sk,
        body: { customerId: 'torn', amount: 1 },
      });
      expect(next.body.consumed).toBe(11);
    } finally {
      await second.stop();
    }
  });

  it(
    'binds its port exclusively: ' + 'a second instance on the same port refuses to start',
    async () => {
      const server = await startServerProcess();
      try {
        const second = await runToExit({
          PORT: String(server.port),
          TALLY_DATA_DIR: tempDataDir('tally-port'),
        });
        expect(second.code).toBe(1);
        expect(second.output).toContain(`cannot listen on port ${server.port}`);
      } finally {
        await server.stop();
      }
    },
  );

  it("refuses to run on the package's slow pure-JS fallback", async () => {
    const result = await runToExit({
      PORT: '0',
      TALLY_DATA_DIR: tempDataDir('tally-fallback'),
      UWS_USE_FALLBACK: '1',
    });
    expect(result.code).toBe(1);
    expect(result.output).toContain('LIBUS_LISTEN_EXCLUSIVE_PORT');
  });
});

describe('a start that fails', () => {
  /** Starts the service with `env` and a data dir that does not exist yet; waits for it to exit. */
  async function failedStart(
    env: Record<string, string>,
  ): Promise<{ code: number | null; stdout: string; stderr: string; dataDir: string }> {
    const dataDir = path.join(tempDataDir('tally-failed-start'), 'data');
    const ran = await runProcess(process.execPath, [MAIN_JS], {
      env: { ...process.env, PORT: '0', TALLY_DATA_DIR: dataDir, ...env },
    });
    return { ...ran, dataDir };
  }

  it(
    'on a port that is taken: ' + 'exits 1 with one line on stderr and creates no data dir',
    async () => {
      const occupier = net.createServer();
      await new Promise<void>((resolve) => occupier.listen(0, resolve));
      const port = (occupier.address() as net.AddressInfo).port;
      try {
        const ran = await failedStart({ PORT: String(port) });
        expect(ran.code).toBe(1);
        expect(ran.stderr).toBe(
          `tally failed to start: cannot listen on port ${port} of 127.0.0.1: it is in use, ` +
            `not open to this account, or not an address of this machine\n`,
        );
        expect(ran.stdout).toBe('');
        expect(fs.existsSync(ran.dataDir)).toBe(false);
        // At debug level the JSON line (with the stack) is written too, on stdout.
        const debug = await failedStart({ PORT: String(port), TALLY_LOG_LEVEL: 'debug' });
        expect(debug.stderr.trim().split('\n')).toHaveLength(1);
        expect(debug.stdout).toContain('"level":"debug"');
        expect(debug.stdout).toContain('"stack"');
        expect(fs.existsSync(debug.dataDir)).toBe(false);
      } finally {
        occupier.close();
      }
    },
  );

  it.each([
    [{ PORT: 'eighty' }, 'PORT must be a whole number, got "eighty"'],
    [{ TALLY_WORKERS: '-1' }, 'TALLY_WORKERS must be a whole number, got "-1"'],
    [
      { TALLY_IDEMPOTENCY_ERA_GROUPS: '8' },
      'TALLY_IDEMPOTENCY_ERA_GROUPS must be from 16 to 64, got 8',
    ],
    [
      { TALLY_GC_CONCURRENT_MARKING: 'yes' },
      'TALLY_GC_CONCURRENT_MARKING must be on or off, got "yes"',
    ],
    [
      { TALLY_LOG_LEVEL: 'loud' },
      'TALLY_LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent, got "loud"',
    ],
  ])(
    'with a bad setting %j: exits 2 with one line on stderr and creates no data dir',
    async (env, message) => {
      const ran = await failedStart(env);
      expect(ran.code).toBe(2);
      expect(ran.stderr).toBe(`${message}\n`);
      expect(ran.stdout).toBe('');
      expect(fs.existsSync(ran.dataDir)).toBe(false);
    },
  );

  it('refuses an era size out of range whether it comes from the environment or the API', () => {
    // startServer throws this problem; main prints it and exits 2 (above).
    expect([16, 40, 64].map(idempotencyEraGroupsProblem)).toEqual([null, null, null]);
    expect(idempotencyEraGroupsProblem(65)).toBe(
      'TALLY_IDEMPOTENCY_ERA_GROUPS must be from 16 to 64, got 65',
    );
    expect(idempotencyEraGroupsProblem(16.5)).toBe(
      'TALLY_IDEMPOTENCY_ERA_GROUPS must be from 16 to 64, got 16.5',
    );
  });

  it(
    'on a data dir another server holds: ' + 'one line on stderr, and that server keeps running',
    async () => {
      const server = await startServerProcess();
      try {
        const ran = await runProcess(process.execPath, [MAIN_JS], {
          env: { ...process.env, PORT: '0', TALLY_DATA_DIR: server.dataDir },
        });
        expect(ran.code).toBe(1);
        expect(ran.stderr).toMatch(/^tally failed to start: [^\n]+\n$/);
        expect(ran.stdout).toBe('');
        expect((await call(server.base, 'GET', '/healthz')).status).toBe(200);
      } finally {
        await server.stop();
      }
    },
  );
});
