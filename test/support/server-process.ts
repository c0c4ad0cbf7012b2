/**
 * Starts the real service as a child process (the compiled `dist/src/main.js`, built by
 * `npm test` before vitest runs) on port 0 with a fresh data dir, and talks to it with
 * `fetch`. Tests see exactly what a user sees, including crashes and restarts.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll } from 'vitest';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const MAIN_JS = path.join(ROOT, 'dist', 'src', 'main.js');

export interface Keys {
  readonly test: { readonly server: string; readonly client: string };
  readonly live: { readonly server: string; readonly client: string };
  readonly admin: string;
}

export interface ServerProcess {
  readonly child: ChildProcess;
  readonly port: number;
  readonly base: string;
  readonly dataDir: string;
  readonly keys: Keys;
  readonly output: () => string;
  stop(): Promise<number | null>;
  kill9(): Promise<void>;
}

/** The data dirs `tempDataDir` made for this test file, removed once its tests are done. */
const madeDirs: string[] = [];

// Registered as the file imports this module, so it runs after the file's own hooks (which
// stop its servers): each `npm test` would otherwise leave dozens of data dirs behind.
afterAll(() => {
  for (const dir of madeDirs.splice(0)) fs.rmSync(dir, { recursive: true, force: true });
});

export function tempDataDir(label = 'tally'): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `${label}-`));
  madeDirs.push(dir);
  return dir;
}

/**
 * Starts the server; with `config`, pushes it to the test environment first (and fails
 * loudly if the push is refused).
 */
