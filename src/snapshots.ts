/**
 * Online snapshots (operator API): a consistent cut of all actor state across every
 * shard, taken without stopping traffic, written as one self-checking file under
 * `<dataDir>/snapshots/` for the operator to download and later restore offline.
 *
 * The cut is one point in the command stream: the front end hands every worker its cut
 * message right after the batches already queued, so every mutation acknowledged before
 * the request is in the snapshot and nothing submitted after it is. The control state
 * (keys, configuration versions, audit chains) is noted at the same moment; configurations
 * and audit entries are append-only, so noting their positions is enough. The shards
 * write their parts while serving; a piscina task splices everything into the file.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { CutResult } from '../actors/protocol.js';
import type { AuditLog } from '../storage/audit-log.js';
import type { ControlStore } from '../storage/control-store.js';
import { SNAPSHOT_FILE_FORMAT, type SnapshotHeader } from '../storage/snapshot-file.js';
import type { SnapshotAssembled, SnapshotAssembleTask } from '../storage/snapshot-assemble-task.js';
import type { KeyRing } from './auth/keys.js';
import type { ShardPool } from './shard-pool.js';

export interface SnapshotInfo {
  readonly id: string;
  status: 'running' | 'complete' | 'failed';
  readonly createdAt: string;
  completedAt: string | null;
  bytes: number | null;
  customers: number | null;
  sha256: string | null;
  error: string | null;
  progress: { customersDone: number; customersTotal: number };
  journalPositions: readonly number[] | null;
}

export interface SnapshotDeps {
  readonly dataDir: string;
  readonly pool: ShardPool;
  readonly control: ControlStore;
  readonly keys: KeyRing;
  readonly audit: AuditLog;
  readonly assemble: (task: SnapshotAssembleTask) => Promise<SnapshotAssembled>;
  /** Records a finished or failed snapshot in the operator audit stream. */
  readonly record: (action: string, info: SnapshotInfo, actor: string) => Promise<unknown>;
}

const META_KEY = 'snapshots';

export class SnapshotBusyError extends Error {}

export class Snapshots {
  private readonly dir: string;
  private readonly known: SnapshotInfo[];
  private running: SnapshotInfo | null = null;

  constructor(private readonly deps: SnapshotDeps) {
    this.dir = path.join(deps.dataDir, 'snapshots');
    fs.mkdirSync(this.dir, { recursive: true });
    // Pieces of a snapshot that a crash interrupted are never listed; clear them away.
    for (const name of fs.readdirSync(this.dir)) {
      if (name.endsWith('.parts') || name.endsWith('.tmp'))
        fs.rmSync(path.join(this.dir, name), { recursive: true, force: true });
    }
    const stored = deps.control.getMeta(META_KEY);
    this.known = Array.isArray(stored) ? (stored as SnapshotInfo[]) : [];
  }

  /**
   * The data dir's snapshot secret in hex, for the operator to keep apart from the files
   * (a restore authenticates a file with it). Created at the server's start.
   */
  secretHex(): string {
    const secret = this.deps.control.snapshotSecret();
    if (secret === null) throw new Error('the data dir has no snapshot secret');
    return secret.toString('hex');
  }

  /** Newest first, the running one included. */
  list(): SnapshotInfo[] {
    return [...(this.running === null ? [] : [this.running]), ...[...this.known].reverse()];
  }

  get(id: string): SnapshotInfo | undefined {
    return this.list().find((info) => info.id === id);
  }

  /** Where a complete snapshot's file is. */
  fileOf(id: string): string {
    return path.join(this.dir, `${id}.tsnap`);
  }

