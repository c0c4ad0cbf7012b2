/**
 * One process at a time per data directory: a running server or a restore in progress.
 *
 * The lock is an OS lock, flock(2) on `<dataDir>/tally.lock`, so the kernel releases it
 * when its holder exits in any way (kill -9 included) and two processes starting at the
 * same moment can never both get it. Node has no flock call; the `flock` command of
 * util-linux takes the lock on a descriptor this process opened and hands it down, and
 * because a flock belongs to the open file, not to the process that called it, the lock
 * stays held for as long as this process keeps the descriptor open. The lock file is
 * never removed (removing it would let a newcomer lock a new file while the holder
 * still locks the old one).
 *
 * Beside it, `tally.pid` says who holds the lock, for the message a refused process
 * prints; it is informational and never decides anything.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { writePrivateFile } from './private-files.js';

const LOCK_FILE = 'tally.lock';
const OWNER_FILE = 'tally.pid';

export interface DataDirOwner {
  readonly pid: number;
  readonly role: string;
  readonly startedAtMs: number;
}

/** Data dirs this process holds, by path, with their descriptor and how many claims share it. */
const held = new Map<string, { fd: number; claims: number }>();

/** Takes the lock on `fd` if it is free; false if another open file holds it. */
function tryLock(fd: number): boolean {
  const result = spawnSync('flock', ['--exclusive', '--nonblock', '3'], {
    stdio: ['ignore', 'ignore', 'pipe', fd],
  });
  if (result.error !== undefined) {
    throw new Error(
      `cannot lock the data dir: the flock command (util-linux) is needed ` +
        `(${result.error.message})`,
    );
  }
  if (result.status === 0) return true;
  if (result.status === 1) return false;
  throw new Error(
    `cannot lock the data dir: flock exited ${result.status}: ${result.stderr.toString().trim()}`,
  );
}

function readOwner(dataDir: string): DataDirOwner | null {
  try {
    const owner = JSON.parse(
      fs.readFileSync(path.join(dataDir, OWNER_FILE), 'utf8'),
    ) as DataDirOwner;
    return typeof owner.pid === 'number' ? owner : null;
  } catch {
    return null;
  }
}

/** The process holding `dataDir`, or null if nobody does (this process counts). */
export function dataDirOwner(dataDir: string): DataDirOwner | null {
  if (held.has(path.resolve(dataDir))) return readOwner(dataDir);
  const lockFile = path.join(dataDir, LOCK_FILE);
  if (!fs.existsSync(lockFile)) return null;
  const fd = fs.openSync(lockFile, fs.constants.O_RDWR | fs.constants.O_NOFOLLOW);
  try {
    if (tryLock(fd)) return null; // free: closing the descriptor below releases it again
    return readOwner(dataDir) ?? { pid: 0, role: 'process', startedAtMs: 0 };
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Makes this process the holder of `dataDir` (created 0700 if missing). Throws if another
 * process holds it. Returns a function that gives it up (claims by this same process
 * share one lock, released with the last).
 */
export function claimDataDir(dataDir: string, role: string): () => void {
  const key = path.resolve(dataDir);
  const mine = held.get(key);
  if (mine !== undefined) {
    mine.claims++;
    return releaser(key, dataDir);
  }
  fs.mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const fd = fs.openSync(
    path.join(dataDir, LOCK_FILE),
    fs.constants.O_RDWR | fs.constants.O_CREAT | fs.constants.O_NOFOLLOW,
    0o600,
  );
  if (!tryLock(fd)) {
    fs.closeSync(fd);
    const owner = readOwner(dataDir);
    const who = owner === null ? '' : ` ${owner.role} (pid ${owner.pid})`;
    throw new Error(`data dir ${dataDir} is in use by a running Tally${who}`);
  }
  held.set(key, { fd, claims: 1 });
  const owner: DataDirOwner = { pid: process.pid, role, startedAtMs: Date.now() };
  writePrivateFile(path.join(dataDir, OWNER_FILE), `${JSON.stringify(owner)}\n`);
  return releaser(key, dataDir);
}

function releaser(key: string, dataDir: string): () => void {
  let released = false;
  return () => {
    const entry = held.get(key);
    if (released || entry === undefined) return;
    released = true;
    if (--entry.claims > 0) return;
    held.delete(key);
    fs.rmSync(path.join(dataDir, OWNER_FILE), { force: true });
    fs.closeSync(entry.fd); // releases the lock
  };
}
