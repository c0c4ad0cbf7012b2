/**
 * `tally keys …`: API key management with the operator key (`/v1/admin/keys`).
 *
 * Secrets are shown exactly once, when the service issues them (create, rotate-admin);
 * the service stores only their SHA-256, so a lost secret cannot be shown again — revoke
 * it and create another. An environment key is refused by the service (403) and the CLI
 * prints that answer: the CLI itself decides nothing about who may manage keys.
 */
import { type Command, Option } from 'commander';
import { addRemoteOptions, TallyClient, type RemoteOptions } from '../client.js';
import { formatTable } from '../format.js';

/** A key as `/v1/admin/keys` shows it: never the secret. */
interface KeyView {
  readonly id: string;
  readonly prefix: string;
  readonly environment: 'test' | 'live' | null;
  readonly class: 'server' | 'client' | 'operator';
  readonly createdAt: string;
  readonly revokedAt: string | null;
}

type JsonOption = { json?: boolean };

export function register(program: Command): void {
  const keys = program
    .command('keys')
    .description('create, list and revoke API keys (operator key)');

  addRemoteOptions(
    keys
      .command('create')
      .description('create an environment key and print its secret (shown once)')
      .addOption(
        new Option('--env <environment>', 'environment of the key')
          .choices(['test', 'live'])
          .makeOptionMandatory(),
      )
      .addOption(
        new Option('--class <class>', 'server (full access) or client (browser-safe reads)')
          .choices(['server', 'client'])
          .makeOptionMandatory(),
      )
      .option('--json', "print the service's answer (including the secret) as JSON"),
    'operator',
  ).action(async (options: RemoteOptions & JsonOption & { env: string; class: string }) => {
    const created = await TallyClient.from(options).json<KeyView & { key: string }>(
      'POST',
      '/v1/admin/keys',
      { environment: options.env, class: options.class },
    );
    if (options.json === true) return printJson(created);
    console.log(
      `Created ${created.environment ?? ''} ${created.class} key ${created.id} ` +
        `(${created.prefix}…).`,
    );
    console.log(created.key);
    console.log('This is the only time the secret is shown: store it now.');
  });

  addRemoteOptions(
    keys
      .command('list')
      .description('list every key, live and revoked (never their secrets)')
      .option('--json', "print the service's answer as JSON"),
    'operator',
  ).action(async (options: RemoteOptions & JsonOption) => {
    const listed = await TallyClient.from(options).json<{ data: KeyView[] }>(
      'GET',
      '/v1/admin/keys',
    );
    if (options.json === true) return printJson(listed);
    const rows = listed.data.map((key) => [
      key.id,
      `${key.prefix}…`,
      key.environment ?? '-',
      key.class,
      key.createdAt,
      key.revokedAt ?? '-',
    ]);
    console.log(formatTable(['ID', 'PREFIX', 'ENVIRONMENT', 'CLASS', 'CREATED', 'REVOKED'], rows));
  });

  addRemoteOptions(
    keys
      .command('revoke')
      .description('revoke a key: it answers 401 from the next request on')
      .argument('<id>', "the key's id (key_…, from `tally keys list`)")
      .option('--json', "print the service's answer as JSON"),
    'operator',
  ).action(async (id: string, options: RemoteOptions & JsonOption) => {
    const revoked = await TallyClient.from(options).json<KeyView>(
      'DELETE',
      `/v1/admin/keys/${encodeURIComponent(id)}`,
    );
    if (options.json === true) return printJson(revoked);
    console.log(
      `Revoked ${revoked.id} ` +
        `(${revoked.prefix}…, ${revoked.environment ?? 'no environment'} ${revoked.class}) ` +
        `at ${revoked.revokedAt ?? '?'}.`,
    );
  });

  addRemoteOptions(
    keys
      .command('rotate-admin')
      .description('issue a new operator key and revoke the one making the request')
      .option('--json', "print the service's answer (including the new secret) as JSON"),
    'operator',
  ).action(async (options: RemoteOptions & JsonOption) => {
    const rotated = await TallyClient.from(options).json<
      KeyView & { key: string; revoked: string }
    >('POST', '/v1/admin/keys/rotate-admin');
    if (options.json === true) return printJson(rotated);
    console.log(`New operator key ${rotated.id} (${rotated.prefix}…):`);
    console.log(rotated.key);
    console.log(
      'This is the only time the secret is shown: store it now (and update TALLY_API_KEY).',
    );
    console.log(`The old operator key ${rotated.revoked} is revoked and answers 401 from now on.`);
    console.log(
      'The server also wrote it to bootstrap-keys.json in its data directory (if that ' +
        'file is still there).',
    );
  });
  registerRotateTokenSecret(keys);
}

/**
 * `tally keys rotate-token-secret --env <environment>`: a new signing secret for the
 * environment's customer tokens (docs/browser.md).
 */
function registerRotateTokenSecret(keys: Command): void {
  addRemoteOptions(
    keys
      .command('rotate-token-secret')
      .description(
        "rotate the signing secret of an environment's customer tokens (those already " +
          'minted keep working until they expire)',
      )
      .addOption(
        new Option('--env <environment>', 'environment whose secret to rotate')
          .choices(['test', 'live'])
          .makeOptionMandatory(),
      )
      .option('--json', "print the service's answer as JSON"),
    'operator',
  ).action(async (options: RemoteOptions & JsonOption & { env: string }) => {
    const rotated = await TallyClient.from(options).json<{
      environment: string;
      generation: number;
      previousValidUntil: string;
    }>('POST', '/v1/admin/customer-token-secret/rotate', { environment: options.env });
    if (options.json === true) return printJson(rotated);
    console.log(
      `${rotated.environment} customer tokens are now signed with secret generation ` +
        `${rotated.generation}.`,
    );
    console.log(
      `Tokens of the previous secret are accepted until ${rotated.previousValidUntil}; ` +
        'older ones no longer.',
    );
  });
}

function printJson(value: unknown): void {
  console.log(JSON.stringify(value, null, 2));
}
