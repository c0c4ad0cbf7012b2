/**
 * Child processes for the benchmark: the bare ceiling server and Tally itself.
 *
 * Both run as separate `node` processes so that neither shares an event loop with the
 * load generator. This module starts one, waits for its `{"msg":"listening","port":n}`
 * line, keeps the tail of its output for error reports (and keeps draining the pipes, so
 * a chatty child can never block on a full pipe), and stops it: SIGTERM, then SIGKILL
 * after a grace period. Every child started here, and the load generators it is told of
 * (`trackChild`), is registered so that `stopAll()`, the signal handlers of
 * `stopOnSignals` and, as a last resort, the synchronous `exit` hook can kill whatever is
 * still running.
 */
import { spawn, type ChildProcess } from 'node:child_process';

/** How long a child may take to print its listening line before we give up. */
const LISTEN_TIMEOUT_MS = 30_000;
/** How long a child gets to exit after SIGTERM before it is SIGKILLed. */
const STOP_GRACE_MS = 5_000;
/** Output kept per child for error messages. */
const OUTPUT_TAIL_CHARS_MAX = 8_192;

export interface Child {
  readonly name: string;
  readonly port: number;
  readonly process: ChildProcess;
  /** The last few KiB of the child's stdout and stderr, for error messages. */
  outputTail(): string;
}

const running = new Set<ChildProcess>();

process.once('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

class OutputTail {
  private text = '';
  add(chunk: string): void {
    this.text = (this.text + chunk).slice(-OUTPUT_TAIL_CHARS_MAX);
  }
  get(): string {
    return this.text;
  }
}

/** Returns the port from a `{"msg":"listening","port":n}` line, or undefined for any other line. */
export function parseListeningLine(line: string): number | undefined {
  if (!line.includes('"listening"')) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(line);
  } catch {
    return undefined; // not a JSON log line; keep waiting
  }
  if (typeof parsed !== 'object' || parsed === null) return undefined;
  const { msg, port } = parsed as { msg?: unknown; port?: unknown };
  if (msg !== 'listening' || typeof port !== 'number' || !Number.isInteger(port) || port <= 0)
    return undefined;
  return port;
}

/**
 * Starts `node <script>` with `env` added to this process's environment and resolves
 * once it prints its listening line. Rejects (and kills the child) if it exits first
 * or stays silent for LISTEN_TIMEOUT_MS; the error carries the child's output tail.
 * The child's stdin is a pipe we never close, so a child that watches stdin (the bare
 * server does) exits when this process dies, however it dies.
 */
export function startChild(
  name: string,
  script: string,
  env: Record<string, string>,
): Promise<Child> {
  const child = spawn(process.execPath, [script], {
    env: { ...process.env, ...env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  running.add(child);
  child.once('exit', () => running.delete(child));
  const tail = new OutputTail();
  child.stderr?.setEncoding('utf8').on('data', (chunk: string) => tail.add(chunk));
  return new Promise<Child>((resolve, reject) => {
    let pending = '';
    let settled = false;
    const fail = (why: string): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      child.kill('SIGKILL');
      reject(new Error(`${name}: ${why}\n--- ${name} output ---\n${tail.get()}`));
    };
    const timer = setTimeout(
      () => fail(`no listening line within ${LISTEN_TIMEOUT_MS} ms`),
      LISTEN_TIMEOUT_MS,
    );
    child.once('error', (error) => fail(`cannot start: ${error.message}`));
    child.once('exit', (code, signal) =>
      fail(`exited before listening (code ${code}, signal ${signal})`),
    );
    child.stdout?.setEncoding('utf8').on('data', (chunk: string) => {
      tail.add(chunk);
      if (settled) return; // keep draining; only the tail is kept
      pending += chunk;
      const lines = pending.split('\n');
      pending = lines.pop() ?? '';
      const port = lines.map(parseListeningLine).find((p) => p !== undefined);
      if (port === undefined) return;
      settled = true;
      clearTimeout(timer);
      resolve({ name, port, process: child, outputTail: () => tail.get() });
    });
  });
}

/** SIGTERM, then SIGKILL after STOP_GRACE_MS. Never rejects: stopping is best effort by design. */
export async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), STOP_GRACE_MS);
  await exited;
  clearTimeout(timer);
}

/** Stops every child this module started or tracks that is still running. */
export async function stopAll(): Promise<void> {
  await Promise.all([...running].map(stopChild));
}

/**
 * Counts a child started elsewhere (the load generator) among this module's, so that
 * `stopAll`, the signal handlers and the `exit` hook stop it too.
 */
export function trackChild<T extends ChildProcess>(child: T): T {
  if (child.exitCode === null && child.signalCode === null) {
    running.add(child);
    child.once('exit', () => running.delete(child));
  }
  return child;
}

/**
 * On SIGINT or SIGTERM, stops every child and runs `cleanup` (removing data dirs), then
 * exits with 128 + the signal's number. Node runs no `exit` hook when a signal ends the
 * process, so without this a benchmark stopped by a signal leaves its servers and its
 * load generator running.
 */
export function stopOnSignals(
  name: string,
  cleanup: () => Promise<void> = () => Promise.resolve(),
): void {
  const stop = (signal: NodeJS.Signals, code: number): void => {
    stoppingOnSignal = true;
    process.stderr.write(`${name}: ${signal}, stopping\n`);
    void stopAll()
      .then(cleanup)
      .finally(() => process.exit(code));
  };
  process.once('SIGINT', () => stop('SIGINT', 130));
  process.once('SIGTERM', () => stop('SIGTERM', 143));
}

/** Set once a signal's handler is stopping this process: it, not `runMain`, exits. */
let stoppingOnSignal = false;

/**
 * Runs a benchmark's `main`: exits 0 when it resolves, or 1 with its error when it fails;
 * but while a signal's handler is stopping the process (the children it stops fail the
 * run in progress) that handler exits, with the signal's code.
 */
export function runMain(name: string, main: () => Promise<void>): void {
  main().then(
    () => {
      if (!stoppingOnSignal) process.exit(0);
    },
    (error: unknown) => {
      if (stoppingOnSignal) return;
      const why = error instanceof Error ? (error.stack ?? error.message) : String(error);
      process.stderr.write(`${name} failed: ${why}\n`);
      process.exit(1);
    },
  );
}
