/**
 * The operator API under `/v1/admin/…` (docs/api.md, Operator API): key management, the
 * operator audit stream, status, snapshots and metrics. Only the operator key (`ak_…`, in
 * `x-tally-key` or `Authorization: Bearer`) reaches these routes; the front end answers
 * 403 to every environment key before a handler runs, so no environment key — not even a
 * live server key — can export or manage another environment's data.
 *
 * Every operator mutation (key create/revoke/rotate, snapshot) is written to the
 * operator audit stream (a hash chain of its own, `operator`) before it is acknowledged;
 * key changes of an environment are also written to that environment's audit log, so
 * its owners see them in `GET /v1/audit`.
 */
import type { Environment } from '../../actors/protocol.js';
import type { AuditInput, AuditLog, AuditVerification } from '../../storage/audit-log.js';
import type { KeyRecord } from '../../storage/control-store.js';
import type { CustomerTokens } from '../auth/customer-token.js';
import { issueKey, type KeyRing } from '../auth/keys.js';
import { decodeComponent } from '../http/query.js';
import type { Router } from '../http/router.js';
import type { ShardPool } from '../shard-pool.js';
import { auditPage, failVerify } from './audit-page.js';
import {
  routerOf,
  type AnyRouteRecord,
  type CompiledRoute,
  type Method,
  type OperatorCaller,
  type ParamReader,
  type RouteInput,
  type RouteRecord,
} from './route-record.js';
import {
  keyCreateSchema,
  operatorAuditQuerySchema,
  tokenSecretRotateSchema,
  type AuditQuery,
  type KeyCreateBody,
  type TokenSecretRotateBody,
} from './validation.js';

/** The operator audit stream's chain name in the audit log. */
export const OPERATOR_STREAM = 'operator';

/** What an operator route's handler receives. */
export type AdminContext<B = unknown, Q = unknown> = RouteInput<B, Q, OperatorCaller>;

/** One operator route (its key class is always `operator`). */
export type AdminRouteRecord = AnyRouteRecord<AdminDeps, OperatorCaller>;

export type AdminRoute = CompiledRoute<AdminDeps, OperatorCaller>;

/**
 * A route other modules contribute (snapshots, metrics): `[method, pattern, the rest of its
 * record]`.
 */
export type AdminRouteEntry = readonly [Method, string, Omit<AdminRouteRecord, 'method' | 'path'>];

export interface AdminDeps {
  readonly keys: KeyRing;
  readonly pool: ShardPool;
  readonly audit: AuditLog;
  readonly verifyAudit: (stream: string) => Promise<AuditVerification>;
  /** Configuration version per environment (0 = none pushed). */
  readonly configVersion: (environment: Environment) => number;
  /** Puts a new operator key in the data dir's bootstrap-keys.json; false when there is none. */
  readonly replaceBootstrapAdmin: (secret: string) => boolean;
  readonly startedAtMs: number;
  /** The customer-token signing secrets (rotated here). */
  readonly customerTokens: CustomerTokens;
}

/** The public view of a key: never its secret or hash. */
export function keyView(record: KeyRecord): Record<string, unknown> {
  return {
    id: record.id,
    prefix: record.prefix,
    environment: record.environment,
    class: record.keyClass === 'admin' ? 'operator' : record.keyClass,
    createdAt: new Date(record.createdAtMs).toISOString(),
    revokedAt: record.revokedAtMs === null ? null : new Date(record.revokedAtMs).toISOString(),
  };
}

/**
 * Writes `input` (actor = the operator key's id) to the operator stream and, for an
 * environment's key, to that environment's log; logs it (ids only, never a secret or the
 * entry's data); then answers with the mutation's result. `mutation` is a control-store
 * write the caller has just issued, in this same turn: the entries are issued before the
 * turn ends, so the control store commits the change and its entries in one transaction
 * (eventTurnBatching, lmdb-env.ts) and a crash keeps both or neither. A mutation outside
 * the control store (a snapshot file) passes its settled result. A failed write answers 500.
 */
export function auditOperator<T>(
  deps: Pick<AdminDeps, 'audit'>,
  ctx: Pick<AdminContext, 'ex' | 'key'>,
  input: Omit<AuditInput, 'actor'>,
  environment: Environment | null,
  mutation: Promise<T>,
  answer: (result: T) => void,
): void {
  const entry = { ...input, actor: ctx.key.id };
  const now = Date.now();
  const writes = [deps.audit.append(OPERATOR_STREAM, entry, now)];
  if (environment !== null) writes.push(deps.audit.append(environment, entry, now));
  Promise.all([mutation, ...writes]).then(
    ([result]) => {
      ctx.ex.logInfo('operator action', {
        action: input.action,
        resourceType: input.resourceType,
        resourceId: input.resourceId,
        actor: ctx.key.id,
        environment,
      });
      answer(result);
    },
    (error: unknown) => ctx.ex.failInternal(error),
  );
}

