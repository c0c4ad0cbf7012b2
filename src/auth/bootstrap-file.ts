/**
 * `<dataDir>/bootstrap-keys.json`: the first keys of a data dir, written at its first
 * start for the operator to read (mode 0600), and kept current when the operator key is
 * rotated, so that the file never hands out a revoked operator key.
 *
 * The file is the operator's copy, not the server's state (keys live in the control store
 * as digests): a data dir whose file was deleted or moved away stays without one, and a
 * rotation does not recreate it.
 */
import fs from 'node:fs';
import path from 'node:path';
import { writePrivateFile } from '../../storage/private-files.js';

export const BOOTSTRAP_FILE = 'bootstrap-keys.json';

export interface BootstrapKeys {
  readonly test: { readonly server: string; readonly client: string };
  readonly live: { readonly server: string; readonly client: string };
  readonly admin: string;
}

export function bootstrapFilePath(dataDir: string): string {
  return path.join(dataDir, BOOTSTRAP_FILE);
}

/** Writes the file as a new 0600 file (storage/private-files.ts). */
export function writeBootstrapFile(dataDir: string, keys: BootstrapKeys): void {
  writePrivateFile(bootstrapFilePath(dataDir), `${JSON.stringify(keys, null, 2)}\n`);
}

/**
 * Replaces the `admin` field with the new operator key, keeping the other fields, by
 * writing a new 0600 file. Answers false when there is no file (nothing is created);
 * throws when the file cannot be read as JSON or written.
 */
export function replaceBootstrapAdmin(dataDir: string, admin: string): boolean {
  const file = bootstrapFilePath(dataDir);
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw error;
  }
  const current = JSON.parse(text) as Record<string, unknown>;
  writePrivateFile(file, `${JSON.stringify({ ...current, admin }, null, 2)}\n`);
  return true;
}
