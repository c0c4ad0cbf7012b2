/**
 * The layers of Tally and the one direction their imports may point, checked by
 * dependency-cruiser (`npm run lint:layers`, part of `npm test`).
 *
 *   src/      the front end (HTTP, API, auth, CLI): may import every layer below.
 *   actors/   the shard worker shell (shard-worker.ts, shard-export.ts), the shard and
 *             its protocol, around the pure core.
 *   core      decide/apply and their helpers (actors/core/, customer.ts, ops.ts and the
 *             amounts, periods and configuration they compute with): no clock, no IO.
 *   storage/  LMDB journal, snapshots, control store, audit log: stores typed records.
 *   shared/   the leaf: assertions, environments, shard hashing, core limits and the
 *             customer record, which every layer above may import.
 *
 *   src/client/, src/better-auth/: the packages an application imports (`tally/client`,
 *             `tally/better-auth`); they run in the application's process, so they import
 *             only each other and the webhook verifier, never the service.
 *
 * bench/ and test/ sit outside the layers and may import anything. TypeScript 7 has no
 * compiler API for dependency-cruiser to parse with, so it parses with swc, which sees
 * type-only imports too: a type import crosses a layer just as a value import does.
 */
const CORE =
  '^actors/(core/|customer\\.ts$|ops\\.ts$|fixed\\.ts$|periods\\.ts$|billing-config\\.ts$|' +
  'webhook-events\\.ts$)';
/** The packages an application imports: the typed HTTP client and the Better Auth plugin. */
const INTEGRATION = '^src/(client|better-auth)/';
/** The Standard Webhooks verifier the Better Auth plugin's receiver uses. */
const WEBHOOK_VERIFIER = '^src/webhooks/verify\\.ts$';
/** The worker's IO shell: the only part of actors/ that may touch storage. */
const WORKER_SHELL = '^actors/(shard-worker|shard-export)\\.ts$';

module.exports = {
  forbidden: [
    {
      name: 'shared-is-the-leaf',
      comment:
        'shared/ is imported by every layer, so it imports nothing outside itself (no node:*, no packages).',
      severity: 'error',
      from: { path: '^shared/' },
      to: { pathNot: '^shared/' },
    },
    {
      name: 'core-is-pure',
      comment:
        'The pure core imports only itself and the leaf: no node:*, no packages (lmdb, msgpackr), ' +
        'no storage/, no src/, and not the shard shell around it.',
      severity: 'error',
      from: { path: CORE },
      to: { pathNot: [CORE, '^shared/'] },
    },
    {
      name: 'storage-below-actors-and-src',
      comment:
        'storage/ stores typed records and checks their shape; it knows neither the actors nor the front end.',
      severity: 'error',
      from: { path: '^storage/' },
      to: { path: '^(actors|src)/' },
    },
    {
      name: 'actors-never-import-src',
      comment:
        "The shard answers with typed replies; HTTP statuses and error bodies are the front end's (src/).",
      severity: 'error',
      from: { path: '^actors/' },
      to: { path: '^src/' },
    },
    {
      name: 'only-the-worker-shell-imports-storage',
      comment:
        'The shard worker (actors/shard-worker.ts) is the IO shell around the shard: it opens the journal and ' +
        'writes snapshots, with actors/shard-export.ts writing snapshot part files for it. The shard, the protocol ' +
        'and the core never import storage/: the shard is handed its journal.',
      severity: 'error',
      from: { path: '^actors/', pathNot: WORKER_SHELL },
      to: { path: '^storage/' },
    },
    {
      name: 'integration-packages-stay-apart',
      comment:
        "tally/client and tally/better-auth run inside the application's process: they import only " +
        'each other and the webhook verifier, never the service (its modules pull in LMDB, uWS, ...).',
      severity: 'error',
      from: { path: INTEGRATION },
      to: { path: '^(src|actors|shared|storage)/', pathNot: [INTEGRATION, WEBHOOK_VERIFIER] },
    },
    {
      name: 'client-plugin-no-node-builtins',
      comment:
        'The Better Auth client plugin is bundled for the browser: no node:* module. (Its import of ' +
        'the server plugin is a type, erased when compiled; a test checks the compiled file.)',
      severity: 'error',
      from: { path: '^src/better-auth/client\\.ts$' },
      to: { dependencyTypes: ['core'] },
    },
    {
      name: 'no-circular',
      comment: 'Layers point one way, and so do the modules inside one.',
      severity: 'error',
      from: {},
      to: { circular: true },
    },
    {
      name: 'not-to-unresolvable',
      comment:
        'Every import resolves (a typo in a path would otherwise pass the layer rules unchecked).',
      severity: 'error',
      from: {},
      to: { couldNotResolve: true },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '^dist/' },
    parser: 'swc',
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['import', 'require', 'node', 'default', 'types'],
      extensions: ['.ts', '.js', '.json'],
    },
  },
};
