/**
 * Tally's recovery benchmark (`npm run bench:recovery`): how long a restart takes, and how
 * much memory it needs, with a large data set.
 *
 * For each worker count and scenario it builds a data directory with Tally's own code
 * (bench/recovery-data.ts: the real server writes the control store, the real Shard and
 * ShardStore write customers × 3 meters and the journal of consume events), starts the
 * real server on it (`dist/src/main.js`, as an operator would) and measures wall time
 * from spawn to the first `/healthz` 200 and the process's peak resident set
 * (bench/recovery-start.ts). It then asks the recovered server for a few customers'
 * balances and checks them against what the workload says they must be, so a fast but
 * wrong recovery cannot pass.
 *
 * Scenarios:
 * - `journal`: no snapshot; recovery replays every journaled event (the worst case: a
 *   shard that never snapshotted, e.g. one that crashed before its first snapshot).
 * - `snapshot`: a snapshot of every customer taken as the shard worker takes them, plus
 *   the journal tail after it (`--tail-events`, default 10% of the events): the normal
 *   restart.
 *
 * What it does not measure: a cold disk (the data was just written and sits in the page
 * cache; `--cold` drops this directory's pages first, but a VM host may still cache
 * them), other processes' load, or requests arriving during recovery.
 */
import { availableParallelism, cpus, loadavg, tmpdir } from 'node:os';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { runMain, stopAll, stopOnSignals } from './children.js';
import { buildDataDir, removeDataDir, type BuiltDataDir, type Workload } from './recovery-data.js';
import {
  diskUsageBytes,
  evictPageCache,
  sampleCustomers,
  startAndMeasure,
  stopServer,
  verifyBalances,
  type StartMeasurement,
} from './recovery-start.js';

const MAIN_SCRIPT = join(dirname(fileURLToPath(import.meta.url)), '..', 'src', 'main.js');

export const RECOVERY_SCENARIOS = ['journal', 'snapshot'] as const;
export type RecoveryScenario = (typeof RECOVERY_SCENARIOS)[number];

/**
 * Recovery targets (docs/performance.md): under 10 s to /healthz 200 and under 2 GiB for 1M
 * customers.
 */
const TARGET_HEALTHZ_MS = 10_000;
const TARGET_RSS_BYTES = 2 * 1024 ** 3;

interface RecoveryOptions extends Workload {
  readonly eventsPerRecord: number;
  readonly tailEvents: number;
  readonly scenarios: readonly RecoveryScenario[];
  readonly workers: readonly number[];
  readonly starts: number;
  readonly cold: boolean;
  readonly keep: boolean;
  readonly parentDir: string;
  readonly jsonPath: string | undefined;
}

const USAGE = `usage: node dist/bench/recovery.js [options]
  --customers <n>          customers, each with 3 meters (default 1000000)
  --events <n>             consume events journaled (default 10000000)
  --events-per-record <n>  events per journal record, as group commit makes them (default 128)
  --tail-events <n>        snapshot scenario: events journaled after the snapshot
                           (default 10% of --events)
  --scenarios <list>       journal (no snapshot), snapshot (snapshot + tail); default both
  --workers <list>         TALLY_WORKERS values to build and start with (default 1)
  --starts <n>             starts measured per data dir (default 1)
  --cold                   drop the data dir's page cache before each start
  --keep                   keep the data dirs (their paths are printed)
  --dir <path>             where the data dirs are created (default the OS temp dir)
  --json <file>            also write the results as JSON`;

function positiveInt(
  name: string,
  raw: string | undefined,
  fallback: number,
  allowZero = false,
): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value < (allowZero ? 0 : 1))
    throw new Error(
      `--${name} must be a ${allowZero ? 'non-negative' : 'positive'} integer, ` +
        `got ${JSON.stringify(raw)}`,
    );
  return value;
}

