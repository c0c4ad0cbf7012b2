/**
 * `tally webhooks …`: the operator's view of webhook endpoints (`/v1/admin/webhooks`):
 * list every endpoint of both environments, approve a live one, enable one that is failing
 * or disabled (which replays what was held for it). Registration itself is the
 * application's (`POST /v1/webhooks` with a server key; docs/webhooks.md).
 */
import type { Command } from 'commander';
import { addRemoteOptions, TallyClient, type RemoteOptions } from '../client.js';
import { formatTable } from '../format.js';

/** An endpoint as the operator routes show it: never its secret. */
interface EndpointView {
  readonly id: string;
  readonly url: string;
  readonly key: string;
  readonly events: '*' | readonly string[];
  readonly environment: 'test' | 'live';
  readonly status: string;
  readonly statusReason: string | null;
  readonly createdAt: string;
}

type JsonOption = { json?: boolean };

function printJson(value: unknown): void {
  console.log(JSON.stringify(value, null, 2));
}

/** `approve` and `enable`: one POST, one line. */
function statusCommand(
  webhooks: Command,
  name: 'approve' | 'enable',
  description: string,
  done: (endpoint: EndpointView) => string,
): void {
  addRemoteOptions(
    webhooks
      .command(name)
      .description(description)
      .argument('<id>', "the endpoint's id (we_…, from `tally webhooks list`)")
      .option('--json', "print the service's answer as JSON"),
    'operator',
  ).action(async (id: string, options: RemoteOptions & JsonOption) => {
    const endpoint = await TallyClient.from(options).json<EndpointView>(
      'POST',
      `/v1/admin/webhooks/${encodeURIComponent(id)}/${name}`,
    );
    if (options.json === true) return printJson(endpoint);
    console.log(done(endpoint));
  });
}

export function register(program: Command): void {
  const webhooks = program
    .command('webhooks')
    .description('list, approve and re-enable webhook endpoints (operator key)');

  addRemoteOptions(
    webhooks
      .command('list')
      .description('list every webhook endpoint of both environments, with its status')
      .option('--json', "print the service's answer as JSON"),
    'operator',
  ).action(async (options: RemoteOptions & JsonOption) => {
    const listed = await TallyClient.from(options).json<{ data: EndpointView[] }>(
      'GET',
      '/v1/admin/webhooks',
    );
    if (options.json === true) return printJson(listed);
    const rows = listed.data.map((e) => [
      e.id,
      e.environment,
      e.status,
      e.key,
      e.events === '*' ? '*' : e.events.join(','),
      e.url,
    ]);
    console.log(formatTable(['ID', 'ENVIRONMENT', 'STATUS', 'KEY', 'EVENTS', 'URL'], rows));
  });

  statusCommand(
    webhooks,
    'approve',
    'approve a live endpoint waiting for approval: it starts receiving events',
    (e) => `Approved ${e.id} (${e.url}): it now receives ${e.environment} events.`,
  );
  statusCommand(
    webhooks,
    'enable',
    'enable a failing or disabled endpoint; the deliveries held for it are retried first',
    (e) => `Enabled ${e.id} (${e.url}): held deliveries are being retried, in order.`,
  );
}
