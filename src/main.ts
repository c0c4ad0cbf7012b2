/**
 * `npm start`: runs Tally on its embedded defaults (PORT 8787, data in ./.tally).
 *
 * Prints the bootstrap keys once, on the first start of an empty data dir, and one
 * JSON line `{"msg":"listening","port":n}` when the port is bound; /healthz answers
 * 200 once recovery has finished. SIGINT/SIGTERM stop it cleanly.
 */
import { DEFAULT_RATE_LIMITS } from './auth/rate-limit.js';
import { startServer } from './server.js';

function intFromEnv(name: string, fallback: number | undefined): number | undefined {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 0) {
    process.stderr.write(`${name} must be a whole number, got ${JSON.stringify(raw)}\n`);
    process.exit(2);
  }
  return value;
}

function log(fields: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify({ time: new Date().toISOString(), ...fields })}\n`);
}

async function main(): Promise<void> {
  const port = intFromEnv('PORT', 8787) ?? 8787;
  const dataDir = process.env['TALLY_DATA_DIR'] || './.tally';
  const workers = intFromEnv('TALLY_WORKERS', undefined);
  const queueMax = intFromEnv('TALLY_QUEUE_MAX', undefined);
  const snapshotEveryBatches = intFromEnv('TALLY_SNAPSHOT_EVERY_BATCHES', undefined);
  const snapshotSliceCustomers = intFromEnv('TALLY_SNAPSHOT_SLICE', undefined);
  const rateLimits = {
    server: intFromEnv('TALLY_RATE_LIMIT_SERVER', DEFAULT_RATE_LIMITS.server) ?? DEFAULT_RATE_LIMITS.server,
    client: intFromEnv('TALLY_RATE_LIMIT_CLIENT', DEFAULT_RATE_LIMITS.client) ?? DEFAULT_RATE_LIMITS.client,
  };
  const server = await startServer({
    port,
    dataDir,
    rateLimits,
    ...(workers === undefined || workers === 0 ? {} : { workers }),
    ...(queueMax === undefined || queueMax === 0 ? {} : { queueMax }),
    ...(snapshotEveryBatches === undefined || snapshotEveryBatches === 0 ? {} : { snapshotEveryBatches }),
    ...(snapshotSliceCustomers === undefined || snapshotSliceCustomers === 0 ? {} : { snapshotSliceCustomers }),
  });
  if (server.bootstrapKeys !== null) {
    process.stdout.write(
      `\nTally created its first API keys (shown once; also in ${dataDir}/bootstrap-keys.json, mode 0600):\n` +
        `${JSON.stringify(server.bootstrapKeys, null, 2)}\n\n`,
    );
  }
  log({ level: 'info', msg: 'listening', port: server.port, dataDir });
  const started = Date.now();
  await server.ready;
  log({ level: 'info', msg: 'ready', recoveryMs: Date.now() - started, shards: server.shardStats() });
  const stop = (signal: string): void => {
    log({ level: 'info', msg: 'stopping', signal });
    server.close().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  };
  process.once('SIGINT', () => stop('SIGINT'));
  process.once('SIGTERM', () => stop('SIGTERM'));
}

main().catch((error: unknown) => {
  process.stderr.write(`tally failed to start: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(1);
});
