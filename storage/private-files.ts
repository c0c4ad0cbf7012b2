/**
 * Files only the account running Tally may read: bootstrap keys, snapshot files, the
 * data directory itself.
 *
 * A file is created fresh with exclusive create and without following a link, so a file
 * or symlink planted at its path by another local account can neither keep its owner and
 * mode nor redirect the write elsewhere: a planted entry is removed first (unlinking a
 * link removes the link, not its target), and if another one appears in between, the
 * create fails instead of writing through it.
 */
import fs from 'node:fs';

const { O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW } = fs.constants;

/** Mode bits that let anyone but the owner read, write or enter. */
const OTHERS_MASK = 0o077;

/**
 * Opens `file` for writing as a new file of mode 0600, replacing whatever was at the
 * path. Returns the descriptor. Throws EEXIST if something is planted at the path between
 * the removal and the create, and the usual errors of open(2).
 */
export function openPrivateFile(file: string): number {
  fs.rmSync(file, { force: true });
  const fd = fs.openSync(file, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600);
  fs.fchmodSync(fd, 0o600); // whatever the umask
  return fd;
}

/** Writes `text` to `file` as a new 0600 file (see openPrivateFile), synced before it returns. */
export function writePrivateFile(file: string, text: string): void {
  const fd = openPrivateFile(file);
  try {
    fs.writeSync(fd, text);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

export interface DirCheck {
  /** Why the directory must not be used (owned by another account, writable by others), or null. */
  readonly unsafe: string | null;
  /** Why the operator should tighten it (readable by others), or null. */
  readonly loose: string | null;
}

/**
 * Creates `dir` (0700) if it does not exist and judges the modes of an existing one. A
 * directory another account owns or may write to is unsafe (whoever can write there owns
 * the database); one that others may read or enter leaks keys' digests, emails and usage.
 */
export function ensurePrivateDir(dir: string): DirCheck {
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  const stat = fs.statSync(dir);
  const uid = process.getuid?.();
  const mode = (stat.mode & 0o777).toString(8).padStart(4, '0');
  if (uid !== undefined && stat.uid !== uid && uid !== 0) {
    return { unsafe: `data dir ${dir} belongs to another account (uid ${stat.uid})`, loose: null };
  }
  if ((stat.mode & 0o022) !== 0) {
    return {
      unsafe: `data dir ${dir} is writable by other accounts (mode ${mode}); chmod 700 it`,
      loose: null,
    };
  }
  if ((stat.mode & OTHERS_MASK) !== 0) {
    return {
      unsafe: null,
      loose: `data dir ${dir} is readable by other accounts (mode ${mode}); chmod 700 it`,
    };
  }
  return { unsafe: null, loose: null };
}