function parseOptions(argv: readonly string[]): RecoveryOptions | 'help' {
  const { values } = parseArgs({
    args: [...argv],
    strict: true,
    options: {
      customers: { type: 'string' },
      events: { type: 'string' },
      'events-per-record': { type: 'string' },
      'tail-events': { type: 'string' },
      scenarios: { type: 'string' },
      workers: { type: 'string' },
      starts: { type: 'string' },
      cold: { type: 'boolean', default: false },
      keep: { type: 'boolean', default: false },
      dir: { type: 'string' },
      json: { type: 'string' },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) return 'help';
  const events = positiveInt('events', values.events, 10_000_000);
  const scenarios = (values.scenarios ?? RECOVERY_SCENARIOS.join(',')).split(',').map((name) => {
    const scenario = RECOVERY_SCENARIOS.find((s) => s === name.trim());
    if (scenario === undefined)
      throw new Error(
        `unknown scenario ${JSON.stringify(name)}; known: ${RECOVERY_SCENARIOS.join(', ')}`,
      );
    return scenario;
  });
  const tailEvents = positiveInt(
    'tail-events',
    values['tail-events'],
    Math.floor(events / 10),
    true,
  );
  if (tailEvents > events) throw new Error('--tail-events cannot exceed --events');
  return {
    customers: positiveInt('customers', values.customers, 1_000_000),
    events,
    eventsPerRecord: positiveInt('events-per-record', values['events-per-record'], 128),
    tailEvents,
    scenarios,
    workers: (values.workers ?? '1').split(',').map((w) => positiveInt('workers', w.trim(), 1)),
    starts: positiveInt('starts', values.starts, 1),
    cold: values.cold,
    keep: values.keep,
    parentDir: values.dir ?? tmpdir(),
    jsonPath: values.json,
  };
}

export interface RecoveryResult {
  readonly workers: number;
  readonly scenario: RecoveryScenario;
  readonly customers: number;
  readonly events: number;
  readonly tailEvents: number | null;
  readonly records: number;
  readonly dataDirBytes: number;
  readonly buildMs: number;
  /** How long taking the snapshot held a shard worker's thread while building (null: none). */
  readonly snapshotBlockedMs: number | null;
  readonly start: number;
  readonly cold: boolean;
  readonly measurement: StartMeasurement;
  /** Sample customers whose balances matched the workload (all of them, or the run fails). */
  readonly verifiedCustomers: number;
}

/** Data dirs not yet removed, so that a signal can remove them too (unless --keep). */
const liveDataDirs = new Set<string>();

async function runOne(
  options: RecoveryOptions,
  workers: number,
  scenario: RecoveryScenario,
  results: RecoveryResult[],
): Promise<void> {
  const dataDir = await mkdtemp(join(options.parentDir, `tally-recovery-${scenario}-w${workers}-`));
  liveDataDirs.add(dataDir);
  const log = (line: string): void =>
    void process.stderr.write(`recovery bench [${scenario}, ${workers} worker(s)]: ${line}\n`);
  try {
    const tailEvents = scenario === 'journal' ? null : options.tailEvents;
    log(`building ${options.customers} customers, ${options.events} events in ${dataDir}`);
    const built: BuiltDataDir = await buildDataDir({
      ...options,
      dataDir,
      workers,
      tailEvents,
      mainScript: MAIN_SCRIPT,
      log,
    });
    const dataDirBytes = await diskUsageBytes(dataDir);
    log(
      `built in ${(built.buildMs / 1000).toFixed(1)} s: ${built.records} ` +
        `records, ${(dataDirBytes / 2 ** 20).toFixed(0)} MiB on disk`,
    );
    for (let start = 1; start <= options.starts; start++) {
      if (options.cold && !(await evictPageCache(dataDir)))
        throw new Error('could not drop the page cache (dd iflag=nocache)');
      const server = await startAndMeasure(MAIN_SCRIPT, dataDir, {
        TALLY_WORKERS: String(workers),
      });
      try {
        const verifiedCustomers = await verifyBalances(
          server,
          built.serverKey,
          options,
          sampleCustomers(options.customers),
        );
        const { measurement } = server;
        results.push({
          workers,
          scenario,
          customers: options.customers,
          events: options.events,
          tailEvents,
          records: built.records,
          dataDirBytes,
          buildMs: built.buildMs,
          snapshotBlockedMs: built.snapshotBlockedMs,
          start,
          cold: options.cold,
          measurement,
          verifiedCustomers,
        });
        log(
          `start ${start}: healthz after ${measurement.msToHealthz.toFixed(0)} ms, peak ` +
            `RSS ${(measurement.peakRssBytes / 2 ** 20).toFixed(0)} MiB`,
        );
      } finally {
        await stopServer(server);
      }
    }
  } finally {
    liveDataDirs.delete(dataDir);
    if (options.keep) log(`kept ${dataDir}`);
    else await removeDataDir(dataDir);
  }
}

const mib = (bytes: number): string => (bytes / 2 ** 20).toFixed(0);

function formatTable(results: readonly RecoveryResult[]): string {
  const header = [
    'workers',
    'scenario',
    'customers',
    'events',
    'tail events',
    'records',
    'data dir MiB',
    'listening ms',
    'healthz ms',
    'recovery ms',
    'peak RSS MiB',
    'peak anon MiB',
    'RSS MiB',
    'file MiB',
    'verified',
    'snapshot stall ms',
  ];
  const rows = results.map((r) => [
    String(r.workers),
    r.scenario + (r.cold ? ' (cold)' : ''),
    r.customers.toLocaleString('en-US'),
    r.events.toLocaleString('en-US'),
    r.tailEvents === null ? 'all' : r.tailEvents.toLocaleString('en-US'),
    r.records.toLocaleString('en-US'),
    mib(r.dataDirBytes),
    r.measurement.msToListening.toFixed(0),
    r.measurement.msToHealthz.toFixed(0),
    String(r.measurement.recoveryMs ?? '-'),
    mib(r.measurement.peakRssBytes),
    mib(r.measurement.peakRssAnonBytes),
    mib(r.measurement.rssBytes),
    mib(r.measurement.rssFileBytes),
    `${r.verifiedCustomers} customers`,
    r.snapshotBlockedMs === null ? '-' : r.snapshotBlockedMs.toFixed(0),
  ]);
  const widths = header.map((h, i) =>
    Math.max(h.length, ...rows.map((cells) => (cells[i] ?? '').length)),
  );
  const line = (cells: readonly string[]): string =>
    cells.map((c, i) => (i < 2 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0))).join('  ');
  const checks = results.map((r) => {
    const time = r.measurement.msToHealthz < TARGET_HEALTHZ_MS ? 'PASS' : 'FAIL';
    const peak = r.measurement.peakRssBytes < TARGET_RSS_BYTES ? 'PASS' : 'FAIL';
    const anon = r.measurement.peakRssAnonBytes < TARGET_RSS_BYTES ? 'PASS' : 'FAIL';
    return (
      `  ${r.scenario}, ${r.workers} worker(s), start ${r.start}: [${time}] healthz ` +
      `< ${TARGET_HEALTHZ_MS / 1000} s  [${peak}] peak RSS < 2 GiB  [${anon}] peak ` +
      `anonymous RSS < 2 GiB`
    );
  });
  return [
    `node ${process.version}, ` +
      `availableParallelism ${availableParallelism()}, ${cpus()[0]?.model ?? 'unknown cpu'}, ` +
      `load average (1 min) ${(loadavg()[0] ?? NaN).toFixed(2)}`,
    '',
    line(header),
    ...rows.map(line),
    'snapshot stall: how long taking that snapshot (while building) held a shard worker, ' +
      'answering nothing',
    '',
    'targets (for 1M customers / 10M events; informational, the exit code ignores them):',
    ...checks,
  ].join('\n');
}

async function main(): Promise<void> {
  let parsed: RecoveryOptions | 'help';
  try {
    parsed = parseOptions(process.argv.slice(2));
  } catch (error) {
    throw new Error(`${error instanceof Error ? error.message : String(error)}\n${USAGE}`);
  }
  if (parsed === 'help') {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  const options = parsed;
  stopOnSignals('recovery bench', async () => {
    if (!options.keep) await Promise.all([...liveDataDirs].map(removeDataDir));
  });
  const results: RecoveryResult[] = [];
  try {
    for (const workers of options.workers) {
      for (const scenario of options.scenarios) await runOne(options, workers, scenario, results);
    }
  } finally {
    await stopAll();
  }
  process.stdout.write(`${formatTable(results)}\n`);
  if (options.jsonPath !== undefined) {
    const report = {
      startedAt: new Date().toISOString(),
      node: process.version,
      availableParallelism: availableParallelism(),
      cpuModel: cpus()[0]?.model,
      results,
    };
    await writeFile(options.jsonPath, `${JSON.stringify(report, null, 2)}\n`);
  }
}

runMain('recovery bench', main);
