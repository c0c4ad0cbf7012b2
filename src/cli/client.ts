/**
 * What every `tally` command shares: the exit codes, the error a command throws to stop
 * with one, the `--url` / `--key` options, the HTTP helper that talks to a running
 * service, and the progress shown on a terminal (a bar for long transfers, a status line
 * for a step that has no size).
 *
 * A command never calls `process.exit` or prints its own error: it throws a `CliError` and
 * `main.ts` prints `error: <message>` on stderr and sets the exit code. The service's answers are
 * `{"error": message, "code": key}` on failure (src/errors.ts); the helper turns such an answer
 * into a `ServiceError` carrying that message, so the user reads exactly what the service said (a
 * 403 on an operator route says "this endpoint requires the operator key").
 */
import { type Command, Option } from 'commander';
import { formatBytes } from './format.js';

/** 0 ok, 1 the operation failed (or was refused by the service), 2 the command line was wrong. */
export const EXIT = { ok: 0, failed: 1, usage: 2 } as const;
export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

export const DEFAULT_URL = 'http://localhost:8787';

/**
 * A request that has not answered in this long is abandoned (exit 1). Every operator
 * call is answered from memory or one durable commit, far below this; the bound only
 * keeps a wedged connection from hanging a CI job forever.
 */
export const REQUEST_TIMEOUT_MS = 30_000;

/** Stops the command with `message` on stderr and `exitCode`. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: ExitCode = EXIT.failed,
  ) {
    super(message);
    this.name = 'CliError';
  }
}

/** The service answered with a non-2xx status; `message` is its `error` text. */
export class ServiceError extends CliError {
  constructor(
    message: string,
    readonly status: number,
  ) {
    super(message, EXIT.failed);
    this.name = 'ServiceError';
  }
}

export interface RemoteOptions {
  readonly url: string;
  readonly key?: string;
}

/**
 * Adds `--url` (env TALLY_URL) and `--key` (env TALLY_API_KEY) to a command that calls the service.
 */
export function addRemoteOptions(command: Command, keyKind: 'server' | 'operator'): Command {
  const keyHelp =
    keyKind === 'server' ? 'environment server key (sk_test_… / sk_live_…)' : 'operator key (ak_…)';
  return command
    .addOption(
      new Option('--url <url>', 'base URL of the Tally service')
        .env('TALLY_URL')
        .default(DEFAULT_URL),
    )
    .addOption(new Option('--key <key>', keyHelp).env('TALLY_API_KEY'));
}

/** A client of one running service, authenticated with one key. */
export class TallyClient {
  private constructor(
    readonly baseUrl: string,
    private readonly key: string,
  ) {}

  /** Fails with a usage error when the URL is not http(s) or no key was given. */
  static from(options: RemoteOptions): TallyClient {
    let parsed: URL;
    try {
      parsed = new URL(options.url);
    } catch {
      throw new CliError(`--url / TALLY_URL is not a URL: ${options.url}`, EXIT.usage);
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
      throw new CliError(
        `--url / TALLY_URL must be http:// or https://, got ${options.url}`,
        EXIT.usage,
      );
    }
    if (options.key === undefined || options.key === '') {
      throw new CliError('no API key: set TALLY_API_KEY or pass --key', EXIT.usage);
    }
    const warning = plainHttpWarning(parsed, options.key);
    if (warning !== null) process.stderr.write(`${warning}\n`);
    return new TallyClient(options.url.replace(/\/+$/, ''), options.key);
  }

  /**
   * Sends one request and answers its parsed JSON body. Throws `ServiceError` for a
   * non-2xx answer (with the service's message) and `CliError` when the service cannot
   * be reached or the whole answer has not arrived within REQUEST_TIMEOUT_MS.
   */
  async json<T>(method: string, path: string, body?: unknown): Promise<T> {
    const response = await this.send(method, path, body, AbortSignal.timeout(REQUEST_TIMEOUT_MS));
    let text: string;
    try {
      text = await response.text();
    } catch (error) {
      throw new CliError(`${method} ${path}: the answer broke off: ${describeFetchFailure(error)}`);
    }
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new CliError(
        `${method} ${path} answered ${response.status} with a body that is not JSON`,
      );
    }
  }

  /**
   * Sends one request and answers the response once its status is 2xx, body unread, for
   * callers that stream it (downloads). The timeout covers the wait for the status only:
   * a large body may take as long as it takes, and the caller's stream reports a broken
   * connection. Failures as for `json`.
   */
  async raw(method: string, path: string, body?: unknown): Promise<Response> {
    const controller = new AbortController();
    const timer = setTimeout(
      () => controller.abort(new DOMException('timed out', 'TimeoutError')),
      REQUEST_TIMEOUT_MS,
    );
    try {
      return await this.send(method, path, body, controller.signal);
    } finally {
      clearTimeout(timer);
    }
  }

  private async send(
    method: string,
    path: string,
    body: unknown,
    signal: AbortSignal,
  ): Promise<Response> {
    const headers: Record<string, string> = { 'x-tally-key': this.key };
    if (body !== undefined) headers['content-type'] = 'application/json';
    let response: Response;
    try {
      response = await fetch(this.baseUrl + path, {
        method,
        headers,
        signal,
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      });
    } catch (error) {
      throw new CliError(`cannot reach Tally at ${this.baseUrl}: ${describeFetchFailure(error)}`);
    }
    if (response.ok) return response;
    throw new ServiceError(await errorMessage(response), response.status);
  }
}

