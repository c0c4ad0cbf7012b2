/**
 * Keyed against unkeyed consumes (`npm run bench:keyed -- [--pairs N] [--seconds S]`): the soak's
 * load (soak-load.ts) without keys and with a new idempotency key on every consume, alternated pair
 * by pair (unkeyed first in odd pairs, keyed first in even ones: `pairOrder`), each run against a
 * fresh Tally on a fresh data dir (the keys a run finds from an earlier one are partly replays,
 * which cost less and flatter the ratio). Each run warms up for WARMUP_SEC with keys of its own (a
 * keyed run until its first run of keys is sealed: see `warmUp`), then measures S seconds:
 * consumes/s, the CPU per consume of each thread group and of wrk (which shares the machine;
 * soak-load.ts gives every request an id of its own, keyed or not, so that wrk's work is the same
 * for both), and the machine's CPU no thread used (idle: a server that leaves cores idle flat out
 * is bound by each request's wait on each thread of its path) and the host took (steal). Prints
 * each pair's ratio (keyed ÷ unkeyed) and their median: single runs on a shared machine move by
 * tens of percent, a median of alternated pairs far less; beside it a 95% interval of the median
 * (`medianInterval`, from six pairs on), which says how far. Then the same for the quiet pairs
 * alone: those whose runs both saw at most QUIET_STEAL_PERCENT of steal (the host's share of the
 * CPU).
 * First it prints the machine check (wrk.ts): how fast a bare server runs on the machine that day.
 *
 * Two measures of a run's throughput. Flat out (the default), wrk's connections send
 * back to back, in bursts as answers come back in batches. `--paced` measures the highest
 * rate the server sustains: a ladder of paced steps (`--from`, then `--step` higher each,
 * S seconds each, on the same server) that goes on until MISSES_TO_STOP steps in a row get
 * less than HELD_SHARE of their rate through; the run's figure is the most any step got
 * through. It also prints the highest rate each run held, and the keyed runs' median of
 * those: a rate the server sustains, to pace the soak at (a peak may be a step behind).
 */
import { parseArgs } from 'node:util';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { runMain, startChild, stopAll, stopChild, stopOnSignals } from './children.js';
import {
  held,
  HELD_SHARE,
  ladderGoesOn,
  highestHeld,
  ladderPeak,
  median as medianOf,
  medianInterval,
  MISSES_TO_STOP,
  pairOrder,
  pairRatios,
  QUIET_STEAL_PERCENT,
  quietPairRatios,
  type KeyedRun,
  type LadderStep,
} from './keyed-ratios.js';
import { gaugeSum, samples } from './metrics-text.js';
import { positiveNumber } from './options.js';
import {
  adminKeyOf,
  DEFAULT_LOAD_NICE,
  LOAD_CUSTOMERS,
  LOAD_TALLY_ENV,
  niceOption,
  runLoad,
  scrape,
  type LoadOptions,
} from './soak-load.js';
import {
  cpuSecondsBetween,
  cpuUsPerRequest,
  idlePercent,
  sampleMachine,
  sampleThreads,
  stealPercent,
} from './thread-cpu.js';
import { makeDataDir, removeDataDir, startTally, type TallyServer } from './tally-server.js';
import { machineCheck, machineCheckText, wrkAvailable } from './wrk.js';

const MAIN_SCRIPT = join(dirname(fileURLToPath(import.meta.url)), '..', 'src', 'main.js');
const BARE_SCRIPT = join(dirname(fileURLToPath(import.meta.url)), 'bare-server.js');
const WARMUP_SEC = 5;
/** The longest a keyed run warms up: a shard seals its keys at least every 30 s. */
const KEYED_WARMUP_MAX_SEC = 45;
/** The most steps of a paced ladder (a guard: a ladder stops where the server falls behind). */
const MAX_STEPS = 40;

const HELD_SHARE_PERCENT = Math.round(HELD_SHARE * 100);

