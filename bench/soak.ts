/**
 * The soak benchmark (`npm run bench:soak -- --minutes N [--rate R]`): sustained durable
 * consumes, each with a unique idempotency key (as AI and API products send a request id
 * with every call), against one Tally for N minutes, while a probe sends one `has` every
 * 20 ms and measures its latency (probe.ts: a lean kept-alive client in a thread of its
 * own, which probes an idle bare uWebSockets.js server the same way, 10 ms apart, as the
 * machine's share of the tail).
 *
 * It answers what a 5-second bench cannot: does memory stay flat as keys accumulate, do
 * snapshots or garbage collection stall reads, does the error count stay at zero. Every
 * 15 s it records RSS (the process's own memory read every second: the window's median and
 * highest reading), the V8 heaps of every thread, idempotency keys in memory and on
 * disk, the snapshots stored and how long they took and held a shard's thread, the
 * probe's p99/p999/max, the host's share of the machine's CPU (steal), the consumes'
 * server-side p99 and non-2xx answers, and the longest GC pause of the threads answering
 * requests (each thread's `perf_hooks` GC observer, read from the metrics); at the end
 * wrk's own latency and socket errors, and whether the targets held (the load's p99
 * against the same load's in a 5-second run before the soak starts). Before the soak, a
 * 5-second wrk run against the bare server says how fast the machine runs that day.
 * With `--report docs/performance.md` the table and an SVG plot of memory and probe latency
 * over time (soak-plot.ts) go into the document's soak section (between its `soak:`
 * markers).
 *
 * Load: wrk (one thread, `--connections`, default 128) with a Lua script that cycles over
 * 10,000 customers and numbers its keys (`--keys none` sends none, to compare keyed with
 * unkeyed throughput); `--rate R` paces the requests of all connections at R per second
 * (one schedule; soak-load.ts), otherwise it runs flat out, at a lower priority than the
 * server (`--load-nice`, default 10; soak-load.ts says why).
 *
 * What it does not measure: the client side of the load beyond wrk's summary, or a disk
 * other than the one the data dir is on; numbers from a shared machine are noise.
 */
import { readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { runMain, startChild, stopAll, stopOnSignals } from './children.js';
import {
  buckets,
  gaugeMax,
  gaugeSum,
  maxBound,
  quantileBound,
  samples,
  since,
  total,
  type Buckets,
} from './metrics-text.js';
import { positiveNumber } from './options.js';
import { PROBE_INTERVAL_MS, quantileOf, startProbes, type ProbeWindow } from './probe.js';
import {
  adminKeyOf,
  keysOption,
  LOAD_TALLY_ENV,
  niceOption,
  runLoad,
  scrape,
  type LoadOptions,
  type LoadSummary,
} from './soak-load.js';
import { plotSoak, type SoakWindow } from './soak-plot.js';
import { verdicts } from './soak-verdicts.js';
import {
  cpuSecondsBetween,
  cpuUsPerRequest,
  sampleMachine,
  sampleThreads,
  stealPercent,
  type MachineTicks,
} from './thread-cpu.js';
import { makeDataDir, removeDataDir, startTally } from './tally-server.js';
import { machineCheck, machineCheckText, wrkAvailable } from './wrk.js';

const BENCH_DIR = dirname(fileURLToPath(import.meta.url));
const MAIN_SCRIPT = join(BENCH_DIR, '..', 'src', 'main.js');
const BARE_SCRIPT = join(BENCH_DIR, 'bare-server.js');
const WINDOW_MS = 15_000;
/** How often the process's own memory is read within a window. */
const MEMORY_SAMPLE_MS = 1_000;
/**
 * Before the soak, the same load runs as the 5-second bench runs it (`npm run bench`: an
 * unmeasured warm-up, then five measured seconds): its p99 is what the soak's is judged by.
 */
const BASELINE_WARMUP_SEC = 2;
const BASELINE_SEC = 5;

interface SoakOptions extends LoadOptions {
  readonly minutes: number;
  readonly workers: number | undefined;
  readonly reportPath: string | undefined;
}

export interface SoakResult {
  readonly startedAt: string;
  readonly node: string;
  readonly options: SoakOptions;
  readonly windows: readonly SoakWindow[];
  /** CPU µs per consume answered, by thread group (thread-cpu.ts), over the whole load. */
  readonly cpuUsPerRequest: Readonly<Record<string, number>>;
  /** The same load for BASELINE_SEC seconds before the soak, as the 5-second bench runs. */
  readonly baseline: LoadSummary;
  readonly load: LoadSummary;
  /**
   * Requests a second the bare server answered in the machine check before the soak: how
   * fast the machine ran that day, which the probe's tail and the CPU per consume follow.
   */
  readonly bareReqPerSec: number;
}

const USAGE = `usage: npm run bench:soak -- [options]
  --minutes <n>         how long the load runs (default 30)
  --rate <r>            consumes per second to aim at (default: as fast as the machine goes)
  --connections <n>     wrk connections (default 128)
  --workers <n>         TALLY_WORKERS for the Tally process (default: Tally's own)
  --keys unique|none    a new idempotency key on every consume (default), or none
  --load-nice <n>       run wrk at this niceness, 0-19 (default 10; 0: as the soak runs)
  --report <path>       write the table and the plot into that Markdown file's soak section
  --help
`;

/** The options, or null when the usage was asked for (printed). */
function parse(argv: readonly string[]): SoakOptions | null {
  const { values } = parseArgs({
    args: [...argv],
    strict: true,
    options: {
      help: { type: 'boolean' },
      minutes: { type: 'string' },
      rate: { type: 'string' },
      connections: { type: 'string' },
      workers: { type: 'string' },
      keys: { type: 'string' },
      'load-nice': { type: 'string' },
      report: { type: 'string' },
    },
  });
  if (values.help === true) {
    process.stdout.write(USAGE);
    return null;
  }
  return {
    minutes: positiveNumber('minutes', values.minutes, 30, false),
    rate: values.rate === undefined ? null : positiveNumber('rate', values.rate, 1, false),
    connections: Math.round(positiveNumber('connections', values.connections, 128, false)),
    workers:
      values.workers === undefined
        ? undefined
        : Math.round(positiveNumber('workers', values.workers, 1, false)),
    keys: keysOption(values.keys),
    loadNice: niceOption(values['load-nice']),
    reportPath: values.report,
  };
}

/**
 * The server's resident memory (MiB): all of it, and the part backed by files. LMDB maps
 * its data file, so pages of the key table a lookup touched count as resident too; the
 * kernel can drop those under pressure, unlike the anonymous rest (heaps, buffers).
 */
async function rssMiB(pid: number): Promise<{ readonly rss: number; readonly file: number }> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  const kb = (field: string): number =>
    Number(new RegExp(`^${field}:\\s+(\\d+) kB$`, 'm').exec(status)?.[1] ?? 0);
  return { rss: kb('VmRSS') / 1024, file: kb('RssFile') / 1024 };
}

/** What one scrape of the metrics says, for the difference to the next one. */
interface Scrape {
  readonly load: Buckets;
  readonly non2xx: number;
  readonly gc: Buckets;
  readonly snapshots: number;
}

const isConsume = (labels: Readonly<Record<string, string>>): boolean =>
  labels['route'] === '/v1/usage/:key/consume';

/**
 * GC pauses judged are those of the threads answering requests (front ends, shards).
 * The webhook delivery thread runs at a lower priority and answers none: its pauses, wall
 * time, wait for a core while the others are busy; the progress line shows its longest.
 */
const answersRequests = (labels: Readonly<Record<string, string>>): boolean =>
  labels['thread'] !== 'webhooks';

