/**
 * The Tally service: binds its port, opens the data directory, starts the shard workers
 * (which recover from their journals), and serves HTTP on uWebSockets.js. The port comes
 * first so that a start that cannot serve creates nothing on disk.
 *
 * Request path: authenticate the key → rate limit (429) → route (404/405) → key class (403) →
 * readiness (503) → content type / length (400/413) → body → validate → shard → reply. Nothing a
 * client sends can reach a 500: every failure up to the shard hop has a catalog entry. The port is
 * bound exclusively: uWS otherwise uses SO_REUSEPORT and a leftover instance would silently share
 * the port and half the traffic.
 */
import { randomBytes } from 'node:crypto';
import os from 'node:os';
import uWS from 'uWebSockets.js';
import type { BillingConfig } from '../actors/billing-config.js';
import type { Environment, WorkerStats } from '../actors/protocol.js';
import { LOGICAL_SHARDS } from '../shared/limits.js';
import { logicalShardOf, workerOf } from '../shared/shard-hash.js';
import { ControlStore, type KeyRecord } from '../storage/control-store.js';
import { claimDataDir } from '../storage/data-dir-lock.js';
import { ensurePrivateDir } from '../storage/private-files.js';
import { SNAPSHOT_SECRET_BYTES } from '../storage/snapshot-file.js';
import { AuditLog, type AuditVerification } from '../storage/audit-log.js';
import { CustomerIndex } from '../storage/customer-index.js';
import { buildAdminRouter, OPERATOR_STREAM, type AdminRoute } from './api/admin-routes.js';
import { openApiCache } from './api/openapi.js';
import { buildPublicRouter, type PublicRoute } from './api/public-routes.js';
import { runRoute } from './api/route-record.js';
import { snapshotRoutes } from './api/snapshot-routes.js';
import { Snapshots } from './snapshots.js';
import { buildApiRouter, type Route } from './api/routes.js';
import { bearerToken, issueKey, KeyRing } from './auth/keys.js';
import {
  replaceBootstrapAdmin,
  writeBootstrapFile,
  type BootstrapKeys,
} from './auth/bootstrap-file.js';
import {
  ClientPolicies,
  CORS_ALLOW_HEADERS,
  CORS_ALLOW_METHODS,
  CORS_MAX_AGE_SEC,
  type ClientSettings,
} from './auth/client-policy.js';
import { CustomerTokens } from './auth/customer-token.js';
import {
  DEFAULT_RATE_LIMITS,
  RateLimiter,
  type RateDecision,
  type RateLimits,
} from './auth/rate-limit.js';
import { ClientAddresses, type AddressKey } from './http/client-address.js';
import { checkBodyHeaders, readJsonBody } from './http/body.js';
import type { ErrorCode } from './errors.js';
import { Exchange, type Headers } from './http/exchange.js';
import { framingProblem } from './http/framing.js';
import { routeQuery } from './http/query.js';
import type { Router } from './http/router.js';
import { silentLogger, type Logger } from './observability/log.js';
import type { FixedRoute } from './observability/http-metrics.js';
import { metricsRoute } from './observability/metrics-route.js';
import { Observability } from './observability/observability.js';
import { UNLIMITED, type Quotas } from '../shared/quotas.js';
import { ShardPool } from './shard-pool.js';
import { SharedBudgets } from './auth/shared-budgets.js';
import { FrontEndThreads, type FrontEndThreadsOptions } from './front-ends/threads.js';
import {
  FRONT_ENDS_MAX,
  IDEMPOTENCY_ERA_GROUPS,
  IDEMPOTENCY_ERA_GROUPS_MAX,
} from '../shared/limits.js';
import { webhookHandler } from './api/commerce-routes.js';
import { syncCatalog, type CatalogAction } from './commerce/catalog-sync.js';
import {
  processorSettingsProblem,
  ProcessorFailure,
  startProcessor,
  STRIPE_WEBHOOK_PATH,
  type Processor,
  type ProcessorSettings,
} from './commerce/processor.js';
import { SideJobs } from './side-jobs.js';
import { webhookAdminRoutes } from './api/webhook-routes.js';
import { WebhookService, type WebhookSettings } from './webhooks/service.js';
import { DevRelay, RELAY_PATH, relayBehavior } from './webhooks/relay.js';
import { failStorageFull, STORAGE_RESERVE_BYTES_DEFAULT, StorageWatch } from './storage-watch.js';

/** Loopback only unless the operator says otherwise: Tally speaks plain HTTP (docs/security.md). */
export const DEFAULT_HOST = '127.0.0.1';

