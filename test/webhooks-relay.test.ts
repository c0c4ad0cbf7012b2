/**
 * The dev relay end to end: a real server, the real `tally listen` spawned as a user runs it,
 * and a real local receiver. Test events reach the receiver at each forwarding entry's path,
 * signed with the secret of the endpoint registered under the entry's key (or the relay's
 * own secret), one printed line per delivery; the listener reconnects after the server
 * restarts; a live key is refused with a message and a non-zero exit; `devTunnel: false`
 * turns the relay off.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { runProcess } from './support/run-process.js';
import {
  call,
  startServerProcess,
  tempDataDir,
  type ServerProcess,
} from './support/server-process.js';
import { specVerifies } from './support/standard-webhooks.js';
import { startReceiver, type Receiver } from './support/webhook-receiver.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const BIN = path.join(ROOT, 'bin', 'tally.js');

const CONFIG = {
  entitlements: { api_calls: { type: 'meter' } },
  products: { free: { default: true, entitlements: { api_calls: { included: 10 } } } },
  webhooks: {
    devTunnel: true,
    forwarding: [
      { key: 'app', path: '/api/auth/tally', events: '*', integration: 'better-auth' },
      { key: 'usage', path: '/usage-hook', events: ['usage.exhausted'] },
    ],
  },
};

let server: ServerProcess;
let receiver: Receiver;
const dataDir = tempDataDir('tally-relay');

beforeAll(async () => {
  server = await startServerProcess({ dataDir, config: CONFIG });
  receiver = await startReceiver();
});
afterAll(async () => {
  await receiver?.close();
  await server?.stop();
});

interface Listener {
  readonly child: ChildProcess;
  output(): string;
  stop(): Promise<number | null>;
}

function listen(key: string, base: string, forwardTo: string): Listener {
  const child = spawn(process.execPath, [BIN, 'listen', '--forward-to', forwardTo], {
    cwd: ROOT,
    env: { ...process.env, TALLY_URL: base, TALLY_API_KEY: key },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout?.on('data', (chunk: Buffer) => (out += chunk.toString()));
  child.stderr?.on('data', (chunk: Buffer) => (out += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
  return {
    child,
    output: () => out,
    stop: () => {
      child.kill('SIGINT');
      return exited;
    },
  };
}

/**
 * A TCP proxy in front of the server, so the listener keeps one address while the server
 * behind it restarts on another port; `target` is where new connections go.
 */
