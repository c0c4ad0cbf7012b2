/**
 * A front-end thread after the first (TALLY_FRONTENDS): its own uWebSockets.js app on the same
 * port (the kernel spreads connections over the listening threads), its own channel to every
 * shard worker.
 *
 * It serves the metering hot path itself (FRONT_END_THREAD_ROUTES: has, limit, balance,
 * consume) for server keys: framing check, key, the key's rate budget (shared with the other
 * front ends), route, storage reserve, query and body validation, shard, answer. Everything
 * else (client keys, operator routes, commerce, a bad key, a request it cannot place) it
 * relays whole to the first front end, which answers it as if it had received it itself; so
 * every route, error and header is the same whichever thread a connection lands on.
 *
 * Keys come from the first front end, which waits for this thread to acknowledge each change
 * before it answers the request that made it.
 */
import { isMainThread, parentPort, workerData } from 'node:worker_threads';
import uWS from 'uWebSockets.js';
import { GcPauses } from '../../actors/gc-pauses.js';
import { nameThisThread } from '../../actors/thread-name.js';
import { assert } from '../../shared/assert.js';
import { runRoute } from '../api/route-record.js';
import { buildFrontEndThreadRouter, type Route } from '../api/routes.js';
import { bearerToken, KeyRing } from '../auth/keys.js';
import { RateLimiter } from '../auth/rate-limit.js';
import { SharedBudgets } from '../auth/shared-budgets.js';
import { checkBodyHeaders, readJsonBody } from '../http/body.js';
import { Exchange } from '../http/exchange.js';
import { framingProblem } from '../http/framing.js';
import { BODY_BYTES_MAX } from '../http/limits.js';
import { routeQuery } from '../http/query.js';
import type { Router } from '../http/router.js';
import { createLogger, isLogLevel, silentLogger, stdoutDestination } from '../observability/log.js';
import { Observability } from '../observability/observability.js';
import { ShardPool } from '../shard-pool.js';
import { failStorageFull } from '../storage-watch.js';
import { LISTENER_BACKPRESSURE_MAX, RELAY_PATH } from '../webhooks/relay.js';
import type { FromFrontEnd, FrontEndThreadData, ToFrontEnd } from './protocol.js';

assert(!isMainThread && parentPort !== null, 'front-end-thread runs in a worker thread');
const data = workerData as FrontEndThreadData;
nameThisThread(`tally-front-${data.frontEnd}`);
const gcPauses = new GcPauses();
const control = data.control;

function post(message: FromFrontEnd): void {
  control.postMessage(message);
}

const obs = new Observability(
  isLogLevel(data.logLevel) && data.logLevel !== 'silent'
    ? createLogger(data.logLevel, stdoutDestination()).child({ frontEnd: data.frontEnd })
    : silentLogger(),
);
const keys = new KeyRing({
  listKeys: () => [],
  putKey: () => Promise.reject(new Error('keys are added on the first front end')),
});
const budgets = new SharedBudgets(data.budgets);
const limiter = new RateLimiter(
  { server: data.rateLimits.server, client: data.rateLimits.client },
  budgets,
);
const pool = ShardPool.connect({
  frontEnd: data.frontEnd,
  ports: data.ports,
  queueMax: data.queueMax,
});
let router: Router<Route> | null = null;
let slotBase = 0;
const storage = { full: false, freeBytes: null as number | null };

/** A relayed request's connection, until its answer has gone out. */
interface Relayed {
  readonly res: uWS.HttpResponse;
  aborted: boolean;
  /** Parts of a streamed answer the socket has not taken yet. */
  readonly queue: Uint8Array[];
  total: number;
}
const relayed = new Map<number, Relayed>();
let nextRelayId = 1;

function handle(res: uWS.HttpResponse, req: uWS.HttpRequest): void {
  const method = req.getCaseSensitiveMethod();
  const url = req.getUrl();
  const ex = new Exchange(res, method, url, obs, req.getHeader('x-request-id'));
  ex.guard(() => {
    const framing = framingProblem(req);
    if (framing !== null) return ex.failAndClose(framing.code, { detail: framing.detail });
    serve(ex, req);
  });
  if (!ex.done) ex.armAbort();
}