export interface ServerOptions {
  readonly port: number;
  /** Address to bind (default DEFAULT_HOST); `0.0.0.0` or `::` for every interface. */
  readonly host?: string;
  /** Per-environment quotas on customers and idempotency keys (default: none). */
  readonly quotas?: Quotas;
  /**
   * Free bytes the data directory's filesystem must keep; below it writes are refused (default
   * STORAGE_RESERVE_BYTES_DEFAULT).
   */
  readonly storageReserveBytes?: number;
  readonly dataDir: string;
  /**
   * Worker threads; fixed per data dir at its first start. Default: `defaultWorkers` (cores − 1, at
   * least 1).
   */
  readonly workers?: number;
  /**
   * Front-end threads on the port (default 1): the first is this thread, the others serve the
   * metering hot path themselves and relay the rest to it (src/front-ends).
   */
  readonly frontEnds?: number;
  /** Per-worker queue bound before 503 (default WORKER_QUEUE_MAX). */
  readonly queueMax?: number;
  /** Journal batches between automatic shard snapshots (default SNAPSHOT_EVERY_BATCHES). */
  readonly snapshotEveryBatches?: number;
  /** Work a shard does per slice of a snapshot copy (default SNAPSHOT_SLICE_WORK). */
  readonly snapshotSliceWork?: number;
  /** Idempotency keys a shard holds in memory before it seals a run (IDEMPOTENCY_RUN_KEYS). */
  readonly idempotencyRunKeys?: number;
  /**
   * Groups of runs a shard's new era of idempotency filters holds at most (16 to 64; default:
   * each new era sized by the keys' rate, within those bounds).
   */
  readonly idempotencyEraGroups?: number;
  /** Requests per minute per key, and for client keys per address and customer. */
  readonly rateLimits?: RateLimits;
  /**
   * The header a trusted reverse proxy writes the client's address into (lower case, e.g.
   * `x-forwarded-for`); default: the socket's peer (src/http/client-address.ts).
   */
  readonly clientAddressHeader?: string;
  /** Where request errors, operator actions and (at debug) access lines go; default: nowhere. */
  readonly log?: Logger;
  /** The payment processor (docs/commerce.md); default: the embedded Stripe sandbox. */
  readonly processor?: ProcessorSettings;
  /** Webhook delivery: allowed private hosts, pinned names, the retry schedule. */
  readonly webhooks?: WebhookSettings;
}

export type { BootstrapKeys } from './auth/bootstrap-file.js';

export interface RunningServer {
  readonly port: number;
  /** The keys created on this first start (null on later starts). */
  readonly bootstrapKeys: BootstrapKeys | null;
  /** The embedded Stripe sandbox's address (null when another processor is configured). */
  readonly stripeSandboxUrl: string | null;
  /** Resolves once recovery has finished and /healthz answers 200. */
  readonly ready: Promise<void>;
  /** What each shard worker recovered (null before it reported ready). */
  shardStats(): Array<WorkerStats | null>;
  close(): Promise<void>;
}

const ENVIRONMENTS: readonly Environment[] = ['test', 'live'];

/** Creates the first keys of an empty data dir and writes them (0600) for the operator. */
async function bootstrapKeys(keys: KeyRing, dataDir: string): Promise<BootstrapKeys | null> {
  if (keys.size > 0) return null;
  const now = Date.now();
  const issued = {
    testServer: issueKey('server', 'test', now),
    testClient: issueKey('client', 'test', now),
    liveServer: issueKey('server', 'live', now),
    liveClient: issueKey('client', 'live', now),
    admin: issueKey('admin', null, now),
  };
  for (const key of Object.values(issued)) await keys.add(key.record);
  const result: BootstrapKeys = {
    test: { server: issued.testServer.secret, client: issued.testClient.secret },
    live: { server: issued.liveServer.secret, client: issued.liveClient.secret },
    admin: issued.admin.secret,
  };
  writeBootstrapFile(dataDir, result);
  return result;
}

/**
 * The default shard worker count: one core per worker beside the front end's, at least
 * one. On two cores a second worker raises `context` and `has` under autocannon (whose
 * own CPU leaves the server short of a core), but with wrk, which leaves the server
 * nearer saturation, one worker serves more of every route: `has` and `context` ~6%,
 * durable `consume` ~40% (each worker journals to its own environment with its own
 * syncs).
 */
export function defaultWorkers(cores: number): number {
  return Math.max(1, cores - 1);
}

/**
 * Why `groups` cannot be the groups of runs an era of idempotency filters holds
 * (`idempotencyEraGroups`, TALLY_IDEMPOTENCY_ERA_GROUPS), or null if it can.
 */
export function idempotencyEraGroupsProblem(groups: number): string | null {
  return Number.isInteger(groups) &&
    groups >= IDEMPOTENCY_ERA_GROUPS &&
    groups <= IDEMPOTENCY_ERA_GROUPS_MAX
    ? null
    : `TALLY_IDEMPOTENCY_ERA_GROUPS must be from ${IDEMPOTENCY_ERA_GROUPS} to ` +
        `${IDEMPOTENCY_ERA_GROUPS_MAX}, got ${groups}`;
}

/**
 * The default front-end thread count: one on two cores or fewer, where a second front end only
 * takes CPU from the shard workers; one per four cores beyond (docs/performance.md, "More
 * cores").
 */
export function defaultFrontEnds(cores: number): number {
  return cores <= 2 ? 1 : Math.max(1, Math.floor(cores / 4));
}

