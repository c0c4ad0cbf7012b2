/**
 * Running the compiled server under `strace -f` and reading the trace: the syscall
 * parser, the descriptor table over time and the traced-server lifecycle shared by the
 * syscall-level durability tests (durability-strace*.test.ts). Everything here is pure
 * parsing or process plumbing; the checks live in the tests.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { expect } from 'vitest';
import { listeningPort, MAIN_JS, type Keys } from './server-process.js';
import { SHARD_PAGE_BYTES } from '../../storage/lmdb-env.js';

/** Startup under strace takes about 2 s here; the limit only stops a hung test. */
const SERVER_READY_MS_MAX = 15_000;
const SERVER_STOP_MS_MAX = 10_000;

export const READ_SYSCALLS = new Set(['read', 'readv', 'recvfrom', 'recvmsg']);
export const WRITE_SYSCALLS = new Set([
  'write',
  'writev',
  'pwrite64',
  'pwritev',
  'pwritev2',
  'sendto',
  'sendmsg',
]);
/** The calls that make written data durable. msync and sync_file_range are traced but do
 *  not count: msync only applies to a writable map (off here) and sync_file_range does not
 *  flush metadata or the disk cache. */
export const SYNC_SYSCALLS = new Set(['fdatasync', 'fsync']);
export const TRACED_SYSCALLS = [
  'openat',
  'close',
  ...READ_SYSCALLS,
  ...WRITE_SYSCALLS,
  ...SYNC_SYSCALLS,
  'msync',
  'sync_file_range',
];
/** Large enough to print a whole LMDB page of a shard (16 KiB), so the journal write shows
 *  the customerId, and every request up to its body. */
export const STRACE_STRING_CHARS = 2 * SHARD_PAGE_BYTES;

// ---------------------------------------------------------------------------------------
// Trace parsing (pure)
// ---------------------------------------------------------------------------------------

/** One syscall of an `strace -f -tt` trace; lines are 1-based. */
export interface Syscall {
  readonly name: string;
  readonly tid: number;
  /** Argument text; for a call split by `<unfinished ...>` both halves, joined. */
  readonly args: string;
  /** What follows ` = `: `0`, `246`, `-1 EIO (Input/output error)`, `?`. */
  readonly result: string;
  readonly startLine: number;
  readonly endLine: number;
}

const LINE = /^(\d+)\s+\d\d:\d\d:\d\d\.\d+\s+(.*)$/;
const COMPLETE = /^(\w+)\((.*)\)\s+= (.+)$/;
const UNFINISHED = /^(\w+)\((.*) <unfinished \.\.\.>$/;
const RESUMED = /^<\.\.\. (\w+) resumed>(.*)\)\s+= (.+)$/;

/**
 * Parses the syscall lines of a trace, joining `<unfinished ...>` / `<... resumed>` pairs
 * per thread. Signal, exit and unmatched lines are ignored: the checks below demand
 * positive evidence, so anything lost here can only make them fail, never pass.
 */
export function parseTrace(trace: string): Syscall[] {
  const calls: Syscall[] = [];
  const pending = new Map<number, { name: string; args: string; startLine: number }>();
  trace.split('\n').forEach((text, index) => {
    const line = LINE.exec(text);
    if (line === null) return;
    const tid = Number(line[1]);
    const rest = line[2] ?? '';
    const lineNo = index + 1;
    const unfinished = UNFINISHED.exec(rest);
    if (unfinished !== null) {
      pending.set(tid, { name: unfinished[1] ?? '', args: unfinished[2] ?? '', startLine: lineNo });
      return;
    }
    const resumed = RESUMED.exec(rest);
    if (resumed !== null) {
      const entry = pending.get(tid);
      pending.delete(tid);
      if (entry === undefined || entry.name !== resumed[1]) return;
      calls.push({
        name: entry.name,
        tid,
        args: entry.args + (resumed[2] ?? ''),
        result: resumed[3] ?? '',
        startLine: entry.startLine,
        endLine: lineNo,
      });
      return;
    }
    const complete = COMPLETE.exec(rest);
    if (complete === null) return;
    calls.push({
      name: complete[1] ?? '',
      tid,
      args: complete[2] ?? '',
      result: complete[3] ?? '',
      startLine: lineNo,
      endLine: lineNo,
    });
  });
  return calls.sort((a, b) => a.startLine - b.startLine);
}

/** What a descriptor referred to between its `openat` returning and its `close` starting. */
export interface FdSpan {
  readonly fd: number;
  readonly path: string;
  readonly flags: string;
  readonly fromLine: number;
  toLine: number;
}

const OPENAT_ARGS = /^[^,]+, "((?:[^"\\]|\\.)*)", ([A-Z0-9_|]+)/;

/**
 * Builds the descriptor table over time from `openat`/`close`. The server is one process
 * (shards are threads), so one table serves every thread id in the trace.
 */
export function descriptorSpans(calls: readonly Syscall[]): FdSpan[] {
  const spans: FdSpan[] = [];
  const open = new Map<number, FdSpan>();
  const events = calls
    .filter((c) => c.name === 'openat' || c.name === 'close')
    .map((c) => ({ call: c, at: c.name === 'openat' ? c.endLine : c.startLine }))
    .sort((a, b) => a.at - b.at);
  for (const { call: c, at } of events) {
    if (c.name === 'close') {
      const span = open.get(callFd(c));
      if (span !== undefined) span.toLine = at;
      open.delete(callFd(c));
      continue;
    }
    const fd = Number(c.result);
    const parsed = OPENAT_ARGS.exec(c.args);
    if (!Number.isInteger(fd) || fd < 0 || parsed === null) continue;
    const span: FdSpan = {
      fd,
      path: parsed[1] ?? '',
      flags: parsed[2] ?? '',
      fromLine: at,
      toLine: Number.POSITIVE_INFINITY,
    };
    // Reused without a traced close (dup2, say): the old span ends here all the same.
    const previous = open.get(fd);
    if (previous !== undefined) previous.toLine = at;
    open.set(fd, span);
    spans.push(span);
  }
  return spans;
}

