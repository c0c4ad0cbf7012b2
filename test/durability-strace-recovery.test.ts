/**
 * The recovery barrier at the syscall level: after `kill -9`, nothing leaves the restarted
 * server before what its shards recovered is on disk.
 *
 * Why it exists: a killed process leaves committed-but-unsynced transactions in the page
 * cache, LMDB reopens at the newest of them, and lmdb-js does not sync at open. A reply
 * computed from that state without a record of its own (an idempotent retry of a consume
 * that was in flight at the kill, a rejection, a read-like write) would acknowledge data
 * a power cut could still take. Each shard worker therefore ends recovery with one
 * durable write (ShardStore.syncRecovered) before it reports ready.
 *
 * The test runs a two-worker server under consume load (fresh idempotency keys, several
 * clients), kills it with SIGKILL while requests are in flight, restarts it under
 * `strace -f` and then retries every request that was in flight with its own idempotency
 * key. In the restarted process's trace, for EACH shard, before the first `200` reply
 * (the `/healthz` that says ready; every shard-served reply comes later):
 * 1. an fdatasync/fsync of `shard-N/data.mdb` that returned 0 (it writes back every dirty
 *    page of the file, whichever process dirtied it);
 * 2. after it, a write through that file's O_DSYNC descriptor (the meta page naming the
 *    synced tree).
 * The negative control restarts with the test-only TALLY_TEST_BREAK_DURABILITY=
 * no-recovery-sync (actors/shard-worker.ts), which reports ready without the barrier,
 * and must be caught.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { call, startServerProcess, tempDataDir } from './support/server-process.js';
import {
  descriptorSpans,
  fileOf,
  isDsync,
  parseTrace,
  requireStrace,
  startTracedServer,
  succeeded,
  SYNC_SYSCALLS,
  WRITE_SYSCALLS,
  type FdSpan,
  type Syscall,
} from './support/strace.js';

const CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'never' } },
  products: { free: { default: true, entitlements: { api_calls: { included: 1_000_000 } } } },
};
const WORKERS = 2;
const CLIENTS = 8;
/** Acknowledged consumes before the kill: enough that groups are in flight at every moment. */
const ACKS_BEFORE_KILL = 400;

interface InFlight {
  readonly customerId: string;
  readonly idempotencyKey: string;
}

/**
 * For each shard, what is missing before the first 200 reply of the trace (see the file
 * header); an empty list when every shard synced its file and wrote its meta page first.
 */
function checkSyncedBeforeFirstReply(
  calls: readonly Syscall[],
  spans: readonly FdSpan[],
  dataDir: string,
  workers: number,
): string[] {
  // Tally's own replies (uWebSockets.js names itself in a header); the embedded payment
  // sandbox, an HTTP server in the same process, answers Tally's processor calls too.
  const reply = calls.find(
    (c) =>
      WRITE_SYSCALLS.has(c.name) &&
      /^"HTTP\/1\.1 200 .*uWebSockets: /.test(c.args.slice(c.args.indexOf('"'))),
  );
  if (reply === undefined) return ['no traced 200 reply'];
  const before = (c: Syscall): boolean => c.endLine < reply.startLine && succeeded(c);
  const problems: string[] = [];
  for (let shard = 0; shard < workers; shard++) {
    const file = path.join(dataDir, `shard-${shard}`, 'data.mdb');
    const on = (c: Syscall, dsync: boolean): boolean => {
      const span = fileOf(c, spans);
      return span !== undefined && span.path === file && isDsync(span) === dsync;
    };
    const sync = calls.find((c) => SYNC_SYSCALLS.has(c.name) && before(c) && on(c, false));
    if (sync === undefined) {
      problems.push(
        `shard ${shard}: no ${[...SYNC_SYSCALLS].join('/')} of ${file} returned 0 before ` +
          `the first 200 reply (line ${reply.startLine})`,
      );
      continue;
    }
    const meta = calls.find(
      (c) => WRITE_SYSCALLS.has(c.name) && before(c) && c.startLine > sync.endLine && on(c, true),
    );
    if (meta === undefined)
      problems.push(
        `shard ${shard}: no meta-page write through the O_DSYNC descriptor of ${file} ` +
          `after its sync (line ${sync.endLine}) and before the first 200 reply ` +
          `(line ${reply.startLine})`,
      );
  }
  return problems;
}