/** The worker count is part of the data dir's layout: the first start fixes it. */
async function resolveWorkers(
  control: ControlStore,
  requested: number | undefined,
): Promise<number> {
  const stored = control.getMeta('workers');
  if (typeof stored === 'number') return stored;
  const workers = requested ?? defaultWorkers(os.availableParallelism());
  await control.putMeta('workers', workers);
  return workers;
}

/**
 * The native module exports the flag at top level while its typings declare it in a
 * runtime-absent enum; read the real value and insist it exists.
 */
const LISTEN_EXCLUSIVE_PORT = (
  uWS as unknown as { LIBUS_LISTEN_EXCLUSIVE_PORT?: uWS.ListenOptions }
).LIBUS_LISTEN_EXCLUSIVE_PORT;

/**
 * Binds the port. `shared`: other front-end threads of this process will bind it too, so the
 * socket takes SO_REUSEPORT; to still refuse a port another process serves, it is first bound
 * exclusively for a moment (a port taken between the two binds is not noticed).
 */
async function listen(
  app: uWS.TemplatedApp,
  host: string,
  port: number,
  shared = false,
): Promise<uWS.us_listen_socket> {
  if (!shared) return listenOnce(app, host, port, LISTEN_EXCLUSIVE_PORT);
  const probe = await listenOnce(uWS.App(), host, port, LISTEN_EXCLUSIVE_PORT);
  const bound = uWS.us_socket_local_port(probe);
  uWS.us_listen_socket_close(probe);
  return listenOnce(app, host, bound, 0 as uWS.ListenOptions);
}

function listenOnce(
  app: uWS.TemplatedApp,
  host: string,
  port: number,
  flags: uWS.ListenOptions | undefined,
): Promise<uWS.us_listen_socket> {
  if (flags === undefined || LISTEN_EXCLUSIVE_PORT === undefined)
    throw new Error('uWebSockets.js lacks LIBUS_LISTEN_EXCLUSIVE_PORT');
  // The typings leave out the (host, port, options, callback) form the native module has.
  const listenOn = app.listen as unknown as (
    host: string,
    port: number,
    options: uWS.ListenOptions,
    cb: (socket: uWS.us_listen_socket | false) => void,
  ) => void;
  return new Promise((resolve, reject) => {
    listenOn.call(app, host, port, flags, (socket) => {
      if (socket === false)
        reject(
          new Error(
            `cannot listen on port ${port} of ${host}: it is in use, not open to this ` +
              `account, or not an address of this machine`,
          ),
        );
      else resolve(socket);
    });
  });
}

interface OpenedDataDir {
  readonly control: ControlStore;
  readonly keys: KeyRing;
  readonly customerTokens: CustomerTokens;
  readonly bootstrap: BootstrapKeys | null;
  readonly workers: number;
  readonly releaseDataDir: () => void;
}

/** Creates or checks the data dir, claims it, opens its control store and first keys. */
async function openDataDir(options: ServerOptions): Promise<OpenedDataDir> {
  // A data dir others may write to is refused (they would own the database); one they may
  // read is served with a warning (docs/security.md, Files on disk).
  const dirCheck = ensurePrivateDir(options.dataDir);
  if (dirCheck.unsafe !== null) throw new Error(dirCheck.unsafe);
  if (dirCheck.loose !== null) options.log?.warn({ dataDir: options.dataDir }, dirCheck.loose);
  // Refuse a data dir another live server (or a restore) is using: two writers would corrupt it.
  const releaseDataDir = claimDataDir(options.dataDir, 'server');
  let control: ControlStore | null = null;
  try {
    control = ControlStore.open(options.dataDir);
    if (control.snapshotSecret() === null)
      await control.putSnapshotSecret(randomBytes(SNAPSHOT_SECRET_BYTES));
    const keys = new KeyRing(control);
    const bootstrap = await bootstrapKeys(keys, options.dataDir);
    const workers = await resolveWorkers(control, options.workers);
    const customerTokens = await CustomerTokens.open(control, ENVIRONMENTS);
    return { control, keys, customerTokens, bootstrap, workers, releaseDataDir };
  } catch (error) {
    await control?.close().catch(() => undefined);
    releaseDataDir();
    throw error;
  }
}

/**
 * Answers a request that arrives while the data dir is still being opened, and closes the
 * connection: its framing has not been checked (http/framing.ts), so nothing after its
 * head may be parsed as another request.
 */
function answerStarting(res: uWS.HttpResponse, req: uWS.HttpRequest, obs: Observability): void {
  new Exchange(res, req.getCaseSensitiveMethod(), req.getUrl(), obs).failAndClose('not_ready', {}, [
    ['retry-after', '1'],
  ]);
}

