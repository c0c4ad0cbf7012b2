/**
 * `tally status`: what `GET /v1/admin/status` reports (operator key) — health, uptime,
 * configuration versions, and per shard worker its customers, queue, journal and last
 * snapshot — as a summary and a table, or as the service's JSON with `--json`.
 */
import type { Command } from 'commander';
import { addRemoteOptions, TallyClient, type RemoteOptions } from '../client.js';
import { formatBytes, formatDuration, formatTable } from '../format.js';

interface ShardStatus {
  readonly index: number;
  readonly customers: number;
  readonly queueDepth: number;
  readonly idempotencyEntries: number;
  readonly journalRecords: number;
  readonly journalBytes: number;
  readonly lastSeq: number;
  readonly snapshotSeq: number;
  readonly lastSnapshotAt: string | null;
}

interface Status {
  readonly ok: boolean;
  readonly startedAt: string;
  readonly uptimeSec: number;
  readonly node: string;
  readonly workers: number;
  readonly environments: Readonly<Record<string, { readonly configVersion: number }>>;
  readonly shards: readonly ShardStatus[];
  readonly customers: number;
}

export function register(program: Command): void {
  addRemoteOptions(
    program
      .command('status')
      .description('health, shards, customers, journal sizes, snapshots and uptime (operator key)')
      .option('--json', "print the service's answer as JSON"),
    'operator',
  ).action(async (options: RemoteOptions & { json?: boolean }) => {
    const status = await TallyClient.from(options).json<Status>('GET', '/v1/admin/status');
    console.log(options.json === true ? JSON.stringify(status, null, 2) : formatStatus(status));
  });
}

function formatStatus(status: Status): string {
  const configs = Object.entries(status.environments)
    .map(
      ([environment, { configVersion }]) =>
        `${environment} ${configVersion === 0 ? 'none pushed' : `v${configVersion}`}`,
    )
    .join(', ');
  const snapshots = status.shards
    .map((shard) => shard.lastSnapshotAt)
    .filter((at): at is string => at !== null);
  const lastSnapshot = snapshots.length === 0 ? 'never' : snapshots.sort().at(-1);
  const journalBytes = status.shards.reduce((sum, shard) => sum + shard.journalBytes, 0);
  const summary = formatTable(
    ['Health:', status.ok ? 'ok' : 'NOT OK'],
    [
      ['Uptime:', `${formatDuration(status.uptimeSec)} (since ${status.startedAt})`],
      ['Node:', status.node],
      ['Configurations:', configs],
      ['Shards:', String(status.shards.length)],
      ['Customers:', String(status.customers)],
      ['Journal:', formatBytes(journalBytes)],
      ['Last shard snapshot:', lastSnapshot ?? 'never'],
    ],
  );
  const shards = formatTable(
    [
      'SHARD',
      'CUSTOMERS',
      'QUEUE',
      'JOURNAL RECORDS',
      'JOURNAL SIZE',
      'LAST SEQ',
      'SNAPSHOT SEQ',
      'LAST SNAPSHOT',
    ],
    status.shards.map((shard) => [
      String(shard.index),
      String(shard.customers),
      String(shard.queueDepth),
      String(shard.journalRecords),
      formatBytes(shard.journalBytes),
      String(shard.lastSeq),
      String(shard.snapshotSeq),
      shard.lastSnapshotAt ?? 'never',
    ]),
  );
  return `${summary}\n\n${shards}`;
}
