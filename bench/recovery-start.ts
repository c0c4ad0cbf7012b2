/**
 * Starts the real Tally (`dist/src/main.js`) on an existing data directory and measures
 * its recovery as an operator sees it: wall time from spawning the process to the first
 * `/healthz` 200, and the process's memory (peak and current resident set, from
 * /proc/<pid>/status, worker threads included: they share the process).
 *
 * What it does not measure: a cold disk. The data was usually just written, so LMDB
 * reads it from the page cache; `evictPageCache` asks the kernel to drop this data dir's
 * pages (only its files, nothing machine-wide) for a cold-ish start, but a virtual
 * machine's host may still cache them.
 */
import { spawnSync } from 'node:child_process';
import { readdir, readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { startChild, stopChild, type Child } from './children.js';
import {
  customerIdOf,
  expectedConsumedMicros,
  RECOVERY_METERS,
  type Workload,
} from './recovery-data.js';

/** Generous: the worst case before any optimisation took minutes, not seconds. */
const HEALTH_TIMEOUT_MS = 15 * 60_000;
const POLL_INTERVAL_MS = 10;

export interface StartMeasurement {
  /** Spawn → `{"msg":"listening"}` line (process start, module loading, port bound). */
  readonly msToListening: number;
  /** Spawn → first `/healthz` 200: what a load balancer would wait for. */
  readonly msToHealthz: number;
  /** The server's own `ready` log line: from listening until every shard has recovered. */
  readonly recoveryMs: number | null;
  /** VmHWM: the process's peak resident set up to the moment it was healthy. */
  readonly peakRssBytes: number;
  /** VmRSS right after it was healthy: what the recovered state keeps. */
  readonly rssBytes: number;
  /**
   * Highest RssAnon seen while polling /healthz (every POLL_INTERVAL_MS): memory the
   * process allocated (heaps, buffers), as opposed to RssFile, the pages of LMDB's
   * read-only memory map that recovery touched. Those are page cache, shared and
   * reclaimable, yet VmHWM counts them.
   */
  readonly peakRssAnonBytes: number;
  /** RssFile right after it was healthy (see peakRssAnonBytes). */
  readonly rssFileBytes: number;
  readonly shards: unknown;
}

export interface StartedServer {
  readonly child: Child;
  readonly baseUrl: string;
  readonly measurement: StartMeasurement;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

async function healthy(baseUrl: string): Promise<boolean> {
  try {
    const response = await fetch(`${baseUrl}/healthz`);
    await response.arrayBuffer();
    return response.status === 200;
  } catch {
    return false;
  }
}

interface ProcessMemory {
  readonly peakRssBytes: number;
  readonly rssBytes: number;
  readonly rssAnonBytes: number;
  readonly rssFileBytes: number;
}

/**
 * Reads VmHWM, VmRSS, RssAnon and RssFile (kB in the file) of `pid`. Throws if /proc lacks them.
 */
export async function processMemory(pid: number): Promise<ProcessMemory> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  const field = (name: string): number => {
    const match = new RegExp(`^${name}:\\s+(\\d+) kB$`, 'm').exec(status);
    if (match === null) throw new Error(`/proc/${pid}/status has no ${name}`);
    return Number(match[1]) * 1024;
  };
  return {
    peakRssBytes: field('VmHWM'),
    rssBytes: field('VmRSS'),
    rssAnonBytes: field('RssAnon'),
    rssFileBytes: field('RssFile'),
  };
}

/** The `ready` line main.ts prints, once it has appeared in the child's output. */
function readyLine(child: Child): { recoveryMs: number; shards: unknown } | null {
  for (const line of child.outputTail().split('\n')) {
    if (!line.includes('"msg":"ready"')) continue;
    const parsed = JSON.parse(line) as { recoveryMs?: unknown; shards?: unknown };
    if (typeof parsed.recoveryMs === 'number')
      return { recoveryMs: parsed.recoveryMs, shards: parsed.shards };
  }
  return null;
}

/**
 * Spawns Tally on `dataDir` (port 0) and resolves once `/healthz` answers 200, with the
 * measurement (`env` may carry NODE_OPTIONS, e.g. `--cpu-prof`, to profile it). Throws if
 * the server exits or stays unhealthy for HEALTH_TIMEOUT_MS; the child stays registered
 * with children.ts, so `stopAll` still stops it.
 */
export async function startAndMeasure(
  mainScript: string,
  dataDir: string,
  env: Readonly<Record<string, string>> = {},
): Promise<StartedServer> {
  const spawnedMs = performance.now();
  const child = await startChild('tally', mainScript, {
    ...env,
    PORT: '0',
    TALLY_DATA_DIR: dataDir,
  });
  const msToListening = performance.now() - spawnedMs;
  const baseUrl = `http://127.0.0.1:${child.port}`;
  const pid = child.process.pid;
  if (pid === undefined) throw new Error('tally has no pid');
  const deadline = spawnedMs + HEALTH_TIMEOUT_MS;
  let peakRssAnonBytes = 0;
  for (;;) {
    if (child.process.exitCode !== null || child.process.signalCode !== null) {
      throw new Error(`tally exited during recovery\n--- output ---\n${child.outputTail()}`);
    }
    if (await healthy(baseUrl)) break;
    peakRssAnonBytes = Math.max(peakRssAnonBytes, (await processMemory(pid)).rssAnonBytes);
    if (performance.now() > deadline)
      throw new Error(`tally not healthy within ${HEALTH_TIMEOUT_MS} ms\n${child.outputTail()}`);
    await sleep(POLL_INTERVAL_MS);
  }
  const msToHealthz = performance.now() - spawnedMs;
  const { rssAnonBytes, ...memory } = await processMemory(pid);
  peakRssAnonBytes = Math.max(peakRssAnonBytes, rssAnonBytes);
  // The ready line is written just before /healthz turns 200; give the pipe a moment.
  let ready = readyLine(child);
  for (let i = 0; ready === null && i < 100; i++) {
    await sleep(10);
    ready = readyLine(child);
  }
  return {
    child,
    baseUrl,
    measurement: {
      msToListening,
      msToHealthz,
      recoveryMs: ready?.recoveryMs ?? null,
      shards: ready?.shards ?? null,
      ...memory,
      peakRssAnonBytes,
    },
  };
}

/** A few customers spread over the id range: first, middle, last. */
export function sampleCustomers(customers: number): number[] {
  return [...new Set([0, Math.floor(customers / 2), customers - 1])];
}

/**
 * Asks the recovered server for every sample customer's balance of every meter and throws
 * unless `consumed` is exactly what the workload put there. Returns the customers checked.
 */
export async function verifyBalances(
  server: StartedServer,
  serverKey: string,
  workload: Workload,
  customers: readonly number[],
): Promise<number> {
  const expected = expectedConsumedMicros(workload, customers);
  for (const [customer, meters] of expected) {
    for (const [m, micros] of meters.entries()) {
      const meter = RECOVERY_METERS[m];
      const url =
        `${server.baseUrl}/v1/usage/${meter}/balance` + `?customerId=${customerIdOf(customer)}`;
      const response = await fetch(url, { headers: { 'x-tally-key': serverKey } });
      const body = (await response.json()) as { consumed?: unknown };
      const want = Number(micros) / 1e6;
      if (response.status !== 200 || body.consumed !== want) {
        throw new Error(
          `recovered ${meter} ` +
            `of ${customerIdOf(customer)}: ${response.status} ${JSON.stringify(body)}, ` +
            `expected consumed ${want}`,
        );
      }
    }
  }
  return expected.size;
}

export async function stopServer(server: StartedServer): Promise<void> {
  await stopChild(server.child.process);
}

async function filesUnder(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true, recursive: true });
  return entries.filter((e) => e.isFile()).map((e) => path.join(e.parentPath, e.name));
}

/** Bytes the data directory occupies on disk (allocated blocks, not apparent sizes). */
export async function diskUsageBytes(dir: string): Promise<number> {
  let total = 0;
  for (const file of await filesUnder(dir)) total += (await stat(file)).blocks * 512;
  return total;
}

/**
 * Drops the page cache of every file under `dir` (GNU dd's `iflag=nocache count=0`,
 * i.e. posix_fadvise DONTNEED on that file only). Returns false if dd refused.
 */
export async function evictPageCache(dir: string): Promise<boolean> {
  let ok = true;
  for (const file of await filesUnder(dir)) {
    const result = spawnSync('dd', [`if=${file}`, 'iflag=nocache', 'count=0', 'status=none']);
    ok &&= result.status === 0;
  }
  return ok;
}