/**
 * Loads a server, kills it with requests in flight, restarts it traced; returns the check's
 * findings.
 */
async function killAndRestartTraced(
  env: Record<string, string>,
): Promise<{ problems: string[]; inFlight: InFlight[]; retries: number[] }> {
  requireStrace();
  const dataDir = tempDataDir('tally-strace-recovery');
  const tracePath = `${dataDir}.strace`;
  const tag = randomBytes(4).toString('hex');
  const first = await startServerProcess({
    dataDir,
    env: { TALLY_WORKERS: String(WORKERS) },
    config: CONFIG,
  });
  const key = first.keys.test.server;
  const inFlight = new Map<number, InFlight>();
  let acked = 0;
  let killed = false;
  const refused: number[] = [];
  const loops = Array.from({ length: CLIENTS }, async (_, client) => {
    for (let n = 0; !killed; n++) {
      const request = { customerId: `r${client}-${tag}`, idempotencyKey: `r${client}-${n}-${tag}` };
      inFlight.set(client, request);
      const res = await call(first.base, 'POST', '/v1/usage/api_calls/consume', {
        key,
        body: { ...request, amount: 1 },
      }).catch(() => null);
      if (res === null || killed) return; // the kill cut it off: it stays in flight
      if (res.status !== 200) refused.push(res.status);
      acked++;
    }
  });
  while (acked < ACKS_BEFORE_KILL && refused.length === 0)
    await new Promise((resolve) => setTimeout(resolve, 5));
  killed = true;
  await first.kill9();
  await Promise.all(loops);
  expect(refused, 'consumes refused under load before the kill').toEqual([]);

  const server = await startTracedServer(dataDir, tracePath, {
    TALLY_WORKERS: String(WORKERS),
    TALLY_RATE_LIMIT_SERVER: '0',
    ...env,
  });
  const retries: number[] = [];
  try {
    for (const request of inFlight.values()) {
      const res = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
        key,
        body: { ...request, amount: 1 },
      });
      retries.push(res.status);
    }
    await server.stop();
  } finally {
    server.kill();
  }
  const calls = parseTrace(fs.readFileSync(tracePath, 'utf8'));
  const problems = checkSyncedBeforeFirstReply(calls, descriptorSpans(calls), dataDir, WORKERS);
  fs.rmSync(dataDir, { recursive: true, force: true });
  fs.rmSync(tracePath, { force: true });
  return { problems, inFlight: [...inFlight.values()], retries };
}

describe('the recovery barrier at the syscall level (strace, kill -9 under load)', () => {
  it(
    "syncs every shard's data file and writes its meta page before the restarted server " +
      'answers 200',
    async () => {
      const { problems, inFlight, retries } = await killAndRestartTraced({});
      expect(inFlight).toHaveLength(CLIENTS);
      expect(retries).toEqual(inFlight.map(() => 200));
      expect(problems).toEqual([]);
    },
  );

  it('negative control: a worker that reports ready without the barrier is caught', async () => {
    const { problems } = await killAndRestartTraced({
      TALLY_TEST_BREAK_DURABILITY: 'no-recovery-sync',
    });
    expect(
      problems.length,
      'shards found unsynced before the first reply in the broken build',
    ).toBeGreaterThan(0);
    expect(
      problems.filter(
        (p) => !/no fdatasync\/fsync of .* returned 0 before the first 200 reply/.test(p),
      ),
    ).toEqual([]);
  });
});