  /**
   * Takes the cut now and writes the file in the background; the returned info updates
   * as it progresses. Throws SnapshotBusyError while another snapshot is running.
   */
  create(actor: string): SnapshotInfo {
    if (this.running !== null)
      throw new SnapshotBusyError(`snapshot ${this.running.id} is still running`);
    const nowMs = Date.now();
    const id =
      `snap_${new Date(nowMs).toISOString().replace(/[-:.]/g, '').slice(0, 15)}Z_` +
      `${randomBytes(3).toString('hex')}`;
    const info: SnapshotInfo = {
      id,
      status: 'running',
      createdAt: new Date(nowMs).toISOString(),
      completedAt: null,
      bytes: null,
      customers: null,
      sha256: null,
      error: null,
      progress: { customersDone: 0, customersTotal: 0 },
      journalPositions: null,
    };
    const partsDir = path.join(this.dir, `${id}.parts`);
    fs.mkdirSync(partsDir);
    const { control, audit, keys, pool } = this.deps;
    // Everything below up to pool.cut runs in this turn: it is one point in time.
    const header: Omit<SnapshotHeader, 'journalPositions'> = {
      k: 'header',
      formatVersion: SNAPSHOT_FILE_FORMAT,
      id,
      createdAtMs: nowMs,
      workers: pool.workerCount,
      environments: ['test', 'live'],
      configVersions: {
        test: control.latestConfigVersion('test'),
        live: control.latestConfigVersion('live'),
      },
      auditSeqs: {
        test: audit.lastSeq('test'),
        live: audit.lastSeq('live'),
        operator: audit.lastSeq('operator'),
      },
    };
    const keyRecords = keys.list();
    const partOf = (index: number): string => path.join(partsDir, `shard-${index}.part`);
    const cut = pool.cut(id, partOf, (done, total) => {
      info.progress = { customersDone: done, customersTotal: total };
    });
    this.running = info;
    void this.complete(
      info,
      cut,
      { ...header, journalPositions: [] },
      keyRecords,
      partOf,
      partsDir,
      actor,
    );
    return info;
  }

  private async complete(
    info: SnapshotInfo,
    cut: Promise<CutResult[]>,
    header: SnapshotHeader,
    keyRecords: ReturnType<KeyRing['list']>,
    partOf: (index: number) => string,
    partsDir: string,
    actor: string,
  ): Promise<void> {
    try {
      const results = await cut;
      info.journalPositions = results.map((r) => r.position);
      const assembled = await this.deps.assemble({
        dataDir: this.deps.dataDir,
        file: this.fileOf(info.id),
        header: { ...header, journalPositions: info.journalPositions },
        keys: keyRecords,
        parts: results.map((r, index) => ({
          path: partOf(index),
          frames: r.frames,
          customers: r.customers,
          bytes: r.bytes,
        })),
      });
      Object.assign(info, {
        status: 'complete',
        bytes: assembled.bytes,
        customers: assembled.customers,
        sha256: assembled.sha256,
      });
      info.progress = { customersDone: assembled.customers, customersTotal: assembled.customers };
    } catch (error) {
      Object.assign(info, {
        status: 'failed',
        error: error instanceof Error ? error.message : String(error),
      });
      fs.rmSync(this.fileOf(info.id), { force: true });
    }
    info.completedAt = new Date().toISOString();
    fs.rmSync(partsDir, { recursive: true, force: true });
    this.known.push(info);
    this.running = null;
    try {
      await this.deps.control.putMeta(META_KEY, this.known);
      await this.deps.record(
        info.status === 'complete' ? 'snapshot.create' : 'snapshot.fail',
        info,
        actor,
      );
    } catch (error) {
      const line = {
        level: 'error',
        msg: 'snapshot bookkeeping failed',
        id: info.id,
        error: String(error),
      };
      process.stderr.write(`${JSON.stringify(line)}\n`);
    }
  }

  /** Removes a finished snapshot's file and listing; answers it, or undefined if there is none. */
  async remove(id: string): Promise<SnapshotInfo | undefined> {
    const index = this.known.findIndex((info) => info.id === id);
    const info = this.known[index];
    if (info === undefined) return undefined;
    this.known.splice(index, 1);
    await this.deps.control.putMeta(META_KEY, this.known);
    fs.rmSync(this.fileOf(id), { force: true });
    return info;
  }
}
