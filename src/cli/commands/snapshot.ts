/**
 * `tally snapshot …`: online snapshots through the operator API, and the offline restore.
 *
 * `create` asks the service for a snapshot, follows its progress, downloads the file
 * (to `<out>.partial`, renamed only once its SHA-256 matches what the service computed
 * and its structure verifies), so a file at `--out` is always a complete snapshot. An
 * existing `--out` (of `create` or `download`) is refused before anything is asked of the
 * service, unless `--force`: a snapshot is often the only copy of something.
 * Progress (the cut, the download, the restore) is drawn on stderr only on a terminal.
 * `restore` runs here, not on the service: it writes a fresh data dir for a server that
 * is not running yet (storage/snapshot-restore.ts says what it refuses and why).
 */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import { type Command, Option } from 'commander';
import type { CustomerRecord } from '../../../shared/customer-record.js';
import { openPrivateFile } from '../../../storage/private-files.js';
import { check, validateCustomerUpsert } from '../../api/validation.js';
import { formatViolations, validateBillingConfig } from '../../config/validate-config.js';
import { SnapshotFileError, verifySnapshotFile } from '../../../storage/snapshot-file.js';
import { RestoreRefusedError, restoreSnapshot } from '../../../storage/snapshot-restore.js';
import {
  addRemoteOptions,
  CliError,
  EXIT,
  progressBar,
  TallyClient,
  type Progress,
  type RemoteOptions,
} from '../client.js';
import { formatBytes, formatTable } from '../format.js';

interface SnapshotView {
  readonly id: string;
  readonly status: 'running' | 'complete' | 'failed';
  readonly createdAt: string;
  readonly completedAt: string | null;
  readonly bytes: number | null;
  readonly customers: number | null;
  readonly sha256: string | null;
  readonly error: string | null;
  readonly progress: { readonly customersDone: number; readonly customersTotal: number };
}

type JsonOption = { json?: boolean };
type OutOptions = { out: string; force?: boolean };

/** How often `create` asks how far the snapshot has got. */
const POLL_MS = 200;