/** Serves a hot-path request of a server key here; relays anything else. */
function serve(ex: Exchange, req: uWS.HttpRequest): void {
  const { method, path: url } = ex;
  const found = router === null ? null : router.lookup(method, url);
  if (found === null || found.kind !== 'match') return relay(ex, req);
  const presented = req.getHeader('x-tally-key') || bearerToken(req.getHeader('authorization'));
  const key = presented === '' ? null : keys.verify(presented);
  if (key === null || key.keyClass !== 'server' || key.environment === null) return relay(ex, req);
  const rate = limiter.take(key, Date.now());
  if (rate !== null) {
    ex.rate = rate;
    if (!rate.allowed)
      return ex.fail('rate_limited', { limit: rate.limit, scope: rate.scope }, [
        ['retry-after', String(rate.retryAfterSec)],
      ]);
  }
  const { route, params } = found.match;
  ex.slot = slotBase + found.match.index;
  if (storage.full && method !== 'GET') return failStorageFull(ex, storage.freeBytes);
  const query = routeQuery(req.getQuery() ?? '', route.takesQuery);
  if (!query.ok) return ex.fail('invalid_query', { detail: query.message });
  const environment = key.environment;
  if (!route.hasBody)
    return runRoute(route, ex, key, environment, params, query.params, undefined, '');
  if (!checkBodyHeaders(ex, req.getHeader('content-type'), req.getHeader('content-length'))) return;
  readJsonBody(ex, (body, bodyText) =>
    runRoute(route, ex, key, environment, params, query.params, body, bodyText),
  );
}

/** A relayed request's message without its body: read while the request is on the stack. */
function requestHead(
  id: number,
  res: uWS.HttpResponse,
  req: uWS.HttpRequest,
  method: string,
  url: string,
  upgrade: boolean,
) {
  const headers: string[] = [];
  req.forEach((name, value) => headers.push(name, value));
  const address = res.getRemoteAddress().slice(0);
  return {
    t: 'request' as const,
    id,
    method,
    url,
    query: req.getQuery() ?? '',
    headers,
    address,
    upgrade,
    // Set here rather than spread in later: a spread plus a property would give each relayed
    // request a hidden class of its own (docs/architecture.md).
    body: null as ArrayBuffer | null,
  };
}

/**
 * Hands the request to the first front end: its head now, its body as it arrives (at most one
 * byte past the largest the first front end accepts, which then answers 413).
 */
function relay(ex: Exchange, req: uWS.HttpRequest): void {
  const { res } = ex;
  // The answer is written from the first front end's message, not through this exchange.
  ex.done = true;
  const id = nextRelayId++;
  const head = requestHead(id, res, req, ex.method, ex.path, false);
  const entry: Relayed = { res, aborted: false, queue: [], total: 0 };
  relayed.set(id, entry);
  res.onAborted(() => {
    entry.aborted = true;
    relayed.delete(id);
    post({ t: 'aborted', id });
  });
  const hasBody =
    req.getHeader('transfer-encoding') !== '' ||
    (req.getHeader('content-length') !== '' && req.getHeader('content-length') !== '0');
  if (!hasBody) return post(head);
  const chunks: Buffer[] = [];
  let size = 0;
  let sent = false;
  res.onData((chunk, isLast) => {
    if (sent || entry.aborted) return;
    const room = BODY_BYTES_MAX + 1 - size;
    const part = Buffer.from(chunk.slice(0, Math.min(room, chunk.byteLength)));
    chunks.push(part);
    size += part.byteLength;
    if (!isLast && size <= BODY_BYTES_MAX) return;
    sent = true;
    const body = Buffer.concat(chunks);
    head.body = body.buffer.slice(body.byteOffset, body.byteOffset + body.byteLength);
    post(head);
  });
}

/** Writes (part of) a relayed request's answer. */
function answer(message: Extract<ToFrontEnd, { t: 'answer' }>): void {
  const entry = relayed.get(message.id);
  upgrades.delete(message.id);
  if (entry === undefined || entry.aborted) return;
  const { res } = entry;
  if (message.total > 0) return stream(message.id, entry, message);
  relayed.delete(message.id);
  res.cork(() => {
    writeHead(res, message);
    if (message.total < 0) res.endWithoutBody();
    else res.end(message.body, message.close);
  });
}

function writeHead(res: uWS.HttpResponse, message: Extract<ToFrontEnd, { t: 'answer' }>): void {
  if (message.status === null) return;
  if (message.status !== '200 OK') res.writeStatus(message.status);
  const headers = message.headers ?? [];
  for (let i = 0; i < headers.length; i += 2)
    res.writeHeader(headers[i] as string, headers[i + 1] as string);
}

/** A part of a streamed answer (a download): written as the client's socket takes it. */
function stream(id: number, entry: Relayed, message: Extract<ToFrontEnd, { t: 'answer' }>): void {
  entry.total = message.total;
  if (message.status !== null) entry.res.cork(() => writeHead(entry.res, message));
  entry.queue.push(new Uint8Array(message.body as ArrayBuffer));
  if (entry.queue.length === 1) drain(id, entry);
}

function drain(id: number, entry: Relayed): void {
  const { res } = entry;
  while (entry.queue.length > 0 && !entry.aborted) {
    const chunk = entry.queue[0] as Uint8Array;
    const before = res.getWriteOffset();
    let ok = false;
    let done = false;
    res.cork(() => {
      [ok, done] = res.tryEnd(chunk, entry.total);
    });
    const taken = done ? chunk.byteLength : ok ? chunk.byteLength : res.getWriteOffset() - before;
    if (taken > 0) post({ t: 'drained', id, bytes: taken });
    if (done) {
      relayed.delete(id);
      return;
    }
    if (!ok) {
      entry.queue[0] = chunk.subarray(taken);
      res.onWritable(() => {
        drain(id, entry);
        return entry.queue.length === 0;
      });
      return;
    }
    entry.queue.shift();
  }
}

