/**
 * What a second local account could do to a Tally data directory, tried as that account
 * would: read files (modes), plant links where Tally is about to write, and race two
 * starts for one data directory. Each case runs the real service or the real CLI.
 */
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { runProcess } from './support/run-process.js';
import {
  listeningPort,
  logLines,
  MAIN_JS,
  startServerProcess,
  tempDataDir,
  type ServerProcess,
} from './support/server-process.js';

const BIN = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'bin', 'tally.js');
const started: ServerProcess[] = [];
afterAll(async () => {
  for (const server of started) await server.stop();
});

/** Mode bits of `file` as an octal string, without following a link. */
const modeOf = (file: string): string => (fs.lstatSync(file).mode & 0o777).toString(8);

/** Every path below `dir`, depth first. */
function walk(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = path.join(dir, entry.name);
    return entry.isDirectory() ? [full, ...walk(full)] : [full];
  });
}

describe('files on disk', () => {
  it(
    'a new data dir and everything in it are private to the account (0700 / 0600), whatever ' +
      'the umask',
    async () => {
      const dataDir = path.join(tempDataDir('modes'), 'data');
      const server = await startServerProcess({ dataDir });
      started.push(server);
      // The server was spawned with the test runner's umask (usually 022): it sets its own.
      expect(modeOf(dataDir)).toBe('700');
      const entries = walk(dataDir);
      expect(entries.some((entry) => entry.endsWith('data.mdb'))).toBe(true);
      for (const entry of entries)
        expect((fs.lstatSync(entry).mode & 0o077).toString(8), entry).toBe('0');
      expect(modeOf(path.join(dataDir, 'bootstrap-keys.json'))).toBe('600');
    },
  );

  it(
    'a data dir others may read is served with a warning; ' + 'one others may write to is refused',
    async () => {
      const readable = tempDataDir('loose');
      fs.chmodSync(readable, 0o755);
      const server = await startServerProcess({ dataDir: readable });
      started.push(server);
      expect(
        logLines(server.output()).some(
          (line) =>
            line.level === 'warn' &&
            /readable by other accounts \(mode 0755\)/.test(String(line.msg)),
        ),
      ).toBe(true);

      const writable = tempDataDir('open');
      fs.chmodSync(writable, 0o777);
      const refused = spawnSync(process.execPath, [MAIN_JS], {
        env: { ...process.env, PORT: '0', TALLY_DATA_DIR: writable },
        encoding: 'utf8',
        timeout: 20_000,
      });
      expect(refused.status).toBe(1);
      expect(refused.stderr).toMatch(/writable by other accounts \(mode 0777\)/);
      expect(fs.readdirSync(writable)).toEqual([]);
    },
  );

  it('a link planted at bootstrap-keys.json is replaced, not written through', async () => {
    const parent = tempDataDir('planted');
    const dataDir = path.join(parent, 'data');
    fs.mkdirSync(dataDir, { mode: 0o700 });
    const stolen = path.join(parent, 'stolen.json');
    fs.writeFileSync(stolen, '', { mode: 0o644 });
    fs.symlinkSync(stolen, path.join(dataDir, 'bootstrap-keys.json'));
    const server = await startServerProcess({ dataDir });
    started.push(server);
    expect(fs.readFileSync(stolen, 'utf8')).toBe('');
    const keysFile = path.join(dataDir, 'bootstrap-keys.json');
    expect(fs.lstatSync(keysFile).isFile()).toBe(true);
    expect(modeOf(keysFile)).toBe('600');
    expect(JSON.parse(fs.readFileSync(keysFile, 'utf8')).admin).toBe(server.keys.admin);
  });

  it(
    "a link planted at the snapshot download's .partial file is replaced, not written " + 'through',
    async () => {
      const server = await startServerProcess();
      started.push(server);
      const dir = tempDataDir('snapout');
      const out = path.join(dir, 'backup.tsnap');
      const stolen = path.join(dir, 'stolen');
      fs.writeFileSync(stolen, '', { mode: 0o644 });
      fs.symlinkSync(stolen, `${out}.partial`);
      const env = { ...process.env, TALLY_URL: server.base, TALLY_API_KEY: server.keys.admin };
      const created = await runProcess(
        process.execPath,
        [BIN, 'snapshot', 'create', '--out', out],
        {
          env,
        },
      );
      expect(created.code, created.stderr).toBe(0);
      expect(fs.readFileSync(stolen, 'utf8')).toBe('');
      expect(fs.lstatSync(out).isFile()).toBe(true);
      expect(modeOf(out)).toBe('600');
    },
  );
});