export function register(program: Command): void {
  const snapshot = program
    .command('snapshot')
    .description('take, list, download and restore snapshots of all state');

  addRemoteOptions(
    snapshot
      .command('create')
      .description('take an online snapshot (traffic keeps flowing) and download it')
      .requiredOption(
        '--out <file>',
        'where to save the snapshot file (must not exist, unless --force)',
      )
      .option('--force', 'replace an existing file at --out')
      .option('--json', 'print the finished snapshot as JSON'),
    'operator',
  ).action(async (options: RemoteOptions & JsonOption & OutOptions) => {
    const client = TallyClient.from(options);
    refuseExisting(options);
    const started = await client.json<SnapshotView>('POST', '/v1/admin/snapshots');
    const finished = await follow(client, started);
    await download(client, finished, options);
    if (options.json === true) return console.log(JSON.stringify(finished, null, 2));
    console.log(
      `Snapshot ${finished.id}: ${finished.customers ?? 0} ` +
        `customers, ${formatBytes(finished.bytes ?? 0)}, sha256 ${finished.sha256 ?? '?'}`,
    );
    console.log(`Saved to ${options.out}.`);
  });

  addRemoteOptions(
    snapshot
      .command('list')
      .description('list the snapshots the service holds, newest first')
      .option('--json', "print the service's answer as JSON"),
    'operator',
  ).action(async (options: RemoteOptions & JsonOption) => {
    const listed = await TallyClient.from(options).json<{ data: SnapshotView[] }>(
      'GET',
      '/v1/admin/snapshots',
    );
    if (options.json === true) return console.log(JSON.stringify(listed, null, 2));
    const rows = listed.data.map((s) => [
      s.id,
      s.status,
      s.createdAt,
      String(s.customers ?? s.progress.customersDone),
      s.bytes === null ? '-' : formatBytes(s.bytes),
      s.sha256?.slice(0, 16) ?? s.error ?? '-',
    ]);
    console.log(formatTable(['ID', 'STATUS', 'CREATED', 'CUSTOMERS', 'SIZE', 'SHA256'], rows));
  });

  addRemoteOptions(
    snapshot
      .command('download')
      .description('download a complete snapshot the service holds')
      .argument('<id>', "the snapshot's id (snap_…)")
      .requiredOption('--out <file>', 'where to save it (must not exist, unless --force)')
      .option('--force', 'replace an existing file at --out'),
    'operator',
  ).action(async (id: string, options: RemoteOptions & OutOptions) => {
    const client = TallyClient.from(options);
    refuseExisting(options);
    const view = await client.json<SnapshotView>(
      'GET',
      `/v1/admin/snapshots/${encodeURIComponent(id)}`,
    );
    await download(client, view, options);
    console.log(`Saved ${view.id} to ${options.out}.`);
  });

  addRemoteOptions(
    snapshot
      .command('delete')
      .description('delete a snapshot file the service holds')
      .argument('<id>', "the snapshot's id (snap_…)"),
    'operator',
  ).action(async (id: string, options: RemoteOptions) => {
    await TallyClient.from(options).raw('DELETE', `/v1/admin/snapshots/${encodeURIComponent(id)}`);
    console.log(`Deleted ${id}.`);
  });

  addRemoteOptions(
    snapshot
      .command('secret')
      .description(
        "print the snapshot secret that authenticates this data dir's snapshot files " +
          '(keep it apart from them: restore needs it)',
      ),
    'operator',
  ).action(async (options: RemoteOptions) => {
    const { secret } = await TallyClient.from(options).json<{ secret: string }>(
      'GET',
      '/v1/admin/snapshot-secret',
    );
    console.log(secret);
  });

  snapshot
    .command('restore')
    .description(
      'restore a snapshot file into an empty data dir (offline: start the server on it afterwards)',
    )
    .argument('<file>', 'the snapshot file')
    .requiredOption('--data-dir <dir>', 'the empty (or new) data dir to restore into')
    .addOption(
      new Option(
        '--workers <n>',
        'shard workers of the restored data dir (default: as in the snapshot)',
      ).argParser(parseWorkers),
    )
    .addOption(
      new Option(
        '--secret-file <file>',
        'file holding the snapshot secret of the data dir the snapshot was taken from (or ' +
          'set TALLY_SNAPSHOT_SECRET)',
      ),
    )
    .option(
      '--unauthenticated',
      'restore a file that cannot be authenticated (no secret, or a snapshot from before ' +
        'files carried a MAC); its content is still validated',
    )
    .action(
      async (
        file: string,
        options: {
          dataDir: string;
          workers?: number;
          secretFile?: string;
          unauthenticated?: boolean;
        },
      ) => {
        if (!fs.existsSync(file)) throw new CliError(`no such file: ${file}`);
        const secret = readSecret(options.secretFile);
        const bars = new Map<string, Progress & { at: number }>();
        const onProgress = (phase: 'verify' | 'restore', read: number, total: number): void => {
          let bar = bars.get(phase);
          if (bar === undefined) {
            bars.get('verify')?.done();
            bar = Object.assign(
              progressBar(phase === 'verify' ? 'verifying' : 'restoring', total),
              { at: 0 },
            );
            bars.set(phase, bar);
          }
          bar.advance(read - bar.at);
          bar.at = read;
        };
        try {
          const result = await restoreSnapshot(file, options.dataDir, {
            ...(options.workers === undefined ? {} : { workers: options.workers }),
            onProgress,
            actor: `cli:${os.userInfo().username}`,
            ...(secret === null ? {} : { secret }),
            unauthenticated: options.unauthenticated === true,
            checkConfig: configProblem,
            checkCustomer: customerProblem,
          });
          bars.get('restore')?.done();
          console.log(
            `Restored snapshot ${result.header.id} ` +
              `(taken ${new Date(result.header.createdAtMs).toISOString()}): ` +
              `${result.customers} customers, ${result.keys} API keys, ` +
              `${result.idempotencyKeys} idempotency keys, ${result.workers} shard worker(s) ` +
              `into ${options.dataDir}.`,
          );
          console.log(`Start the server on it: TALLY_DATA_DIR=${options.dataDir} npm start`);
        } catch (error) {
          if (error instanceof RestoreRefusedError || error instanceof SnapshotFileError)
            throw new CliError(error.message);
          throw error;
        }
      },
    );
}

/**
 * The secret from `--secret-file` or TALLY_SNAPSHOT_SECRET (64 hex digits), or null when neither is
 * given.
 */
function readSecret(secretFile: string | undefined): Buffer | null {
  const text =
    secretFile === undefined
      ? process.env['TALLY_SNAPSHOT_SECRET']
      : fs.readFileSync(secretFile, 'utf8');
  if (text === undefined || text.trim() === '') return null;
  const hex = text.trim();
  if (!/^[0-9a-fA-F]{64}$/.test(hex))
    throw new CliError('a snapshot secret is 64 hex digits, as `tally snapshot secret` prints it');
  return Buffer.from(hex, 'hex');
}

