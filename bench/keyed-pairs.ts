/**
 * Keyed against unkeyed consumes (`npm run bench:keyed -- [--pairs N] [--seconds S]`): the
 * soak's load (soak-load.ts) without keys and with a new idempotency key on every consume,
 * alternated pair by pair, each run against a fresh Tally on a fresh data dir (the keys a
 * run finds from an earlier one are partly replays, which cost less and flatter the
 * ratio). Each run warms up for WARMUP_SEC with keys of its own (a keyed run until its first
 * run of keys is sealed: see `warmUp`), then measures S seconds: consumes/s and the CPU per
 * consume of each thread group. Prints each pair's ratio (keyed ÷ unkeyed) and their
 * median: single runs on a shared machine move by tens of percent, a median of alternated
 * pairs far less.
 */
import { parseArgs } from 'node:util';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { stopAll } from './children.js';
import { pairRatios, type KeyedRun } from './keyed-ratios.js';
import { gaugeSum, samples } from './metrics-text.js';
import { positiveNumber } from './options.js';
import {
  adminKeyOf,
  DEFAULT_LOAD_NICE,
  LOAD_TALLY_ENV,
  niceOption,
  runLoad,
  scrape,
  type LoadOptions,
} from './soak-load.js';
import { cpuSecondsBetween, sampleThreads } from './thread-cpu.js';
import { makeDataDir, removeDataDir, startTally, type TallyServer } from './tally-server.js';
import { wrkAvailable } from './wrk.js';

const MAIN_SCRIPT = join(dirname(fileURLToPath(import.meta.url)), '..', 'src', 'main.js');
const WARMUP_SEC = 5;
/** The longest a keyed run warms up: a shard seals its keys at least every 30 s. */
const KEYED_WARMUP_MAX_SEC = 45;

const USAGE = `usage: npm run bench:keyed -- [options]
  --pairs <n>           alternated pairs of runs, unkeyed first (default 6)
  --seconds <n>         measured seconds of each run, after ${WARMUP_SEC} s of warm-up (default 20)
  --connections <n>     wrk connections (default 128)
  --load-nice <n>       run wrk at this niceness, 0-19 (default ${DEFAULT_LOAD_NICE})
  --help
`;

async function measure(load: LoadOptions, seconds: number): Promise<KeyedRun> {
  const dataDir = await makeDataDir();
  try {
    const server = await startTally(MAIN_SCRIPT, 'tally', dataDir, LOAD_TALLY_ENV);
    const pid = server.child.process.pid ?? 0;
    await warmUp(server, load);
    const before = sampleThreads(pid);
    const summary = await runLoad(server, load, seconds);
    const cpu = cpuSecondsBetween(before, sampleThreads(pid));
    if (summary.errors > 0 || summary.non2xx > 0)
      throw new Error(`${summary.errors} socket errors and ${summary.non2xx} non-2xx answers`);
    return {
      perSec: summary.perSec,
      cpuUsPerRequest: Object.fromEntries(
        [...cpu].map(([group, s]) => [group, (s * 1e6) / Math.max(1, summary.requests)]),
      ),
    };
  } finally {
    await stopAll();
    await removeDataDir(dataDir);
  }
}

/**
 * Runs the load for WARMUP_SEC; a keyed run goes on, WARMUP_SEC at a time, until a run of
 * keys is sealed. A shard's first seal also opens the first era of filters and makes its
 * memory resident (~0.1 GB of fresh pages), which a long-running server does once per
 * ~33 million keys; left inside a measured run of seconds, that once-only cost would be
 * charged to a few hundred thousand consumes.
 */
async function warmUp(server: TallyServer, load: LoadOptions): Promise<void> {
  await runLoad(server, load, WARMUP_SEC);
  if (load.keys === 'none') return;
  const adminKey = await adminKeyOf(server);
  for (let sec = WARMUP_SEC; ; sec += WARMUP_SEC) {
    const runs = gaugeSum(samples(await scrape(server, adminKey)), 'tally_shard_idempotency_runs');
    if (runs > 0) return;
    if (sec >= KEYED_WARMUP_MAX_SEC)
      throw new Error(`no run of keys was sealed in ${sec} s of keyed warm-up`);
    await runLoad(server, load, WARMUP_SEC);
  }
}

function describe(keys: LoadOptions['keys'], run: KeyedRun): string {
  const cpu = Object.entries(run.cpuUsPerRequest)
    .map(([group, us]) => `${group} ${us.toFixed(1)}`)
    .join(', ');
  const label = keys === 'unique' ? 'keyed  ' : 'unkeyed';
  return `${label} ${run.perSec.toFixed(0)} consumes/s (CPU µs per consume: ${cpu})`;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    args: process.argv.slice(2),
    strict: true,
    options: {
      help: { type: 'boolean' },
      pairs: { type: 'string' },
      seconds: { type: 'string' },
      connections: { type: 'string' },
      'load-nice': { type: 'string' },
    },
  });
  if (values.help === true) {
    process.stdout.write(USAGE);
    return;
  }
  const pairs = positiveNumber('pairs', values.pairs, 6, true);
  const seconds = positiveNumber('seconds', values.seconds, 20, true);
  const base = {
    connections: positiveNumber('connections', values.connections, 128, true),
    rate: null,
    loadNice: niceOption(values['load-nice']),
  };
  if (!(await wrkAvailable()))
    throw new Error('wrk is not installed: `apt-get install wrk` (Debian, Ubuntu)');
  const unkeyed: KeyedRun[] = [];
  const keyed: KeyedRun[] = [];
  for (let pair = 1; pair <= pairs; pair++) {
    for (const keys of ['none', 'unique'] as const) {
      const run = await measure({ ...base, keys }, seconds);
      (keys === 'none' ? unkeyed : keyed).push(run);
      process.stdout.write(`pair ${pair}: ${describe(keys, run)}\n`);
    }
  }
  const { ratios, median } = pairRatios(unkeyed, keyed);
  process.stdout.write(
    `keyed ÷ unkeyed by pair: ${ratios.map((r) => r.toFixed(2)).join(', ')}; ` +
      `median ${median.toFixed(2)}×\n`,
  );
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    process.stderr.write(
      `bench:keyed failed: ${
        error instanceof Error ? (error.stack ?? error.message) : String(error)
      }\n`,
    );
    process.exit(1);
  },
);
