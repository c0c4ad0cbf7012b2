/**
 * Debian's `chromium` for the real-browser tests (playwright-core drives it; no browser is
 * downloaded). TALLY_CHROMIUM names another binary. Without one, the caller skips and this
 * says so once, naming the test file.
 */
import fs from 'node:fs';

export function findChromium(testFile: string): string | undefined {
  const found = [process.env['TALLY_CHROMIUM'], '/usr/bin/chromium', '/usr/bin/chromium-browser']
    .filter((p): p is string => p !== undefined && p !== '')
    .find((p) => fs.existsSync(p));
  if (found === undefined)
    console.warn(
      `${testFile} skipped: no chromium binary (apt-get install chromium, or set TALLY_CHROMIUM)`,
    );
  return found;
}