/** A relay WebSocket's upgrade, waiting for the first front end's checks. */
interface Upgrade {
  readonly secKey: string;
  readonly secProtocol: string;
  readonly secExtensions: string;
  readonly context: uWS.us_socket_context_t;
}
const upgrades = new Map<number, Upgrade>();
const sockets = new Map<number, uWS.WebSocket<{ id: number }>>();

/** The dev relay's WebSocket: the first front end checks the upgrade and sends the events. */
const relaySockets: uWS.WebSocketBehavior<{ id: number }> = {
  idleTimeout: 120,
  sendPingsAutomatically: true,
  maxBackpressure: LISTENER_BACKPRESSURE_MAX,
  maxPayloadLength: 4096,
  upgrade: (res, req, context) => {
    const id = nextRelayId++;
    const head = requestHead(id, res, req, req.getCaseSensitiveMethod(), req.getUrl(), true);
    upgrades.set(id, {
      secKey: req.getHeader('sec-websocket-key'),
      secProtocol: req.getHeader('sec-websocket-protocol'),
      secExtensions: req.getHeader('sec-websocket-extensions'),
      context,
    });
    const entry: Relayed = { res, aborted: false, queue: [], total: 0 };
    relayed.set(id, entry);
    res.onAborted(() => {
      entry.aborted = true;
      relayed.delete(id);
      upgrades.delete(id);
      post({ t: 'aborted', id });
    });
    post(head);
  },
  open: (socket) => {
    const { id } = socket.getUserData();
    sockets.set(id, socket);
    post({ t: 'wsOpen', id });
  },
  close: (socket) => {
    const { id } = socket.getUserData();
    sockets.delete(id);
    post({ t: 'wsClose', id });
  },
};

/** The first front end accepted a relayed upgrade. */
function upgraded(id: number, userData: unknown): void {
  const upgrade = upgrades.get(id);
  const entry = relayed.get(id);
  upgrades.delete(id);
  relayed.delete(id);
  if (upgrade === undefined || entry === undefined || entry.aborted) return;
  const data = { ...(userData as object), id };
  entry.res.cork(() =>
    entry.res.upgrade(
      data,
      upgrade.secKey,
      upgrade.secProtocol,
      upgrade.secExtensions,
      upgrade.context,
    ),
  );
}

const app = uWS.App();
app.ws(RELAY_PATH, relaySockets);
app.any('/*', handle);
let socket: uWS.us_listen_socket | null = null;

control.on('message', (message: ToFrontEnd) => {
  switch (message.t) {
    case 'keys':
      keys.replaceAll(message.records);
      budgets.learn(message.budgets);
      post({ t: 'ack', seq: message.seq });
      return;
    case 'storage':
      storage.full = message.full;
      storage.freeBytes = message.freeBytes;
      return;
    case 'ready': {
      const built = buildFrontEndThreadRouter(pool);
      slotBase = obs.metrics.register(built.list());
      router = built;
      post({ t: 'ack', seq: message.seq });
      return;
    }
    case 'answer':
      answer(message);
      return;
    case 'cut': {
      const entry = relayed.get(message.id);
      relayed.delete(message.id);
      if (entry !== undefined && !entry.aborted) entry.res.close();
      return;
    }
    case 'upgrade':
      upgraded(message.id, message.userData);
      return;
    case 'wsSend': {
      const socket = sockets.get(message.id);
      if (socket === undefined) return;
      // A listener that stopped reading is dropped, as the first front end drops its own.
      if (socket.getBufferedAmount() > LISTENER_BACKPRESSURE_MAX) socket.end(1013, 'too slow');
      else socket.send(message.text);
      return;
    }
    case 'wsEnd':
      sockets.get(message.id)?.end(message.code, message.reason);
      return;
    case 'metrics':
      post({
        t: 'metrics',
        requestId: message.requestId,
        data: obs.metrics.data(),
        gc: gcPauses.stats(),
      });
      return;
    case 'stop':
      if (socket !== null) uWS.us_listen_socket_close(socket);
      // Present at run time, missing from the typings of this build.
      (app as unknown as { close(): void }).close();
      // Commands queued this turn go out before the workers hear that this front end stopped.
      pool.flushNow();
      post({ t: 'stopped' });
      control.close();
      for (const port of data.ports) port.close();
      return;
  }
});

app.listen(data.host, data.port, (listening) => {
  socket = listening === false ? null : listening;
  post({
    t: 'listening',
    error: listening === false ? `front end ${data.frontEnd} cannot listen on ${data.port}` : null,
  });
});
