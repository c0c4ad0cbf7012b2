/**
 * Write-ahead, then reply, under concurrency, at the syscall level: the compiled server
 * with two shard workers runs under `strace -f` while 16 clients send consumes and
 * context writes (each creating a customer, so each is a journaled write) at once. For
 * every reply, between reading its request and writing its reply, the trace must show,
 * on the data file of the shard that owns the request's customer:
 * 1. a completed write carrying the customerId (its journal record's page);
 * 2. an fdatasync/fsync that STARTED after that write returned and RETURNED 0 before the
 *    reply's first byte: the request's own group's sync, not an earlier one that was
 *    already running when the record was written;
 * 3. a write through the file's O_DSYNC descriptor after that sync (the meta page).
 * A server that released a group's replies on the previous group's sync would pass a
 * sequential test whenever the previous sync happened to start late; under concurrency
 * most groups are written while the previous one syncs (overlappingSync), which this
 * check refuses. The negative control runs the same load with the test-only
 * TALLY_TEST_BREAK_DURABILITY=previous-sync (actors/shard-worker.ts) and must fail.
 *
 * One more client creates keys meanwhile: each 201 must likewise follow a write of the
 * key id to the control store's `data.mdb`, a sync of it started after that write, and
 * its meta page.
 *
 * The owning shard is computed with the server's own routing (logicalShardOf, workerOf);
 * both shards must appear. One warm-up write per shard comes first and is not checked, so
 * the negative control cannot be caught merely by its very first append (which has no
 * previous sync at all).
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { LOGICAL_SHARDS } from '../shared/limits.js';
import { logicalShardOf, workerOf } from '../shared/shard-hash.js';
import { call, tempDataDir } from './support/server-process.js';
import {
  callFd,
  descriptorSpans,
  fileOf,
  isDsync,
  parseTrace,
  READ_SYSCALLS,
  requireStrace,
  startTracedServer,
  succeeded,
  SYNC_SYSCALLS,
  WRITE_SYSCALLS,
  type FdSpan,
  type Syscall,
} from './support/strace.js';

const CONFIG = {
  entitlements: { api_calls: { type: 'meter', reset: 'never' }, sso: { type: 'feature' } },
  products: {
    free: { default: true, entitlements: { sso: true, api_calls: { included: 1_000_000 } } },
  },
};
const WORKERS = 2;
const CLIENTS = 16;
const REQUESTS_PER_CLIENT = 8;
/** Keys created by one more client meanwhile: control-store writes, checked the same way. */
const KEYS_CREATED = 6;

interface Sent {
  readonly customerId: string;
  readonly kind: 'consume' | 'context';
  readonly shard: number;
}

const shardOf = (customerId: string): number =>
  workerOf(logicalShardOf('test', customerId, LOGICAL_SHARDS), WORKERS);

/**
 * The bytes written on `first`'s descriptor from `first` on, up to the next read of it:
 * one reply, which uWS writes in one call when the socket is corked and in several
 * (status line, headers, body) when another socket holds the cork.
 */
