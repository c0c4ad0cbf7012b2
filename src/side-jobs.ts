/**
 * CPU-heavy side jobs off the front end's event loop, on piscina threads: audit-chain
 * verification and operator snapshot files. Each kind has its own lane (one thread,
 * started on first use), so a burst of verifications in one environment never delays an
 * operator's snapshot, and the verification lane is bounded:
 *
 * - a verification of a chain whose last entry has not changed since a verdict at most
 *   VERIFY_CACHE_MS old answers that verdict without walking the chain again;
 * - requests for a chain while a walk of it is queued or running share that walk;
 * - at most VERIFY_QUEUE_MAX distinct walks wait or run at once; past that the call
 *   fails with SideJobsBusyError (the route answers 503 with Retry-After).
 *
 * So sixty verifications of the test chain cost one walk, and a live verification waits
 * behind at most a few others.
 */
import { Piscina } from 'piscina';
import type { AuditVerification } from '../storage/audit-log.js';
import type { AuditVerifyTask } from '../storage/audit-verify-task.js';
import type { SnapshotAssembled, SnapshotAssembleTask } from '../storage/snapshot-assemble-task.js';

/** Distinct chain walks waiting or running at once before verifications are refused. */
export const VERIFY_QUEUE_MAX = 8;
/** How long a verdict for an unchanged chain is answered again without a new walk. */
export const VERIFY_CACHE_MS = 60_000;
/** Idle pool threads exit after this long. */
const IDLE_TIMEOUT_MS = 30_000;

export class SideJobsBusyError extends Error {}

interface Verdict {
  readonly lastSeq: number;
  readonly atMs: number;
  readonly result: Promise<AuditVerification>;
}

export class SideJobs {
  private verifyLane: Piscina | null = null;
  private snapshotLane: Piscina | null = null;
  /** The newest walk of each chain, finished or not. */
  private readonly verdicts = new Map<string, Verdict>();
  private walks = 0;

  /**
   * `lastSeq(stream)`: the chain's last entry, read cheaply on this thread. `tasks`: the
   * folder of the compiled task modules (the pool threads load JavaScript).
   */
  constructor(
    private readonly dataDir: string,
    private readonly lastSeq: (stream: string) => number,
    private readonly tasks: URL = new URL('../storage/', import.meta.url),
  ) {}

  /**
   * The verdict on `stream`'s chain as it stands. Rejects with SideJobsBusyError when the
   * lane is full, or with the walk's own error.
   */
  verifyAudit(stream: string, nowMs = Date.now()): Promise<AuditVerification> {
    const lastSeq = this.lastSeq(stream);
    const known = this.verdicts.get(stream);
    if (known !== undefined && known.lastSeq === lastSeq && nowMs - known.atMs <= VERIFY_CACHE_MS)
      return known.result;
    if (this.walks >= VERIFY_QUEUE_MAX)
      return Promise.reject(new SideJobsBusyError('audit verification lane is full'));
    this.walks++;
    this.verifyLane ??= new Piscina({ maxThreads: 1, idleTimeout: IDLE_TIMEOUT_MS });
    const task: AuditVerifyTask = { dataDir: this.dataDir, environment: stream };
    const result = (
      this.verifyLane.run(task, {
        filename: new URL('audit-verify-task.js', this.tasks).href,
      }) as Promise<AuditVerification>
    ).finally(() => this.walks--);
    const verdict: Verdict = { lastSeq, atMs: nowMs, result };
    this.verdicts.set(stream, verdict);
    // A failed walk is not a verdict: the next request tries again.
    result.catch(() => {
      if (this.verdicts.get(stream) === verdict) this.verdicts.delete(stream);
    });
    return result;
  }

  /** Writes an operator snapshot file on the snapshot lane. */
  assembleSnapshot(task: SnapshotAssembleTask): Promise<SnapshotAssembled> {
    this.snapshotLane ??= new Piscina({ maxThreads: 1, idleTimeout: IDLE_TIMEOUT_MS });
    return this.snapshotLane.run(task, {
      filename: new URL('snapshot-assemble-task.js', this.tasks).href,
    }) as Promise<SnapshotAssembled>;
  }

  async destroy(): Promise<void> {
    await Promise.all([this.verifyLane?.destroy(), this.snapshotLane?.destroy()]);
  }
}