/** A key id path segment: 1 to 255 characters once decoded. */
const keyIdParam: ParamReader = (raw, ex) => {
  const id = decodeComponent(raw, false);
  if (id === null || id.length === 0 || id.length > 255) {
    ex.fail('invalid_query', { detail: 'id must be 1 to 255 characters' });
    return null;
  }
  return id;
};

/** POST /v1/admin/keys: a new environment key, shown once in the answer. */
function createKey(ctx: AdminContext<KeyCreateBody>, deps: AdminDeps): void {
  const { environment } = ctx.body;
  const issued = issueKey(ctx.body.class, environment, Date.now());
  const audit = {
    action: 'key.create',
    resourceType: 'key',
    resourceId: issued.record.id,
    data: { environment, class: ctx.body.class, prefix: issued.record.prefix },
  };
  auditOperator(deps, ctx, audit, environment, deps.keys.add(issued.record), () =>
    ctx.ex.json(201, { ...keyView(issued.record), key: issued.secret }),
  );
}

/** DELETE /v1/admin/keys/{id}: the key answers 401 from the next request on. */
function revokeKey(ctx: AdminContext, deps: AdminDeps): void {
  const id = ctx.param;
  const record = deps.keys.find(id);
  if (record === undefined) return ctx.ex.fail('key_not_found', { id });
  // Revoking the operator key by id would lock every operator out; rotating replaces it.
  if (record.keyClass === 'admin' && record.revokedAtMs === null)
    return ctx.ex.fail('operator_key_not_revocable');
  // Said, not hidden behind a 200: the caller may be revoking the wrong key.
  if (record.revokedAtMs !== null)
    return ctx.ex.fail('key_already_revoked', {
      id,
      revokedAt: new Date(record.revokedAtMs).toISOString(),
    });
  const audit = {
    action: 'key.revoke',
    resourceType: 'key',
    resourceId: id,
    data: { environment: record.environment, class: record.keyClass, prefix: record.prefix },
  };
  auditOperator(deps, ctx, audit, record.environment, deps.keys.revoke(id, Date.now()), (revoked) =>
    ctx.ex.json(200, keyView(revoked ?? record)),
  );
}

/**
 * POST /v1/admin/keys/rotate-admin: issues a new operator key and revokes the one that
 * made the request, online. Both writes and the audit entry are issued in one turn, so
 * they commit in one transaction: a crash leaves the old key alone or the new one, never
 * none and never an unaudited rotation. Once committed, the data dir's bootstrap-keys.json
 * (if it is still there) gets the new key, so it never hands out a revoked one.
 */
function rotateAdmin(ctx: AdminContext, deps: AdminDeps): void {
  const issued = issueKey('admin', null, Date.now());
  const rotated = Promise.all([
    deps.keys.add(issued.record),
    deps.keys.revoke(ctx.key.id, Date.now()),
  ]);
  const audit = {
    action: 'key.rotate',
    resourceType: 'key',
    resourceId: issued.record.id,
    data: { revoked: ctx.key.id, prefix: issued.record.prefix },
  };
  auditOperator(deps, ctx, audit, null, rotated, () => {
    updateBootstrapFile(deps, ctx, issued.secret);
    ctx.ex.json(201, { ...keyView(issued.record), key: issued.secret, revoked: ctx.key.id });
  });
}

/**
 * The rotation is committed whatever happens here: a file that cannot be rewritten is
 * logged (never its content) and the new key is still answered.
 */
function updateBootstrapFile(deps: AdminDeps, ctx: AdminContext, secret: string): void {
  try {
    if (deps.replaceBootstrapAdmin(secret))
      ctx.ex.logInfo('bootstrap keys file updated with the new operator key', {});
  } catch (error) {
    ctx.ex.logWarn('bootstrap keys file not updated: it still holds the revoked operator key', {
      reason: error instanceof Error ? error.message : String(error),
    });
  }
}

/**
 * POST /v1/admin/customer-token-secret/rotate: a new signing secret for the environment's
 * customer tokens. Tokens the replaced secret signed stay valid (for at most their
 * lifetime, an hour); those of the secret before it stop working at once. Written
 * durably, with its audit entries, before the answer.
 */
