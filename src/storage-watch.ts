/**
 * Watches the free space of the data directory's filesystem, so that a full disk is met
 * with clear refusals instead of a crash.
 *
 * Every write Tally acknowledges must reach the disk first; when the disk cannot take it,
 * the journal write fails and the shard worker (and with it the process) stops, because
 * memory would otherwise run ahead of disk. To keep that from happening in the first
 * place, the front end polls `statfs` and, while the free space is below a reserve,
 * refuses every request that may write (503 `storage_full`, before anything is decided),
 * while reads go on being answered from memory. When space returns, writes resume on the
 * next poll; no restart is needed. Entering and leaving the full state is logged at warn.
 */
import type { Exchange } from './http/exchange.js';
import { statfs } from 'node:fs/promises';
import type { Logger } from './observability/log.js';

/**
 * How often the free space is read: a busy shard writes a few MB a second at most, far below a
 * reserve.
 */
export const STORAGE_POLL_MS = 1000;

/**
 * Default reserve: room for the journal writes of several seconds at full speed, plus LMDB's own
 * growth.
 */
export const STORAGE_RESERVE_BYTES_DEFAULT = 64 * 1024 * 1024;

export class StorageWatch {
  /** Free bytes for this process's account at the last poll (null before the first). */
  freeBytes: number | null = null;
  totalBytes: number | null = null;
  full = false;
  /** Requests refused because the storage was full. */
  refused = 0;
  /** Called after each poll (the other front-end threads are told the state). */
  onPoll: ((full: boolean, freeBytes: number | null) => void) | null = null;
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly dir: string,
    private readonly reserveBytes: number,
    private readonly log: Logger,
  ) {}

  /**
   * Reads the free space once now (so a start on a full disk refuses writes at once), then every
   * STORAGE_POLL_MS.
   */
  async start(): Promise<void> {
    await this.poll();
    this.timer = setInterval(() => void this.poll(), STORAGE_POLL_MS);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  private async poll(): Promise<void> {
    let stats: Awaited<ReturnType<typeof statfs>>;
    try {
      stats = await statfs(this.dir);
    } catch (error) {
      // Cannot tell: keep the last state rather than guess either way.
      this.log.warn({ err: error, dataDir: this.dir }, 'storage: cannot read free space');
      return;
    }
    this.freeBytes = stats.bavail * stats.bsize;
    this.totalBytes = stats.blocks * stats.bsize;
    const full = this.freeBytes < this.reserveBytes;
    this.onPoll?.(full, this.freeBytes);
    if (full === this.full) return;
    this.full = full;
    const fields = {
      dataDir: this.dir,
      freeBytes: this.freeBytes,
      reserveBytes: this.reserveBytes,
    };
    if (full) this.log.warn(fields, 'storage full: refusing writes until space is freed');
    else this.log.warn(fields, 'storage has room again: accepting writes');
  }
}

/** Answers 503 `storage_full` (Retry-After 5) to a request that may write. */
export function failStorageFull(ex: Exchange, freeBytes: number | null): void {
  ex.fail(
    'storage_full',
    {
      detail:
        `${freeBytes ?? 0} bytes free on the data directory's filesystem, below the reserve; ` +
        `reads are still served`,
    },
    [['retry-after', '5']],
  );
}
