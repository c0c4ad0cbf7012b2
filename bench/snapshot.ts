/**
 * Snapshot and restore at scale (`npm run bench:snapshot`): what an operator waits for,
 * and what traffic feels, when the service holds many customers.
 *
 * It builds a data dir with `--customers` customers (3 meters each; recovery-data.ts,
 * written by the real shard and store), starts Tally on it, and then:
 * - takes an online snapshot with the real CLI (`tally snapshot create --out`: the cut,
 *   the shards' copy, the file on the server, the download, its SHA-256 and structure
 *   check) while a client keeps sending `has` requests one at a time, and reports the
 *   server-side time (created → complete), the CLI's total, the file size, and the
 *   slowest `has` answer during the snapshot (a shard copies its customers in slices
 *   between batches; the CLI's download and hashing share the machine's cores);
 * - restores the file offline with the CLI into a fresh dir (time, peak RSS of the CLI);
 * - starts Tally on the restored dir (time to /healthz 200) and compares a sample of
 *   customers' balances with the original server's.
 *
 * What it does not measure: a remote download (loopback only), a cold page cache, or
 * a snapshot under heavy write load (the snapshot test covers correctness under writes).
 */
import { spawn } from 'node:child_process';
import { mkdtemp, readFile, stat } from 'node:fs/promises';
import { availableParallelism, cpus, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { runMain, stopAll, stopOnSignals } from './children.js';
import { buildDataDir, customerIdOf, removeDataDir, RECOVERY_METERS } from './recovery-data.js';
import { processMemory, startAndMeasure, stopServer } from './recovery-start.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const MAIN_SCRIPT = join(ROOT, 'dist', 'src', 'main.js');
const CLI = join(ROOT, 'bin', 'tally.js');

interface Ran {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  readonly ms: number;
  readonly peakRssBytes: number;
  /**
   * The highest RssAnon seen (sampled every 10 ms): the CLI's own memory, without the pages
   * of the data files it maps, which VmHWM and maxRSS count as well.
   */
  readonly peakRssAnonBytes: number;
}

/** Runs the CLI; peak RSS from the child's own resource usage (GNU time is not assumed). */
function tally(args: readonly string[], env: Record<string, string>): Promise<Ran> {
  const started = performance.now();
  // A wrapper that runs the CLI in-process and prints its peak RSS on exit.
  const wrapper =
    `process.on('exit', () => process.stderr.write('\\nMAXRSS_KB=' + ` +
    `process.resourceUsage().maxRSS + '\\n'));
process.argv = [process.argv[0], ${JSON.stringify(CLI)}, ...process.argv.slice(1)];
await import(${JSON.stringify(`file://${CLI}`)});`;
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--input-type=module', '-e', wrapper, ...args], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    let peakRssAnonBytes = 0;
    const sampler = setInterval(() => {
      if (child.pid === undefined) return;
      processMemory(child.pid).then(
        (memory) => (peakRssAnonBytes = Math.max(peakRssAnonBytes, memory.rssAnonBytes)),
        () => undefined, // gone between the check and the read
      );
    }, 10);
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.once('error', reject);
    child.once('close', (code) => {
      clearInterval(sampler);
      const kb = Number(/MAXRSS_KB=(\d+)/.exec(stderr)?.[1] ?? 0);
      resolve({
        code,
        stdout,
        stderr: stderr.replace(/\n?MAXRSS_KB=\d+\n/, ''),
        ms: performance.now() - started,
        peakRssBytes: kb * 1024,
        peakRssAnonBytes,
      });
    });
  });
}

/** Sends `has` one at a time until `stop()`; answers the slowest and the count. */
function probe(
  baseUrl: string,
  key: string,
  customers: number,
): {
  stop: () => Promise<{ maxMs: number; count: number; failures: number; statuses: number[] }>;
} {
  let running = true;
  let maxMs = 0;
  let count = 0;
  let failures = 0;
  const statuses = new Set<number>();
  const loop = (async () => {
    for (let i = 0; running; i++) {
      const started = performance.now();
      const res = await fetch(
        `${baseUrl}/v1/entitlements/sso/has?customerId=${customerIdOf((i * 7919) % customers)}`,
        { headers: { 'x-tally-key': key } },
      );
      await res.arrayBuffer();
      if (res.status !== 200) {
        failures++;
        statuses.add(res.status);
      }
      maxMs = Math.max(maxMs, performance.now() - started);
      count++;
    }
  })();
  return {
    async stop() {
      running = false;
      await loop;
      return { maxMs, count, failures, statuses: [...statuses] };
    },
  };
}

async function balances(baseUrl: string, key: string, ids: readonly string[]): Promise<string[]> {
  const out: string[] = [];
  for (const id of ids) {
    for (const meter of RECOVERY_METERS) {
      const res = await fetch(`${baseUrl}/v1/usage/${meter}/balance?customerId=${id}`, {
        headers: { 'x-tally-key': key },
      });
      out.push(`${res.status} ${await res.text()}`);
    }
  }
  return out;
}

const mib = (bytes: number): string => `${(bytes / 1024 / 1024).toFixed(0)} MiB`;
const sec = (ms: number): string => `${(ms / 1000).toFixed(1)} s`;