describe('data dir lock', () => {
  it(
    'is held by the running process, not by its pid file: removing the file (as a racing ' +
      'start would) lets no second server in',
    async () => {
      const server = await startServerProcess();
      started.push(server);
      fs.rmSync(path.join(server.dataDir, 'tally.pid'));
      const second = spawnSync(process.execPath, [MAIN_JS], {
        env: { ...process.env, PORT: '0', TALLY_DATA_DIR: server.dataDir },
        encoding: 'utf8',
        timeout: 20_000,
      });
      expect(second.status).toBe(1);
      expect(second.stderr).toMatch(/in use by a running Tally/);
    },
  );

  it(
    'of two servers started at the same moment after a stale pid file, ' + 'exactly one runs',
    async () => {
      for (let round = 0; round < 3; round++) {
        const dataDir = tempDataDir('race');
        // A stale owner file as a killed server leaves it (a pid that is not running).
        fs.writeFileSync(
          path.join(dataDir, 'tally.pid'),
          `${JSON.stringify({ pid: 2 ** 22 - 1, role: 'server', startedAtMs: 0 })}\n`,
        );
        const children = [0, 1].map(() =>
          spawn(process.execPath, [MAIN_JS], {
            env: { ...process.env, PORT: '0', TALLY_DATA_DIR: dataDir },
            stdio: ['ignore', 'pipe', 'pipe'],
          }),
        );
        const outcomes = await Promise.all(
          children.map(
            (child) =>
              new Promise<'listening' | 'refused'>((resolve) => {
                let out = '';
                const seen = (chunk: Buffer): void => {
                  out += chunk.toString();
                  if (listeningPort(out) !== null) resolve('listening');
                };
                child.stdout.on('data', seen);
                child.stderr.on('data', seen);
                child.once('exit', () =>
                  resolve(/in use by a running Tally/.test(out) ? 'refused' : 'listening'),
                );
              }),
          ),
        );
        for (const child of children) child.kill('SIGKILL');
        expect(outcomes.sort(), `round ${round}`).toEqual(['listening', 'refused']);
      }
    },
  );
});

describe('bind address', () => {
  /**
   * Starts the service with `env`; resolves with its port and the `listening` line once it is up.
   */
  async function start(
    env: Record<string, string>,
  ): Promise<{ port: number; line: Record<string, unknown>; stop: () => void }> {
    const child = spawn(process.execPath, [MAIN_JS], {
      env: { ...process.env, PORT: '0', TALLY_DATA_DIR: tempDataDir('host'), ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    const port = await new Promise<number>((resolve, reject) => {
      child.stdout.on('data', (chunk: Buffer) => {
        out += chunk.toString();
        const found = listeningPort(out);
        if (found !== null) resolve(found);
      });
      child.once('exit', () => reject(new Error(out)));
    });
    const line = logLines(out).find((l) => l.msg === 'listening') ?? {};
    return { port, line, stop: () => child.kill('SIGKILL') };
  }
  const reachable = (host: string, port: number): Promise<boolean> =>
    fetch(`http://${host}:${port}/healthz`).then(
      () => true,
      () => false,
    );

  it('binds 127.0.0.1 by default, and TALLY_HOST elsewhere', async () => {
    const plain = await start({});
    try {
      expect(plain.line).toMatchObject({ host: '127.0.0.1' });
      expect(await reachable('127.0.0.1', plain.port)).toBe(true);
      expect(await reachable('127.0.0.2', plain.port)).toBe(false);
    } finally {
      plain.stop();
    }
    const other = await start({ TALLY_HOST: '127.0.0.2' });
    try {
      expect(await reachable('127.0.0.2', other.port)).toBe(true);
      expect(await reachable('127.0.0.1', other.port)).toBe(false);
    } finally {
      other.stop();
    }
  });
});