function replyText(calls: readonly Syscall[], first: Syscall): string {
  const fd = callFd(first);
  let text = '';
  for (const c of calls) {
    if (c.startLine < first.startLine || callFd(c) !== fd) continue;
    if (READ_SYSCALLS.has(c.name)) break;
    if (WRITE_SYSCALLS.has(c.name))
      text += [...c.args.matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((m) => m[1]).join('');
  }
  return text;
}

/**
 * Checks one request against the trace; returns null when the order holds, else what
 * is missing (see the file header for the three steps).
 */
function checkRequest(
  calls: readonly Syscall[],
  spans: readonly FdSpan[],
  dataDir: string,
  sent: Sent,
): string | null {
  const { customerId } = sent;
  const shardFile = path.join(dataDir, `shard-${sent.shard}`, 'data.mdb');
  const request = calls.find(
    (c) => READ_SYSCALLS.has(c.name) && c.args.includes(customerId) && succeeded(c),
  );
  if (request === undefined) return `${customerId}: no traced read of its request`;
  const response = calls.find(
    (c) =>
      WRITE_SYSCALLS.has(c.name) && callFd(c) === callFd(request) && c.startLine > request.endLine,
  );
  if (response === undefined)
    return (
      `${customerId}: no write on fd ${callFd(request)} after its request ` +
      `(line ${request.endLine})`
    );
  const expected =
    sent.kind === 'consume'
      ? /^HTTP\/1\.1 200 .*\\"consumed\\":1[,}]/
      : /^HTTP\/1\.1 200 .*\\"customer\\":\{\\"id\\":/;
  const reply = replyText(calls, response);
  if (!expected.test(reply))
    return (
      `${customerId}: the writes from the first after its request ` +
      `(line ${response.startLine}) are not its ${sent.kind} reply: ${reply.slice(0, 300)}`
    );
  const inWindow = (c: Syscall): boolean =>
    c.startLine > request.endLine && c.endLine < response.startLine && succeeded(c);
  const onShard = (c: Syscall, dsync: boolean): boolean => {
    const file = fileOf(c, spans);
    return file !== undefined && file.path === shardFile && isDsync(file) === dsync;
  };
  const where =
    `between its request (line ${request.endLine}) ` + `and its reply (line ${response.startLine})`;
  const journalWrite = calls.find(
    (c) =>
      WRITE_SYSCALLS.has(c.name) && inWindow(c) && onShard(c, false) && c.args.includes(customerId),
  );
  if (journalWrite === undefined)
    return `${customerId}: no completed write carrying it to ${shardFile} ${where}`;
  const sync = calls.find(
    (c) =>
      SYNC_SYSCALLS.has(c.name) &&
      inWindow(c) &&
      c.startLine > journalWrite.endLine &&
      onShard(c, false),
  );
  if (sync === undefined)
    return (
      `${customerId}: no sync of ${shardFile} that started after its journal write ` +
      `(line ${journalWrite.endLine}) and returned 0 before its reply (line ${response.startLine})`
    );
  const meta = calls.find(
    (c) =>
      WRITE_SYSCALLS.has(c.name) && inWindow(c) && c.startLine > sync.endLine && onShard(c, true),
  );
  if (meta === undefined)
    return (
      `${customerId}: no meta-page write through the O_DSYNC descriptor of ${shardFile} ` +
      `after its sync (line ${sync.endLine}) and before its reply`
    );
  return null;
}

/**
 * The same order for a key created through the operator API, on the control store's
 * file: its reply (found by the key id it carries) must follow a completed write of the
 * key id to `control/data.mdb`, a sync of that file started after it, and the meta page.
 */
function checkKeyCreate(
  calls: readonly Syscall[],
  spans: readonly FdSpan[],
  dataDir: string,
  keyId: string,
): string | null {
  const controlFile = path.join(dataDir, 'control', 'data.mdb');
  const response = calls.find(
    (c) =>
      WRITE_SYSCALLS.has(c.name) &&
      c.args.includes(keyId) &&
      /^"HTTP\/1\.1 201 /.test(c.args.slice(c.args.indexOf('"'))),
  );
  if (response === undefined) return `${keyId}: no traced 201 reply carrying it`;
  const request = calls
    .filter(
      (c) =>
        READ_SYSCALLS.has(c.name) &&
        callFd(c) === callFd(response) &&
        c.endLine < response.startLine &&
        succeeded(c) &&
        c.args.includes('/v1/admin/keys'),
    )
    .at(-1);
  if (request === undefined)
    return `${keyId}: no traced read of its request before its reply (line ${response.startLine})`;
  const inWindow = (c: Syscall): boolean =>
    c.startLine > request.endLine && c.endLine < response.startLine && succeeded(c);
  const onControl = (c: Syscall, dsync: boolean): boolean => {
    const file = fileOf(c, spans);
    return file !== undefined && file.path === controlFile && isDsync(file) === dsync;
  };
  const write = calls.find(
    (c) =>
      WRITE_SYSCALLS.has(c.name) && inWindow(c) && onControl(c, false) && c.args.includes(keyId),
  );
  if (write === undefined)
    return (
      `${keyId}: no completed write carrying it to ${controlFile} between its request ` +
      `(line ${request.endLine}) and its reply (line ${response.startLine})`
    );
  const sync = calls.find(
    (c) =>
      SYNC_SYSCALLS.has(c.name) &&
      inWindow(c) &&
      c.startLine > write.endLine &&
      onControl(c, false),
  );
  if (sync === undefined)
    return (
      `${keyId}: no sync of ${controlFile} that started after its write ` +
      `(line ${write.endLine}) and returned 0 before its reply (line ${response.startLine})`
    );
  const meta = calls.find(
    (c) =>
      WRITE_SYSCALLS.has(c.name) && inWindow(c) && c.startLine > sync.endLine && onControl(c, true),
  );
  if (meta === undefined)
    return (
      `${keyId}: no meta-page write through the O_DSYNC descriptor of ${controlFile} after ` +
      `its sync and before its reply`
    );
  return null;
}

/** Runs the load under strace; returns the violations and the requests checked. */
async function tracedLoad(
  env: Record<string, string>,
): Promise<{ violations: string[]; keyViolations: string[]; sent: Sent[]; statuses: number[] }> {
  requireStrace();
  const dataDir = tempDataDir('tally-strace-conc');
  const tracePath = `${dataDir}.strace`;
  const server = await startTracedServer(dataDir, tracePath, {
    TALLY_WORKERS: String(WORKERS),
    TALLY_RATE_LIMIT_SERVER: '0',
    ...env,
  });
  const tag = randomBytes(4).toString('hex');
  const sent: Sent[] = [];
  const statuses: number[] = [];
  const keyIds: string[] = [];
  try {
    const key = server.keys.test.server;
    expect((await call(server.base, 'POST', '/v1/sync/push', { key, body: CONFIG })).status).toBe(
      200,
    );
    // Warm-up: one write per shard, not checked.
    const warm = new Set<number>();
    for (let n = 0; warm.size < WORKERS; n++) {
      const customerId = `warm${n}-${tag}`;
      if (warm.has(shardOf(customerId))) continue;
      warm.add(shardOf(customerId));
      expect(
        (
          await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
            key,
            body: { customerId, amount: 1 },
          })
        ).status,
      ).toBe(200);
    }
    const keyClient = async (): Promise<void> => {
      for (let n = 0; n < KEYS_CREATED; n++) {
        const res = await call(server.base, 'POST', '/v1/admin/keys', {
          key: server.keys.admin,
          body: { environment: 'test', class: 'server' },
        });
        statuses.push(res.status === 201 ? 200 : res.status);
        keyIds.push(res.body.id as string);
      }
    };
    await Promise.all([
      keyClient(),
      ...Array.from({ length: CLIENTS }, async (_, client) => {
        for (let n = 0; n < REQUESTS_PER_CLIENT; n++) {
          const customerId = `q${client}x${n}-${tag}`;
          const kind = (client + n) % 2 === 0 ? 'consume' : 'context';
          sent.push({ customerId, kind, shard: shardOf(customerId) });
          const res =
            kind === 'consume'
              ? await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
                  key,
                  body: { customerId, amount: 1 },
                })
              : await call(server.base, 'POST', '/v1/context', {
                  key,
                  body: { customer: { id: customerId }, features: ['sso'], usage: ['api_calls'] },
                });
          statuses.push(res.status);
        }
      }),
    ]);
    await server.stop();
  } finally {
    server.kill();
  }
  const trace = fs.readFileSync(tracePath, 'utf8');
  const calls = parseTrace(trace);
  const spans = descriptorSpans(calls);
  const violations = sent
    .map((s) => checkRequest(calls, spans, dataDir, s))
    .filter((v): v is string => v !== null);
  const keyViolations = keyIds
    .map((id) => checkKeyCreate(calls, spans, dataDir, id))
    .filter((v): v is string => v !== null);
  fs.rmSync(dataDir, { recursive: true, force: true });
  fs.rmSync(tracePath, { force: true });
  return { violations, keyViolations, sent, statuses };
}

describe('durability at the syscall level under concurrency (strace, two shards)', () => {
  it(
    "replies to each of 16 clients' writes only after its own shard synced its own record, " +
      'and to key creates after the control store synced',
    async () => {
      const { violations, keyViolations, sent, statuses } = await tracedLoad({});
      expect(statuses.filter((s) => s !== 200)).toEqual([]);
      expect(new Set(sent.map((s) => s.shard)).size).toBe(WORKERS);
      expect(violations).toEqual([]);
      expect(keyViolations).toEqual([]);
    },
  );

  it("negative control: releasing replies on the previous group's sync is caught", async () => {
    const { violations, sent } = await tracedLoad({ TALLY_TEST_BREAK_DURABILITY: 'previous-sync' });
    expect(violations.length, 'violations found in the broken build').toBeGreaterThan(0);
    // Each is a reply that overtook its own record's write, sync or meta page; none is a
    // request the checker could not find.
    expect(
      violations.filter(
        (v) => !/no completed write carrying it|no sync of|no meta-page write/.test(v),
      ),
    ).toEqual([]);
    process.stdout.write(
      `negative control: ${violations.length} of ${sent.length} replies caught without ` +
        `their own sync\n`,
    );
  });
});
