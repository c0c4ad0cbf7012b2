/**
 * Every line of source is at most 100 columns, as the code style asks. Biome formats code at
 * 100 columns (biome.json `lineWidth`), but it cannot wrap what has no break points of its own:
 * comments and string literals (an error message, a test title, a template) pass through as
 * they are written, however long. This test catches those: it reads every .ts and .js file
 * under the source directories (not dist, not node_modules) and lists `file:line (N columns)`
 * for each line over the limit. Long comments are re-wrapped; long strings are split into
 * concatenated pieces whose value is the same string.
 *
 * Columns are characters (code points), not bytes: `→` is one column. The one exception is a
 * URL, which cannot be split without breaking it: a line whose only overlong part is a URL
 * (nothing but closing punctuation after it) is allowed. None remains at the time of writing.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const MAX_COLUMNS = 100;
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const DIRECTORIES = ['src', 'actors', 'shared', 'storage', 'bench', 'test', 'bin'];
const SKIPPED = new Set(['dist', 'node_modules']);

function sourceFiles(directory: string): string[] {
  if (!fs.existsSync(directory)) return [];
  const files: string[] = [];
  for (const entry of fs.readdirSync(directory, { withFileTypes: true })) {
    if (SKIPPED.has(entry.name)) continue;
    const full = path.join(directory, entry.name);
    if (entry.isDirectory()) files.push(...sourceFiles(full));
    else if (entry.isFile() && /\.(ts|js)$/.test(entry.name)) files.push(full);
  }
  return files;
}

const columns = (text: string): number => [...text].length;

/** A line that is over the limit only because of a URL, which cannot be wrapped. */
function onlyUrlOverlong(line: string): boolean {
  const url = /https?:\/\/\S+/.exec(line);
  if (url === null) return false;
  const before = line.slice(0, url.index);
  const after = line.slice(url.index + url[0].length);
  return columns(before) < MAX_COLUMNS && /^[\s)\]}'"`.,;:>]*$/.test(after);
}

describe('line length', () => {
  it(`keeps every source line within ${MAX_COLUMNS} columns (URLs excepted)`, () => {
    const files = DIRECTORIES.flatMap((directory) => sourceFiles(path.join(ROOT, directory)));
    expect(files.length).toBeGreaterThan(100);
    const overlong: string[] = [];
    for (const file of files) {
      const lines = fs.readFileSync(file, 'utf8').split(/\r?\n/);
      lines.forEach((line, index) => {
        const width = columns(line);
        if (width > MAX_COLUMNS && !onlyUrlOverlong(line))
          overlong.push(`${path.relative(ROOT, file)}:${index + 1} (${width} columns)`);
      });
    }
    expect(overlong, `lines over ${MAX_COLUMNS} columns:\n${overlong.join('\n')}`).toEqual([]);
  });
});