const USAGE = `usage: npm run bench:keyed -- [options]
  --pairs <n>           pairs of runs, unkeyed first in odd pairs and keyed first in
                        even ones (default 6)
  --seconds <n>         measured seconds of each run, after ${WARMUP_SEC} s of warm-up (default 20;
                        of each step with --paced, default 10)
  --paced               measure the highest rate sustained: paced steps from --from, --step
                        higher each, until ${MISSES_TO_STOP} steps in a row get less than
                        ${HELD_SHARE_PERCENT}% of their rate through
  --from <r>            consumes/s of a paced ladder's first step (default 16000)
  --step <r>            consumes/s each step adds (default 1000)
  --connections <n>     wrk connections (default 128)
  --load-nice <n>       run wrk at this niceness, 0-19 (default ${DEFAULT_LOAD_NICE})
  --customers <n>       customers the consumes go to in turn (default ${LOAD_CUSTOMERS})
  --help
`;

/** A paced ladder: the first step's rate and what each step adds. */
interface Ladder {
  readonly from: number;
  readonly step: number;
}

type PacedStep = LadderStep & KeyedRun;

/** A paced run: its peak step, and the highest rate it held (null: no step held). */
type PacedRun = PacedStep & { readonly heldUpTo: number | null };

/** The data dir of the run in progress, for a signal's cleanup. */
let liveDataDir: string | null = null;

/** Runs `load` on a fresh Tally after its warm-up: flat out, or up a paced ladder. */
async function measure(
  load: LoadOptions,
  seconds: number,
  ladder: Ladder | null,
): Promise<KeyedRun | PacedRun> {
  const dataDir = await makeDataDir();
  liveDataDir = dataDir;
  try {
    const server = await startTally(MAIN_SCRIPT, 'tally', dataDir, LOAD_TALLY_ENV);
    await warmUp(server, load);
    if (ladder === null) return await measured(server, load, seconds);
    const steps: PacedStep[] = [];
    for (let rate = ladder.from; steps.length < MAX_STEPS; rate += ladder.step) {
      const step = { askedPerSec: rate, ...(await measured(server, { ...load, rate }, seconds)) };
      steps.push(step);
      process.stdout.write(
        `  ${rate}/s asked: ${step.perSec.toFixed(0)} got through` +
          `${held(step) ? '' : ' (fell behind)'}\n`,
      );
      if (!ladderGoesOn(steps)) break;
    }
    const peak = ladderPeak(steps);
    if (peak === null) throw new Error('a paced ladder ran no step');
    return { ...peak, heldUpTo: highestHeld(steps) };
  } finally {
    await stopAll();
    await removeDataDir(dataDir);
    liveDataDir = null;
  }
}

