/**
 * Durability semantics of the storage layer: `await durable` must mean "on disk".
 *
 * Three checks, weakest to strongest:
 * 1. the control environment is opened with overlappingSync/noSync off, a shard's with
 *    overlappingSync on and separateFlushed (as lmdb-js reads them back), both syncing;
 * 2. after `await durable`, a second process opening the directory read-only sees the
 *    record (visibility across processes; by itself this does not prove an fsync, since
 *    the page cache is shared);
 * 3. under strace, with every fdatasync/fsync delayed by DELAY_MS, a real ShardStore in a
 *    child process resolves `durable` only after a sync call has completed, and no sooner
 *    than DELAY_MS after append(). A store that resolved on commit (e.g. on the put
 *    promise instead of its `flushed`, in the shard's overlappingSync mode), or with
 *    noSync, fails this. The same holds for the recovery barrier, `syncRecovered`, which
 *    the child calls first, as a recovering worker does. strace is required (.ci/run
 *    installs it); without it the test fails.
 * And the failure side: when the disk refuses a write, every `durable` of that batch
 * rejects with the cause, and nothing else (no stray unhandled rejection) kills the process.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterEach, describe, it, expect } from 'vitest';
import { decodeRecord } from '../storage/codec.js';
import { ShardStore } from '../storage/journal.js';
import { DURABLE_ENV_OPTIONS, openDurableEnv, SHARD_ENV_OPTIONS } from '../storage/lmdb-env.js';

const projectRoot = resolve(import.meta.dirname, '..');
const DELAY_MS = 150;
const dirs: string[] = [];

afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function tempDir(tag: string): string {
  const dir = mkdtempSync(join(tmpdir(), `tally-durability-${tag}-`));
  dirs.push(dir);
  return dir;
}

const straceWorks = spawnSync('strace', ['-f', '-o', '/dev/null', 'true']).status === 0;

describe('storage durability', () => {
  it('opens the control environment with overlappingSync and noSync off', async () => {
    expect(DURABLE_ENV_OPTIONS).toMatchObject({
      overlappingSync: false,
      noSync: false,
      noMetaSync: false,
    });
    const env = openDurableEnv(tempDir('options'), ['journal']);
    // lmdb-js copies the effective root options onto the root store (and turns
    // overlappingSync off there if the environment on disk was opened without it).
    const effective = env.root as unknown as { overlappingSync: unknown; noSync: unknown };
    expect(effective.overlappingSync).toBe(false);
    expect(effective.noSync).toBe(false);
    await env.root.close();
  });

  it('opens shard environments with overlappingSync and separateFlushed, syncing', async () => {
    expect(SHARD_ENV_OPTIONS).toMatchObject({
      overlappingSync: true,
      separateFlushed: true,
      noSync: false,
      noMetaSync: false,
    });
    const env = openDurableEnv(tempDir('shard-options'), ['journal'], SHARD_ENV_OPTIONS);
    const effective = env.root as unknown as { overlappingSync: unknown; noSync: unknown };
    expect(effective.overlappingSync).toBe(true);
    expect(effective.noSync).toBe(false);
    await env.root.close();
  });

  it(
    'after `await durable`, ' + 'another process opening the env read-only sees the record',
    async () => {
      const dir = tempDir('child');
      const store = ShardStore.open(dir);
      try {
        const events = [{ type: 'usage', amountMinor: 42n }];
        const { seq, durable } = store.append(events);
        await durable;
        const child = spawnSync(
          process.execPath,
          ['--input-type=module', '-e', readJournalHexScript, dir, String(seq)],
          {
            cwd: projectRoot,
            encoding: 'utf8',
          },
        );
        expect(child.stderr).toBe('');
        expect(child.status).toBe(0);
        expect(child.stdout).not.toBe('missing');
        expect(decodeRecord(Buffer.from(child.stdout.trim(), 'hex'))).toEqual({
          ok: true,
          value: events,
        });
      } finally {
        await store.close();
      }
    },
  );

  it(
    'resolves `durable` and the recovery barrier only after an fsync completes (strace, ' +
      'delayed fdatasync)',
    () => {
      expect(straceWorks, 'strace must be installed (.ci/run installs it)').toBe(true);
      const outDir = compileStorage(probeScript);
      const dataDir = tempDir('strace');
      const tracePath = join(outDir, 'trace.txt');
      const child = spawnSync(
        'strace',
        [
          '-f',
          '-o',
          tracePath,
          '-e',
          'trace=fdatasync,fsync,write',
          '-e',
          `inject=fdatasync,fsync:delay_enter=${DELAY_MS * 1000}`,
          process.execPath,
          join(outDir, 'probe.mjs'),
          dataDir,
        ],
        { encoding: 'utf8' },
      );
      expect(child.status, child.stderr).toBe(0);
      const barrierLine = /BARRIER DURABLE elapsedMs=([\d.]+)/.exec(child.stdout);
      expect(barrierLine, child.stdout).not.toBeNull();
      expect(Number(barrierLine?.[1])).toBeGreaterThanOrEqual(DELAY_MS);
      const durableLine = /\nDURABLE seq=(\d+) elapsedMs=([\d.]+)/.exec(child.stdout);
      expect(durableLine, child.stdout).not.toBeNull();
      expect(Number(durableLine?.[2])).toBeGreaterThanOrEqual(DELAY_MS);

      const trace = readFileSync(tracePath, 'utf8').split('\n');
      const syncCompleted = (line: string): boolean =>
        /f(data)?sync(\(\d+\)| resumed>).*= 0/.test(line);
      const barrierIssued = trace.findIndex((line) => line.includes('write(1, "BARRIER ISSUED'));
      const barrierDone = trace.findIndex((line) => line.includes('write(1, "BARRIER DURABLE'));
      expect(barrierIssued).toBeGreaterThanOrEqual(0);
      expect(barrierDone).toBeGreaterThan(barrierIssued);
      expect(
        trace.slice(barrierIssued, barrierDone).filter(syncCompleted).length,
      ).toBeGreaterThanOrEqual(1);
      const issued = trace.findIndex((line) => line.includes('write(1, "ISSUED'));
      const resolved = trace.findIndex((line) => line.includes('write(1, "DURABLE'));
      expect(issued).toBeGreaterThanOrEqual(0);
      expect(resolved).toBeGreaterThan(issued);
      const syncsCompleted = trace.slice(issued, resolved).filter(syncCompleted);
      expect(syncsCompleted.length).toBeGreaterThanOrEqual(1);
    },
  );

  it('rejects `durable` for every append of a batch the disk refuses', () => {
    const outDir = compileStorage(failingProbeScript);
    // A 4 MiB file-size limit (SIGXFSZ ignored, so write() fails with EFBIG instead of
    // killing the process) makes the 8 MiB record's transaction fail.
    const child = spawnSync(
      'bash',
      [
        '-c',
        `trap '' XFSZ; ulimit -f 4096; exec "$0" "$1" "$2"`,
        process.execPath,
        join(outDir, 'probe.mjs'),
        tempDir('efbig'),
      ],
      { encoding: 'utf8' },
    );
    expect(child.status, child.stderr).toBe(0);
    expect(child.stdout.trim().split('\n')).toEqual([
      'small DURABLE',
      expect.stringMatching(/^big REJECTED journal append of seq 2 was not committed: \S/),
      expect.stringMatching(/^same-batch REJECTED journal append of seq 3 was not committed: \S/),
      'CLOSED',
    ]);
  });
});

/** Child: open the journal read-only, print the raw record at seq as hex. */
const readJournalHexScript = `
import { open } from 'lmdb';
const [path, seq] = process.argv.slice(1);
const root = open({ path, readOnly: true });
const journal = root.openDB({ name: 'journal', encoding: 'binary', keyEncoding: 'ordered-binary' });
const bytes = journal.get(Number(seq));
process.stdout.write(bytes === undefined ? 'missing' : Buffer.from(bytes).toString('hex'));
await root.close();
`;

