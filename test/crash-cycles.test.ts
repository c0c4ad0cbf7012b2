/**
 * Durability under repeated SIGKILL: one data dir, two shard workers, several cycles of
 * "start, load, kill -9", some of them killed again while recovering. Under load:
 * - consume loops, each owning its customers with at most one request in flight, every
 *   request with its own idempotency key (so nothing is ever retried);
 * - a control loop creating keys, pushing configurations and upserting customers (each
 *   an audited write, stored in the control store's audit chain, the customer's through
 *   its shard's journal).
 * Every 200 counts as acknowledged, including the last ones before the kill: no reply is
 * exempt. After every restart:
 * - each customer's consumed total is its acknowledged count, plus at most the requests
 *   that were in flight at kills (answered never, perhaps applied);
 * - every acknowledged key authenticates, the configuration is at least the last
 *   acknowledged version, and the audit chain holds a `config.push`, `key.create` and
 *   `customer.upsert` entry for each acknowledged one, and verifies.
 * A server that exits without being killed, or a request that fails while the server
 * should be up, fails the test: only our own SIGKILL may end a process.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  call,
  listeningPort,
  MAIN_JS,
  startServerProcess,
  tempDataDir,
  type Keys,
  type ServerProcess,
} from './support/server-process.js';

const CYCLES = 6;
const LOOPS = 24;
const CUSTOMERS_PER_LOOP = 3;
const LOAD_MS = [500, 1100] as const;
/** What ends each cycle: a timer, or the first acknowledgment of a kind once armed. */
const KILL_ON = ['timer', 'key', 'consume', 'push', 'upsert', 'key'] as const;
const ENV = { TALLY_WORKERS: '2', TALLY_RATE_LIMIT_SERVER: '0', TALLY_RATE_LIMIT_CLIENT: '0' };
/** Per cycle: journal only, then snapshots every few batches, copied a customer per slice. */
const SNAPSHOTS = [
  {},
  { TALLY_SNAPSHOT_EVERY_BATCHES: '5', TALLY_SNAPSHOT_SLICE: '1' },
  { TALLY_SNAPSHOT_EVERY_BATCHES: '20' },
];

/** The pushed document differs per version (its allowance), so a pull shows which one survived. */
const configOf = (version: number) => ({
  entitlements: { api_calls: { type: 'meter', reset: 'never' } },
  products: {
    free: { default: true, entitlements: { api_calls: { included: 1_000_000_000 + version } } },
  },
});

interface Ledger {
  readonly acked: Map<string, number>;
  readonly maybe: Map<string, number>;
  readonly keys: Array<{ id: string; secret: string }>;
  readonly upserts: Set<string>;
  /** The last acknowledged push: its version and which document it was (configOf). */
  lastConfig: { version: number; doc: number };
  readonly configs: Set<number>;
  pushes: number;
}

type AckKind = 'consume' | 'key' | 'push' | 'upsert';

/**
 * Runs load against `server` until `killing()`; records every acknowledgment in `ledger`
 * and tells `acked` of each, right as it arrives (a cycle may kill the server there).
 */
async function load(
  server: ServerProcess,
  keys: Keys,
  ledger: Ledger,
  cycle: number,
  killing: () => boolean,
  failures: string[],
  acked: (kind: AckKind) => void,
): Promise<void> {
  const sk = keys.test.server;
  const failed = (what: string, detail: unknown): void => {
    if (!killing())
      failures.push(
        `cycle ${cycle}: ${what} failed while the server should be up: ${String(detail)}`,
      );
  };
  const consumeLoop = async (loop: number): Promise<void> => {
    for (let n = 0; !killing(); n++) {
      const customerId = `cc-${loop}-${n % CUSTOMERS_PER_LOOP}`;
      ledger.maybe.set(customerId, (ledger.maybe.get(customerId) ?? 0) + 1);
      let res: Awaited<ReturnType<typeof call>>;
      try {
        res = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
          key: sk,
          body: { customerId, amount: 1, idempotencyKey: `${cycle}-${loop}-${n}` },
        });
      } catch (error) {
        failed('a consume', error);
        return; // in flight at the kill: stays in `maybe`
      }
      ledger.maybe.set(customerId, (ledger.maybe.get(customerId) ?? 0) - 1);
      if (res.status !== 200) {
        failures.push(`cycle ${cycle}: consume answered ${res.status} ${JSON.stringify(res.body)}`);
        return;
      }
      ledger.acked.set(customerId, (ledger.acked.get(customerId) ?? 0) + 1);
      acked('consume');
    }
  };
  const controlLoop = async (): Promise<void> => {
    for (let n = 0; !killing(); n++) {
      try {
        const created = await call(server.base, 'POST', '/v1/admin/keys', {
          key: keys.admin,
          body: { environment: 'test', class: 'server' },
        });
        if (created.status !== 201) throw new Error(`key create answered ${created.status}`);
        ledger.keys.push({ id: created.body.id, secret: created.body.key });
        acked('key');
        const doc = ++ledger.pushes;
        const pushed = await call(server.base, 'POST', '/v1/sync/push', {
          key: sk,
          body: configOf(doc),
        });
        if (pushed.status !== 200)
          throw new Error(`push answered ${pushed.status} ${JSON.stringify(pushed.body)}`);
        const version = pushed.body.version as number;
        if (!(version > ledger.lastConfig.version))
          throw new Error(`push answered version ${version} after ${ledger.lastConfig.version}`);
        ledger.lastConfig = { version, doc };
        ledger.configs.add(version);
        acked('push');
        const id = `up-${cycle}-${n}`;
        const upserted = await call(server.base, 'POST', '/v1/customers', {
          key: sk,
          body: { id, name: `N${n}` },
        });
        if (upserted.status !== 201) throw new Error(`upsert answered ${upserted.status}`);
        ledger.upserts.add(id);
        acked('upsert');
      } catch (error) {
        failed('a control-store write', error);
        return;
      }
    }
  };
  await Promise.all([...Array.from({ length: LOOPS }, (_, i) => consumeLoop(i)), controlLoop()]);
}