export async function startServer(options: ServerOptions): Promise<RunningServer> {
  // Settings first, then the port, then the data dir: a start that cannot serve (a bad
  // setting, the port is taken) must leave nothing behind, not even a new, empty data dir.
  const processorProblem = processorSettingsProblem(options.processor ?? {});
  if (processorProblem !== null) throw new Error(processorProblem);
  const app = uWS.App();
  const obs = new Observability(options.log ?? silentLogger());
  let frontEnd: FrontEnd | null = null;
  // The dev relay's WebSocket (test events to `tally listen`); refused until ready.
  let relay: DevRelay | null = null;
  const relaySockets = relayBehavior(() => relay);
  app.ws(RELAY_PATH, relaySockets);
  app.any('/*', (res, req) =>
    frontEnd === null ? answerStarting(res, req, obs) : frontEnd.handle(res, req),
  );
  const frontEnds = options.frontEnds ?? 1;
  if (!Number.isInteger(frontEnds) || frontEnds < 1 || frontEnds > FRONT_ENDS_MAX)
    throw new Error(`TALLY_FRONTENDS must be 1 to ${FRONT_ENDS_MAX}, got ${frontEnds}`);
  const eraGroupsProblem =
    options.idempotencyEraGroups === undefined
      ? null
      : idempotencyEraGroupsProblem(options.idempotencyEraGroups);
  if (eraGroupsProblem !== null) throw new Error(eraGroupsProblem);
  const host = options.host ?? DEFAULT_HOST;
  const socket = await listen(app, host, options.port, frontEnds > 1);
  const port = uWS.us_socket_local_port(socket);
  let opened: OpenedDataDir;
  try {
    opened = await openDataDir(options);
  } catch (error) {
    uWS.us_listen_socket_close(socket);
    throw error;
  }
  const { control, keys, customerTokens, bootstrap, workers, releaseDataDir } = opened;
  const clientPolicies = new ClientPolicies();
  for (const environment of ENVIRONMENTS)
    clientPolicies.set(environment, clientSettingsOf(control.latestConfig(environment)?.config));
  let processor: Processor;
  try {
    processor = await startProcessor(options.processor ?? {}, port);
  } catch (error) {
    uWS.us_listen_socket_close(socket);
    await control.close().catch(() => undefined);
    releaseDataDir();
    throw error;
  }

  let pool: ShardPool | null = null;
  const pushChains = new Map<Environment, Promise<unknown>>();
  const pushConfig = (
    environment: Environment,
    config: BillingConfig,
    actor: string,
  ): Promise<{ version: number; pushedAtMs: number; catalog: CatalogAction[] }> => {
    const previous = pushChains.get(environment) ?? Promise.resolve();
    const next = previous.then(async () => {
      // The processor first: a push it fails changes nothing in Tally.
      const version = (control.latestConfig(environment)?.version ?? 0) + 1;
      const catalog = await syncCatalog(processor, environment, version, config).catch(
        (error: unknown) => {
          throw new ProcessorFailure(error instanceof Error ? error.message : String(error));
        },
      );
      const pushedAtMs = Date.now();
      // Both writes are issued in this one turn, so the control store commits them in one
      // transaction (eventTurnBatching, lmdb-env.ts): a crash keeps the version and its
      // audit entry together or neither.
      const stored = control.putConfig(environment, { version, pushedAtMs, config });
      const event = webhooks.configPushed(environment, version, pushedAtMs);
      const entry = {
        action: 'config.push',
        resourceType: 'config',
        resourceId: `v${version}`,
        actor,
        data: { version },
      };
      await Promise.all([stored, event, audit.append(environment, entry, pushedAtMs)]);
      pool?.broadcastConfig(environment, version, config);
      clientPolicies.set(environment, config.client);
      return { version, pushedAtMs, catalog };
    });
    pushChains.set(
      environment,
      next.catch(() => undefined),
    );
    return next;
  };

  const storage = new StorageWatch(
    options.dataDir,
    options.storageReserveBytes ?? STORAGE_RESERVE_BYTES_DEFAULT,
    obs.log,
  );
  await storage.start();
  const rateLimits = options.rateLimits ?? DEFAULT_RATE_LIMITS;
  // Several front ends count a key's requests in one shared window (shared-budgets.ts).
  const budgets = frontEnds > 1 ? new SharedBudgets() : null;
  const front = new FrontEnd(
    keys,
    new RateLimiter(rateLimits, budgets),
    () => pool !== null,
    obs,
    storage,
    {
      policies: clientPolicies,
      tokens: customerTokens,
      addresses: new ClientAddresses(options.clientAddressHeader ?? null),
    },
  );
  frontEnd = front;
  const threads =
    budgets === null
      ? null
      : new FrontEndThreads({
          host,
          port,
          budgets,
          rateLimits,
          logLevel: options.log?.level ?? 'silent',
          handle: (res, req) => front.handle(res, req),
          relay: relaySockets as FrontEndThreadsOptions['relay'],
        });

  const poolOptions = {
    dataDir: options.dataDir,
    workers,
    ...(options.queueMax === undefined ? {} : { queueMax: options.queueMax }),
    ...(options.snapshotEveryBatches === undefined
      ? {}
      : { snapshotEveryBatches: options.snapshotEveryBatches }),
    ...(options.snapshotSliceWork === undefined
      ? {}
      : { snapshotSliceWork: options.snapshotSliceWork }),
    ...(options.idempotencyRunKeys === undefined
      ? {}
      : { idempotencyRunKeys: options.idempotencyRunKeys }),
    ...(options.idempotencyEraGroups === undefined
      ? {}
      : { idempotencyEraGroups: options.idempotencyEraGroups }),
    ...(options.quotas === undefined ? {} : { quotas: options.quotas }),
    frontEnds,
    onErasRebuilt: (shard: number, groups: number, ms: number) =>
      obs.log.info({ shard, groups, ms }, 'idempotency filters rebuilt'),
  };
  let customers: CustomerIndex | null = null;
  const startedAtMs = Date.now();
  const audit = new AuditLog(control.auditDb, control.auditRefsDb);
  const webhooks = new WebhookService(
    options.dataDir,
    control,
    audit,
    options.webhooks ?? {},
    options.log,
  );
  const webhookDeps = {
    webhooks: webhooks.endpoints,
    deliveries: webhooks.deliveries,
    resumeDeliveries: (id: string) => webhooks.resume(id),
  };
  // CPU-heavy side jobs (audit-chain verification, snapshot files) on their own bounded lanes.
  const sideJobs = new SideJobs(options.dataDir, (stream) => audit.lastSeq(stream));
  const verifyAudit = (stream: string): Promise<AuditVerification> => sideJobs.verifyAudit(stream);
  const ready = ShardPool.start(poolOptions).then(async (started) => {
    await appendRecoveredAudits(started, audit);
    for (const environment of ENVIRONMENTS) {
      const latest = control.latestConfig(environment);
      if (latest !== null)
        started.broadcastConfig(environment, latest.version, latest.config as BillingConfig);
    }
    await resyncSandboxCatalog(processor, control, options.log);
    customers = CustomerIndex.open(options.dataDir, workers, (environment, id) =>
      workerOf(logicalShardOf(environment as Environment, id, LOGICAL_SHARDS), workers),
    );
    const apiRouter = buildApiRouter({
      auditQuota: options.quotas?.auditEntriesPerDay ?? UNLIMITED,
      processor,
      pool: started,
      control,
      customers,
      audit,
      verifyAudit,
      pushConfig,
      openApiJson: openApiCache(control),
      customerTokens,
      ...webhookDeps,
    });
    webhooks.start(workers, started.outboxMarks);
    const devRelay = await DevRelay.open(keys, control, webhooks.endpoints);
    webhooks.onRelayEvent = (event) => devRelay.deliver(event);
    devRelay.onListening = (listening) => webhooks.setRelayListening(listening);
    relay = devRelay;
    const commerceDeps = { pool: started, control, audit, processor };
    front.setWebhook(webhookHandler(commerceDeps));
    const adminDeps = {
      keys,
      pool: started,
      audit,
      verifyAudit,
      configVersion: (environment: Environment) => control.latestConfigVersion(environment),
      replaceBootstrapAdmin: (secret: string) => replaceBootstrapAdmin(options.dataDir, secret),
      startedAtMs,
      customerTokens,
    };
    const snapshots = new Snapshots({
      dataDir: options.dataDir,
      pool: started,
      control,
      keys,
      audit,
      assemble: (task) => sideJobs.assembleSnapshot(task),
      record: (action, info, actor) => {
        const fields = {
          action,
          resourceType: 'snapshot',
          resourceId: info.id,
          actor,
          bytes: info.bytes,
          customers: info.customers,
          error: info.error,
        };
        if (info.status === 'failed') obs.log.warn(fields, 'operator action');
        else obs.log.info(fields, 'operator action');
        return audit.append(
          OPERATOR_STREAM,
          {
            action,
            resourceType: 'snapshot',
            resourceId: info.id,
            actor,
            data: {
              bytes: info.bytes,
              customers: info.customers,
              sha256: info.sha256,
              error: info.error,
              journalPositions: info.journalPositions,
            },
          },
          Date.now(),
        );
      },
    });
    const adminRouter = buildAdminRouter(adminDeps, [
      ...snapshotRoutes(adminDeps, snapshots),
      ...webhookAdminRoutes(webhookDeps),
      [
        'GET',
        '/v1/admin/metrics',
        metricsRoute({
          pool: started,
          obs,
          startedAtMs,
          storage,
          webhooksGc: () => webhooks.gcPauses,
          ...(threads === null ? {} : { frontEnds: threads }),
        }),
      ],
    ]);
    front.setRouters(apiRouter, adminRouter);
    // Every front end listens and serves before /healthz says ready.
    if (threads !== null) {
      for (let index = 1; index < frontEnds; index++)
        await threads.start(started.channelsOf(index), keys.list());
      keys.afterChange = (records) => threads.syncKeys(records);
      storage.onPoll = (full, freeBytes) => threads.storage(full, freeBytes);
      threads.storage(storage.full, storage.freeBytes);
      await threads.ready();
    }
    pool = started;
  });

  return {
    port,
    bootstrapKeys: bootstrap,
    stripeSandboxUrl: processor.sandboxUrl,
    ready,
    shardStats: () => pool?.workerStats() ?? [],
    async close() {
      uWS.us_listen_socket_close(socket);
      await ready.catch(() => undefined);
      // Before the shards: their commands must all have reached the workers.
      await threads?.stop();
      (relay as DevRelay | null)?.closeAll();
      // Before the shards: the delivery thread reads their outboxes until it has stopped.
      await webhooks.close();
      if (pool !== null) await pool.stop();
      await sideJobs.destroy();
      storage.stop();
      await processor.close();
      await (customers as CustomerIndex | null)?.close();
      await control.close();
      releaseDataDir();
    },
  };
}

