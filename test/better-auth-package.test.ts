/**
 * The package entry points an application imports: `tally/client`, `tally/better-auth`,
 * `tally/better-auth/client` and `tally/webhooks` resolve through `exports` to compiled
 * JavaScript with type declarations beside it, and the client plugin compiles to a module
 * that imports nothing, so a browser bundle of it carries no server code and no server key.
 */
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ENTRY_POINTS = [
  'tally/client',
  'tally/better-auth',
  'tally/better-auth/client',
  'tally/webhooks',
];

describe('package exports', () => {
  it.each(ENTRY_POINTS)('%s resolves to compiled JavaScript with declarations', (name) => {
    const file = fileURLToPath(import.meta.resolve(name));
    expect(file).toMatch(/\/dist\/src\/.+\.js$/);
    expect(fs.existsSync(file)).toBe(true);
    expect(fs.existsSync(file.replace(/\.js$/, '.d.ts'))).toBe(true);
  });

  it('the client plugin imports nothing once compiled', () => {
    const source = fs.readFileSync(
      fileURLToPath(import.meta.resolve('tally/better-auth/client')),
      'utf8',
    );
    expect(source).toContain('export const tallyClient');
    expect(source).not.toMatch(/\bimport\b|\brequire\(/);
  });
});
