/**
 * `npm start`: runs Tally on its embedded defaults (PORT 8787, data in ./.tally).
 *
 * Prints the bootstrap keys once, on the first start of an empty data dir (the only
 * time a secret is ever written to stdout), and otherwise only JSON log lines (pino,
 * level TALLY_LOG_LEVEL, default info): `"msg":"listening"` with `port` when the port is
 * bound, `"msg":"ready"` once recovery has finished (/healthz answers 200 from then on).
 * A start-up failure (a bad setting, a data dir in use, a port taken) is one plain line on
 * stderr for the person starting it, exit code non-zero; its JSON log line (with the
 * stack) only at debug level, so it is not said twice. Settings are checked and the port
 * bound before anything is created in the data dir, so a failed first start leaves no
 * data dir behind. SIGINT/SIGTERM stop it cleanly.
 */
import os from 'node:os';
import v8 from 'node:v8';
import { nameThisThread } from '../actors/thread-name.js';
import { parsePerEnvironment, type PerEnvironment } from '../shared/quotas.js';
import { DEFAULT_RATE_LIMITS } from './auth/rate-limit.js';
import { createLogger, isLogLevel, LOG_LEVELS, stdoutDestination } from './observability/log.js';
import {
  DEFAULT_HOST,
  defaultFrontEnds,
  idempotencyEraGroupsProblem,
  startServer,
} from './server.js';
import { policyOptionsFromEnv } from './webhooks/address-policy.js';
import { parseSchedule } from './webhooks/schedule.js';
import type { WebhookSettings } from './webhooks/service.js';

// Everything the service creates (data dir, LMDB files, snapshots, keys) is readable by
// its own account only, whatever the shell's umask (docs/security.md, Files on disk).
process.umask(0o077);
nameThisThread('tally-main');

const levelRaw = process.env['TALLY_LOG_LEVEL'] || 'info';
if (!isLogLevel(levelRaw)) {
  process.stderr.write(
    `TALLY_LOG_LEVEL must be one of ${LOG_LEVELS.join(', ')}, got ${JSON.stringify(levelRaw)}\n`,
  );
  process.exit(2);
}
// One stdout stream for log lines and the bootstrap block, so they come out in order.
const stdout = stdoutDestination();
const log = createLogger(levelRaw, stdout);

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

/**
 * A per-environment quota setting: `1000` for both environments, or `test:1000,live:0`; 0 or unset
 * = unlimited.
 */
function quotaFromEnv(name: string): PerEnvironment {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return { test: 0, live: 0 };
  try {
    return parsePerEnvironment(raw);
  } catch (error) {
    process.stderr.write(`${name}: ${error instanceof Error ? error.message : String(error)}\n`);
    process.exit(2);
  }
}

/** An environment variable, or undefined when unset or empty. */
function optionalEnv(name: string): string | undefined {
  const raw = process.env[name];
  return raw === undefined || raw === '' ? undefined : raw;
}

/**
 * Webhook delivery settings: TALLY_WEBHOOK_ALLOWED_HOSTS (private hosts endpoints may
 * reach), TALLY_WEBHOOK_RESOLVE (`name=ip,…`, fixed answers for names) and
 * TALLY_WEBHOOK_RETRY_SCHEDULE (`ms,ms,…`). A bad value stops the start (exit 2).
 */
function webhookSettingsFromEnv(): WebhookSettings {
  try {
    const schedule = optionalEnv('TALLY_WEBHOOK_RETRY_SCHEDULE');
    return {
      policy: policyOptionsFromEnv(process.env),
      ...(schedule === undefined ? {} : { retryScheduleMs: parseSchedule(schedule) }),
    };
  } catch (error) {
    process.stderr.write(`${error instanceof Error ? error.message : String(error)}\n`);
    process.exit(2);
  }
}

/**
 * TALLY_GC_CONCURRENT_MARKING: `on`, `off`, or unset (off on a machine of at most two
 * cores). Off, V8 marks the heap for a full collection in steps on the thread that owns
 * it rather than on helper threads beside it: where the helpers have no core of their own
 * they fall behind, and the collection's final pause marks what they left (up to 37–51 ms
 * for a shard of 100,000 customers, against 12–16 ms in steps: docs/performance.md).
 */
function concurrentMarkingFromEnv(): boolean {
  const raw = optionalEnv('TALLY_GC_CONCURRENT_MARKING');
  if (raw === undefined) return os.availableParallelism() > 2;
  if (raw === 'on' || raw === 'off') return raw === 'on';
  process.stderr.write(
    `TALLY_GC_CONCURRENT_MARKING must be on or off, got ${JSON.stringify(raw)}\n`,
  );
  process.exit(2);
}

