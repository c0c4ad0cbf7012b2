/**
 * The `tally` command line: builds the commander program from the command modules and
 * runs it, turning every outcome into one of three exit codes (client.ts, EXIT):
 * 0 ok, 1 the operation failed, 2 the command line was wrong.
 *
 * Each command group lives in `commands/<group>.ts` and exports `register(program)`;
 * adding a group is an import and one entry in COMMAND_GROUPS. Commander reports usage
 * errors (unknown command or option, missing argument, bad choice) by throwing once
 * `exitOverride` is set; they exit 2 with commander's message (and a "did you mean" when
 * a command name is close), and `--help` exits 0. Commander would answer
 * `tally <unknown> --help` with the parent's help and exit 0, hiding the typo: that is
 * refused here as an unknown command too.
 *
 * `bin/tally.js` imports this module (compiled to dist/src/cli/main.js) and calls `run`.
 */
import fs from 'node:fs';
import { Command, CommanderError } from 'commander';
import { CliError, EXIT, type ExitCode } from './client.js';
import * as keys from './commands/keys.js';
import * as listen from './commands/listen.js';
import * as snapshot from './commands/snapshot.js';
import * as status from './commands/status.js';
import * as sync from './commands/sync.js';
import * as webhooks from './commands/webhooks.js';

const COMMAND_GROUPS: ReadonlyArray<{ register(program: Command): void }> = [
  sync,
  keys,
  snapshot,
  status,
  webhooks,
  listen,
];

/** The whole program, every command registered; parse with `run`. */
export function buildProgram(): Command {
  const program = new Command('tally')
    .description(
      'Operate a Tally billing service: push and pull billing configuration, manage keys, ' +
        'take and restore snapshots, check status.',
    )
    .version(packageVersion(), '-V, --version')
    .exitOverride()
    .showSuggestionAfterError(true)
    .showHelpAfterError('(run with --help for usage)')
    .addHelpText(
      'after',
      '\nEnvironment: TALLY_URL (default http://localhost:8787), TALLY_API_KEY; --url and ' +
        '--key override them.\n' +
        'Exit codes: 0 ok, 1 failed (the service refused or could not be reached), 2 usage error.',
    );
  for (const group of COMMAND_GROUPS) group.register(program);
  return program;
}

/** Parses `argv` (process.argv shape) and runs the command; answers the exit code. Never throws. */
export async function run(argv: readonly string[]): Promise<ExitCode> {
  // Whatever the CLI creates (snapshot files, a restored data dir) is the owner's alone.
  process.umask(0o077);
  try {
    const program = buildProgram();
    refuseUnknownCommandBeforeHelp(program, argv.slice(2));
    await program.parseAsync([...argv]);
    return EXIT.ok;
  } catch (error) {
    // Commander has already printed its message (or the help) itself.
    if (error instanceof CommanderError) return error.exitCode === 0 ? EXIT.ok : EXIT.usage;
    if (error instanceof CliError) {
      console.error(`error: ${error.message}`);
      return error.exitCode;
    }
    // Not a foreseen failure: show where it came from, it is a bug to report.
    console.error('error: unexpected failure (a bug in the tally CLI):');
    console.error(error);
    return EXIT.failed;
  }
}

/**
 * With `--help` / `-h` on the line, follows the command words from the program down; a
 * word that names no subcommand of a command that only groups others (`tally snapshto
 * --help`, `tally keys revok --help`) is an unknown command: exit 2, with a suggestion.
 */
function refuseUnknownCommandBeforeHelp(program: Command, args: readonly string[]): void {
  if (!args.some((arg) => arg === '--help' || arg === '-h')) return;
  let command = program;
  for (const arg of args) {
    // A command that groups others takes only flags (--help), never an option with a value.
    if (arg.startsWith('-')) continue;
    if (command.commands.length === 0 || arg === 'help') return;
    const sub = command.commands.find(
      (candidate) => candidate.name() === arg || candidate.aliases().includes(arg),
    );
    if (sub === undefined) {
      const names = command.commands.map((candidate) => candidate.name());
      return command.error(`error: unknown command '${arg}'${suggestion(arg, names)}`, {
        code: 'commander.unknownCommand',
        exitCode: EXIT.usage,
      });
    }
    command = sub;
  }
}

/**
 * `\n(Did you mean x?)` for the closest name within two edits, as commander words it; '' when none
 * is close.
 */
export function suggestion(word: string, names: readonly string[]): string {
  let best: string | null = null;
  let bestDistance = 3;
  for (const name of names) {
    const distance = editDistance(word, name);
    if (distance < bestDistance && distance < Math.max(word.length, name.length) * 0.6) {
      best = name;
      bestDistance = distance;
    }
  }
  return best === null ? '' : `\n(Did you mean ${best}?)`;
}

/** Levenshtein distance, counting a swap of two neighbours as one edit. */
function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) =>
    Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)),
  );
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      const row = d[i] as number[];
      const above = d[i - 1] as number[];
      row[j] = Math.min(
        (above[j] as number) + 1,
        (row[j - 1] as number) + 1,
        (above[j - 1] as number) + cost,
      );
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1])
        row[j] = Math.min(row[j] as number, ((d[i - 2] as number[])[j - 2] as number) + 1);
    }
  }
  return (d[a.length] as number[])[b.length] as number;
}

/** The version in package.json, found upwards from this module (src/cli or dist/src/cli). */
function packageVersion(): string {
  for (let dir = new URL('.', import.meta.url); dir.pathname !== '/'; dir = new URL('..', dir)) {
    try {
      const pkg = JSON.parse(fs.readFileSync(new URL('package.json', dir), 'utf8')) as {
        name?: unknown;
        version?: unknown;
      };
      if (pkg.name === 'tally' && typeof pkg.version === 'string') return pkg.version;
    } catch {
      /* no package.json here: look further up */
    }
  }
  return 'unknown';
}