/** Every acknowledged write must be there (see the file header). */
async function verify(
  server: ServerProcess,
  keys: Keys,
  ledger: Ledger,
  when: string,
): Promise<void> {
  const sk = keys.test.server;
  for (let loop = 0; loop < LOOPS; loop++) {
    for (let c = 0; c < CUSTOMERS_PER_LOOP; c++) {
      const customerId = `cc-${loop}-${c}`;
      const res = await call(
        server.base,
        'GET',
        `/v1/usage/api_calls/balance?customerId=${customerId}`,
        { key: sk },
      );
      expect(res.status, when).toBe(200);
      const acked = ledger.acked.get(customerId) ?? 0;
      const maybe = ledger.maybe.get(customerId) ?? 0;
      const consumed = res.body.consumed as number;
      expect(
        consumed >= acked && consumed <= acked + maybe,
        `${when}: ${customerId} consumed ${consumed}, acknowledged ${acked}, in flight at ` +
          `kills ${maybe}`,
      ).toBe(true);
      // What recovery found is now settled: the next check starts from it.
      ledger.acked.set(customerId, consumed);
      ledger.maybe.set(customerId, 0);
    }
  }
  for (const key of ledger.keys) {
    const res = await call(server.base, 'GET', '/v1/sync/pull', { key: key.secret });
    expect(res.status, `${when}: acknowledged key ${key.id} must authenticate`).toBe(200);
  }
  const pulled = await call(server.base, 'GET', '/v1/sync/pull', { key: sk });
  expect(pulled.body.version, `${when}: configuration version`).toBeGreaterThanOrEqual(
    ledger.lastConfig.version,
  );
  if (pulled.body.version === ledger.lastConfig.version && ledger.lastConfig.doc >= 0)
    expect(pulled.body.config, when).toEqual(configOf(ledger.lastConfig.doc));
  // A push in flight at the kill may have landed: later pushes continue from there.
  ledger.lastConfig = { version: pulled.body.version, doc: -1 };
  const envAudit = await auditIds(server, sk, '/v1/audit');
  for (const version of ledger.configs)
    expect(
      envAudit.has(`config.push v${version}`),
      `${when}: audit entry of config v${version}`,
    ).toBe(true);
  for (const id of ledger.upserts)
    expect(envAudit.has(`customer.upsert ${id}`), `${when}: audit entry of upsert ${id}`).toBe(
      true,
    );
  const operatorAudit = await auditIds(server, keys.admin, '/v1/admin/audit');
  for (const key of ledger.keys)
    expect(operatorAudit.has(`key.create ${key.id}`), `${when}: audit entry of key ${key.id}`).toBe(
      true,
    );
  for (const [route, key] of [
    ['/v1/audit/verify', sk],
    ['/v1/admin/audit/verify', keys.admin],
  ] as const) {
    expect(
      (await call(server.base, 'GET', route, { key })).body,
      `${when}: ${route}`,
    ).toMatchObject({ ok: true });
  }
}

/** `action resourceId` of every entry of an audit stream. */
async function auditIds(server: ServerProcess, key: string, route: string): Promise<Set<string>> {
  const seen = new Set<string>();
  let cursor: string | null = null;
  do {
    const page: { status: number; body: any } = await call(
      server.base,
      'GET',
      `${route}?limit=100${cursor === null ? '' : `&cursor=${cursor}`}`,
      { key },
    );
    expect(page.status).toBe(200);
    for (const entry of page.body.data as Array<{ action: string; resourceId: string }>)
      seen.add(`${entry.action} ${entry.resourceId}`);
    cursor = page.body.nextCursor;
  } while (cursor !== null);
  return seen;
}

/**
 * Starts the server and kills it `delayMs` after it starts listening, which it does before
 * its shards recover (/healthz answers 200 only once they have). Says when the kill came.
 */
