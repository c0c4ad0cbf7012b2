/**
 * The service's structured log: one JSON object per line on stdout (pino), written
 * asynchronously so a log line never blocks the event loop on a slow pipe.
 *
 * Line shape: `{"level":"info","time":"<ISO>","pid":n,"hostname":"…",…fields,"msg":"…"}`.
 * The level is its name, not pino's number, so a reader needs no table. pino flushes the
 * asynchronous buffer synchronously on `process.exit`, so the last lines before an exit
 * (a fatal start-up error, a stop on SIGTERM) are not lost.
 *
 * Secrets never reach the log by construction: callers log key **ids**, route patterns
 * and request ids, never headers or bodies; `redactPath` removes anything key-shaped
 * from the one client-controlled string that is logged (the path, at debug level).
 */
import { pino, type DestinationStream, type Logger } from 'pino';

export type { Logger };

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

export function isLogLevel(value: string): value is LogLevel {
  return (LOG_LEVELS as readonly string[]).includes(value);
}

/** stdout, buffered and written off the hot path (sonic-boom); flushed on exit. */
export function stdoutDestination(): ReturnType<typeof pino.destination> {
  return pino.destination({ fd: 1, sync: false });
}

/** A logger writing JSON lines to `destination` (tests pass an in-memory stream). */
export function createLogger(level: LogLevel, destination: DestinationStream): Logger {
  return pino(
    {
      level,
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    destination,
  );
}

/** A logger that writes nothing (for code paths that run without a service around them). */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}

const KEY_SHAPED = /(?:sk|ck)_(?:test|live)_[A-Za-z0-9_-]+|ak_[A-Za-z0-9_-]+/g;
const KEY_PREFIX = /(?:sk|ck)_(?:test|live)_|ak_/;

/** Whether `text` holds anything that starts like an API key. */
export function holdsKeyPrefix(text: string): boolean {
  return KEY_PREFIX.test(text);
}

/**
 * A request path, percent-decoded, with anything that looks like an API key replaced (a
 * client may put one there by mistake). Decoding comes first, so that `sk%5Ftest%5F…`
 * is found too; a malformed escape is left as it is.
 */
export function redactPath(path: string): string {
  const decoded = path.includes('%') ? path.replace(/(?:%[0-9A-Fa-f]{2})+/g, decodeRun) : path;
  return decoded.replace(KEY_SHAPED, '[redacted]');
}

function decodeRun(run: string): string {
  try {
    return decodeURIComponent(run);
  } catch {
    return run; // not UTF-8: keep the escapes
  }
}