/** One measured run of `load`: consumes/s and the CPU per consume of each thread group. */
async function measured(
  server: TallyServer,
  load: LoadOptions,
  seconds: number,
): Promise<KeyedRun> {
  const pid = server.child.process.pid ?? 0;
  const before = sampleThreads(pid);
  const machineBefore = sampleMachine();
  const summary = await runLoad(server, load, seconds);
  const cpu = cpuSecondsBetween(before, sampleThreads(pid));
  const machineAfter = sampleMachine();
  if (summary.errors > 0 || summary.non2xx > 0)
    throw new Error(`${summary.errors} socket errors and ${summary.non2xx} non-2xx answers`);
  return {
    perSec: summary.perSec,
    cpuUsPerRequest: cpuUsPerRequest(cpu, summary.requests),
    stealPercent: stealPercent(machineBefore, machineAfter),
    idlePercent: idlePercent(machineBefore, machineAfter),
    loadCpuUsPerRequest: summary.loadCpuUsPerRequest,
  };
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

function describe(keys: LoadOptions['keys'], run: KeyedRun | PacedRun): string {
  const cpu = Object.entries(run.cpuUsPerRequest)
    .map(([group, us]) => `${group} ${us.toFixed(1)}`)
    .join(', ');
  const at =
    'askedPerSec' in run
      ? ` at most (at ${run.askedPerSec}/s asked; held ${run.heldUpTo ?? 'no step'}` +
        `${run.heldUpTo === null ? '' : '/s'})`
      : '';
  const load =
    run.loadCpuUsPerRequest === undefined ? '' : `; wrk ${run.loadCpuUsPerRequest.toFixed(1)}`;
  const idle = run.idlePercent === undefined ? '' : `; idle ${run.idlePercent.toFixed(0)}%`;
  const steal = run.stealPercent === undefined ? '' : `; steal ${run.stealPercent.toFixed(0)}%`;
  return (
    `${label(keys)} ${run.perSec.toFixed(0)} consumes/s${at} ` +
    `(CPU µs per consume: ${cpu}${load}${idle}${steal})`
  );
}

function label(keys: LoadOptions['keys']): string {
  return keys === 'unique' ? 'keyed  ' : 'unkeyed';
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    args: process.argv.slice(2),
    strict: true,
    options: {
      help: { type: 'boolean' },
      pairs: { type: 'string' },
      seconds: { type: 'string' },
      paced: { type: 'boolean' },
      from: { type: 'string' },
      step: { type: 'string' },
      connections: { type: 'string' },
      'load-nice': { type: 'string' },
      customers: { type: 'string' },
    },
  });
  if (values.help === true) {
    process.stdout.write(USAGE);
    return;
  }
  const pairs = positiveNumber('pairs', values.pairs, 6, true);
  const paced = values.paced === true;
  const seconds = positiveNumber('seconds', values.seconds, paced ? 10 : 20, true);
  const ladder = paced
    ? {
        from: positiveNumber('from', values.from, 16_000, false),
        step: positiveNumber('step', values.step, 1000, false),
      }
    : null;
  if (!paced && (values.from !== undefined || values.step !== undefined))
    throw new Error('--from and --step set a paced ladder: add --paced');
  const base = {
    connections: positiveNumber('connections', values.connections, 128, true),
    rate: null,
    loadNice: niceOption(values['load-nice']),
    customers: positiveNumber('customers', values.customers, LOAD_CUSTOMERS, true),
  };
  if (!(await wrkAvailable()))
    throw new Error('wrk is not installed: `apt-get install wrk` (Debian, Ubuntu)');
  stopOnSignals('bench:keyed', () =>
    liveDataDir === null ? Promise.resolve() : removeDataDir(liveDataDir),
  );
  const bare = await startChild('bare', BARE_SCRIPT, { PORT: '0' });
  const bareReqPerSec = await machineCheck(bare.port);
  await stopChild(bare.process);
  process.stdout.write(`machine check: ${machineCheckText(bareReqPerSec)}\n`);
  const unkeyed: KeyedRun[] = [];
  const keyed: KeyedRun[] = [];
  const keyedHeld: number[] = [];
  for (let pair = 1; pair <= pairs; pair++) {
    for (const keys of pairOrder(pair)) {
      if (paced) process.stdout.write(`pair ${pair}, ${label(keys).trim()}, paced steps:\n`);
      const run = await measure({ ...base, keys }, seconds, ladder);
      (keys === 'none' ? unkeyed : keyed).push(run);
      if (keys === 'unique' && 'heldUpTo' in run && run.heldUpTo !== null)
        keyedHeld.push(run.heldUpTo);
      process.stdout.write(`pair ${pair}: ${describe(keys, run)}\n`);
    }
  }
  const { ratios, median } = pairRatios(unkeyed, keyed);
  const interval = medianInterval(ratios);
  process.stdout.write(
    `keyed ÷ unkeyed${paced ? ' (highest rates sustained)' : ''} by pair: ` +
      `${ratios.map((r) => r.toFixed(2)).join(', ')}; median ${median.toFixed(2)}× ` +
      (interval === null
        ? '(too few pairs for a 95% interval of the median: six or more)\n'
        : `(${(100 * interval.coverage).toFixed(1)}% interval of the median: ` +
          `${interval.low.toFixed(2)}–${interval.high.toFixed(2)}×)\n`),
  );
  const quiet = quietPairRatios(unkeyed, keyed);
  process.stdout.write(
    `pairs whose runs both saw at most ${QUIET_STEAL_PERCENT}% steal: ` +
      (quiet.pairs.length === 0
        ? 'none\n'
        : `${quiet.pairs.length} of ${ratios.length} (pair ${quiet.pairs.join(', ')}); ` +
          `median ${quiet.median.toFixed(2)}×\n`),
  );
  if (keyedHeld.length > 0)
    process.stdout.write(
      `keyed runs held up to ${keyedHeld.join(', ')}/s; median ${medianOf(keyedHeld)}/s ` +
        '(a rate to pace the soak at: one the server sustains)\n',
    );
}

runMain('bench:keyed', main);