function readScrape(all: ReturnType<typeof samples>): Scrape {
  return {
    load: buckets(all, 'tally_http_request_duration_seconds', isConsume),
    non2xx: all
      .filter(
        (s) =>
          s.name === 'tally_http_requests_total' &&
          isConsume(s.labels) &&
          !(s.labels['status'] ?? '').startsWith('2'),
      )
      .reduce((sum, s) => sum + s.value, 0),
    gc: buckets(all, 'tally_gc_pause_seconds', answersRequests),
    snapshots: gaugeSum(all, 'tally_shard_snapshots_taken'),
  };
}

/**
 * One window's figures from the scrape at its end, the one before, the probe, and the
 * process's own memory read every second of the window (`ownSecondsMiB`).
 */
async function windowOf(
  atSec: number,
  pid: number,
  all: ReturnType<typeof samples>,
  now: Scrape,
  before: Scrape,
  gcAtStart: ReadonlyMap<string, number>,
  [probe, bare]: readonly ProbeWindow[],
  steal: number,
  ownSecondsMiB: readonly number[],
): Promise<SoakWindow> {
  const load = since(now.load, before.load);
  const gcByThread = gcLongestByThread(all);
  const snapshots = now.snapshots - before.snapshots;
  const ms = (seconds: number | null): number | null => (seconds === null ? null : seconds * 1000);
  const memory = await rssMiB(pid);
  const own = [...ownSecondsMiB, memory.rss - memory.file];
  return {
    atSec,
    rssMiB: memory.rss,
    rssFileMiB: memory.file,
    ownMiBMedian: quantileOf(own, 0.5),
    ownMiBMax: Math.max(...own),
    heapMiB:
      (gaugeSum(all, 'tally_process_heap_used_bytes') +
        gaugeSum(all, 'tally_shard_heap_used_bytes')) /
      (1024 * 1024),
    memoryKeys: gaugeSum(all, 'tally_shard_idempotency_keys_in_memory'),
    keptKeys: gaugeSum(all, 'tally_shard_idempotency_entries'),
    runs: gaugeSum(all, 'tally_shard_idempotency_runs'),
    filterMiB: gaugeSum(all, 'tally_shard_idempotency_filter_bytes') / 2 ** 20,
    snapshots,
    snapshotMsMax:
      snapshots > 0 ? ms(gaugeMax(all, 'tally_shard_snapshot_duration_seconds')) : null,
    snapshotPauseMsMax:
      snapshots > 0 ? ms(gaugeMax(all, 'tally_shard_snapshot_pause_max_seconds')) : null,
    snapshotWorkMsMax:
      snapshots > 0 ? ms(gaugeMax(all, 'tally_shard_snapshot_work_max_seconds')) : null,
    snapshotStoreMs: snapshots > 0 ? ms(gaugeMax(all, 'tally_shard_snapshot_store_seconds')) : null,
    snapshotStoreWorkMs:
      snapshots > 0 ? ms(gaugeMax(all, 'tally_shard_snapshot_store_work_seconds')) : null,
    probeMsP99: probe?.msP99 ?? Number.NaN,
    probeMsP999: probe?.msP999 ?? Number.NaN,
    probeMsMax: probe?.msMax ?? Number.NaN,
    probeLatenciesMs: probe?.latenciesMs ?? [],
    probeFailures: probe?.failures ?? 0,
    bareProbeMsP99: bare?.msP99 ?? Number.NaN,
    bareProbeMsMax: bare?.msMax ?? Number.NaN,
    bareProbeLatenciesMs: bare?.latenciesMs ?? [],
    stealPercent: steal,
    loadRequests: total(load),
    loadMsP99: quantileBound(load, 0.99) * 1000,
    loadNon2xx: now.non2xx - before.non2xx,
    gcPauseMsMax: maxBound(since(now.gc, before.gc)) * 1000,
    gcLongestMs: ms(gcByThread.size === 0 ? null : Math.max(...gcByThread.values())),
    gcLongestInSoakMs: ms(longestSince(gcByThread, gcAtStart)),
  };
}

/** Each thread's longest GC pause since start (s), of the threads answering requests. */
function gcLongestByThread(all: ReturnType<typeof samples>): Map<string, number> {
  return new Map(
    all
      .filter((s) => s.name === 'tally_gc_pause_max_seconds' && answersRequests(s.labels))
      .map((s) => [s.labels['thread'] ?? '', s.value]),
  );
}

