import { defineConfig } from 'vitest/config';

// Tests run from TypeScript sources; anything that needs worker threads or a real
// server process runs the compiled output in dist/ (built by `npm test` first).
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
  },
});