/**
 * The per-request pipeline; everything before the shard hop runs synchronously here. The
 * checks common to all routes (framing, key, rate limit, route, key class, readiness,
 * query string, body) run here; each route's own (path parameter, query and body
 * schemas, exact numbers) then run in `runRoute`, from its record.
 */
class FrontEnd {
  private readonly publicRouter: Router<PublicRoute>;
  private router: Router<Route> | null = null;
  private adminRouter: Router<AdminRoute> | null = null;
  /** The processor's webhook receiver: signed by the processor, not keyed. */
  private webhook: ((ex: Exchange, req: uWS.HttpRequest) => void) | null = null;
  /** Metrics series of each router's first route (a match's index is added to it). */
  private apiSlotBase = 0;
  private adminSlotBase = 0;

  constructor(
    private readonly keys: KeyRing,
    private readonly limiter: RateLimiter,
    isReady: () => boolean,
    private readonly obs: Observability,
    private readonly storage: StorageWatch,
    private readonly clients: ClientAccess,
  ) {
    this.publicRouter = buildPublicRouter({ isReady, storageFull: () => storage.full });
  }

  /**
   * Refuses (503, Retry-After) a request that may write while the disk is below its
   * reserve: every method but GET. Answers and returns true when it refused.
   */
  private refusedForStorage(ex: Exchange): boolean {
    if (!this.storage.full || ex.method === 'GET') return false;
    this.storage.refused++;
    failStorageFull(ex, this.storage.freeBytes);
    return true;
  }

