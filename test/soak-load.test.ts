import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LOAD_REQUEST_HEADER, runLoad } from '../bench/soak-load.js';

/** A stand-in for Tally that answers every consume after `answerMs` and keeps what it was sent. */
let answerMs = 0;
const bodies: string[] = [];
const keysSent: string[] = [];
/** Each request's LOAD_REQUEST_HEADER, or undefined. */
const idsSent: Array<string | undefined> = [];
const server = createServer((request: IncomingMessage, response: ServerResponse) => {
  let body = '';
  request.on('data', (chunk: Buffer) => {
    body += chunk.toString('utf8');
  });
  request.on('end', () => {
    bodies.push(body);
    keysSent.push(String(request.headers['x-tally-key']));
    const id = request.headers[LOAD_REQUEST_HEADER];
    idsSent.push(typeof id === 'string' ? id : undefined);
    const answer = () =>
      response.writeHead(200, { 'content-type': 'application/json' }).end('{"allowed":true}');
    if (answerMs === 0) answer();
    else setTimeout(answer, answerMs);
  });
});
let baseUrl = '';

beforeAll(async () => {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

const target = () => ({ baseUrl, keys: { server: 'tk_test_soak' } });

describe('the soak load (wrk)', () => {
  it('holds the rate it is paced at, whatever the connections’ latency', async () => {
    bodies.length = 0;
    // Answers take 40 ms: a fixed wait of connections / rate (160 ms) before each request
    // would send 64 / 0.2 s = 320 a second. 64 connections leave room for 1,600 a second,
    // so answers slowed by a busy machine still leave the rate reachable.
    answerMs = 40;
    const paced = await runLoad(
      target(),
      { connections: 64, rate: 400, keys: 'unique', loadNice: 0 },
      3,
    ).finally(() => {
      answerMs = 0;
    });
    expect(paced.errors).toBe(0);
    expect(paced.non2xx).toBe(0);
    expect(paced.perSec).toBeGreaterThan(400 * 0.9);
    expect(paced.perSec).toBeLessThan(400 * 1.1);
    expect(Math.abs(bodies.length - paced.requests)).toBeLessThanOrEqual(64);
  });

  it('sends consumes over the customers in turn, each with a key of its own', async () => {
    bodies.length = 0;
    keysSent.length = 0;
    idsSent.length = 0;
    const summary = await runLoad(
      target(),
      { connections: 4, rate: 1000, keys: 'unique', loadNice: 0 },
      2,
    );
    const parsed = bodies.map(
      (b) => JSON.parse(b) as { customerId: string; amount: number; idempotencyKey: string },
    );
    expect(parsed.length).toBeGreaterThan(1500);
    expect(new Set(parsed.map((p) => p.idempotencyKey)).size).toBe(parsed.length);
    expect(new Set(parsed.map((p) => p.customerId)).size).toBe(parsed.length);
    expect(parsed.every((p) => p.amount === 1)).toBe(true);
    expect(new Set(keysSent)).toEqual(new Set(['tk_test_soak']));
    // The key is the request's id: no header carries another.
    expect(idsSent.every((id) => id === undefined)).toBe(true);
    // wrk's own CPU, from getrusage: some, and less than two cores' for the 2-second run
    // with a second to spare (its start).
    expect(summary.loadCpuUsPerRequest).toBeGreaterThan(0);
    expect(summary.loadCpuUsPerRequest * summary.requests).toBeLessThan(2 * 3e6);
  });

  it('sends consumes to as many customers in turn as it is told', async () => {
    bodies.length = 0;
    await runLoad(
      target(),
      { connections: 4, rate: 1000, keys: 'unique', loadNice: 0, customers: 7 },
      1,
    );
    const ids = bodies.map((b) => (JSON.parse(b) as { customerId: string }).customerId);
    expect(ids.length).toBeGreaterThan(100);
    expect(new Set(ids)).toEqual(new Set([0, 1, 2, 3, 4, 5, 6].map((n) => `soak-${n}`)));
  });

  it('with --keys none sends an id in a header, no key; flat out outruns paced', async () => {
    bodies.length = 0;
    idsSent.length = 0;
    const flat = await runLoad(
      target(),
      { connections: 4, rate: null, keys: 'none', loadNice: 0 },
      2,
    );
    // Faster than the paced load above (1,000/s, the same 4 connections); on a loaded machine
    // beside the rest of the suite a flat-out run here has managed as little as ~1,340/s.
    expect(flat.perSec).toBeGreaterThan(1000);
    expect(bodies.every((b) => !b.includes('idempotencyKey'))).toBe(true);
    // As many ids as requests, none twice: wrk builds a request unlike any before, as keyed.
    expect(idsSent.every((id) => id !== undefined && /^[0-9a-z]+-[0-9]+$/.test(id))).toBe(true);
    expect(new Set(idsSent).size).toBe(idsSent.length);
    expect(flat.loadCpuUsPerRequest).toBeGreaterThan(0);
  });
});