function rotateTokenSecret(ctx: AdminContext<TokenSecretRotateBody>, deps: AdminDeps): void {
  const { environment } = ctx.body;
  const { generation, stored } = deps.customerTokens.rotate(environment, Date.now());
  const audit = {
    action: 'customer-token-secret.rotate',
    resourceType: 'customer-token-secret',
    resourceId: `${environment}:${generation}`,
    data: { environment, generation },
  };
  auditOperator(deps, ctx, audit, environment, stored, (rotated) =>
    ctx.ex.json(200, {
      environment,
      generation,
      previousValidUntil: new Date(rotated.previousValidUntilMs).toISOString(),
    }),
  );
}

/** GET /v1/admin/status: health, shards, journal sizes, snapshots, uptime. */
function status(ctx: AdminContext, deps: AdminDeps): void {
  const depths = deps.pool.queueDepths();
  deps.pool.liveStats().then(
    (shards) => {
      const now = Date.now();
      ctx.ex.json(200, {
        ok: true,
        startedAt: new Date(deps.startedAtMs).toISOString(),
        uptimeSec: Math.floor((now - deps.startedAtMs) / 1000),
        node: process.version,
        workers: shards.length,
        environments: {
          test: { configVersion: deps.configVersion('test') },
          live: { configVersion: deps.configVersion('live') },
        },
        shards: shards.map((s, index) => ({
          index,
          customers: s.customers,
          queueDepth: depths[index] ?? 0,
          idempotencyEntries: s.idempotencyEntries,
          journalRecords: s.journalRecords,
          journalBytes: s.usedBytes,
          lastSeq: s.lastSeq,
          snapshotSeq: s.snapshotSeq,
          lastSnapshotAt:
            s.lastSnapshotAtMs === null ? null : new Date(s.lastSnapshotAtMs).toISOString(),
        })),
        customers: shards.reduce((sum, s) => sum + s.customers, 0),
      });
    },
    (error: unknown) => ctx.ex.failInternal(error),
  );
}

function route<B = undefined, Q = undefined>(
  record: RouteRecord<AdminDeps, B, Q, OperatorCaller>,
): AdminRouteRecord {
  return record;
}

/** The built-in operator routes, in router order. */
export const ADMIN_ROUTES: readonly AdminRouteRecord[] = [
  route({
    method: 'GET',
    path: '/v1/admin/status',
    keys: 'operator',
    audited: false,
    handle: status,
  }),
  route({
    method: 'GET',
    path: '/v1/admin/keys',
    keys: 'operator',
    audited: false,
    handle: (ctx, deps) => ctx.ex.json(200, { data: deps.keys.list().map(keyView) }),
  }),
  route<KeyCreateBody>({
    method: 'POST',
    path: '/v1/admin/keys',
    keys: 'operator',
    audited: true,
    body: { schema: keyCreateSchema, numbers: 'as-parsed' },
    handle: createKey,
  }),
  route({
    method: 'POST',
    path: '/v1/admin/keys/rotate-admin',
    keys: 'operator',
    audited: true,
    handle: rotateAdmin,
  }),
  route<TokenSecretRotateBody>({
    method: 'POST',
    path: '/v1/admin/customer-token-secret/rotate',
    keys: 'operator',
    audited: true,
    body: { schema: tokenSecretRotateSchema, numbers: 'as-parsed' },
    handle: rotateTokenSecret,
  }),
  route({
    method: 'DELETE',
    path: '/v1/admin/keys/:id',
    keys: 'operator',
    param: keyIdParam,
    audited: true,
    handle: revokeKey,
  }),
  route<undefined, AuditQuery>({
    method: 'GET',
    path: '/v1/admin/audit',
    keys: 'operator',
    query: operatorAuditQuerySchema,
    audited: false,
    handle: (ctx, deps) => auditPage(ctx.ex, deps.audit, OPERATOR_STREAM, ctx.query),
  }),
  route({
    method: 'GET',
    path: '/v1/admin/audit/verify',
    keys: 'operator',
    audited: false,
    handle: (ctx, deps) =>
      deps.verifyAudit(OPERATOR_STREAM).then(
        (verdict) => ctx.ex.json(200, verdict),
        (error: unknown) => failVerify(ctx.ex, error),
      ),
  }),
];

/**
 * Every operator route: the built-in ones and those `extra` contributes, their schemas compiled.
 */
export function buildAdminRouter(
  deps: AdminDeps,
  extra: readonly AdminRouteEntry[] = [],
): Router<AdminRoute> {
  const records = [
    ...ADMIN_ROUTES,
    ...extra.map(([method, path, rest]): AdminRouteRecord => ({ method, path, ...rest })),
  ];
  for (const record of records)
    if (record.keys !== 'operator')
      throw new Error(`${record.method} ${record.path}: operator routes take the operator key`);
  return routerOf(records, deps);
}