/** Child under strace: append one batch with the real ShardStore and report when durable. */
const probeScript =
  `
import { writeSync } from 'node:fs';
import { ShardStore } from './storage/journal.js';
const store = ShardStore.open(process.argv[2]);
store.replay(0, () => undefined);
writeSync(1, 'BARRIER ISSUED\\n');
const barrierStartedMs = performance.now();
await store.syncRecovered();
writeSync(1, 'BARRIER DURABLE elapsedMs=' + (performance.now() - ` +
  `barrierStartedMs).toFixed(1) + '\\n');
writeSync(1, 'ISSUED\\n');
const startedMs = performance.now();
const { seq, durable } = store.append([{ type: 'probe', amountMinor: 1n }]);
await durable;
writeSync(1, 'DURABLE seq=' + seq + ' elapsedMs=' + (performance.now() - ` +
  `startedMs).toFixed(1) + '\\n');
await store.close();
`;

/** Child with a file-size limit: one good batch, then a batch too big to write. */
const failingProbeScript =
  `
import { writeSync } from 'node:fs';
import { ShardStore } from './storage/journal.js';
const out = (line) => writeSync(1, line + '\\n');
const store = ShardStore.open(process.argv[2]);
await store.append([{ type: 'small' }]).durable.then(() => out('small DURABLE'));
const big = store.append([{ type: 'big', blob: 'x'.repeat(8 * 1024 * 1024) }]);
const sameBatch = store.append([{ type: 'same-batch' }]);
for (const [name, appended] of [['big', big], ['same-batch', sameBatch]]) {
  await appended.durable.then(() => out(name + ' DURABLE'), (error) => out(name + ' ` +
  `REJECTED ' + error.message));
}
await store.close().then(() => out('CLOSED'), (error) => out('CLOSE FAILED ' + error.message));
`;

/**
 * Node 20 cannot run TypeScript, so compile the storage sources (and what they import)
 * to plain ESM in a temp dir that resolves packages from the project's node_modules,
 * and put the child's script beside them.
 */
function compileStorage(script: string): string {
  const outDir = tempDir('build');
  const tsc = spawnSync(
    join(projectRoot, 'node_modules/.bin/tsc'),
    [
      '--ignoreConfig',
      '--outDir',
      outDir,
      '--rootDir',
      projectRoot,
      '--module',
      'nodenext',
      '--moduleResolution',
      'nodenext',
      '--target',
      'es2022',
      '--types',
      'node',
      '--skipLibCheck',
      '--strict',
      join(projectRoot, 'storage/journal.ts'),
    ],
    { encoding: 'utf8', cwd: projectRoot },
  );
  expect(tsc.status, tsc.stdout + tsc.stderr).toBe(0);
  writeFileSync(join(outDir, 'package.json'), '{ "type": "module" }\n');
  symlinkSync(join(projectRoot, 'node_modules'), join(outDir, 'node_modules'));
  writeFileSync(join(outDir, 'probe.mjs'), script);
  return outDir;
}