async function killDuringRecovery(
  dataDir: string,
  env: Record<string, string>,
  delayMs: number,
): Promise<string> {
  const child = spawn(process.execPath, [MAIN_JS], {
    env: { ...process.env, PORT: '0', TALLY_DATA_DIR: dataDir, ...ENV, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (out += chunk.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  let port: number | null = null;
  for (
    const deadline = Date.now() + 30_000;
    port === null && child.exitCode === null && Date.now() < deadline;
  ) {
    port = listeningPort(out);
    if (port === null) await new Promise((resolve) => setTimeout(resolve, 2));
  }
  expect(port, `the server never listened:\n${out}`).not.toBeNull();
  if (delayMs > 0) await new Promise((resolve) => setTimeout(resolve, delayMs));
  const ready = (await fetch(`http://127.0.0.1:${port}/healthz`).catch(() => null))?.status === 200;
  expect(child.exitCode, `the server exited by itself while recovering:\n${out}`).toBeNull();
  child.kill('SIGKILL');
  await exited;
  expect(child.signalCode).toBe('SIGKILL');
  return ready ? 'after recovery' : 'during recovery';
}

describe('crash cycles', () => {
  it(
    `keeps every acknowledged write and control-store change across ${CYCLES} kill -9 ` +
      `cycles under load (two workers, kills during recovery too)`,
    async () => {
      const dataDir = tempDataDir('tally-crash-cycles');
      const ledger: Ledger = {
        acked: new Map(),
        maybe: new Map(),
        keys: [],
        upserts: new Set(),
        lastConfig: { version: 0, doc: 0 },
        configs: new Set(),
        pushes: 0,
      };
      const failures: string[] = [];
      const recoveryKills: string[] = [];
      let keys: Keys | undefined;
      let totalAcked = 0;
      for (let cycle = 0; cycle < CYCLES; cycle++) {
        const env = SNAPSHOTS[cycle % SNAPSHOTS.length] as Record<string, string>;
        if (cycle > 0 && cycle % 2 === 0)
          recoveryKills.push(await killDuringRecovery(dataDir, env, (cycle - 2) * 10));
        const server = await startServerProcess({
          dataDir,
          env: { ...ENV, ...env },
          ...(keys === undefined ? {} : { keys }),
        });
        keys ??= server.keys;
        let killing = false;
        server.child.once('exit', (code, signal) => {
          if (!killing)
            failures.push(
              `cycle ${cycle}: the server exited by itself (code ${code}, ` +
                `signal ${signal}):\n${server.output().slice(-2000)}`,
            );
        });
        try {
          if (cycle > 0) await verify(server, keys, ledger, `after kill ${cycle}`);
          else {
            expect(
              (
                await call(server.base, 'POST', '/v1/sync/push', {
                  key: keys.test.server,
                  body: configOf(0),
                })
              ).status,
            ).toBe(200);
            ledger.lastConfig = { version: 1, doc: 0 };
            ledger.configs.add(1);
          }
          const before = [...ledger.acked.values()].reduce((a, b) => a + b, 0);
          // Half the kills come on a timer; the others the moment an acknowledgment of one kind
          // arrives, so a reply sent before its write was durable would be caught in the act.
          const killOn = KILL_ON[cycle % KILL_ON.length] as AckKind | 'timer';
          let armed = false;
          const running = load(
            server,
            keys,
            ledger,
            cycle,
            () => killing,
            failures,
            (kind) => {
              if (armed && kind === killOn && !killing) {
                killing = true;
                server.child.kill('SIGKILL');
              }
            },
          );
          await new Promise((resolve) =>
            setTimeout(resolve, LOAD_MS[0] + Math.random() * (LOAD_MS[1] - LOAD_MS[0])),
          );
          expect(failures).toEqual([]);
          armed = true;
          if (killOn === 'timer') killing = true;
          await (killOn === 'timer'
            ? server.kill9()
            : new Promise((resolve) => server.child.once('exit', resolve)));
          expect(server.child.signalCode).toBe('SIGKILL');
          await running;
          totalAcked += [...ledger.acked.values()].reduce((a, b) => a + b, 0) - before;
        } finally {
          killing = true;
          if (server.child.exitCode === null && server.child.signalCode === null)
            await server.kill9();
        }
        expect(failures).toEqual([]);
      }
      const last = await startServerProcess({ dataDir, env: ENV, keys: keys as Keys });
      try {
        await verify(last, keys as Keys, ledger, `after kill ${CYCLES}`);
      } finally {
        await last.stop();
      }
      expect(failures).toEqual([]);
      expect(totalAcked, 'consumes acknowledged over all cycles').toBeGreaterThan(CYCLES * 100);
      expect(ledger.keys.length, 'keys created').toBeGreaterThan(CYCLES);
      expect(recoveryKills, 'a kill that came while the shards recovered').toContain(
        'during recovery',
      );
      fs.rmSync(dataDir, { recursive: true, force: true });
      process.stdout.write(
        `crash cycles: ${totalAcked} consumes, ${ledger.keys.length} ` +
          `keys, ${ledger.configs.size} configs, ${ledger.upserts.size} upserts ` +
          `acknowledged; recovery kills: ${recoveryKills.join(', ')}\n`,
      );
    },
  );
});
