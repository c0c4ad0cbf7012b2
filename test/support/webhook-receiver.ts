/**
 * A real HTTP receiver for webhook tests: it records every request (headers and the raw
 * body) and answers with whatever status the test chooses, per request. It checks nothing
 * itself; tests verify signatures with the independent implementation beside it.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { specVerifies } from './standard-webhooks.js';

export interface Received {
  readonly id: string;
  readonly timestamp: string;
  readonly signature: string;
  readonly body: string;
  readonly event: { id: string; type: string; createdAt: string; environment: string; data: any };
  /** The status this request was answered with. */
  readonly answered: number;
}

export interface Receiver {
  readonly url: string;
  readonly port: number;
  readonly received: Received[];
  /** Decides each answer (default 200); may delay it. */
  answer: (request: Received, index: number) => number | Promise<number>;
  /** Resolves once `predicate` holds for what was received (polls; 20 s at most). */
  until(predicate: (received: readonly Received[]) => boolean, timeoutMs?: number): Promise<void>;
  /** Every request whose signature verifies with `secret` (spec implementation). */
  verified(secret: string): Received[];
  close(): Promise<void>;
}

export async function startReceiver(port = 0): Promise<Receiver> {
  const received: Received[] = [];
  const receiver: Receiver = {
    url: '',
    port: 0,
    received,
    answer: () => 200,
    async until(predicate, timeoutMs = 20_000) {
      const deadline = Date.now() + timeoutMs;
      while (!predicate(received)) {
        if (Date.now() > deadline)
          throw new Error(
            `receiver: condition not met; got ${received.map((r) => r.event.type).join(', ')}`,
          );
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    },
    verified(secret) {
      return received.filter((r) =>
        specVerifies(secret, { id: r.id, timestamp: r.timestamp, signature: r.signature }, r.body),
      );
    },
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  const server = http.createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      const header = (name: string) => String(request.headers[name] ?? '');
      const base = {
        id: header('webhook-id'),
        timestamp: header('webhook-timestamp'),
        signature: header('webhook-signature'),
        body,
        event: JSON.parse(body),
      };
      const index = received.length;
      Promise.resolve(receiver.answer({ ...base, answered: 0 }, index)).then((status) => {
        received.push({ ...base, answered: status });
        response.writeHead(status).end('ok');
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  const actual = (server.address() as AddressInfo).port;
  return Object.assign(receiver, { url: `http://127.0.0.1:${actual}/hooks`, port: actual });
}