  /** Installs the routers once the shards are up, and gives each route its metrics series. */
  setRouters(api: Router<Route>, admin: Router<AdminRoute>): void {
    this.apiSlotBase = this.obs.metrics.register(api.list());
    this.adminSlotBase = this.obs.metrics.register(admin.list());
    this.router = api;
    this.adminRouter = admin;
  }

  setWebhook(handler: (ex: Exchange, req: uWS.HttpRequest) => void): void {
    this.webhook = handler;
  }

  handle(res: uWS.HttpResponse, req: uWS.HttpRequest): void {
    // Methods are case-sensitive (RFC 9110); the router knows them in upper case.
    const method = req.getCaseSensitiveMethod();
    const url = req.getUrl();
    const ex = new Exchange(res, method, url, this.obs, req.getHeader('x-request-id'));
    ex.guard(() => {
      // First of all, before any route runs: bytes read as a body here might be a second
      // request to a proxy in front, or the other way round (http/framing.ts).
      const framing = framingProblem(req);
      if (framing !== null) return ex.failAndClose(framing.code, { detail: framing.detail });
      this.dispatch(ex, req);
    });
    // Still to answer (a shard's reply, a body to read): watch for the client leaving.
    if (!ex.done) ex.armAbort();
  }

  private dispatch(ex: Exchange, req: uWS.HttpRequest): void {
    const { method, path: url } = ex;
    // The public routes (public-routes.ts), before any key: one comparison per path.
    if (url === '/healthz' || url === '/v1/schema/billing') return this.dispatchPublic(ex, url);
    if (url === STRIPE_WEBHOOK_PATH) {
      ex.slot = this.obs.metrics.fixedSlot(STRIPE_WEBHOOK_PATH, method);
      if (this.refusedForStorage(ex)) return;
      if (this.webhook === null) return ex.fail('not_ready', {}, [['retry-after', '1']]);
      return this.webhook(ex, req);
    }
    if (!url.startsWith('/v1/')) return ex.fail('route_not_found', { method, path: url });
    if (method === 'OPTIONS' && this.preflight(ex, req, url)) return;

    const presented = req.getHeader('x-tally-key') || bearerToken(req.getHeader('authorization'));
    if (presented === '') return this.failUnkeyed(ex, req, 'key_missing');
    const key = this.keys.verify(presented);
    if (key === null) return this.failUnkeyed(ex, req, 'key_invalid');
    // A client key's request is counted per address too (and, for a customer read, per
    // customer further down); `address` is unused for every other key.
    const nowMs = Date.now();
    let address: AddressKey = 0;
    let rate: RateDecision | null;
    if (key.keyClass === 'client') {
      const environment = key.environment as Environment;
      if (!this.admitOrigin(ex, req, environment)) return;
      if (this.limiter.limitsAddresses) address = this.clients.addresses.of(ex.res, req);
      rate = this.limiter.takeClient(key, address, nowMs);
    } else rate = this.limiter.take(key, nowMs);
    if (rate !== null) {
      ex.rate = rate;
      if (!rate.allowed) return failRateLimited(ex, rate);
    }
    if (url.startsWith('/v1/admin/')) return this.dispatchAdmin(ex, req, key);
    if (key.environment === null) return ex.fail('environment_key_required');
    if (this.router === null) return ex.fail('not_ready', {}, [['retry-after', '1']]);

    const found = this.router.lookup(method, url);
    if (found.kind === 'not_found') return ex.fail('route_not_found', { method, path: url });
    if (found.kind === 'method_not_allowed')
      return ex.fail('method_not_allowed', { method, path: url }, [['allow', found.allow]]);
    const { route, params } = found.match;
    ex.slot = this.apiSlotBase + found.match.index;
    if (route.record.keys === 'server' && key.keyClass !== 'server')
      return ex.fail('server_key_required');
    if (this.refusedForStorage(ex)) return;

    const query = routeQuery(req.getQuery() ?? '', route.takesQuery);
    if (!query.ok) return ex.fail('invalid_query', { detail: query.message });
    const environment = key.environment;
    if (route.record.browser === true && key.keyClass === 'client') {
      const customerId = query.params['customerId'];
      // Without one, the route's query schema answers 400 below.
      if (customerId !== undefined && !this.admitCustomer(ex, req, key, address, customerId, nowMs))
        return;
    }
    if (!route.hasBody)
      return runRoute(route, ex, key, environment, params, query.params, undefined, '');
    if (!checkBodyHeaders(ex, req.getHeader('content-type'), req.getHeader('content-length')))
      return;
    readJsonBody(ex, (body, bodyText) =>
      runRoute(route, ex, key, environment, params, query.params, body, bodyText),
    );
  }

