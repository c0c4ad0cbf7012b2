/**
 * Reads of a table another thread writes see every commit made before them, even when this
 * thread read the table moments earlier in the same turn (lmdb-js keeps a thread's read
 * snapshot until a timer resets it). The writer here is a real worker thread; this thread
 * blocks on shared memory while it commits, so no timer can run in between.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import { afterEach, describe, expect, it } from 'vitest';
import { CustomerIndex } from '../storage/customer-index.js';
import { openDurableEnv, SHARD_ENV_OPTIONS } from '../storage/lmdb-env.js';
import {
  putEndpoint,
  readEndpoints,
  type WebhookEndpointRecord,
} from '../storage/webhook-registry.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const dist = (file: string): string => pathToFileURL(path.join(ROOT, 'dist', file)).href;
const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

/**
 * Starts a worker that waits for the go signal, runs `write` (the body of an async function
 * given `env`, the opened environment), then signals done. `await go()` lets it write while
 * this thread blocks (no event loop turn here), and resolves once the worker finished.
 */
function writerThread(envPath: string, names: string[], write: string, options: object) {
  const signal = new Int32Array(new SharedArrayBuffer(4));
  const code = `
    const { workerData } = require('node:worker_threads');
    Promise.all([import(workerData.lmdbEnv), import(workerData.registry)]).then(
      async ([{ openDurableEnv }, registry]) => {
        const env = openDurableEnv(workerData.envPath, workerData.names, workerData.options);
        Atomics.store(workerData.signal, 0, 1);
        Atomics.notify(workerData.signal, 0);
        Atomics.wait(workerData.signal, 0, 1);
        await (async (env, registry) => { ${write} })(env, registry);
        Atomics.store(workerData.signal, 0, 3);
        Atomics.notify(workerData.signal, 0);
      },
    );
  `;
  const worker = new Worker(code, {
    eval: true,
    workerData: {
      lmdbEnv: dist('storage/lmdb-env.js'),
      registry: dist('storage/webhook-registry.js'),
      envPath,
      names,
      options,
      signal,
    },
  });
  return {
    /** Waits (blocking) for the worker to open its environment. */
    ready(): void {
      Atomics.wait(signal, 0, 0, 10_000);
      expect(Atomics.load(signal, 0)).toBe(1);
    },
    /** Lets it write and blocks until it has: nothing else runs on this thread meanwhile. */
    go(): void {
      Atomics.store(signal, 0, 2);
      Atomics.notify(signal, 0);
      Atomics.wait(signal, 0, 2, 10_000);
      expect(Atomics.load(signal, 0)).toBe(3);
    },
    stop: () => worker.terminate(),
  };
}

function endpoint(status: WebhookEndpointRecord['status'], atMs: number): WebhookEndpointRecord {
  return {
    id: 'we_1',
    environment: 'test',
    url: 'https://example.com/hook',
    key: 'k',
    events: ['*'],
    status,
    statusReason: null,
    secret: 'whsec_x',
    previousSecret: null,
    previousSecretUntilMs: null,
    createdAtMs: 1,
    updatedAtMs: atMs,
  };
}

describe('reads of another thread’s commits', () => {
  it('the delivery thread’s endpoint read sees an enable made since its last read', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'tally-fresh-'));
    dirs.push(dir);
    const envPath = path.join(dir, 'control');
    const env = openDurableEnv<'webhooks'>(envPath, ['webhooks']);
    try {
      await putEndpoint(env.dbs.webhooks, endpoint('failing', 10));
      const enable = JSON.stringify(endpoint('active', 20));
      const writer = writerThread(
        envPath,
        ['webhooks'],
        `await registry.putEndpoint(env.dbs.webhooks, ${enable});`,
        {},
      );
      try {
        writer.ready();
        expect(readEndpoints(env.dbs.webhooks).map((r) => r.status)).toEqual(['failing']);
        writer.go();
        expect(readEndpoints(env.dbs.webhooks).map((r) => r.status)).toEqual(['active']);
      } finally {
        await writer.stop();
      }
    } finally {
      await env.root.close();
    }
  });

  it('the customer index sees a customer a shard committed since its last read', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'tally-fresh-'));
    dirs.push(dir);
    const index = CustomerIndex.open(dir, 1, () => 0);
    try {
      const writer = writerThread(
        path.join(dir, 'shard-0'),
        ['customers'],
        `await env.dbs.customers.put(['test', 'c1'], Buffer.from('{"id":"c1"}'));
         await env.root.flushed;`,
        SHARD_ENV_OPTIONS,
      );
      try {
        writer.ready();
        expect(index.get('test', 'c1')).toBeNull();
        expect(index.page('test', null, 10).items).toEqual([]);
        writer.go();
        expect(index.get('test', 'c1')).toBe('{"id":"c1"}');
        expect(index.page('test', null, 10).items).toEqual(['{"id":"c1"}']);
      } finally {
        await writer.stop();
      }
    } finally {
      await index.close();
    }
  });
});
