/**
 * The `tally` command line: builds the commander program from the command modules and
 * runs it, turning every outcome into one of three exit codes (client.ts, EXIT):
 * 0 ok, 1 the operation failed, 2 the command line was wrong.
 *
 * Each command group lives in `commands/<group>.ts` and exports `register(program)`;
 * adding a group is an import and one entry in COMMAND_GROUPS. Commander reports usage
 * errors (unknown command or option, missing argument, bad choice) by throwing once
 * `exitOverride` is set; they exit 2 with commander's message, and `--help` exits 0.
 *
 * `bin/tally.js` imports this module (compiled to dist/src/cli/main.js) and calls `run`.
 */
import fs from 'node:fs';
import { Command, CommanderError } from 'commander';
import { CliError, EXIT, type ExitCode } from './client.js';
import * as keys from './commands/keys.js';
import * as snapshot from './commands/snapshot.js';
import * as status from './commands/status.js';
import * as sync from './commands/sync.js';

const COMMAND_GROUPS: ReadonlyArray<{ register(program: Command): void }> = [sync, keys, snapshot, status];

/** The whole program, every command registered; parse with `run`. */
export function buildProgram(): Command {
  const program = new Command('tally')
    .description('Operate a Tally billing service: push and pull billing configuration, manage keys, take and restore snapshots, check status.')
    .version(packageVersion(), '-V, --version')
    .exitOverride()
    .showHelpAfterError('(run with --help for usage)')
    .addHelpText(
      'after',
      '\nEnvironment: TALLY_URL (default http://localhost:8787), TALLY_API_KEY; --url and --key override them.\n' +
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
    await buildProgram().parseAsync([...argv]);
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

/** The version in package.json, found upwards from this module (src/cli or dist/src/cli). */
function packageVersion(): string {
  for (let dir = new URL('.', import.meta.url); dir.pathname !== '/'; dir = new URL('..', dir)) {
    try {
      const pkg = JSON.parse(fs.readFileSync(new URL('package.json', dir), 'utf8')) as { name?: unknown; version?: unknown };
      if (pkg.name === 'tally' && typeof pkg.version === 'string') return pkg.version;
    } catch {
      /* no package.json here: look further up */
    }
  }
  return 'unknown';
}