  /**
   * Answers the CORS preflight of a browser route (docs/browser.md): 204 with the allow
   * headers when some environment allows the page's origin, else 403. Returns false, to
   * let the request be handled as any other (a key is then required), on every other
   * path: a server route never answers a preflight with allow headers, so no browser
   * sends it a keyed request.
   */
  private preflight(ex: Exchange, req: uWS.HttpRequest, url: string): boolean {
    const found = this.router?.lookup('GET', url);
    if (found?.kind !== 'match' || found.match.route.record.browser !== true) return false;
    const origin = req.getHeader('origin');
    // Not a CORS preflight (no Origin): say which methods the path takes.
    if (origin === '') {
      ex.send(204, '', [['allow', CORS_ALLOW_METHODS]]);
      return true;
    }
    const allowed = this.clients.policies.replyHeaderForAny(origin);
    if (allowed === null) {
      ex.fail('origin_not_allowed', { origin, environment: 'test or live' });
      return true;
    }
    ex.cors = allowed;
    ex.send(204, '', PREFLIGHT_HEADERS);
    return true;
  }

  /**
   * A request without a valid key: when it comes from a page an environment allows, the
   * page may read the 401 (rather than see a network error).
   */
  private failUnkeyed(ex: Exchange, req: uWS.HttpRequest, code: 'key_missing' | 'key_invalid') {
    const origin = req.getHeader('origin');
    if (origin !== '') ex.cors = this.clients.policies.replyHeaderForAny(origin);
    ex.fail(code);
  }

  /**
   * A client key's request from a page (it sent `Origin`): refused (403, no CORS headers,
   * not counted) unless the key's environment allows the origin; allowed, every reply
   * carries the headers that let the page read it. Requests without `Origin` (not a
   * browser's) pass. Returns false when it answered.
   */
  private admitOrigin(ex: Exchange, req: uWS.HttpRequest, environment: Environment): boolean {
    const origin = req.getHeader('origin');
    if (origin === '') return true;
    const allowed = this.clients.policies.replyHeader(environment, origin);
    if (allowed === null) {
      ex.fail('origin_not_allowed', { origin, environment });
      return false;
    }
    ex.cors = allowed;
    return true;
  }

  /**
   * The customer checks of a client-key customer read: its token (required or not, by the
   * environment's configuration), then the customer's rate budget. Returns false when it
   * answered.
   */
  private admitCustomer(
    ex: Exchange,
    req: uWS.HttpRequest,
    key: KeyRecord,
    address: AddressKey,
    customerId: string,
    nowMs: number,
  ): boolean {
    const problem = this.customerTokenProblem(
      req,
      key.environment as Environment,
      customerId,
      nowMs,
    );
    if (problem !== null) {
      // Refused before it is served: it counts nowhere, so it carries no rate headers.
      if (ex.rate !== null) this.limiter.untakeClient(key, address, nowMs);
      ex.rate = null;
      ex.fail(problem, { customerId, environment: key.environment as Environment });
      return false;
    }
    if (ex.rate === null) return true;
    const rate = this.limiter.takeCustomer(key, address, customerId, ex.rate, nowMs);
    ex.rate = rate;
    if (rate.allowed) return true;
    failRateLimited(ex, rate);
    return false;
  }

  /** Why the request's customer token does not let it read `customerId`, or null when it does. */
  private customerTokenProblem(
    req: uWS.HttpRequest,
    environment: Environment,
    customerId: string,
    nowMs: number,
  ): ErrorCode | null {
    const token = req.getHeader('x-tally-customer-token');
    if (token === '')
      return this.clients.policies.requiresCustomerToken(environment)
        ? 'customer_token_required'
        : null;
    const verified = this.clients.tokens.verify(environment, token, nowMs);
    if (typeof verified === 'string') return verified;
    return verified.customerId === customerId ? null : 'customer_token_mismatch';
  }