async function tcpProxy(target: () => number) {
  const open = new Set<net.Socket>();
  const proxy = net.createServer((client) => {
    const upstream = net.connect(target(), '127.0.0.1');
    open.add(client);
    client.pipe(upstream).pipe(client);
    const close = () => {
      open.delete(client);
      client.destroy();
      upstream.destroy();
    };
    client.on('error', close).on('close', close);
    upstream.on('error', close).on('close', close);
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(proxy.address() as net.AddressInfo).port}`,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of open) socket.destroy();
        proxy.close(() => resolve());
      }),
  };
}

async function until(check: () => boolean, what: () => string, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what()}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

describe('tally listen', () => {
  it('forwards test events, signed, to each forwarding path; reconnects', async () => {
    // The application registered its receiver (as the Better Auth plugin does lazily).
    const registered = await call(server.base, 'POST', '/v1/webhooks', {
      key: server.keys.test.server,
      body: { url: 'http://127.0.0.1:9/api/auth/tally', key: 'app', events: '*' },
    });
    expect(registered.status).toBe(201);
    const base = receiver.url.replace(/\/hooks$/, '');
    const proxy = await tcpProxy(() => server.port);
    const listener = listen(server.keys.test.server, proxy.url, base);
    try {
      await until(
        () => listener.output().includes('Ready:'),
        () => listener.output(),
      );
      const relaySecret = /relay secret (whsec_\S+)\)/.exec(listener.output())?.[1] ?? '';
      expect(relaySecret).toMatch(/^whsec_/);
      const paths: string[] = [];
      receiver.answer = (request) => {
        paths.push(request.event.type);
        return 204;
      };
      await call(server.base, 'POST', '/v1/usage/api_calls/consume', {
        key: server.keys.test.server,
        body: { customerId: 'relay-1', amount: 10 },
      });
      await until(
        () => receiver.received.length >= 3,
        () => `${listener.output()}\n${server.output()}`,
      );
      const byType = (type: string) => receiver.received.filter((r) => r.event.type === type);
      expect(byType('customer.created')).toHaveLength(1);
      expect(byType('usage.exhausted')).toHaveLength(2);
      // Each path's delivery verifies with that entry's secret.
      const verified = receiver.verified(registered.body.secret).map((r) => r.event.type);
      expect(verified.sort()).toEqual(['customer.created', 'usage.exhausted']);
      expect(receiver.verified(relaySecret).map((r) => r.event.type)).toEqual(['usage.exhausted']);
      await until(
        () => (listener.output().match(/ → \/\S+ 204/g) ?? []).length === 3,
        () => listener.output(),
      );
      expect(listener.output()).toMatch(
        /\d{4}-\d\d-\d\dT\S+Z {2}customer\.created {2}evt_\S+ {2}→ \/api\/auth\/tally 204/,
      );
      expect(listener.output()).toMatch(/usage\.exhausted {2}evt_\S+ {2}→ \/usage-hook 204/);

      // The server goes away and comes back (behind the same address): the listener reconnects.
      await server.stop();
      await until(
        () => listener.output().includes('reconnecting'),
        () => listener.output(),
      );
      server = await startServerProcess({ dataDir });
      const before = receiver.received.length;
      const readyCount = () => (listener.output().match(/Ready:/g) ?? []).length;
      await until(
        () => readyCount() === 2,
        () => listener.output(),
        40_000,
      );
      await call(server.base, 'POST', '/v1/customers', {
        key: server.keys.test.server,
        body: { id: 'relay-2', name: 'After' },
      });
      await until(
        () => receiver.received.length > before,
        () => `${listener.output()}\n${server.output()}`,
      );
      const last = receiver.received.at(-1);
      expect(last?.event.data.customer.id).toBe('relay-2');
      expect(
        specVerifies(
          registered.body.secret,
          {
            id: last?.id ?? '',
            timestamp: last?.timestamp ?? '',
            signature: last?.signature ?? '',
          },
          last?.body ?? '',
        ),
      ).toBe(true);
    } finally {
      expect(await listener.stop()).toBe(0);
      await proxy.close();
    }
  });

  it('refuses a live key with a clear message and a non-zero exit', async () => {
    const ran = await runProcess(process.execPath, [BIN, 'listen', '--forward-to', 'http://x'], {
      cwd: ROOT,
      env: { ...process.env, TALLY_URL: server.base, TALLY_API_KEY: server.keys.live.server },
    });
    expect(ran.code).toBe(1);
    expect(ran.stderr).toContain('test-environment events only');
    // The service refuses it too, for a client that does not check.
    const refused = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const ws = new WebSocket(`${server.base.replace('http', 'ws')}/v1/listen`, {
        headers: { 'x-tally-key': server.keys.live.server },
      });
      ws.on('unexpected-response', (request, response) => {
        let body = '';
        response.on('data', (chunk: Buffer) => (body += chunk.toString()));
        response.on('end', () => {
          request.destroy();
          resolve({ status: response.statusCode ?? 0, body });
        });
      });
      ws.on('open', () => reject(new Error('a live key opened the relay')));
    });
    expect(refused.status).toBe(403);
    expect((JSON.parse(refused.body) as { code: string }).code).toBe('relay_test_only');
  });

  it('devTunnel: false turns the relay off', async () => {
    await call(server.base, 'POST', '/v1/sync/push', {
      key: server.keys.test.server,
      body: { ...CONFIG, webhooks: { ...CONFIG.webhooks, devTunnel: false } },
    });
    const ran = await runProcess(process.execPath, [BIN, 'listen', '--forward-to', 'http://x'], {
      cwd: ROOT,
      env: { ...process.env, TALLY_URL: server.base, TALLY_API_KEY: server.keys.test.server },
    });
    expect(ran.code).toBe(1);
    expect(ran.stderr).toContain('devTunnel');
  });
});
