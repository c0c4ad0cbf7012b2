/**
 * The ceiling for the benchmark: a bare uWebSockets.js server that does the least an
 * HTTP endpoint can do, so that Tally's throughput can be reported as a ratio of it,
 * measured in the same run on the same machine.
 *
 * `GET /*` answers `true`; `POST /*` reads the whole body (onData, with onAborted, as
 * Tally must) and answers `{"ok":true}`. Both send the same `content-type` Tally sends.
 * It does no routing, no auth, no JSON parsing, no validation and no disk IO: whatever
 * Tally does beyond this is what the ratio prices.
 *
 * With `RATE_LIMIT_HEADERS=<limit>` every reply also carries the three `X-RateLimit-*`
 * lines Tally's rate limiter adds (same names, values of the same length), written the
 * way Tally writes them: in the content type's `writeHeader` call. This second ceiling is
 * the control for the limiter's price: the load generator parses every header line of
 * every reply (autocannon does so in JavaScript), so "Tally with the limiter ÷ Tally
 * without" includes the generator's own cost of reading three more lines; the same ratio
 * between the two bare servers is that cost alone (bench/report.ts divides it out).
 *
 * It runs as its own child process (`node dist/bench/bare-server.js`) so it never shares
 * an event loop with the load generator. Env: `PORT` (0 = any free port). When it is
 * listening it prints one JSON line, `{"msg":"listening","port":n,"native":true}`.
 * It exits on SIGTERM/SIGINT and when its stdin closes, so a parent that dies without
 * cleaning up (even SIGKILL) leaves no server behind.
 *
 * This package silently falls back to a slow pure-Node implementation when its native
 * binary cannot load; a ceiling measured on that fallback would be meaningless, so the
 * server refuses to start on it.
 */
import uWS from 'uWebSockets.js';

/** Bodies above this are refused with 413: the bench sends ~40 bytes ("limit everything"). */
const BODY_BYTES_MAX = 64 * 1024;
const CONTENT_TYPE = 'application/json';
const GET_BODY = 'true';
const POST_BODY = '{"ok":true}';

/**
 * The content-type value to write: plain, or followed by the three rate-limit lines when
 * RATE_LIMIT_HEADERS is set, in Tally's order. Remaining is `limit - 1` and reset the end
 * of the current minute, refreshed each second, so the lines are as long as Tally's.
 */
function contentTypeValue(limit: number | null): () => string {
  if (limit === null) return () => CONTENT_TYPE;
  const render = (): string => {
    const resetSec = Math.ceil((Date.now() + 1) / 60_000) * 60;
    return (
      `${CONTENT_TYPE}\r\nx-ratelimit-limit: ${limit}\r\nx-ratelimit-reset: ${resetSec}` +
      `\r\nx-ratelimit-remaining: ${limit - 1}`
    );
  };
  let value = render();
  setInterval(() => (value = render()), 1000).unref();
  return () => value;
}

function parseLimit(raw: string | undefined): number | null {
  if (raw === undefined || raw === '') return null;
  const limit = Number(raw);
  if (!Number.isSafeInteger(limit) || limit < 1)
    throw new Error(`RATE_LIMIT_HEADERS must be a positive integer, got ${raw}`);
  return limit;
}

const contentType = contentTypeValue(parseLimit(process.env['RATE_LIMIT_HEADERS']));

/**
 * The native binding exports `LIBUS_LISTEN_EXCLUSIVE_PORT` as a plain number (the typings
 * only declare the `ListenOptions` enum, which does not exist at runtime), and the
 * pure-Node fallback does not export it at all, so it doubles as the "is native" check.
 */
function exclusivePortOption(): uWS.ListenOptions {
  const value = (uWS as unknown as { LIBUS_LISTEN_EXCLUSIVE_PORT?: unknown })
    .LIBUS_LISTEN_EXCLUSIVE_PORT;
  if (typeof value !== 'number') {
    throw new Error(
      'uWebSockets.js loaded its pure-Node fallback (native binary unavailable); refusing ' +
        'to measure a ceiling on it',
    );
  }
  return value as uWS.ListenOptions;
}

function parsePort(raw: string | undefined): number {
  const port = Number(raw ?? '0');
  if (!Number.isInteger(port) || port < 0 || port > 65_535)
    throw new Error(`PORT must be an integer 0..65535, got ${raw}`);
  return port;
}

function answerGet(res: uWS.HttpResponse): void {
  res.writeStatus('200 OK').writeHeader('content-type', contentType()).end(GET_BODY);
}

/**
 * Reads the body to the end (copying each chunk: uWS detaches it after the callback), then answers.
 */
function answerPost(res: uWS.HttpResponse): void {
  let aborted = false;
  let bodyBytes = 0;
  const chunks: Buffer[] = [];
  res.onAborted(() => {
    aborted = true;
  });
  res.onData((chunk, isLast) => {
    bodyBytes += chunk.byteLength;
    if (bodyBytes <= BODY_BYTES_MAX) chunks.push(Buffer.from(chunk.slice(0)));
    if (!isLast || aborted) return;
    const status = bodyBytes <= BODY_BYTES_MAX ? '200 OK' : '413 Payload Too Large';
    res.cork(() => {
      res.writeStatus(status).writeHeader('content-type', contentType()).end(POST_BODY);
    });
  });
}

function exitWhenOrphaned(listenSocket: uWS.us_listen_socket): void {
  const stop = (why: string): void => {
    process.stderr.write(`bare-server: stopping (${why})\n`);
    uWS.us_listen_socket_close(listenSocket);
    process.exit(0);
  };
  process.once('SIGTERM', () => stop('SIGTERM'));
  process.once('SIGINT', () => stop('SIGINT'));
  process.stdin.once('end', () => stop('stdin closed: parent gone'));
  process.stdin.once('close', () => stop('stdin closed: parent gone'));
  process.stdin.resume();
}

function main(): void {
  const listenOption = exclusivePortOption();
  const port = parsePort(process.env['PORT']);
  uWS
    .App()
    .get('/*', answerGet)
    .post('/*', answerPost)
    .listen(port, listenOption, (listenSocket) => {
      if (listenSocket === false) {
        process.stderr.write(`bare-server: cannot listen on port ${port}\n`);
        process.exit(1);
      }
      exitWhenOrphaned(listenSocket);
      const boundPort = uWS.us_socket_local_port(listenSocket as unknown as uWS.us_socket);
      process.stdout.write(
        `${JSON.stringify({ msg: 'listening', port: boundPort, native: true, pid: process.pid })}` +
          `\n`,
      );
    });
}

main();