  /**
   * A public route: GET only, like every route another method is a 405 with `Allow`; no key, no
   * query.
   */
  private dispatchPublic(ex: Exchange, url: FixedRoute): void {
    const { method } = ex;
    ex.slot = this.obs.metrics.fixedSlot(url, method);
    const found = this.publicRouter.lookup(method, url);
    if (found.kind === 'not_found') return ex.fail('route_not_found', { method, path: url });
    if (found.kind === 'method_not_allowed')
      return ex.fail('method_not_allowed', { method, path: url }, [['allow', found.allow]]);
    runRoute(found.match.route, ex, null, null, found.match.params, NO_QUERY, undefined, '');
  }

  /** Operator routes: only the operator key, whatever the route; then route, query, body. */
  private dispatchAdmin(ex: Exchange, req: uWS.HttpRequest, key: KeyRecord): void {
    const { method, path: url } = ex;
    if (key.keyClass !== 'admin') return ex.fail('operator_key_required');
    if (this.adminRouter === null) return ex.fail('not_ready', {}, [['retry-after', '1']]);
    const found = this.adminRouter.lookup(method, url);
    if (found.kind === 'not_found') return ex.fail('route_not_found', { method, path: url });
    if (found.kind === 'method_not_allowed')
      return ex.fail('method_not_allowed', { method, path: url }, [['allow', found.allow]]);
    const { route, params } = found.match;
    ex.slot = this.adminSlotBase + found.match.index;
    if (this.refusedForStorage(ex)) return;
    const query = routeQuery(req.getQuery() ?? '', route.takesQuery);
    if (!query.ok) return ex.fail('invalid_query', { detail: query.message });
    if (!route.hasBody) return runRoute(route, ex, key, null, params, query.params, undefined, '');
    if (!checkBodyHeaders(ex, req.getHeader('content-type'), req.getHeader('content-length')))
      return;
    readJsonBody(ex, (body, bodyText) =>
      runRoute(route, ex, key, null, params, query.params, body, bodyText),
    );
  }
}

/** What the front end needs to serve client keys to web pages. */
interface ClientAccess {
  readonly policies: ClientPolicies;
  readonly tokens: CustomerTokens;
  readonly addresses: ClientAddresses;
}

/** The allow headers of a preflight answer, beside `access-control-allow-origin`. */
const PREFLIGHT_HEADERS: Headers = [
  ['access-control-allow-methods', CORS_ALLOW_METHODS],
  ['access-control-allow-headers', CORS_ALLOW_HEADERS],
  ['access-control-max-age', String(CORS_MAX_AGE_SEC)],
];

/** 429 with Retry-After, naming the budget that ran out. */
function failRateLimited(ex: Exchange, rate: RateDecision): void {
  ex.fail('rate_limited', { limit: rate.limit, scope: rate.scope }, [
    ['retry-after', String(rate.retryAfterSec)],
  ]);
}

/** The `client` section of a stored configuration (undefined before the first push). */
function clientSettingsOf(config: unknown): ClientSettings | undefined {
  return (config as BillingConfig | undefined)?.client;
}

/** The query of a public route: none is read. */
const NO_QUERY: Readonly<Record<string, string>> = Object.freeze({});

/**
 * The embedded sandbox starts empty at every start: it is given the catalog of the stored
 * configurations again, so checkout works without a new push. (Stripe keeps its own.)
 */
async function resyncSandboxCatalog(
  processor: Processor,
  control: ControlStore,
  log: Logger | undefined,
): Promise<void> {
  if (processor.sandboxUrl === null) return;
  for (const environment of ENVIRONMENTS) {
    const latest = control.latestConfig(environment);
    if (latest === null) continue;
    await syncCatalog(processor, environment, latest.version, latest.config as BillingConfig).catch(
      (error: unknown) => {
        log?.warn(
          { environment, error: error instanceof Error ? error.message : String(error) },
          'stripe sandbox catalog sync failed',
        );
      },
    );
  }
}

/**
 * Before serving: every audit entry a shard stored with its change but the chain lacks (the
 * process died after the change was durable and before its entry was) is appended now, in
 * the order the changes were decided, with the time they were decided; then the shards
 * may forget their copies. Entries the chain already holds are only forgotten.
 */
async function appendRecoveredAudits(pool: ShardPool, audit: AuditLog): Promise<void> {
  const recovered = pool
    .takeRecoveredAudits()
    .sort((a, b) => a.atMs - b.atMs || (a.ref < b.ref ? -1 : 1));
  for (const entry of recovered) {
    const { ref, environment, action, resourceType, resourceId, actor, data, atMs } = entry;
    if (!audit.hasRef(ref))
      await audit.append(environment, { action, resourceType, resourceId, actor, data }, atMs, ref);
  }
  for (const entry of recovered)
    pool.auditsRecorded(entry.environment, entry.resourceId, [entry.ref]);
}
