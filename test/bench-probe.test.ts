/**
 * The soak's latency probe (bench/probe.ts): it reads replies however the bytes arrive,
 * counts what is not a 2xx reply as a failure instead of a latency, and its thread
 * probes every target. Real servers on port 0; the thread runs from the compiled dist/
 * (`npm test` builds first).
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { Probe, ReplyReader } from '../bench/probe.js';

const servers: http.Server[] = [];

afterEach(async () => {
  for (const server of servers.splice(0)) await new Promise((resolve) => server.close(resolve));
});

/** A server that answers every request with `status` and `body` (content-length set). */
async function serve(status: number, body = 'true'): Promise<number> {
  const server = http.createServer((_request, response) => {
    response.writeHead(status, { 'content-length': Buffer.byteLength(body) });
    response.end(body);
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as AddressInfo).port;
}

describe('ReplyReader', () => {
  const reply = (status: number, body: string): string =>
    `HTTP/1.1 ${status} OK\r\nContent-Length: ${body.length}\r\n\r\n${body}`;

  it('takes a reply split anywhere, and two replies in one chunk one at a time', () => {
    const whole = reply(200, 'false') + reply(503, '{"error":"busy"}');
    for (let cut = 1; cut < whole.length; cut++) {
      const reader = new ReplyReader();
      const statuses = [reader.push(whole.slice(0, cut)), reader.push(whole.slice(cut))];
      // Whatever the cut, the first reply completes by the second push at the latest.
      const first = statuses.find((s) => s !== null);
      expect(first).toBe(200);
      if (statuses[0] === null) expect(reader.push('')).toBe(503);
      else expect(statuses[1]).toBe(503);
    }
  });

  it('refuses a reply without a content length', () => {
    const reader = new ReplyReader();
    expect(() => reader.push('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n')).toThrow(
      /unreadable reply/,
    );
  });
});

describe('Probe', () => {
  it('records the latency of 2xx replies over one kept-alive connection', async () => {
    let connections = 0;
    const port = await serve(200);
    servers[0]?.on('connection', () => connections++);
    const probe = new Probe({ port, path: '/has?customerId=c-{n}', headers: { 'x-k': 'v' } });
    for (let i = 0; i < 5; i++) await probe.once();
    const window = probe.window();
    probe.close();
    expect(window.count).toBe(5);
    expect(window.failures).toBe(0);
    expect(window.msMax).toBeGreaterThan(0);
    expect(window.msP99).toBeLessThanOrEqual(window.msMax);
    expect(connections).toBe(1);
    // The window was read: the next one starts empty.
    expect(probe.window().count).toBe(0);
  });

  it('counts a non-2xx reply and a refused connection as failures, not latencies', async () => {
    const port = await serve(503, '{"error":"busy"}');
    const probe = new Probe({ port, path: '/', headers: {} });
    await probe.once();
    await probe.once();
    const server = servers.pop();
    await new Promise((resolve) => server?.close(resolve));
    await probe.once();
    const window = probe.window();
    probe.close();
    expect(window).toMatchObject({ count: 0, failures: 3 });
  });
});

describe('startProbes', () => {
  it('probes every target from its own thread until stopped', async () => {
    // The compiled module, so that its thread (probe-thread.js) is there to start.
    const compiled = new URL('../dist/bench/probe.js', import.meta.url).href;
    const { startProbes } = (await import(compiled)) as typeof import('../bench/probe.js');
    const ok = await serve(200);
    const failing = await serve(500);
    const probes = startProbes([
      { port: ok, path: '/', headers: {} },
      { port: failing, path: '/', headers: {} },
    ]);
    await new Promise((resolve) => setTimeout(resolve, 300));
    const [first, second] = await probes.window();
    await probes.stop();
    // One probe every 20 ms for 300 ms: about 15 each (timers and startup allow fewer).
    expect(first?.count).toBeGreaterThanOrEqual(5);
    expect(first?.failures).toBe(0);
    expect(second?.count).toBe(0);
    expect(second?.failures).toBeGreaterThanOrEqual(5);
  });
});
