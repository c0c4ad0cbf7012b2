/**
 * `tally listen --forward-to <url>`: the dev relay's client. It holds a WebSocket to the
 * service's `GET /v1/listen` with a test server key, forwards each test event it receives
 * (already signed by the service) to the local receiver with a POST, one at a time in the
 * order received, and prints one line per delivery: time, type, event id, path and the
 * receiver's status. When the connection drops it reconnects with backoff (1 s doubling to
 * 30 s, back to 1 s once connected). A live key, a client key or a relay turned off is
 * refused with the service's message and exit code 1, before or at the first connection.
 * It runs until interrupted (SIGINT/SIGTERM: exit 0).
 */
import { type Command, Option } from 'commander';
import WebSocket from 'ws';
import { addRemoteOptions, CliError, EXIT, TallyClient, type RemoteOptions } from '../client.js';

const BACKOFF_START_MS = 1000;
const BACKOFF_MAX_MS = 30_000;
/** A local receiver that has not answered in this long counts as failed (the line says so). */
const FORWARD_TIMEOUT_MS = 15_000;

interface ListenOptions extends RemoteOptions {
  readonly forwardTo: string;
  readonly events: string;
}

type RelayMessage =
  | { type: 'ready'; secret: string; forwarding: Array<{ key: string; path: string }> }
  | {
      type: 'event';
      eventId: string;
      eventType: string;
      path: string;
      headers: Record<string, string>;
      body: string;
    };

/** `<forward-to>` + the entry's path (`''`: the URL itself). */
export function forwardUrl(base: string, path: string): string {
  return path === '' ? base : base.replace(/\/+$/, '') + path;
}

/** Refuses, before connecting, a key that cannot be a test server key. */
function checkKey(key: string | undefined): void {
  if (key === undefined || key === '') return; // TallyClient.from says what is missing
  if (!key.startsWith('sk_test_'))
    throw new CliError(
      'tally listen relays test-environment events only: use a test server key (sk_test_…), ' +
        'not a live, client or operator key',
      EXIT.failed,
    );
}

async function forward(target: string, message: Extract<RelayMessage, { type: 'event' }>) {
  try {
    const response = await fetch(target, {
      method: 'POST',
      headers: { ...message.headers, 'content-type': 'application/json' },
      body: message.body,
      redirect: 'manual',
      signal: AbortSignal.timeout(FORWARD_TIMEOUT_MS),
    });
    await response.arrayBuffer().catch(() => undefined);
    return String(response.status);
  } catch (error) {
    const cause = (error as { cause?: { code?: string; message?: string } }).cause;
    return `failed (${cause?.code ?? cause?.message ?? (error as Error).message})`;
  }
}

/** Connects, and reconnects, until stopped; rejects with a CliError for a refusal. */
function relay(client: TallyClient, key: string, options: ListenOptions): Promise<void> {
  const events = encodeURIComponent(options.events);
  const wsUrl = `${client.baseUrl.replace(/^http/, 'ws')}/v1/listen?events=${events}`;
  let backoff = BACKOFF_START_MS;
  let chain: Promise<void> = Promise.resolve();
  let stopping = false;
  let socket: WebSocket | null = null;
  let pending: NodeJS.Timeout | null = null;
  return new Promise((resolve, reject) => {
    const stop = () => {
      stopping = true;
      if (pending !== null) clearTimeout(pending);
      socket?.close(1000);
      resolve();
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
    const connect = () => {
      const ws = new WebSocket(wsUrl, { headers: { 'x-tally-key': key } });
      socket = ws;
      ws.on('unexpected-response', (request, response) => {
        // Taken now: once the answer has ended, a keep-alive agent takes the socket back.
        const connection = response.socket;
        let text = '';
        response.on('data', (chunk: Buffer) => (text += chunk.toString()));
        response.on('end', () => {
          let message = text;
          try {
            message = (JSON.parse(text) as { error?: string }).error ?? text;
          } catch {
            /* not JSON: show it as it came */
          }
          const status = response.statusCode ?? 0;
          const refused = status === 401 || status === 403 || status === 400;
          if (refused) stopping = true;
          // Handling this event makes closing the connection ours (ws leaves it open).
          request.destroy();
          connection.destroy();
          if (refused) {
            if (pending !== null) clearTimeout(pending);
            reject(new CliError(`the service refused the relay (${status}): ${message}`));
          } else retry(`the service answered ${status}: ${message}`);
        });
      });
      ws.on('open', () => {
        backoff = BACKOFF_START_MS;
      });
      ws.on('message', (data) => {
        const message = JSON.parse(data.toString()) as RelayMessage;
        if (message.type === 'ready') {
          console.log(
            `Ready: forwarding test events to ${options.forwardTo} ` +
              `(relay secret ${message.secret})`,
          );
          return;
        }
        const target = forwardUrl(options.forwardTo, message.path);
        chain = chain.then(async () => {
          const status = await forward(target, message);
          console.log(
            `${new Date().toISOString()}  ${message.eventType}  ${message.eventId}  → ` +
              `${message.path === '' ? target : message.path} ${status}`,
          );
        });
      });
      ws.on('error', (error) => {
        if (ws.readyState !== WebSocket.OPEN) retry(error.message);
      });
      ws.on('close', () => retry('connection closed'));
    };
    const retry = (why: string) => {
      if (stopping || pending !== null) return;
      process.stderr.write(`relay: ${why}; reconnecting in ${backoff / 1000} s\n`);
      pending = setTimeout(() => {
        pending = null;
        connect();
      }, backoff);
      backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
    };
    connect();
  });
}

export function register(program: Command): void {
  addRemoteOptions(
    program
      .command('listen')
      .description(
        'forward test-environment events, signed, to a local receiver (dev relay; test server key)',
      )
      .requiredOption(
        '--forward-to <url>',
        "the receiver's base URL; each forwarding entry's path is appended",
      )
      .addOption(new Option('--events <kinds>', 'event kinds to forward').default('*')),
    'server',
  ).action(async (options: ListenOptions) => {
    checkKey(options.key);
    try {
      new URL(options.forwardTo);
    } catch {
      throw new CliError(`--forward-to is not a URL: ${options.forwardTo}`, EXIT.usage);
    }
    const client = TallyClient.from(options);
    await relay(client, options.key ?? '', options);
  });
}
