/**
 * Starts the real Tally server (`dist/src/main.js`) for the benchmark and makes it ready
 * to measure: a fresh temporary data directory, wait for `/healthz` to answer 200 (that
 * is, recovery is done), read the bootstrap keys it wrote, push the bench's billing
 * configuration with the test-environment server key.
 *
 * Nothing here is mocked: the process, the journal and its disk writes are the ones
 * production runs. What it does not reproduce is a production data set: the journal
 * starts empty, so recovery, LMDB page cache and actor state sizes are those of a small
 * database.
 *
 * It starts one Tally per call; tallies.ts decides how many run and with what settings.
 */
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startChild, type Child } from './children.js';
import { BENCH_CONFIG, hasRequest, type BenchKeys } from './scenarios.js';

const HEALTH_TIMEOUT_MS = 60_000;
const POLL_INTERVAL_MS = 50;

export interface TallyServer {
  readonly child: Child;
  readonly baseUrl: string;
  readonly keys: BenchKeys;
  readonly dataDir: string;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls until `probe` returns a value; throws with `what` after HEALTH_TIMEOUT_MS. */
async function waitFor<T>(
  what: string,
  child: Child,
  probe: () => Promise<T | undefined>,
): Promise<T> {
  const deadline = Date.now() + HEALTH_TIMEOUT_MS;
  for (;;) {
    if (child.process.exitCode !== null || child.process.signalCode !== null) {
      throw new Error(
        `${child.name} exited while waiting for ${what}\n--- ${child.name} output ` +
          `---\n${child.outputTail()}`,
      );
    }
    const value = await probe().catch(() => undefined);
    if (value !== undefined) return value;
    if (Date.now() > deadline)
      throw new Error(
        `${child.name}: no ${what} within ${HEALTH_TIMEOUT_MS} ms\n--- ${child.name} ` +
          `output ---\n${child.outputTail()}`,
      );
    await sleep(POLL_INTERVAL_MS);
  }
}

async function healthy(baseUrl: string): Promise<true | undefined> {
  const response = await fetch(`${baseUrl}/healthz`);
  await response.arrayBuffer();
  return response.status === 200 ? true : undefined;
}

async function readKeys(dataDir: string): Promise<BenchKeys | undefined> {
  const raw: unknown = JSON.parse(await readFile(join(dataDir, 'bootstrap-keys.json'), 'utf8'));
  const test = (raw as { test?: { server?: unknown; client?: unknown } }).test;
  if (typeof test?.server !== 'string' || typeof test.client !== 'string') return undefined;
  return { server: test.server, client: test.client };
}

async function pushConfig(
  name: string,
  baseUrl: string,
  keys: BenchKeys,
  config: unknown,
): Promise<void> {
  const response = await fetch(`${baseUrl}/v1/sync/push`, {
    method: 'POST',
    headers: { 'x-tally-key': keys.server, 'content-type': 'application/json' },
    body: JSON.stringify(config),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${name}: config push answered ${response.status}: ${text}`);
}

/** True once `npm run build` has produced the server. */
export function tallyBuilt(mainScript: string): boolean {
  return existsSync(mainScript);
}

/** A fresh, empty data directory; the caller removes it with removeDataDir. */
export function makeDataDir(): Promise<string> {
  return mkdtemp(join(tmpdir(), 'tally-bench-'));
}

/**
 * Starts Tally as child `name` on `dataDir`, with `env` added to its environment (the caller's
 * TALLY_WORKERS, TALLY_RATE_LIMIT_*; PORT and TALLY_DATA_DIR are set here), pushes `config` (the
 * HTTP bench's BENCH_CONFIG unless given) and returns it ready to measure. Throws (the child stays
 * registered for `stopAll`) if it does not listen, become healthy, write its keys or accept the
 * configuration in time.
 */
export async function startTally(
  mainScript: string,
  name: string,
  dataDir: string,
  env: Readonly<Record<string, string>>,
  config: unknown = BENCH_CONFIG,
): Promise<TallyServer> {
  const child = await startChild(name, mainScript, { ...env, PORT: '0', TALLY_DATA_DIR: dataDir });
  const baseUrl = `http://127.0.0.1:${child.port}`;
  await waitFor('healthy /healthz', child, () => healthy(baseUrl));
  const keys = await waitFor('bootstrap-keys.json', child, () => readKeys(dataDir));
  await pushConfig(name, baseUrl, keys, config);
  return { child, baseUrl, keys, dataDir };
}

/**
 * Sends one `has` request (customer 0, client key) and returns its `x-ratelimit-limit`
 * header, or null when there is none: what the limiter really runs with, which the
 * environment alone cannot show (a Tally that ignores TALLY_RATE_LIMIT_* still starts).
 * Throws unless the request answers 2xx.
 */
export async function rateLimitHeader(server: TallyServer): Promise<string | null> {
  const request = hasRequest('cust-0', server.keys);
  const response = await fetch(`${server.baseUrl}${request.path ?? '/'}`, {
    headers: request.headers as Record<string, string>,
  });
  const text = await response.text();
  if (!response.ok)
    throw new Error(
      `${server.child.name}: rate-limit probe ${request.path} answered ${response.status}: ${text}`,
    );
  return response.headers.get('x-ratelimit-limit');
}

/** Removes a data directory made by makeDataDir. Call after the process has stopped. */
export async function removeDataDir(dataDir: string): Promise<void> {
  await rm(dataDir, { recursive: true, force: true });
}
