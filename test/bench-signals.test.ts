/**
 * A benchmark stopped by a signal stops what it started: the Tally server, the bare
 * server and the load generator. Node runs no `exit` hook when a signal ends a process,
 * so each benchmark installs handlers for SIGINT and SIGTERM (bench/children.ts); without
 * them a soak stopped with `kill` leaves wrk sending at full speed and Tally running.
 * Needs the compiled dist/ (`npm test` builds first) and wrk.
 */
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const SOAK_SCRIPT = fileURLToPath(new URL('../dist/bench/soak.js', import.meta.url));

interface ProcessInfo {
  readonly pid: number;
  readonly ppid: number;
  readonly name: string;
}

function processes(): ProcessInfo[] {
  const found: ProcessInfo[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const close = stat.lastIndexOf(')');
      const fields = stat.slice(close + 2).split(' ');
      // A zombie has exited; only its parent's wait is missing.
      if (fields[0] === 'Z') continue;
      found.push({
        pid: Number(entry),
        ppid: Number(fields[1]),
        name: stat.slice(stat.indexOf('(') + 1, close),
      });
    } catch {
      /* exited while listed */
    }
  }
  return found;
}

function descendantsOf(root: number): ProcessInfo[] {
  const all = processes();
  const found: ProcessInfo[] = [];
  const parents = new Set([root]);
  for (let grew = true; grew; ) {
    grew = false;
    for (const p of all)
      if (parents.has(p.ppid) && !parents.has(p.pid)) {
        parents.add(p.pid);
        found.push(p);
        grew = true;
      }
  }
  return found;
}

const alive = (pid: number): boolean => processes().some((p) => p.pid === pid);

async function waitFor<T>(what: string, probe: () => T | null, timeoutMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = probe();
    if (value !== null) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe('benchmarks stopped by a signal', () => {
  it('a soak stopped with SIGTERM stops its servers and its load generator', async () => {
    const soak = spawn(
      process.execPath,
      [SOAK_SCRIPT, '--minutes', '5', '--rate', '500', '--connections', '4'],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let output = '';
    soak.stdout.setEncoding('utf8').on('data', (chunk: string) => (output += chunk));
    soak.stderr.setEncoding('utf8').on('data', (chunk: string) => (output += chunk));
    const exited = new Promise<number | null>((resolve) => soak.once('exit', resolve));
    const pid = soak.pid as number;
    let children: ProcessInfo[] = [];
    try {
      // Running: Tally and the bare server (node) and wrk, the load of its first run.
      children = await waitFor(
        'the soak to start wrk',
        () => {
          const found = descendantsOf(pid);
          return found.some((p) => p.name === 'wrk') &&
            found.filter((p) => p.name.startsWith('node') || p.name.startsWith('tally')).length >= 2
            ? found
            : null;
        },
        60_000,
      );
      soak.kill('SIGTERM');
      expect(await exited, output).toBe(143);
      expect(output).toContain('soak: SIGTERM, stopping');
      const left = await waitFor(
        'the soak’s children to exit',
        () => {
          const running = children.filter((c) => alive(c.pid));
          return running.length === 0 ? running : null;
        },
        10_000,
      ).catch(() => children.filter((c) => alive(c.pid)));
      expect(left.map((c) => `${c.name} ${c.pid}`)).toEqual([]);
    } finally {
      if (soak.exitCode === null) soak.kill('SIGKILL');
      for (const child of [...children, ...descendantsOf(pid)])
        if (alive(child.pid)) process.kill(child.pid, 'SIGKILL');
    }
  }, 90_000);
});
