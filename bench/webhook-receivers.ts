/**
 * The webhook receivers of the `consume-webhooks` scenario, in the bench process: one that
 * answers 204 at once, one that answers after SLOW_RECEIVER_MS, and an address where nothing
 * listens (connections are refused, so every delivery is retried on the schedule). They are
 * registered as test endpoints of the `tally-webhooks` Tally before it is measured; the
 * bench process exits at the end of the run, which closes them.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { TallyServer } from './tally-server.js';

/** How long the slow receiver takes to answer: long, but inside the 15 s delivery timeout. */
export const SLOW_RECEIVER_MS = 5000;

/** Received deliveries per receiver, for the curious (not reported). */
export const received = { fast: 0, slow: 0 };

function receiver(delayMs: number, count: () => void): Promise<string> {
  const server = http.createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      count();
      setTimeout(() => response.writeHead(204).end(), delayMs);
    });
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => {
      server.unref();
      resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`);
    }),
  );
}

/** A loopback port nothing listens on: bound, then closed. */
async function downUrl(): Promise<string> {
  const server = http.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return `http://127.0.0.1:${port}/hooks`;
}

/** Starts the receivers and registers the three endpoints. Throws when a registration fails. */
export async function registerBenchEndpoints(server: TallyServer): Promise<void> {
  const urls = [
    await receiver(0, () => received.fast++),
    await receiver(SLOW_RECEIVER_MS, () => received.slow++),
    await downUrl(),
  ];
  for (const [index, url] of urls.entries()) {
    const response = await fetch(`${server.baseUrl}/v1/webhooks`, {
      method: 'POST',
      headers: { 'x-tally-key': server.keys.server, 'content-type': 'application/json' },
      body: JSON.stringify({ url, key: `bench-${index}`, events: '*' }),
    });
    if (response.status !== 201)
      throw new Error(`webhook registration answered ${response.status}: ${await response.text()}`);
  }
}
