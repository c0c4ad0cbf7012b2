/**
 * The Tally processes the benchmark runs, and why there can be two.
 *
 * The bench's Tally runs with rate limiting on and a limit of RATE_LIMIT_HUGE requests
 * per minute per key, far above what any run sends: it must never answer 429 (a fast
 * refusal would inflate req/s), yet every request still pays for the accounting and the
 * `X-RateLimit-*` headers, as in production. A second Tally with rate limiting off
 * (`0`: no accounting, no headers) starts only when a selected scenario targets it
 * (`has-unlimited`), so the limiter's cost can be measured in the same run.
 *
 * Each Tally gets its own fresh data directory and bootstrap keys. A one-request probe
 * records whether the limiter is really on (the `x-ratelimit-limit` header): a Tally
 * built before rate limiting existed ignores the variables and starts anyway.
 */
import type { BenchOptions } from './options.js';
import { registerBenchEndpoints, SLOW_RECEIVER_MS } from './webhook-receivers.js';
import type { TallyInstance } from './scenarios.js';
import {
  makeDataDir,
  rateLimitHeader,
  startTally,
  tallyBuilt,
  type TallyServer,
} from './tally-server.js';

/** Requests per minute per key: ~10^4 times what a 10 s bench run sends in a minute. */
export const RATE_LIMIT_HUGE = 1_000_000_000;

interface InstanceSpec {
  /** Child name and table label. */
  readonly label: string;
  readonly env: Readonly<Record<string, string>>;
  readonly note: string;
}

const rateLimitEnv = (perMinute: number): Record<string, string> => ({
  TALLY_RATE_LIMIT_SERVER: String(perMinute),
  TALLY_RATE_LIMIT_CLIENT: String(perMinute),
});

export const TALLY_INSTANCES: Readonly<Record<TallyInstance, InstanceSpec>> = {
  'rate-limited': {
    label: 'tally',
    env: rateLimitEnv(RATE_LIMIT_HUGE),
    note: `rate limit ${RATE_LIMIT_HUGE}/min per key (on, never reached)`,
  },
  'rate-limit-off': { label: 'tally-rl-off', env: rateLimitEnv(0), note: 'rate limiting off (0)' },
  webhooks: {
    label: 'tally-webhooks',
    env: rateLimitEnv(RATE_LIMIT_HUGE),
    note:
      `as tally, with three webhook endpoints: one answering at once, one after ` +
      `${SLOW_RECEIVER_MS / 1000} s, one down`,
  },
};

export interface Tallies {
  /** Empty when Tally is not built; otherwise always holds 'rate-limited'. */
  readonly servers: ReadonlyMap<TallyInstance, TallyServer>;
  readonly note: string;
  /** The rate-limited Tally's `has` answered `x-ratelimit-limit: RATE_LIMIT_HUGE`. */
  readonly rateLimitHeaderSeen: boolean;
  /**
   * The rate-limit-off Tally's `has` carried an `x-ratelimit-limit` header; null when it did not
   * run.
   */
  readonly rateLimitOffHeaderSeen: boolean | null;
}

/**
 * The rate-limited Tally always (it is the bench's Tally); others only if a scenario targets them.
 */
function neededInstances(options: BenchOptions): TallyInstance[] {
  return [...new Set<TallyInstance>(['rate-limited', ...options.scenarios.map((s) => s.tally)])];
}

async function startInstance(
  mainScript: string,
  instance: TallyInstance,
  options: BenchOptions,
  dataDirs: string[],
): Promise<TallyServer> {
  const dataDir = await makeDataDir();
  dataDirs.push(dataDir); // before starting, so cleanup removes it even if the start fails
  const spec = TALLY_INSTANCES[instance];
  const workers: Record<string, string> =
    options.workers === undefined ? {} : { TALLY_WORKERS: String(options.workers) };
  const server = await startTally(mainScript, spec.label, dataDir, { ...workers, ...spec.env });
  if (instance === 'webhooks') await registerBenchEndpoints(server);
  return server;
}

function describe(instances: readonly TallyInstance[], options: BenchOptions): string {
  const each = instances.map((i) => `${TALLY_INSTANCES[i].label}: ${TALLY_INSTANCES[i].note}`);
  return `TALLY_WORKERS=${options.workers ?? '(default)'}, fresh data dir each; ${each.join('; ')}`;
}

/**
 * Starts the Tallies the selected scenarios need (in parallel), each ready to measure,
 * and probes their rate-limit headers. Registers each data directory in `dataDirs` for
 * the caller to remove. Returns no servers, and a note saying why, when Tally is not
 * built. Throws if a Tally fails to start or its probe request is not answered 2xx; the
 * children stay registered for `stopAll`.
 */
export async function startTallies(
  mainScript: string,
  options: BenchOptions,
  dataDirs: string[],
): Promise<Tallies> {
  if (!tallyBuilt(mainScript)) {
    const note =
      `NOT RUN: ${mainScript} does not exist (run npm run build once the server ` +
      `exists); bare only`;
    return { servers: new Map(), note, rateLimitHeaderSeen: false, rateLimitOffHeaderSeen: null };
  }
  const instances = neededInstances(options);
  const started = await Promise.all(
    instances.map(async (i) => [i, await startInstance(mainScript, i, options, dataDirs)] as const),
  );
  const servers = new Map<TallyInstance, TallyServer>(started);
  const limited = servers.get('rate-limited');
  if (limited === undefined) throw new Error('the rate-limited Tally must always run');
  const off = servers.get('rate-limit-off');
  return {
    servers,
    note: describe(instances, options),
    rateLimitHeaderSeen: (await rateLimitHeader(limited)) === String(RATE_LIMIT_HUGE),
    rateLimitOffHeaderSeen: off === undefined ? null : (await rateLimitHeader(off)) !== null,
  };
}
