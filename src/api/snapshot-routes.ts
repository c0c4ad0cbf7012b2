/**
 * The operator's snapshot routes: create (202, runs in the background), list, one
 * snapshot's state and progress, download of a complete file (streamed, with its SHA-256
 * in a header so the client can check what it saved), delete, and the export of the
 * snapshot secret that authenticates the files (docs/security.md).
 */
import fs from 'node:fs';
import { decodeComponent } from '../http/query.js';
import { streamFile } from '../http/file-stream.js';
import { SnapshotBusyError, type SnapshotInfo, type Snapshots } from '../snapshots.js';
import {
  auditOperator,
  type AdminContext,
  type AdminDeps,
  type AdminRouteEntry,
} from './admin-routes.js';
import type { ParamReader } from './route-record.js';

/** A snapshot id path segment (`snap_…`). */
const snapshotId: ParamReader = (raw, ex) => {
  const id = decodeComponent(raw, false);
  if (id === null || !/^snap_[A-Za-z0-9_]{1,64}$/.test(id)) {
    ex.fail('invalid_query', { detail: 'id must be a snapshot id (snap_…)' });
    return null;
  }
  return id;
};

export function snapshotRoutes(
  deps: Pick<AdminDeps, 'audit'>,
  snapshots: Snapshots,
): AdminRouteEntry[] {
  /** The snapshot the path names, or null after answering 404. */
  const found = (ctx: AdminContext): SnapshotInfo | null => {
    const id = ctx.param;
    const info = snapshots.get(id);
    if (info === undefined) ctx.ex.fail('snapshot_not_found', { id });
    return info ?? null;
  };
  return [
    [
      'GET',
      '/v1/admin/snapshot-secret',
      {
        keys: 'operator',
        audited: false,
        handle(ctx) {
          ctx.ex.logInfo('operator action', {
            action: 'snapshot.secret.export',
            resourceType: 'snapshot',
            actor: ctx.key.id,
          });
          ctx.ex.json(200, { secret: snapshots.secretHex() });
        },
      },
    ],
    [
      'POST',
      '/v1/admin/snapshots',
      {
        keys: 'operator',
        audited: true,
        handle(ctx) {
          try {
            const info = snapshots.create(ctx.key.id);
            ctx.ex.logInfo('snapshot started', { resourceId: info.id, actor: ctx.key.id });
            ctx.ex.json(202, info);
          } catch (error) {
            if (!(error instanceof SnapshotBusyError)) throw error;
            ctx.ex.fail('snapshot_in_progress');
          }
        },
      },
    ],
    [
      'GET',
      '/v1/admin/snapshots',
      {
        keys: 'operator',
        audited: false,
        handle(ctx) {
          ctx.ex.json(200, { data: snapshots.list() });
        },
      },
    ],
    [
      'GET',
      '/v1/admin/snapshots/:id',
      {
        keys: 'operator',
        param: snapshotId,
        audited: false,
        handle(ctx) {
          const info = found(ctx);
          if (info !== null) ctx.ex.json(200, info);
        },
      },
    ],
    [
      'GET',
      '/v1/admin/snapshots/:id/file',
      {
        keys: 'operator',
        param: snapshotId,
        audited: false,
        handle(ctx) {
          const info = found(ctx);
          if (info === null) return;
          const { id } = info;
          if (info.status !== 'complete' || info.sha256 === null)
            return ctx.ex.fail('snapshot_not_ready', { id, status: info.status });
          const file = snapshots.fileOf(id);
          const size = fs.statSync(file, { throwIfNoEntry: false })?.size;
          if (size === undefined) return ctx.ex.fail('snapshot_not_found', { id });
          streamFile(ctx.ex, file, size, [
            ['content-type', 'application/octet-stream'],
            ['content-disposition', `attachment; filename="${id}.tsnap"`],
            ['x-tally-snapshot-sha256', info.sha256],
          ]);
        },
      },
    ],
    [
      'DELETE',
      '/v1/admin/snapshots/:id',
      {
        keys: 'operator',
        param: snapshotId,
        audited: true,
        handle(ctx) {
          const id = ctx.param;
          if (snapshots.get(id)?.status === 'running')
            return ctx.ex.fail('snapshot_not_ready', { id, status: 'running' });
          snapshots.remove(id).then(
            (removed) => {
              if (removed === undefined) return ctx.ex.fail('snapshot_not_found', { id });
              auditOperator(
                deps,
                ctx,
                { action: 'snapshot.delete', resourceType: 'snapshot', resourceId: id, data: {} },
                null,
                Promise.resolve(),
                () => ctx.ex.send(204, ''),
              );
            },
            (error: unknown) => ctx.ex.failInternal(error),
          );
        },
      },
    ],
  ];
}
