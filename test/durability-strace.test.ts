/**
 * Write-ahead, then reply — proven at the syscall level on the real server.
 *
 * Why it exists: the kill -9 crash test (crash.test.ts) cannot tell "on disk" from "in the
 * page cache", because a killed process leaves the page cache behind. This test runs the
 * compiled server (`dist/src/main.js`) under `strace -f` and, for each consume, checks the
 * order of the syscalls between reading the request and writing the reply. Everything
 * below must happen after the request was read and before the reply's first byte is sent:
 * 1. a write to the shard's `<dataDir>/shard-0/data.mdb` that carries the consume's
 *    customerId (the journal page of this batch, not some other transaction);
 * 2. an fdatasync/fsync on that file that STARTED after that write returned and RETURNED
 *    0 (LMDB's mdb_env_sync0 flushing the data pages);
 * 3. a write through the shard file's O_DSYNC descriptor after that sync returned (LMDB's
 *    meta page: the commit record, synchronous by itself).
 * Only 1–3 together make the consume survive a power cut, so a reply that overtakes any
 * of them is a violation. Descriptors are mapped to paths from the traced `openat`/`close`
 * calls, so a sync of the front end's control store does not count.
 *
 * What the trace showed on Linux x86_64 (lmdb-js 3.5.6, uWS 20.30, strace 6.1): uWS reads
 * requests with recvfrom and answers with sendto(…, MSG_NOSIGNAL); LMDB's writer thread
 * writes pages with writev/pwrite64, syncs with fdatasync (never fsync, msync or
 * sync_file_range with useWritemap off) and writes the meta page with pwrite64 on a
 * descriptor opened O_WRONLY|O_DSYNC. The checker also accepts the other members of each
 * family (read/recvmsg, write/writev/sendmsg, fsync) so a library update that switches
 * calls still gets checked rather than silently passing.
 *
 * The server runs with TALLY_WORKERS=1 so every customer lives in shard-0. strace is
 * required: without it (or without ptrace permission) the test fails, it never skips;
 * .ci/run installs strace.
 *
 * The checker is a pure function over the trace text, and the synthetic traces at the
 * bottom show it rejecting each way the order can break (so a pass means something).
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
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
  entitlements: { api_calls: { type: 'meter' } },
  products: { free: { default: true, entitlements: { api_calls: { included: 1000 } } } },
};

/** Consumes to check; each is one batch, one fsync, so a few are plenty. */
const CONSUMES = 5;

/** How one consume went through the trace; every field is the call that proved a step. */
interface ConsumeEvidence {
  readonly request: Syscall;
  readonly journalWrite: Syscall;
  readonly sync: Syscall;
  readonly metaWrite: Syscall;
  readonly response: Syscall;
}

interface DurabilityReport {
  readonly violations: string[];
  readonly evidence: Map<string, ConsumeEvidence>;
}

/**
 * Checks, for each customerId, the order request → journal write → completed sync →
 * meta write through O_DSYNC → reply, all on `shardDataFile` (see the file header).
 * Never throws on a bad trace: every missing or misordered step is a violation string that
 * names the customer and quotes the trace between request and reply.
 */
function checkReplyAfterSync(
  trace: string,
  shardDataFile: string,
  customerIds: readonly string[],
): DurabilityReport {
  const calls = parseTrace(trace);
  const spans = descriptorSpans(calls);
  const lines = trace.split('\n');
  const violations: string[] = [];
  const evidence = new Map<string, ConsumeEvidence>();
  for (const customerId of customerIds) {
    const result = checkOne(calls, spans, shardDataFile, customerId);
    if (typeof result === 'string') violations.push(result);
    else if ('problem' in result)
      violations.push(
        `${customerId}: ${result.problem}\n${excerpt(lines, result.from, result.to)}`,
      );
    else evidence.set(customerId, result);
  }
  return { violations, evidence };
}