/**
 * The longest of the pauses that became a thread's longest after `atStart` was read: each
 * is a pause of the soak itself, known exactly. Null when no thread's longest changed.
 */
function longestSince(
  now: ReadonlyMap<string, number>,
  atStart: ReadonlyMap<string, number>,
): number | null {
  let longest: number | null = null;
  for (const [thread, seconds] of now)
    if (seconds > (atStart.get(thread) ?? 0)) longest = Math.max(longest ?? 0, seconds);
  return longest;
}

async function soak(options: SoakOptions, dataDir: string): Promise<SoakResult> {
  const server = await startTally(MAIN_SCRIPT, 'tally', dataDir, {
    ...LOAD_TALLY_ENV,
    ...(options.workers === undefined ? {} : { TALLY_WORKERS: String(options.workers) }),
  });
  const adminKey = await adminKeyOf(server);
  const pid = server.child.process.pid ?? 0;
  await runLoad(server, options, BASELINE_WARMUP_SEC);
  const baseline = await runLoad(server, options, BASELINE_SEC);
  const bare = await startChild('bare', BARE_SCRIPT, { PORT: '0' });
  // Before the first scrape: the soak's first window counts nothing of these 5 seconds.
  const bareReqPerSec = await machineCheck(bare.port);
  process.stderr.write(`machine check: ${machineCheckText(bareReqPerSec)}\n`);
  const atStart = samples(await scrape(server, adminKey));
  let before = readScrape(atStart);
  const gcAtStart = gcLongestByThread(atStart);
  const probe = startProbes([
    {
      port: server.child.port,
      path: '/v1/entitlements/sso/has?customerId=probe-{n}',
      headers: { 'x-tally-key': server.keys.client },
    },
    { port: bare.port, path: '/has?customerId=probe-{n}', headers: {} },
  ]);
  const started = Date.now();
  const windows: SoakWindow[] = [];
  // The process's own memory every second: a window's level is the median of its readings,
  // so that a moment's peak (half a second as an era's image is written, a heap just before
  // its collection) is its peak, not the window's level; the verdict prints both.
  let ownSeconds: number[] = [];
  const memoryTimer = setInterval(() => {
    rssMiB(pid).then(
      (m) => ownSeconds.push(m.rss - m.file),
      () => undefined,
    );
  }, MEMORY_SAMPLE_MS);
  let machineBefore: MachineTicks | null = sampleMachine();
  const timer = setInterval(() => {
    void (async () => {
      const all = samples(await scrape(server, adminKey));
      const now = readScrape(all);
      const machine = sampleMachine();
      const steal =
        machine === null || machineBefore === null
          ? Number.NaN
          : stealPercent(machineBefore, machine);
      machineBefore = machine;
      const atSec = Math.round((Date.now() - started) / 1000);
      const probes = await probe.window();
      const seconds = ownSeconds;
      ownSeconds = [];
      const w = await windowOf(atSec, pid, all, now, before, gcAtStart, probes, steal, seconds);
      before = now;
      const longest = all
        .filter((x) => x.name === 'tally_gc_pause_max_seconds')
        .map((x) => `${x.labels['thread']} ${(x.value * 1000).toFixed(1)}`)
        .join(', ');
      windows.push(w);
      const working =
        w.snapshotWorkMsMax === null
          ? ''
          : `, ${w.snapshotWorkMsMax.toFixed(1)} less waits for a core`;
      const storing =
        w.snapshotStoreMs === null
          ? ''
          : `; storing ${w.snapshotStoreMs.toFixed(1)}` +
            (w.snapshotStoreWorkMs === null ? '' : `, ${w.snapshotStoreWorkMs.toFixed(1)}`);
      const held =
        w.snapshotPauseMsMax === null
          ? ''
          : ` (held ${w.snapshotPauseMsMax.toFixed(1)} ms${working}${storing})`;
      const frontMiB = gaugeSum(all, 'tally_process_heap_used_bytes') / 2 ** 20;
      process.stderr.write(
        `soak ${w.atSec}s: RSS ${w.rssMiB.toFixed(0)} MiB ` +
          `(files ${w.rssFileMiB.toFixed(0)}; own ${w.ownMiBMedian.toFixed(0)} median, ` +
          `${w.ownMiBMax.toFixed(0)} max), heap ${w.heapMiB.toFixed(0)} MiB ` +
          `(front end ${frontMiB.toFixed(0)}), ` +
          `keys ${w.memoryKeys} in memory / ${w.keptKeys} kept, ${w.runs} runs ` +
          `(filters ${w.filterMiB.toFixed(1)} MiB), ` +
          `probe p99 ${w.probeMsP99.toFixed(2)} ms max ${w.probeMsMax.toFixed(1)} ms ` +
          `(bare ${w.bareProbeMsP99.toFixed(2)} / ${w.bareProbeMsMax.toFixed(1)}), ` +
          `load ${(w.loadRequests / (WINDOW_MS / 1000)).toFixed(0)}/s p99 ≤${w.loadMsP99} ms, ` +
          `GC max ≤${w.gcPauseMsMax} ms (longest since start: ${longest} ms), ` +
          `snapshots ${w.snapshots}${held}, steal ${w.stealPercent.toFixed(0)}%\n`,
      );
    })();
  }, WINDOW_MS);
  try {
    const cpuBefore = sampleThreads(pid);
    const load = await runLoad(server, options, options.minutes * 60);
    const cpu = cpuSecondsBetween(cpuBefore, sampleThreads(pid));

    return {
      startedAt: new Date(started).toISOString(),
      node: process.version,
      options,
      windows,
      cpuUsPerRequest: cpuUsPerRequest(cpu, load.requests),
      baseline,
      load,
      bareReqPerSec,
    };
  } finally {
    clearInterval(timer);
    clearInterval(memoryTimer);
    await probe.stop();
  }
}

