/**
 * One delivery attempt over HTTP: POST the signed event to the endpoint and report what
 * happened, never throwing. Redirects are not followed (a 3xx is a failed attempt); an
 * attempt that has not answered within DELIVERY_TIMEOUT_MS fails as a timeout. The
 * connection goes only to an address the endpoint's environment allows: the name is
 * resolved through the address policy, and the address actually connected to is checked
 * again once the socket is up (an IP literal skips resolution, and this catches it).
 */
import http from 'node:http';
import https from 'node:https';
import type { Socket } from 'node:net';
import type { Environment } from '../../shared/environment.js';
import type { AddressPolicy } from './address-policy.js';
import { DELIVERY_TIMEOUT_MS, RESPONSE_BYTES_MAX } from './schedule.js';

export interface PostResult {
  /** The receiver's status, or null when none came. */
  readonly status: number | null;
  readonly durationMs: number;
  /** Why the attempt failed (null when it succeeded with a 2xx). */
  readonly error: string | null;
}

export interface PostTarget {
  readonly url: string;
  readonly environment: Environment;
  readonly headers: Readonly<Record<string, string>>;
  readonly body: string;
  readonly agent: http.Agent;
}

const USER_AGENT = 'Tally-Webhooks/1';

/** Keep-alive agents: one per endpoint, so one receiver's sockets never serve another's. */
export function endpointAgent(url: string, sockets: number): http.Agent {
  const options = { keepAlive: true, maxSockets: sockets, maxFreeSockets: sockets };
  return url.startsWith('https:') ? new https.Agent(options) : new http.Agent(options);
}

/** Checks the connected address; destroys the socket with the reason when it is refused. */
function guardSocket(
  socket: Socket,
  policy: AddressPolicy,
  environment: Environment,
  host: string,
): void {
  const check = () => {
    const address = socket.remoteAddress;
    if (address === undefined) return;
    const refused = policy.refusal(environment, host, address);
    if (refused !== null) socket.destroy(new Error(refused));
  };
  if (socket.remoteAddress !== undefined && !socket.connecting) check();
  else socket.once('connect', check);
}

/** Sends one attempt; resolves with how it went (never rejects). */
export function postEvent(target: PostTarget, policy: AddressPolicy): Promise<PostResult> {
  const started = performance.now();
  const url = new URL(target.url);
  const client = url.protocol === 'https:' ? https : http;
  return new Promise((resolve) => {
    let settled = false;
    const finish = (status: number | null, error: string | null) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve({ status, durationMs: Math.round(performance.now() - started), error });
    };
    const request = client.request(url, {
      method: 'POST',
      agent: target.agent,
      lookup: policy.guardedLookup(target.environment) as never,
      headers: {
        ...target.headers,
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(target.body),
        'user-agent': USER_AGENT,
      },
    });
    const timer = setTimeout(() => {
      finish(null, `timeout after ${DELIVERY_TIMEOUT_MS} ms`);
      request.destroy(new Error('timeout'));
    }, DELIVERY_TIMEOUT_MS);
    request.on('socket', (socket) =>
      guardSocket(socket as Socket, policy, target.environment, url.hostname),
    );
    request.on('error', (error) => finish(null, error.message || String(error)));
    request.on('response', (response) => {
      const status = response.statusCode ?? 0;
      let read = 0;
      response.on('data', (chunk: Buffer) => {
        read += chunk.length;
        if (read > RESPONSE_BYTES_MAX) response.destroy();
      });
      const done = () => {
        if (status >= 200 && status < 300) return finish(status, null);
        if (status >= 300 && status < 400)
          return finish(status, `redirect (${status}) not followed`);
        finish(status, `receiver answered ${status}`);
      };
      response.on('end', done);
      response.on('close', done);
      response.on('error', done);
    });
    request.end(target.body);
  });
}