function checkOne(
  calls: readonly Syscall[],
  spans: readonly FdSpan[],
  shardDataFile: string,
  customerId: string,
): ConsumeEvidence | string | { problem: string; from: number; to: number } {
  const request = calls.find(
    (c) => READ_SYSCALLS.has(c.name) && c.args.includes(customerId) && succeeded(c),
  );
  if (request === undefined)
    return (
      `${customerId}: no traced read of its request (syscalls ` +
      `traced: ${[...READ_SYSCALLS].join(', ')})`
    );
  const response = calls.find(
    (c) =>
      WRITE_SYSCALLS.has(c.name) && callFd(c) === callFd(request) && c.startLine > request.endLine,
  );
  if (response === undefined)
    return (
      `${customerId}: no write on fd ${callFd(request)} after its request ` +
      `(line ${request.endLine})`
    );
  const window = { from: request.endLine, to: response.startLine };
  if (
    !/^"HTTP\/1\.1 200 .*\\"consumed\\":1[,}]/.test(response.args.slice(response.args.indexOf('"')))
  ) {
    return {
      problem:
        `the first write after the request (line ${response.startLine}) is not its 200 ` +
        `reply with "consumed":1`,
      ...window,
    };
  }
  const inWindow = (c: Syscall): boolean =>
    c.startLine > request.endLine && c.endLine < response.startLine && succeeded(c);
  const onShard = (c: Syscall, dsync: boolean): boolean => {
    const file = fileOf(c, spans);
    return file !== undefined && file.path === shardDataFile && isDsync(file) === dsync;
  };
  const reply = `the reply (line ${response.startLine})`;
  const journalWrite = calls.find(
    (c) =>
      WRITE_SYSCALLS.has(c.name) && inWindow(c) && onShard(c, false) && c.args.includes(customerId),
  );
  if (journalWrite === undefined) {
    const problem =
      `no completed write carrying the customerId to ${shardDataFile} between the ` +
      `request (line ${request.endLine}) and ${reply}`;
    return { problem, ...window };
  }
  const sync = calls.find(
    (c) =>
      SYNC_SYSCALLS.has(c.name) &&
      inWindow(c) &&
      c.startLine > journalWrite.endLine &&
      onShard(c, false),
  );
  if (sync === undefined) {
    const problem =
      `no ${[...SYNC_SYSCALLS].join('/')} of ${shardDataFile} that returned 0 ` +
      `after the journal write (line ${journalWrite.endLine}) and before ${reply}`;
    return { problem, ...window };
  }
  const metaWrite = calls.find(
    (c) =>
      WRITE_SYSCALLS.has(c.name) && inWindow(c) && c.startLine > sync.endLine && onShard(c, true),
  );
  if (metaWrite === undefined) {
    const problem =
      `no meta-page write through the O_DSYNC descriptor of ${shardDataFile} ` +
      `after the sync (line ${sync.endLine}) and before ${reply}`;
    return { problem, ...window };
  }
  return { request, journalWrite, sync, metaWrite, response };
}

