/**
 * Keeps the benchmark from rotting: runs `node dist/bench/run.js --tiny` (a few seconds,
 * 4 connections) against the real Tally server and the bare ceiling, exactly as
 * `npm run bench` does, and checks that every scenario moved real traffic without a
 * single error. It asserts nothing about speed: a shared CI box makes throughput
 * numbers noise, while a broken route, key or request shows up here as non-2xx.
 * It also checks that the bench's Tally really runs with its rate limiter on (the
 * `x-ratelimit-limit` header) and the `has-unlimited` Tally with it off, since the
 * has/has-unlimited comparison prices the limiter only if both hold.
 * Needs the compiled dist/ (`npm test` builds first).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import type { BenchReport, ServerStats } from '../bench/report.js';

const RUN_SCRIPT = fileURLToPath(new URL('../dist/bench/run.js', import.meta.url));
const BENCH_TIMEOUT_MS = 60_000;

let running: ChildProcess | undefined;

afterEach(() => {
  // The bench stops its own servers on SIGTERM; this only matters if the test timed out.
  if (running !== undefined && running.exitCode === null && running.signalCode === null)
    running.kill('SIGTERM');
  running = undefined;
});

function runBench(args: readonly string[]): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [RUN_SCRIPT, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    running = child;
    let output = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (output += chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (output += chunk));
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, output }));
  });
}

function expectClean(stats: ServerStats, label: string): void {
  expect(stats.reqPerSec, `${label}: req/s`).toBeGreaterThan(0);
  expect(
    stats.non2xx,
    `${label}: non-2xx (status codes ${JSON.stringify(stats.statusCodes)})`,
  ).toBe(0);
  expect(stats.errors, `${label}: connection errors`).toBe(0);
  expect(stats.dropped, `${label}: requests never answered (server closed connections)`).toBe(0);
}

describe('bench (tiny)', () => {
  it(
    'runs every scenario, has-unlimited included, against Tally and the bare server without errors',
    async () => {
      const dir = await mkdtemp(join(tmpdir(), 'tally-bench-test-'));
      try {
        const jsonPath = join(dir, 'bench.json');
        const { code, output } = await runBench(['--tiny', '--json', jsonPath]);
        expect(code, output).toBe(0);
        const report = JSON.parse(await readFile(jsonPath, 'utf8')) as BenchReport;
        expect(report.tally.ran, report.tally.note).toBe(true);
        expect(report.scenarios.map((s) => s.name)).toEqual(
          expect.arrayContaining(['has', 'has-unlimited']),
        );
        expect(
          report.rateLimitHeaderSeen,
          'rate-limited tally sent x-ratelimit-limit: 1000000000',
        ).toBe(true);
        expect(
          report.rateLimitOffHeaderSeen,
          'tally with rate limiting off sent no x-ratelimit-limit',
        ).toBe(false);
        for (const scenario of report.scenarios) {
          expectClean(scenario.bare, `${scenario.name} bare`);
          // has and has-unlimited are priced net of the rate-limit headers' parsing cost.
          if (scenario.name.startsWith('has')) {
            expect(
              scenario.headerControl,
              `${scenario.name}: bare + rate-limit headers results`,
            ).not.toBeNull();
            if (scenario.headerControl !== null)
              expectClean(scenario.headerControl, `${scenario.name} bare + rate-limit headers`);
          }
          expect(scenario.tally, `${scenario.name}: tally results`).not.toBeNull();
          if (scenario.tally !== null) expectClean(scenario.tally, `${scenario.name} tally`);
        }
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    },
    BENCH_TIMEOUT_MS,
  );
});
