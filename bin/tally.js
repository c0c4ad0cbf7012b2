#!/usr/bin/env node
// The `tally` command (package.json "bin"). The CLI is TypeScript compiled by `npm run build`
// (which `npm ci` runs through the `prepare` script); this shim only loads it, and says what
// to do instead of printing a stack trace when it has not been built.
import fs from 'node:fs';

const main = new URL('../dist/src/cli/main.js', import.meta.url);
if (!fs.existsSync(main)) {
  console.error(
    'tally: the CLI is not built (dist/src/cli/main.js is missing); run `npm run build` first',
  );
  process.exit(1);
}
const { run } = await import(main.href);
process.exitCode = await run(process.argv);
