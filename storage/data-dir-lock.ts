/**
 * The data dir's owner file, `<dataDir>/tally.pid`: a running server (or a restore in
 * progress) writes its pid there and removes it on a clean stop. A second server on the
 * same data dir, or an offline restore into it, refuses while the owner is alive.
 *
 * LMDB's own lock file cannot say this (many processes may open an environment), and
 * Node has no flock. A pid that is no longer running — a killed server — leaves a stale
 * file, which the next owner takes over; a live pid that is not a Node process (the pid
 * was reused) is treated as stale too.
 */
import fs from 'node:fs';
import path from 'node:path';

const FILE = 'tally.pid';

export interface DataDirOwner {
  readonly pid: number;
  readonly role: string;
  readonly startedAtMs: number;
}

function isAlive(pid: number): boolean {
  if (pid === process.pid) return true;
  try {
    process.kill(pid, 0);
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
  // On Linux, make sure the pid still belongs to a Node process (not a reused pid).
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('node');
  } catch {
    return true;
  }
}

/** The live owner of `dataDir`, or null if none (no file, or a stale one). */
export function dataDirOwner(dataDir: string): DataDirOwner | null {
  let owner: DataDirOwner;
  try {
    owner = JSON.parse(fs.readFileSync(path.join(dataDir, FILE), 'utf8')) as DataDirOwner;
  } catch {
    return null;
  }
  return typeof owner.pid === 'number' && isAlive(owner.pid) ? owner : null;
}

/**
 * Makes this process the owner of `dataDir` (created if missing). Throws if another live
 * process owns it. Returns a function that gives it up.
 */
export function claimDataDir(dataDir: string, role: string): () => void {
  fs.mkdirSync(dataDir, { recursive: true });
  const owner = dataDirOwner(dataDir);
  if (owner !== null && owner.pid !== process.pid) {
    throw new Error(`data dir ${dataDir} is in use by a running Tally ${owner.role} (pid ${owner.pid})`);
  }
  const file = path.join(dataDir, FILE);
  const mine = `${JSON.stringify({ pid: process.pid, role, startedAtMs: Date.now() } satisfies DataDirOwner)}\n`;
  if (owner === null && fs.existsSync(file)) fs.rmSync(file, { force: true }); // stale
  try {
    // Exclusive create: of two processes starting at once, exactly one wins.
    fs.writeFileSync(file, mine, { flag: 'wx', mode: 0o644 });
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
    const winner = dataDirOwner(dataDir);
    if (winner?.pid !== process.pid) throw new Error(`data dir ${dataDir} is in use by a running Tally (pid ${winner?.pid ?? 'unknown'})`);
  }
  return () => {
    if (dataDirOwner(dataDir)?.pid === process.pid) fs.rmSync(file, { force: true });
  };
}