/** The service's `error` text, or the status line when the body is not one of its errors. */
async function errorMessage(response: Response): Promise<string> {
  const text = await response.text().catch(() => '');
  try {
    const parsed = JSON.parse(text) as { error?: unknown };
    if (typeof parsed.error === 'string') return `${parsed.error} (HTTP ${response.status})`;
  } catch {
    /* not JSON: a proxy or another server answered */
  }
  return `HTTP ${response.status} ${response.statusText}`.trim();
}

/** fetch hides the socket error in `cause`: ECONNREFUSED says more than "fetch failed". */
function describeFetchFailure(error: unknown): string {
  if (error instanceof Error && error.name === 'TimeoutError')
    return `no answer within ${REQUEST_TIMEOUT_MS / 1000} s`;
  const cause =
    error instanceof Error
      ? (error.cause as { code?: unknown; message?: unknown } | undefined)
      : undefined;
  if (typeof cause?.code === 'string') return cause.code;
  if (typeof cause?.message === 'string') return cause.message;
  return error instanceof Error ? error.message : String(error);
}

export interface Progress {
  /** Adds `n` units (bytes) done. */
  advance(n: number): void;
  /** Ends the bar (prints the final state and a newline). */
  done(): void;
}

/** Redraws at most this often: a terminal needs no more, and a fast download would flood it. */
const PROGRESS_REDRAW_MS = 100;
const PROGRESS_BAR_WIDTH = 24;

/**
 * A one-line progress bar on `stream` (stderr by default, so stdout stays clean for
 * data). Draws nothing unless `stream` is a terminal. `total` null: counts bytes only.
 */
export function progressBar(
  label: string,
  total: number | null,
  stream: NodeJS.WriteStream = process.stderr,
  unit: 'bytes' | 'count' = 'bytes',
): Progress {
  const formatAmount =
    unit === 'bytes' ? formatBytes : (n: number): string => n.toLocaleString('en-US');
  let doneBytes = 0;
  let drawnAtMs = 0;
  const draw = (): void => {
    const amount =
      total === null
        ? formatAmount(doneBytes)
        : `${formatAmount(doneBytes)}/${formatAmount(total)}`;
    let bar = '';
    if (total !== null && total > 0) {
      const fraction = Math.min(1, doneBytes / total);
      const filled = Math.round(fraction * PROGRESS_BAR_WIDTH);
      bar =
        ` [${'#'.repeat(filled)}${'.'.repeat(PROGRESS_BAR_WIDTH - filled)}] ` +
        `${Math.floor(fraction * 100)}%`;
    }
    stream.write(`\r${label}${bar} ${amount}`);
  };
  return {
    advance(n) {
      doneBytes += n;
      const now = Date.now();
      if (!stream.isTTY || now - drawnAtMs < PROGRESS_REDRAW_MS) return;
      drawnAtMs = now;
      draw();
    },
    done() {
      if (!stream.isTTY) return;
      draw();
      stream.write('\n');
    },
  };
}

/** Whether `hostname` (as URL parses it) names this machine: localhost, 127.0.0.0/8 or ::1. */
export function isLoopback(hostname: string): boolean {
  return (
    hostname === 'localhost' ||
    hostname === '[::1]' ||
    /^127(?:\.\d{1,3}){3}$/.test(hostname) ||
    /^\[::ffff:7f[0-9a-f]{2}:[0-9a-f]{1,4}\]$/.test(hostname)
  );
}

/**
 * The warning printed before a key goes over plain http:// to another machine (anyone on
 * the network path could read it), or null for https:// and for this machine.
 */
export function plainHttpWarning(url: URL, key: string): string | null {
  if (url.protocol !== 'http:' || isLoopback(url.hostname)) return null;
  const kind = key.startsWith('ak_') ? 'the operator key' : 'an API key';
  return (
    `warning: sending ${kind} over plain http:// to ${url.host}: anyone on the network ` +
    `path can read it; use https:// (TLS in front of Tally)`
  );
}

export interface Activity {
  /** Clears the status line (the command's own output follows on stdout). */
  end(): void;
}

/**
 * A one-line status (`label…`) on `stream` (stderr by default) while a step with no size
 * to count runs, such as a push; cleared when it ends. Nothing unless `stream` is a
 * terminal, so piped or captured output stays exactly the command's result.
 */
export function activity(label: string, stream: NodeJS.WriteStream = process.stderr): Activity {
  if (!stream.isTTY) return { end: () => undefined };
  stream.write(`${label}…`);
  return { end: () => void stream.write('\r\x1b[K') };
}

/** Runs `step` with `label` shown as an activity meanwhile. */
export async function withActivity<T>(
  label: string,
  step: () => Promise<T>,
  stream: NodeJS.WriteStream = process.stderr,
): Promise<T> {
  const shown = activity(label, stream);
  try {
    return await step();
  } finally {
    shown.end();
  }
}
