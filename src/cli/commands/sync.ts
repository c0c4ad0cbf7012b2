/**
 * `tally push <config.json>` and `tally pull [--out file]`: the billing configuration of
 * the environment the server key belongs to (`/v1/sync/push`, `/v1/sync/pull`).
 *
 * Push validates the file locally with the service's own validator first (the same JSON
 * Schema and semantic rules, src/config/validate-config.ts), so a broken file is refused
 * with every violation listed and no request sent. It then shows what would change
 * against the deployed version and asks before pushing, unless `--yes`. Without a
 * terminal to ask on it refuses (exit 2) rather than wait on a pipe that never answers.
 *
 * While it waits on the service it shows what it is doing on stderr, on a terminal only.
 *
 * The service has no compare-and-swap on pushes, so another push between our pull and
 * our push would make the diff stale; push says so when the version it got is not the
 * one after the version it compared against.
 */
import fs from 'node:fs';
import readline from 'node:readline';
import type { Command } from 'commander';
import {
  addRemoteOptions,
  CliError,
  EXIT,
  ServiceError,
  TallyClient,
  withActivity,
  type RemoteOptions,
} from '../client.js';
import { changeCount, diffConfigs, formatDiff } from '../config-diff.js';

interface Pulled {
  readonly config: unknown;
  readonly version: number;
  readonly pushedAt: string;
}

type PushOptions = RemoteOptions & { yes?: boolean; dryRun?: boolean };

interface Pushed {
  readonly version: number;
  readonly pushedAt: string;
}

export function register(program: Command): void {
  addRemoteOptions(
    program
      .command('push')
      .description(
        'validate a billing configuration, show what changes against the deployed one, and push it',
      )
      .argument('<config.json>', 'the billing configuration file')
      .option('-y, --yes', 'push without asking (for CI)')
      .option('--dry-run', 'show what would change and push nothing'),
    'server',
  ).action((file: string, options: PushOptions) => push(file, options));

  addRemoteOptions(
    program
      .command('pull')
      .description('print the deployed billing configuration (exactly as pushed)')
      .option('-o, --out <file>', 'write it to this file instead of stdout'),
    'server',
  ).action((options: RemoteOptions & { out?: string }) => pull(options));
}

async function push(file: string, options: PushOptions): Promise<void> {
  const config = readJsonFile(file);
  // Loaded here, not at start-up: compiling the schema is the slowest part of the CLI's
  // start and only push needs it.
  const { validateBillingConfig } = await import('../../config/validate-config.js');
  const validation = validateBillingConfig(config);
  if (!validation.ok) {
    const count = validation.errors.length;
    const listed = validation.errors.map((error) => `  - ${error}`).join('\n');
    throw new CliError(
      `${file} is not a valid billing configuration (${count} ` +
        `violation${count === 1 ? '' : 's'}); nothing was pushed:\n${listed}`,
    );
  }
  const client = TallyClient.from(options);
  const deployed = await withActivity(
    `reading the deployed configuration from ${client.baseUrl}`,
    () => pullOrNull(client),
  );
  const environment = environmentOfKey(options.key);
  const target =
    `${environment === null ? "the key's environment" : `the ${environment} environment`} ` +
    `at ${client.baseUrl}`;
  console.log(
    deployed === null
      ? `Nothing is deployed to ${target} yet.`
      : `Deployed to ${target}: version ${deployed.version} (pushed ${deployed.pushedAt}).`,
  );

  const diff = diffConfigs(deployed?.config ?? null, config);
  if (deployed !== null && changeCount(diff) === 0) {
    console.log('No changes: the deployed configuration already matches; nothing pushed.');
    return;
  }
  const lines = formatDiff(diff);
  // A first push is a change even when the document is empty: it creates version 1.
  if (lines.length === 0) lines.push('An empty configuration: no entitlements, no products.');
  for (const line of lines) console.log(line);
  if (options.dryRun === true) {
    console.log('Dry run: nothing pushed.');
    return;
  }
  if (options.yes !== true) await confirm(`Push this configuration to ${target}?`);

  const pushed = await withActivity(`pushing ${file}`, () =>
    client.json<Pushed>('POST', '/v1/sync/push', config),
  );
  console.log(`Pushed version ${pushed.version} (${pushed.pushedAt}).`);
  const expected = (deployed?.version ?? 0) + 1;
  if (pushed.version !== expected) {
    console.log(
      `Note: another push landed meanwhile; the diff above was against ` +
        `version ${deployed?.version ?? 'none'}, not version ${pushed.version - 1}.`,
    );
  }
}

async function pull(options: RemoteOptions & { out?: string }): Promise<void> {
  const client = TallyClient.from(options);
  const pulled = await client.json<Pulled>('GET', '/v1/sync/pull');
  const text = `${JSON.stringify(pulled.config, null, 2)}\n`;
  if (options.out === undefined) {
    process.stdout.write(text);
    return;
  }
  try {
    fs.writeFileSync(options.out, text);
  } catch (error) {
    throw new CliError(`cannot write ${options.out}: ${(error as Error).message}`);
  }
  // On stderr, so the file's path is not mistaken for output in scripts that capture stdout.
  console.error(`Wrote version ${pulled.version} (pushed ${pulled.pushedAt}) to ${options.out}.`);
}

/** The deployed configuration, or null when the environment has none yet (404). */
async function pullOrNull(client: TallyClient): Promise<Pulled | null> {
  try {
    return await client.json<Pulled>('GET', '/v1/sync/pull');
  } catch (error) {
    if (error instanceof ServiceError && error.status === 404) return null;
    throw error;
  }
}

function readJsonFile(file: string): unknown {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (error) {
    throw new CliError(
      `cannot read ${file}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`,
    );
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw new CliError(`${file} is not valid JSON: ${(error as Error).message}`);
  }
}

/** `sk_test_…` → test. The server decides; this only labels the prompt. */
function environmentOfKey(key: string | undefined): 'test' | 'live' | null {
  const match = /^[sc]k_(test|live)_/.exec(key ?? '');
  return match === null ? null : (match[1] as 'test' | 'live');
}

/**
 * Asks on the terminal; anything but y/yes cancels (exit 1). Without a terminal on stdin
 * there is nobody to ask: refuse with a usage error instead of blocking on the pipe.
 */
async function confirm(question: string): Promise<void> {
  if (process.stdin.isTTY !== true) {
    throw new CliError(
      'stdin is not a terminal, so there is nobody to confirm the push; pass --yes to ' +
        'push without asking',
      EXIT.usage,
    );
  }
  const rl = readline.createInterface({ input: process.stdin, output: process.stdout });
  const answer = await new Promise<string>((resolve) => {
    rl.once('close', () => resolve('')); // Ctrl-D: no
    rl.question(`${question} [y/N] `, resolve);
  });
  rl.close();
  if (!/^y(es)?$/i.test(answer.trim())) throw new CliError('push cancelled; nothing was pushed');
}
