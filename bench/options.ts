/**
 * Command-line options of `npm run bench` (`node dist/bench/run.js`), parsed and
 * checked in one place so the runner only ever sees valid, explicit values.
 */
import { parseArgs } from 'node:util';
import { CUSTOMER_COUNT, SCENARIOS, type Scenario } from './scenarios.js';

export interface BenchOptions {
  /** Seconds of each measured segment (one round of one server). */
  readonly durationSec: number;
  readonly warmupSec: number;
  /**
   * Segments per server per scenario, alternated bare/tally/tally/bare/… (see run.ts `measure`).
   */
  readonly rounds: number;
  /** Each scenario runs at each of these connection counts (unless it pins its own). */
  readonly connectionsList: readonly number[];
  readonly pipelining: number;
  readonly scenarios: readonly Scenario[];
  readonly workers: number | undefined;
  readonly jsonPath: string | undefined;
  /** Markdown file whose generated section is replaced by this run (docs/performance.md). */
  readonly reportPath: string | undefined;
  readonly tiny: boolean;
  readonly full: boolean;
  /**
   * The load generator: wrk (the default: a C program, Debian's `wrk`) or autocannon (in this
   * process; --tiny's).
   */
  readonly driver: 'autocannon' | 'wrk';
}

export const USAGE = `usage: node dist/bench/run.js [options]
  --duration <s>        seconds of each measured segment (default 5; tiny 0.5)
  --warmup <s>          unmeasured seconds per server per scenario first (default 2; tiny 0.3)
  --rounds <n>          measured segments per server per scenario, alternated
                        bare,tally,tally,bare,... (has with has-unlimited:
                        bare,tally,tally-rl-off, then reversed) (default 5; tiny 2)
  --connections <list>  comma-separated connection counts; every scenario runs at each
                        (default 256,50; tiny 4)
  --pipelining <n>      pipelined requests per connection (default 1: uWS closes the
                        connection when a request is pipelined behind a pending async
                        response, which every Tally response is; see run.ts)
  --scenarios <list>    comma-separated, from: ${SCENARIOS.map((s) => s.name).join(', ')}
                        (default: all but the --full-only ones)
  --workers <n>         TALLY_WORKERS for the Tally processes (default: Tally's own)
  --tiny                a few seconds in all, for the test suite (autocannon)
  --full                also run the --full-only scenarios
  --driver <name>       wrk (default; Debian's wrk package: apt-get install wrk; one
                        thread, pipelining 1) or autocannon (default with --tiny)
  --json <path>         also write the results as JSON
  --report <path>       rewrite the generated section of a Markdown file
                        (docs/performance.md) with this run's figures
  --help`;

/** `--name`'s value, `fallback` when absent; throws a usage error unless it is positive. */
export function positiveNumber(
  name: string,
  raw: string | undefined,
  fallback: number,
  integer: boolean,
): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  const valid = Number.isFinite(value) && value > 0 && (!integer || Number.isInteger(value));
  if (!valid)
    throw new Error(
      `--${name} must be a positive ${integer ? 'integer' : 'number'}, got ${JSON.stringify(raw)}`,
    );
  return value;
}

function pickScenarios(raw: string | undefined, full: boolean): Scenario[] {
  if (raw === undefined) return SCENARIOS.filter((s) => full || !s.fullOnly);
  return raw.split(',').map((name) => {
    const scenario = SCENARIOS.find((s) => s.name === name.trim());
    if (scenario === undefined)
      throw new Error(
        `unknown scenario ${JSON.stringify(name)}; ` +
          `known: ${SCENARIOS.map((s) => s.name).join(', ')}`,
      );
    return scenario;
  });
}

/** Parses argv (without node and script). Throws a usage error on anything invalid. */
export function parseOptions(argv: readonly string[]): BenchOptions | 'help' {
  const { values } = parseArgs({
    args: [...argv],
    strict: true,
    options: {
      duration: { type: 'string' },
      warmup: { type: 'string' },
      rounds: { type: 'string' },
      connections: { type: 'string' },
      pipelining: { type: 'string' },
      scenarios: { type: 'string' },
      workers: { type: 'string' },
      json: { type: 'string' },
      report: { type: 'string' },
      driver: { type: 'string' },
      tiny: { type: 'boolean', default: false },
      full: { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) return 'help';
  const tiny = values.tiny;
  const driver = values.driver ?? (tiny ? 'autocannon' : 'wrk');
  if (driver !== 'autocannon' && driver !== 'wrk')
    throw new Error(`--driver must be autocannon or wrk, got ${JSON.stringify(driver)}`);
  const options: BenchOptions = {
    driver,
    durationSec: positiveNumber('duration', values.duration, tiny ? 0.5 : 5, false),
    warmupSec: positiveNumber('warmup', values.warmup, tiny ? 0.3 : 2, false),
    rounds: positiveNumber('rounds', values.rounds, tiny ? 2 : 5, true),
    connectionsList: connectionCounts(values.connections, tiny ? [4] : [256, 50]),
    pipelining: positiveNumber('pipelining', values.pipelining, 1, true),
    scenarios: pickScenarios(values.scenarios, values.full),
    workers:
      values.workers === undefined ? undefined : positiveNumber('workers', values.workers, 1, true),
    jsonPath: values.json,
    reportPath: values.report,
    tiny,
    full: values.full,
  };
  for (const scenario of options.scenarios) {
    for (const connections of scenario.connections === undefined
      ? options.connectionsList
      : [scenario.connections]) {
      const pipelining = scenario.pipelining ?? options.pipelining;
      if (Math.floor(CUSTOMER_COUNT / connections) < pipelining) {
        throw new Error(
          `${scenario.name}: ${connections} connections x pipelining ${pipelining} needs ` +
            `more than ${CUSTOMER_COUNT} customers`,
        );
      }
    }
  }
  return options;
}

function connectionCounts(raw: string | undefined, fallback: readonly number[]): number[] {
  if (raw === undefined) return [...fallback];
  return raw.split(',').map((part) => positiveNumber('connections', part.trim(), 1, true));
}