/** The trace from line `from` to `to`, each line cut short, at most 60 lines. */
function excerpt(lines: readonly string[], from: number, to: number): string {
  const shown = lines.slice(from - 1, Math.min(to, from + 59));
  return shown
    .map((text, i) => `  ${from + i}: ${text.length > 160 ? `${text.slice(0, 160)}…` : text}`)
    .join('\n');
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

describe('durability at the syscall level (strace)', () => {
  it(
    'replies to each consume only after its journal page, an fdatasync and the meta page ' +
      'hit the shard file',
    async () => {
      requireStrace();
      const dataDir = tempDataDir('tally-strace');
      const tracePath = `${dataDir}.strace`;
      const server = await startTracedServer(dataDir, tracePath);
      // A random tag makes each customerId a string that occurs nowhere else in the trace.
      const tag = randomBytes(4).toString('hex');
      const customerIds = Array.from({ length: CONSUMES }, (_, n) => `c${n}-${tag}`);
      try {
        const sk = server.keys.test.server;
        expect(
          (await call(server.base, 'POST', '/v1/sync/push', { key: sk, body: CONFIG })).status,
        ).toBe(200);
        for (const customerId of customerIds) {
          const res = await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
            key: sk,
            body: { customerId, amount: 1 },
          });
          expect(res, server.output()).toMatchObject({ status: 200, body: { consumed: 1 } });
        }
        await server.stop();
      } finally {
        server.kill();
      }

      const trace = fs.readFileSync(tracePath, 'utf8');
      const shardDataFile = path.join(dataDir, 'shard-0', 'data.mdb');
      const { violations, evidence } = checkReplyAfterSync(trace, shardDataFile, customerIds);
      expect(violations).toEqual([]);
      expect([...evidence.keys()]).toEqual(customerIds);
      for (const { sync } of evidence.values()) expect(sync.result).toMatch(/^0\b/);
      fs.rmSync(dataDir, { recursive: true, force: true });
      fs.rmSync(tracePath, { force: true });
    },
  );

  // Negative controls: the same checker on synthetic traces shaped like the real one.
  const FILE = '/d/shard-0/data.mdb';
  const ID = 'c7-feedbeef';
  const opens = [
    `100 10:00:00.000001 openat(AT_FDCWD, "/d/control/data.mdb", O_RDWR|O_CREAT, 0664) = 19`,
    `101 10:00:00.000002 openat(AT_FDCWD, "${FILE}", O_RDWR|O_CREAT, 0664) = 27`,
    `101 10:00:00.000003 openat(AT_FDCWD, "${FILE}", O_WRONLY|O_DSYNC|O_CLOEXEC) = 28`,
  ];
  const request =
    `100 10:00:01.000001 recvfrom(29, "POST /v1/usage/api_calls/consume ` +
    `HTTP/1.1\\r\\n\\r\\n{\\"customerId\\":\\"${ID}\\",\\"amount\\":1}", 524288, 0, NULL, ` +
    `NULL) = 90`;
  const journal =
    `101 10:00:01.000002 writev(27, ` +
    `[{iov_base="\\3\\0\\0\\250customerId\\253${ID}", iov_len=4096}], 1) = 4096`;
  const sync = `101 10:00:01.000003 fdatasync(27)     = 0`;
  const meta = `101 10:00:01.000004 pwrite64(28, "\\0\\0\\0\\20", 4096, 4096) = 4096`;
  const reply =
    `100 10:00:01.000005 sendto(29, "HTTP/1.1 200 ` +
    `OK\\r\\n\\r\\n{\\"balance\\":999,\\"consumed\\":1,\\"overage\\":0}", 150, ` +
    `MSG_NOSIGNAL, NULL, 0) = 150`;
  const build = (...body: string[]): string => [...opens, ...body, ''].join('\n');

  const cases: { name: string; trace: string; violation: RegExp | null }[] = [
    { name: 'the real order', trace: build(request, journal, sync, meta, reply), violation: null },
    {
      name: 'the real order with the sync split by another thread (-f)',
      trace: build(
        request,
        journal,
        `101 10:00:01.000003 fdatasync(27 <unfinished ...>`,
        `100 10:00:01.000003 close(40) = 0`,
        `101 10:00:01.000004 <... fdatasync resumed>) = 0`,
        meta,
        reply,
      ),
      violation: null,
    },
    {
      name: 'reply written before the fdatasync',
      trace: build(request, journal, reply, sync, meta),
      violation: /no fdatasync\/fsync .* returned 0/,
    },
    {
      name: 'reply written while the fdatasync is still running',
      trace: build(
        request,
        journal,
        `101 10:00:01.000003 fdatasync(27 <unfinished ...>`,
        meta,
        reply,
        `101 10:00:01.000006 <... fdatasync resumed>) = 0`,
      ),
      violation: /no fdatasync\/fsync/,
    },
    {
      name: 'fdatasync failed',
      trace: build(
        request,
        journal,
        sync.replace('= 0', '= -1 EIO (Input/output error)'),
        meta,
        reply,
      ),
      violation: /no fdatasync\/fsync/,
    },
    {
      name: 'only the control store was synced',
      trace: build(request, journal, sync.replace('(27)', '(19)'), meta, reply),
      violation: /no fdatasync\/fsync/,
    },
    {
      name: 'sync before the journal write',
      trace: build(request, sync, journal, meta, reply),
      violation: /no fdatasync\/fsync/,
    },
    {
      name: 'no journal write carrying the customer',
      trace: build(request, sync, meta, reply),
      violation: /no completed write carrying the customerId/,
    },
    {
      name: 'meta page written after the reply',
      trace: build(request, journal, sync, reply, meta),
      violation: /no meta-page write/,
    },
    {
      name: 'request never read',
      trace: build(journal, sync, meta, reply),
      violation: /no traced read of its request/,
    },
  ];

  it.each(cases)('checker on a synthetic trace: $name', ({ trace, violation }) => {
    const { violations } = checkReplyAfterSync(trace, FILE, [ID]);
    if (violation === null) expect(violations).toEqual([]);
    else {
      expect(violations).toHaveLength(1);
      expect(violations[0]).toMatch(violation);
    }
  });
});
