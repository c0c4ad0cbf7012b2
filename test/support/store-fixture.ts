/**
 * Temp directories and opened stores for storage tests, closed and removed after each
 * test so that a failing test leaves no LMDB environment open behind it.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach } from 'vitest';

export interface Closable {
  close(): Promise<void>;
}

export function storeFixture<S extends Closable>(prefix: string, openStore: (dir: string) => S) {
  const dirs: string[] = [];
  const open: S[] = [];
  afterEach(async () => {
    await Promise.all(open.splice(0).map((store) => store.close()));
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });
  /** A store opened some other way, closed after the test like the others. */
  const adopt = <T extends S>(store: T): T => {
    open.push(store);
    return store;
  };
  return {
    adopt,
    tempDir(): string {
      const dir = mkdtempSync(join(tmpdir(), prefix));
      dirs.push(dir);
      return dir;
    },
    openStore(dir: string): S {
      return adopt(openStore(dir));
    },
    async closeStore(store: S): Promise<void> {
      open.splice(open.indexOf(store), 1);
      await store.close();
    },
  };
}