async function main(): Promise<void> {
  // Before any worker's heap exists: V8's flags are the process's, read as each collection
  // starts marking.
  if (!concurrentMarkingFromEnv()) v8.setFlagsFromString('--no-concurrent-marking');
  const port = intFromEnv('PORT', 8787) ?? 8787;
  const host = process.env['TALLY_HOST'] || DEFAULT_HOST;
  const dataDir = process.env['TALLY_DATA_DIR'] || './.tally';
  const workers = intFromEnv('TALLY_WORKERS', undefined);
  const frontEnds =
    intFromEnv('TALLY_FRONTENDS', undefined) || defaultFrontEnds(os.availableParallelism());
  const queueMax = intFromEnv('TALLY_QUEUE_MAX', undefined);
  const snapshotEveryBatches = intFromEnv('TALLY_SNAPSHOT_EVERY_BATCHES', undefined);
  const snapshotSliceWork = intFromEnv('TALLY_SNAPSHOT_SLICE', undefined);
  const idempotencyRunKeys = intFromEnv('TALLY_IDEMPOTENCY_RUN_KEYS', undefined);
  const idempotencyEraGroups = intFromEnv('TALLY_IDEMPOTENCY_ERA_GROUPS', undefined);
  const eraGroupsProblem =
    idempotencyEraGroups === undefined || idempotencyEraGroups === 0
      ? null
      : idempotencyEraGroupsProblem(idempotencyEraGroups);
  if (eraGroupsProblem !== null) {
    process.stderr.write(`${eraGroupsProblem}\n`);
    process.exit(2);
  }
  const rateLimits = {
    server:
      intFromEnv('TALLY_RATE_LIMIT_SERVER', DEFAULT_RATE_LIMITS.server) ??
      DEFAULT_RATE_LIMITS.server,
    client:
      intFromEnv('TALLY_RATE_LIMIT_CLIENT', DEFAULT_RATE_LIMITS.client) ??
      DEFAULT_RATE_LIMITS.client,
    clientAddress:
      intFromEnv('TALLY_RATE_LIMIT_CLIENT_ADDRESS', DEFAULT_RATE_LIMITS.clientAddress) ??
      DEFAULT_RATE_LIMITS.clientAddress,
    clientCustomer:
      intFromEnv('TALLY_RATE_LIMIT_CLIENT_CUSTOMER', DEFAULT_RATE_LIMITS.clientCustomer) ??
      DEFAULT_RATE_LIMITS.clientCustomer,
  };
  const clientAddressHeader = optionalEnv('TALLY_CLIENT_ADDRESS_HEADER')?.toLowerCase();
  const reserveMb = intFromEnv('TALLY_STORAGE_RESERVE_MB', undefined);
  const quotas = {
    customers: quotaFromEnv('TALLY_QUOTA_CUSTOMERS'),
    idempotencyKeys: quotaFromEnv('TALLY_QUOTA_IDEMPOTENCY_KEYS'),
    auditEntriesPerDay: quotaFromEnv('TALLY_QUOTA_AUDIT_ENTRIES_PER_DAY'),
  };
  // The payment processor: without STRIPE_SECRET_KEY, the embedded Stripe sandbox
  // (docs/commerce.md).
  const secretKey = optionalEnv('STRIPE_SECRET_KEY');
  const webhookSecret = optionalEnv('STRIPE_WEBHOOK_SECRET');
  const apiUrl = optionalEnv('STRIPE_API_URL');
  const processor = {
    ...(secretKey === undefined ? {} : { secretKey }),
    ...(webhookSecret === undefined ? {} : { webhookSecret }),
    ...(apiUrl === undefined ? {} : { apiUrl }),
  };
  const server = await startServer({
    port,
    host,
    quotas,
    ...(reserveMb === undefined ? {} : { storageReserveBytes: reserveMb * 1024 * 1024 }),
    dataDir,
    rateLimits,
    ...(clientAddressHeader === undefined ? {} : { clientAddressHeader }),
    log,
    processor,
    webhooks: webhookSettingsFromEnv(),
    ...(workers === undefined || workers === 0 ? {} : { workers }),
    frontEnds,
    ...(queueMax === undefined || queueMax === 0 ? {} : { queueMax }),
    ...(snapshotEveryBatches === undefined || snapshotEveryBatches === 0
      ? {}
      : { snapshotEveryBatches }),
    ...(snapshotSliceWork === undefined || snapshotSliceWork === 0 ? {} : { snapshotSliceWork }),
    ...(idempotencyRunKeys === undefined || idempotencyRunKeys === 0 ? {} : { idempotencyRunKeys }),
    ...(idempotencyEraGroups === undefined || idempotencyEraGroups === 0
      ? {}
      : { idempotencyEraGroups }),
  });
  if (server.bootstrapKeys !== null) {
    stdout.write(
      `\nTally created its first API keys (shown once; also ` +
        `in ${dataDir}/bootstrap-keys.json, mode 0600):\n` +
        `${JSON.stringify(server.bootstrapKeys, null, 2)}\n\n`,
    );
  }
  log.info({ host, port: server.port, dataDir }, 'listening');
  if (server.stripeSandboxUrl !== null)
    log.info(
      { url: server.stripeSandboxUrl },
      'stripe sandbox (no STRIPE_SECRET_KEY: payments are simulated)',
    );
  else log.info({ apiUrl: apiUrl ?? 'https://api.stripe.com' }, 'stripe');
  const started = Date.now();
  await server.ready;
  log.info({ recoveryMs: Date.now() - started, shards: server.shardStats() }, 'ready');
  const stop = (signal: string): void => {
    log.info({ signal }, 'stopping');
    server.close().then(
      () => process.exit(0),
      (error: unknown) => {
        log.error({ err: error }, 'stop failed');
        process.exit(1);
      },
    );
  };
  process.once('SIGINT', () => stop('SIGINT'));
  process.once('SIGTERM', () => stop('SIGTERM'));
}

main().catch((error: unknown) => {
  // One line for the person starting the service; the details (stack) at debug level.
  const reason = error instanceof Error ? error.message : String(error);
  const message = `tally failed to start: ${reason}`;
  process.stderr.write(`${message}\n`);
  log.debug({ err: error }, message);
  // Exit once the debug line (if any) is out: the logger writes asynchronously.
  try {
    stdout.flushSync();
  } catch {
    /* nothing buffered, or stdout is gone: the stderr line is what matters */
  }
  process.exit(1);
});