export function callFd(c: Syscall): number {
  const match = /^(\d+)/.exec(c.args);
  return match === null ? -1 : Number(match[1]);
}

/** The file a call's descriptor referred to when the call started, if traced. */
export function fileOf(c: Syscall, spans: readonly FdSpan[]): FdSpan | undefined {
  const fd = callFd(c);
  return spans.find((s) => s.fd === fd && s.fromLine < c.startLine && c.startLine <= s.toLine);
}

/** A sync succeeded when it returned 0; a read or write when it moved at least one byte. */
export function succeeded(c: Syscall): boolean {
  const value = /^-?\d+/.exec(c.result);
  if (value === null) return false; // `?`: the process went away mid-call
  return SYNC_SYSCALLS.has(c.name) ? Number(value[0]) === 0 : Number(value[0]) > 0;
}

export const isDsync = (s: FdSpan): boolean => /(^|\|)O_D?SYNC(\||$)/.test(s.flags);

/** Fails (never skips) when strace is missing or cannot trace here. */
export function requireStrace(): void {
  const version = spawnSync('strace', ['-V'], { encoding: 'utf8' });
  if (version.error !== undefined) {
    throw new Error(
      `strace is required by this test and could not be run (${version.error.message}). ` +
        'Install it (Debian/Ubuntu: apt-get install strace); .ci/run does so in CI.',
    );
  }
  const probe = spawnSync('strace', ['-f', '-o', '/dev/null', 'true'], { encoding: 'utf8' });
  if (probe.status !== 0) {
    throw new Error(
      `strace is installed but cannot trace here (exit ${probe.status}): ${probe.stderr.trim()}. ` +
        'It needs ptrace: run as root or with CAP_SYS_PTRACE, kernel.yama.ptrace_scope <= ' +
        '1, and a container seccomp profile that allows ptrace.',
    );
  }
}

export interface TracedServer {
  readonly base: string;
  readonly keys: Keys;
  readonly output: () => string;
  /** SIGTERM to the server (strace then exits with it, flushing the trace). */
  stop(): Promise<void>;
  /** Kills whatever is still running; safe to call after stop(). */
  kill(): void;
}

export async function startTracedServer(
  dataDir: string,
  tracePath: string,
  env: Record<string, string> = {},
): Promise<TracedServer> {
  const straceArgs = [
    '-f',
    '-tt',
    '--seccomp-bpf',
    '-e',
    `trace=${TRACED_SYSCALLS.join(',')}`,
    '-s',
    String(STRACE_STRING_CHARS),
    '-o',
    tracePath,
  ];
  const strace = spawn('strace', [...straceArgs, process.execPath, MAIN_JS], {
    env: { ...process.env, PORT: '0', TALLY_DATA_DIR: dataDir, TALLY_WORKERS: '1', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  strace.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
  strace.stderr.on('data', (chunk: Buffer) => (out += chunk.toString()));
  const exited = new Promise<void>((resolve) => strace.once('exit', () => resolve()));
  const output = (): string => out;
  // Only while strace runs: once it has exited its pid may belong to someone else.
  const kill = (): void => {
    if (strace.exitCode !== null || strace.signalCode !== null) return;
    for (const pid of childPids(strace.pid)) process.kill(pid, 'SIGKILL');
    strace.kill('SIGKILL');
  };
  try {
    const port = await waitFor(strace, output, () => listeningPort(out));
    const base = `http://127.0.0.1:${port}`;
    await waitFor(strace, output, async () =>
      (await fetch(`${base}/healthz`).catch(() => null))?.status === 200 ? true : null,
    );
    const keys = JSON.parse(
      fs.readFileSync(path.join(dataDir, 'bootstrap-keys.json'), 'utf8'),
    ) as Keys;
    const server = childPids(strace.pid);
    expect(server, `strace should have exactly one child (the server)\n${out}`).toHaveLength(1);
    const stop = async (): Promise<void> => {
      process.kill(server[0] as number, 'SIGTERM');
      const timer = setTimeout(kill, SERVER_STOP_MS_MAX);
      await exited;
      clearTimeout(timer);
    };
    return { base, keys, output, stop, kill };
  } catch (error) {
    kill();
    throw error;
  }
}

/** Pids whose parent is `parentPid` (read from /proc: strace cannot be asked). */
export function childPids(parentPid: number | undefined): number[] {
  const pids: number[] = [];
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue; // exited while we listed /proc
    }
    // Fields after "(comm)": state, ppid, ...; comm may itself contain spaces or parens.
    const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
    if (ppid === parentPid) pids.push(Number(entry));
  }
  return pids;
}

async function waitFor<T>(
  child: ChildProcess,
  output: () => string,
  probe: () => T | null | Promise<T | null>,
): Promise<T> {
  const deadline = Date.now() + SERVER_READY_MS_MAX;
  while (Date.now() < deadline) {
    if (child.exitCode !== null)
      throw new Error(`strace/server exited (${child.exitCode}):\n${output()}`);
    const value = await probe();
    if (value !== null) return value;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(
    `server under strace did not become ready in ${SERVER_READY_MS_MAX} ms:\n${output()}`,
  );
}