export async function startServerProcess(
  options: { dataDir?: string; env?: Record<string, string>; config?: unknown; keys?: Keys } = {},
): Promise<ServerProcess> {
  const dataDir = options.dataDir ?? tempDataDir();
  const child = spawn(process.execPath, [MAIN_JS], {
    // Tests that are not about rate limits must not run into them: limits on, but huge.
    env: {
      ...process.env,
      PORT: '0',
      TALLY_DATA_DIR: dataDir,
      TALLY_RATE_LIMIT_SERVER: '1000000000',
      TALLY_RATE_LIMIT_CLIENT: '1000000000',
      TALLY_RATE_LIMIT_CLIENT_ADDRESS: '1000000000',
      TALLY_RATE_LIMIT_CLIENT_CUSTOMER: '1000000000',
      TALLY_CLIENT_ADDRESS_HEADER: '',
      // The embedded Stripe sandbox unless a test names a processor (empty means unset).
      STRIPE_SECRET_KEY: '',
      STRIPE_WEBHOOK_SECRET: '',
      STRIPE_API_URL: '',
      ...options.env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout?.on('data', (chunk: Buffer) => (out += chunk.toString()));
  child.stderr?.on('data', (chunk: Buffer) => (out += chunk.toString()));
  const port = await waitFor(
    () => listeningPort(out),
    () => out,
    child,
  );
  const base = `http://127.0.0.1:${port}`;
  await waitFor(
    async () => ((await fetch(`${base}/healthz`).catch(() => null))?.status === 200 ? true : null),
    () => out,
    child,
  );
  // A restored data dir has no bootstrap file: its keys are the original server's.
  const keys =
    options.keys ??
    (JSON.parse(fs.readFileSync(path.join(dataDir, 'bootstrap-keys.json'), 'utf8')) as Keys);
  const exited = new Promise<number | null>((resolve) =>
    child.once('exit', (code) => resolve(code)),
  );
  if (options.config !== undefined) {
    const pushed = await call(base, 'POST', '/v1/sync/push', {
      key: keys.test.server,
      body: options.config,
    });
    if (pushed.status !== 200) {
      // Nobody else will stop it: the caller never gets the handle.
      child.kill('SIGKILL');
      throw new Error(`config push refused: ${JSON.stringify(pushed.body)}`);
    }
  }
  return {
    child,
    port,
    base,
    dataDir,
    keys,
    output: () => out,
    async stop() {
      child.kill('SIGTERM');
      return exited;
    },
    async kill9() {
      child.kill('SIGKILL');
      await exited;
    },
  };
}

/**
 * The port of the server's `listening` log line in `output` (JSON lines; the field order
 * is pino's, so the line is parsed, not matched), or null before it has been printed.
 */
export function listeningPort(output: string): number | null {
  for (const line of output.split('\n')) {
    if (!line.includes('"listening"')) continue;
    try {
      const parsed = JSON.parse(line) as { msg?: unknown; port?: unknown };
      if (parsed.msg === 'listening' && typeof parsed.port === 'number') return parsed.port;
    } catch {
      /* a partial line: not printed in full yet */
    }
  }
  return null;
}

/** The server's JSON log lines so far (the bootstrap block and any partial last line skipped). */
export function logLines(output: string): Array<Record<string, unknown>> {
  const lines: Array<Record<string, unknown>> = [];
  for (const line of output.split('\n')) {
    if (!line.startsWith('{"level"')) continue;
    try {
      lines.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      /* a partial line: not printed in full yet */
    }
  }
  return lines;
}

/** Waits (up to 5 s: log lines are written asynchronously) for a log line `predicate` accepts. */
export async function waitForLogLine(
  server: ServerProcess,
  predicate: (line: Record<string, unknown>) => boolean,
): Promise<Record<string, unknown>> {
  const deadline = Date.now() + 5000;
  for (;;) {
    const found = logLines(server.output()).find(predicate);
    if (found !== undefined) return found;
    if (Date.now() > deadline) throw new Error(`no such log line in:\n${server.output()}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

async function waitFor<T>(
  probe: () => T | null | Promise<T | null>,
  output: () => string,
  child: ChildProcess,
): Promise<T> {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`server exited (${child.exitCode}):\n${output()}`);
    const value = await probe();
    if (value !== null) return value;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`server did not become ready:\n${output()}`);
}

/** Servers whose every `call` opens a connection of its own (see `freshConnections`). */
const freshBases = new Set<string>();

/**
 * Makes every later `call` to `base` open a new connection and close it after the answer,
 * instead of reusing one: with several front-end threads on the port, the kernel spreads
 * connections, not requests, so this is what makes a suite reach all of them.
 */
export function freshConnections(base: string): void {
  freshBases.add(base);
}

/** Bodies longer than this go on a connection of their own (see `call`). */
const LARGE_BODY_CHARS = 64 * 1024;

/** One request on a connection of its own (`Connection: close`). */
function callFresh(
  base: string,
  method: string,
  pathAndQuery: string,
  headers: Record<string, string>,
  body: string | undefined,
): Promise<{ status: number; bytes: Buffer; headers: Headers }> {
  return new Promise((resolve, reject) => {
    let responded = false;
    const request = http.request(
      base + pathAndQuery,
      { method, headers: { ...headers, connection: 'close' }, agent: false },
      (response) => {
        responded = true;
        const chunks: Buffer[] = [];
        response.on('data', (chunk: Buffer) => chunks.push(chunk));
        response.on('end', () => {
          const received = new Headers();
          for (const [name, value] of Object.entries(response.headers))
            for (const one of Array.isArray(value) ? value : [value ?? ''])
              received.append(name, one);
          resolve({
            status: response.statusCode ?? 0,
            bytes: Buffer.concat(chunks),
            headers: received,
          });
        });
        response.on('error', reject);
      },
    );
    // A server may answer from the head alone (a 400 or 413) and close: a body still being
    // written then fails (EPIPE), and that error can come before the answer is read. So a
    // large body waits for such an answer first and is not sent if one comes; an error
    // after the answer is ignored, an error before it is a failure.
    request.on('error', (error) => {
      if (!responded) reject(error);
    });
    if (body === undefined || body.length <= LARGE_BODY_CHARS) {
      request.end(body);
      return;
    }
    request.setHeader('content-length', Buffer.byteLength(body));
    request.flushHeaders();
    const send = setTimeout(() => request.end(body), HEAD_ANSWER_WAIT_MS);
    request.once('response', (response) => {
      clearTimeout(send);
      // Answered without the body: the request can never be completed, so it is dropped.
      response.once('end', () => {
        if (!request.writableEnded) request.destroy();
      });
    });
  });
}

/** How long a large body waits for an answer judged from the head alone. */
const HEAD_ANSWER_WAIT_MS = 300;

/** A small fetch wrapper: JSON in, status + parsed JSON (or text) out. */
export async function call(
  base: string,
  method: string,
  pathAndQuery: string,
  options: {
    key?: string;
    body?: unknown;
    rawBody?: string;
    headers?: Record<string, string>;
    /** The answer's body as a Buffer, unparsed. */
    binary?: boolean;
  } = {},
): Promise<{ status: number; body: any; headers: Headers }> {
  const headers: Record<string, string> = { ...options.headers };
  if (options.key !== undefined) headers['x-tally-key'] = options.key;
  let body: string | undefined;
  if (options.rawBody !== undefined) body = options.rawBody;
  else if (options.body !== undefined) {
    body = JSON.stringify(options.body);
    headers['content-type'] ??= 'application/json';
  }
  let status: number;
  let bytes: Buffer;
  let received: Headers;
  // A body past what the server accepts may be answered (413) and the connection closed
  // before fetch has written all of it, which fetch reports as EPIPE instead of the answer;
  // a connection of its own reads the answer that came.
  if (freshBases.has(base) || (body !== undefined && body.length > LARGE_BODY_CHARS)) {
    ({
      status,
      bytes,
      headers: received,
    } = await callFresh(base, method, pathAndQuery, headers, body));
  } else {
    const response = await fetch(base + pathAndQuery, {
      method,
      headers,
      ...(body === undefined ? {} : { body }),
    });
    status = response.status;
    received = response.headers;
    bytes = Buffer.from(await response.arrayBuffer());
  }
  if (options.binary === true) return { status, body: bytes, headers: received };
  const text = bytes.toString('utf8');
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    /* not JSON: keep the text so the assertion shows it */
  }
  return { status, body: parsed, headers: received };
}