/** CPU µs per consume by thread group, e.g. `main 20.1 µs, tally-shard-0 14.2 µs, …`. */
function cpuLine(result: SoakResult): string {
  return Object.entries(result.cpuUsPerRequest)
    .map(([group, us]) => `${group} ${us.toFixed(1)} µs`)
    .join(', ');
}

/** The soak table and plot, between the document's soak markers (added at its end when missing). */
async function writeReport(path: string, result: SoakResult, svgPath: string): Promise<void> {
  const begin =
    '<!-- soak:begin: written by `npm run bench:soak -- --report docs/performance.md`; ' +
    'edit outside the markers -->';
  const end = '<!-- soak:end -->';
  const o = result.options;
  const last = result.windows.at(-1);
  const fixed = (value: number | null, digits: number): string =>
    value === null ? '–' : value.toFixed(digits);
  const block = [
    begin,
    '## Soak',
    '',
    `${result.startedAt.slice(0, 10)}, Node ${result.node}: ${o.minutes} min of durable ` +
      `consumes${o.keys === 'unique' ? ' with a unique idempotency key each' : ' without keys'}, ` +
      `wrk ${o.connections} ` +
      `connections${o.rate === null ? ' flat out' : ` paced at ${o.rate}/s`}` +
      `${o.loadNice === 0 ? '' : ` at nice ${o.loadNice}`}, a \`has\` ` +
      `probe every ${PROBE_INTERVAL_MS} ms. ` +
      `Load: ${result.load.perSec.toFixed(0)} consumes/s, ` +
      `p99 ${result.load.msP99.toFixed(1)} ms, ${result.load.errors} socket ` +
      `errors, ${result.load.non2xx} non-2xx. CPU per consume: ${cpuLine(result)}. ` +
      `The machine: before the soak ${machineCheckText(result.bareReqPerSec)}.`,
    '',
    ...verdicts(result.windows, result.load, result.baseline).map((line) => `- ${line}`),
    '',
    `![Memory and probe latency over the soak](${svgPath.split('/').pop() ?? svgPath})`,
    '',
    "Load p99 and GC pauses are bucket bounds from the server's histograms; snapshot " +
      'figures are the longest of the window (cut to stored; the longest hold of the ' +
      "thread by the clock / less the thread's waits for a core; the transaction that " +
      'stored the latest snapshot, the same two ways: a longer hold was a slice of the ' +
      "copy); steal is the share of the machine's CPU time the host took in the window.",
    '',
    '| at | RSS MiB | of it files MiB | own MiB (median / max) | heap MiB | keys in memory | ' +
      'keys kept | runs | ' +
      'filters MiB | snapshots | snapshot ms | held / less waits ms | of it storing ms | ' +
      'probe p99 ms | p999 ms | max ms | bare p99 / max ms | steal % | load/s | ' +
      'load p99 ms | non-2xx | GC max ms |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|',
    ...result.windows.map(
      (w) =>
        `| ${w.atSec} s | ${w.rssMiB.toFixed(0)} | ${w.rssFileMiB.toFixed(0)} ` +
        `| ${w.ownMiBMedian.toFixed(0)} / ${w.ownMiBMax.toFixed(0)} ` +
        `| ${w.heapMiB.toFixed(0)} | ${w.memoryKeys} ` +
        `| ${w.keptKeys} | ${w.runs} | ${w.filterMiB.toFixed(1)} ` +
        `| ${w.snapshots} | ${fixed(w.snapshotMsMax, 0)} ` +
        `| ${fixed(w.snapshotPauseMsMax, 1)} / ${fixed(w.snapshotWorkMsMax, 1)} ` +
        `| ${fixed(w.snapshotStoreMs, 1)} / ${fixed(w.snapshotStoreWorkMs, 1)} ` +
        `| ${w.probeMsP99.toFixed(2)} ` +
        `| ${w.probeMsP999.toFixed(2)} | ${w.probeMsMax.toFixed(1)} ` +
        `| ${w.bareProbeMsP99.toFixed(2)} / ${w.bareProbeMsMax.toFixed(1)} ` +
        `| ${Number.isNaN(w.stealPercent) ? '–' : w.stealPercent.toFixed(0)} ` +
        `| ${(w.loadRequests / (WINDOW_MS / 1000)).toFixed(0)} | ${w.loadMsP99} ` +
        `| ${w.loadNon2xx} | ${w.gcPauseMsMax} |`,
    ),
    '',
    last === undefined
      ? ''
      : `At the end: RSS ${last.rssMiB.toFixed(0)} MiB, ${last.keptKeys} keys kept, ` +
        `${last.memoryKeys} of them in memory, the rest in ${last.runs} runs on disk.`,
    end,
  ].join('\n');
  const existing = await readFile(path, 'utf8').catch(() => '# Performance\n');
  const from = existing.indexOf('<!-- soak:begin');
  const to = existing.indexOf(end);
  const next =
    from !== -1 && to > from
      ? existing.slice(0, from) + block + existing.slice(to + end.length)
      : `${existing.trimEnd()}\n\n${block}\n`;
  await writeFile(path, next);
  await writeFile(svgPath, plotSoak(result.windows));
}

async function main(): Promise<void> {
  const options = parse(process.argv.slice(2));
  if (options === null) return;
  if (!(await wrkAvailable()))
    throw new Error('wrk is not installed: `apt-get install wrk` (Debian, Ubuntu)');
  const dataDir = await makeDataDir();
  stopOnSignals('soak', () => removeDataDir(dataDir));
  try {
    const result = await soak(options, dataDir);
    process.stdout.write(
      `${JSON.stringify(result.load)}\nCPU per consume: ${cpuLine(result)}\n` +
        `${verdicts(result.windows, result.load, result.baseline).join('\n')}\n`,
    );
    if (options.reportPath !== undefined)
      await writeReport(options.reportPath, result, join(dirname(options.reportPath), 'soak.svg'));
  } finally {
    await stopAll();
    await removeDataDir(dataDir);
  }
}

runMain('soak', main);