/** Why a restored configuration would be refused by a push, or null. */
function configProblem(config: unknown): string | null {
  const checked = validateBillingConfig(config);
  return checked.ok ? null : formatViolations(checked.errors);
}

/** Why a restored customer's id or profile would be refused by an upsert, or null. */
function customerProblem(customer: CustomerRecord): string | null {
  const { id, profile } = customer;
  const body = {
    id,
    ...(profile.name === null ? {} : { name: profile.name }),
    ...(profile.email === null ? {} : { email: profile.email }),
    metadata: profile.metadata,
  };
  const checked = check(validateCustomerUpsert, body, 'body');
  return checked.ok ? null : checked.message;
}

/** An existing file (or link, or anything else) at `--out` stops the command unless `--force`. */
function refuseExisting(options: OutOptions): void {
  if (options.force !== true && exists(options.out)) {
    throw new CliError(
      `${options.out} already exists; pass --force to replace it (nothing was done)`,
    );
  }
}

function exists(file: string): boolean {
  try {
    fs.lstatSync(file);
    return true;
  } catch {
    return false;
  }
}

function parseWorkers(raw: string): number {
  const workers = Number(raw);
  if (!Number.isInteger(workers) || workers < 1 || workers > 64)
    throw new CliError(`--workers must be a whole number from 1 to 64, got ${raw}`, EXIT.usage);
  return workers;
}

/** Polls until the snapshot is no longer running, drawing its progress; fails if it failed. */
async function follow(client: TallyClient, started: SnapshotView): Promise<SnapshotView> {
  let view = started;
  let bar: Progress | null = null;
  let shown = 0;
  while (view.status === 'running') {
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    view = await client.json<SnapshotView>(
      'GET',
      `/v1/admin/snapshots/${encodeURIComponent(view.id)}`,
    );
    const { customersDone, customersTotal } = view.progress;
    if (bar === null && customersTotal > 0)
      bar = progressBar(`snapshot ${view.id} (customers)`, customersTotal, process.stderr, 'count');
    bar?.advance(customersDone - shown);
    shown = customersDone;
  }
  bar?.done();
  if (view.status === 'failed')
    throw new CliError(`snapshot ${view.id} failed: ${view.error ?? 'unknown error'}`);
  return view;
}

/**
 * Streams the file to `<out>.partial`, hashing it; renames it to `out` only if the hash
 * matches the service's and the file verifies. Never leaves a partial file at `out`.
 */
async function download(
  client: TallyClient,
  view: SnapshotView,
  options: OutOptions,
): Promise<void> {
  const out = options.out;
  const response = await client.raw(
    'GET',
    `/v1/admin/snapshots/${encodeURIComponent(view.id)}/file`,
  );
  const expected = response.headers.get('x-tally-snapshot-sha256') ?? view.sha256;
  const total = Number(response.headers.get('content-length') ?? view.bytes ?? 0);
  const partial = `${out}.partial`;
  const hash = createHash('sha256');
  const bar = progressBar(`downloading ${view.id}`, total > 0 ? total : null);
  // New and private even if something was planted at the path (storage/private-files.ts).
  const fd = openPrivateFile(partial);
  try {
    if (response.body === null) throw new CliError('the service sent no file');
    for await (const chunk of response.body) {
      hash.update(chunk);
      fs.writeSync(fd, chunk);
      bar.advance(chunk.length);
    }
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    bar.done();
    const actual = hash.digest('hex');
    if (expected !== null && actual !== expected)
      throw new CliError(
        `download of ${view.id} is damaged: sha256 ${actual}, the service says ${expected}`,
      );
    verifySnapshotFile(partial);
    // Something may have appeared at `out` while the file was downloading.
    if (options.force !== true && exists(out)) {
      throw new CliError(
        `${out} appeared during the download and was kept; the snapshot stays on the ` +
          `service: tally snapshot download ${view.id} --out <file>`,
      );
    }
    fs.renameSync(partial, out);
  } catch (error) {
    try {
      fs.closeSync(fd);
    } catch {
      /* already closed */
    }
    fs.rmSync(partial, { force: true });
    if (error instanceof SnapshotFileError)
      throw new CliError(`downloaded ${view.id} but it does not verify: ${error.message}`);
    throw error;
  }
}