async function main(): Promise<void> {
  const { values } = parseArgs({
    args: process.argv.slice(2),
    options: {
      customers: { type: 'string' },
      workers: { type: 'string' },
      dir: { type: 'string' },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(
      'usage: node dist/bench/snapshot.js [--customers n (default 1000000)] [--workers n ' +
        '(default 1)] [--dir path]\n',
    );
    return;
  }
  const customers = Number(values.customers ?? 1_000_000);
  const workers = Number(values.workers ?? 1);
  if (
    !Number.isSafeInteger(customers) ||
    customers < 3 ||
    !Number.isSafeInteger(workers) ||
    workers < 1
  )
    throw new Error('--customers and --workers must be positive integers');
  const parent = await mkdtemp(join(values.dir ?? tmpdir(), 'tally-snapbench-'));
  const dataDir = join(parent, 'data');
  const restoredDir = join(parent, 'restored');
  const file = join(parent, 'bench.tsnap');
  const log = (line: string): void => void process.stderr.write(`bench:snapshot: ${line}\n`);
  stopOnSignals('bench:snapshot', () => removeDataDir(parent));
  try {
    log(`building ${customers} customers x 3 meters (${workers} worker(s)) ...`);
    const built = await buildDataDir({
      dataDir,
      customers,
      events: customers * 3,
      eventsPerRecord: 128,
      tailEvents: 0,
      workers,
      mainScript: MAIN_SCRIPT,
      log,
    });
    const keys = JSON.parse(await readFile(join(dataDir, 'bootstrap-keys.json'), 'utf8')) as {
      test: { server: string; client: string };
      admin: string;
    };
    // Every budget off: the client sends `has` as fast as it is answered, from one address.
    const original = await startAndMeasure(MAIN_SCRIPT, dataDir, {
      TALLY_RATE_LIMIT_SERVER: '0',
      TALLY_RATE_LIMIT_CLIENT: '0',
      TALLY_RATE_LIMIT_CLIENT_ADDRESS: '0',
      TALLY_RATE_LIMIT_CLIENT_CUSTOMER: '0',
    });
    log(`original healthy after ${sec(original.measurement.msToHealthz)}; taking the snapshot ...`);
    const traffic = probe(original.baseUrl, keys.test.client, customers);
    const created = await tally(['snapshot', 'create', '--out', file, '--json'], {
      TALLY_URL: original.baseUrl,
      TALLY_API_KEY: keys.admin,
    });
    const during = await traffic.stop();
    if (created.code !== 0) throw new Error(`snapshot create failed: ${created.stderr}`);
    const info = JSON.parse(created.stdout) as {
      id: string;
      createdAt: string;
      completedAt: string;
      bytes: number;
      customers: number;
    };
    const serverMs = Date.parse(info.completedAt) - Date.parse(info.createdAt);
    const secret = await tally(['snapshot', 'secret'], {
      TALLY_URL: original.baseUrl,
      TALLY_API_KEY: keys.admin,
    });
    if (secret.code !== 0) throw new Error(`snapshot secret failed: ${secret.stderr}`);
    const sample = [0, 1, Math.floor(customers / 2), customers - 1].map(customerIdOf);
    const before = await balances(original.baseUrl, keys.test.server, sample);
    await stopServer(original);

    log('restoring ...');
    const restored = await tally(['snapshot', 'restore', file, '--data-dir', restoredDir], {
      TALLY_SNAPSHOT_SECRET: secret.stdout.trim(),
    });
    if (restored.code !== 0) throw new Error(`restore failed: ${restored.stderr}`);
    const started = await startAndMeasure(MAIN_SCRIPT, restoredDir, {});
    const after = await balances(started.baseUrl, keys.test.server, sample);
    await stopServer(started);
    const same = before.every((b, i) => b === after[i]);

    const rows: Array<[string, string]> = [
      ['customers (3 meters each)', String(info.customers)],
      [
        'data dir built in',
        `${sec(built.buildMs)} (${built.records} journal records, then a shard snapshot)`,
      ],
      [
        'snapshot file',
        `${mib((await stat(file)).size)} (${(info.bytes / info.customers).toFixed(0)} ` +
          `bytes per customer)`,
      ],
      ['snapshot on the server (cut → file complete)', sec(serverMs)],
      ['tally snapshot create (incl. download + SHA-256 + verify)', sec(created.ms)],
      [
        'has answers during it (one at a time)',
        `${during.count}, slowest ${during.maxMs.toFixed(1)} ms, failed ${during.failures}` +
          (during.failures > 0 ? ` (status ${during.statuses.join(', ')})` : ''),
      ],
      [
        'tally snapshot restore',
        `${sec(restored.ms)}, peak RSS ${mib(restored.peakRssBytes)} ` +
          `(anonymous ${mib(restored.peakRssAnonBytes)})`,
      ],
      [
        'restored server: spawn → /healthz 200',
        `${sec(started.measurement.msToHealthz)}, peak ` +
          `RSS ${mib(started.measurement.peakRssBytes)}`,
      ],
      ['sampled balances equal original', same ? 'yes' : 'NO'],
    ];
    process.stdout.write(
      `node ${process.version}, ${availableParallelism()} cores ` +
        `(${cpus()[0]?.model ?? '?'}), ${workers} worker(s)\n`,
    );
    for (const [name, value] of rows) process.stdout.write(`${name.padEnd(58)} ${value}\n`);
    if (!same) throw new Error('restored balances differ from the original');
  } finally {
    await stopAll();
    await removeDataDir(parent);
  }
}

runMain('bench:snapshot', main);
