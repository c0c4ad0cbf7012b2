/**
 * The bench report's round-by-round view: each round's Tally segment against the bare
 * segment measured next to it, and the notes beside a target's whole-run verdict.
 * Synthetic segments, so every expected number is worked out by hand.
 */
import { describe, expect, it } from 'vitest';
import { LatencyHistogram } from '../bench/latency-histogram.js';
import type { SegmentResult } from '../bench/load.js';
import { roundRatios, roundsNote, scenarioResults, summarize } from '../bench/report.js';
import { SCENARIOS } from '../bench/scenarios.js';

/** One second of `ok2xx` answers, every one taking `latencyMs`. */
function segment(ok2xx: number, latencyMs: number): SegmentResult {
  const latency = new LatencyHistogram();
  for (let i = 0; i < 100; i++) latency.record(latencyMs);
  return {
    durationSec: 1,
    ok2xx,
    dropped: 0,
    non2xx: 0,
    errors: 0,
    timeouts: 0,
    statusCodes: { 200: ok2xx },
    latency,
  };
}

function scenario(name: string) {
  const found = SCENARIOS.find((s) => s.name === name);
  if (found === undefined) throw new Error(`no scenario ${name}`);
  return found;
}

describe('bench report, round by round', () => {
  it('divides each round of tally by the same round of bare, in measurement order', () => {
    const bare = summarize([segment(1000, 1), segment(800, 1), segment(1000, 1)]);
    const tally = summarize([segment(400, 1), segment(360, 1), segment(300, 1)]);
    expect(tally.reqPerSecBySegment).toEqual([400, 360, 300]);
    expect(roundRatios(tally, bare)).toEqual([0.4, 0.45, 0.3]);
    // The whole run is 1060 / 2800, which the rounds' spread puts in context.
    expect(tally.reqPerSec / bare.reqPerSec).toBeCloseTo(0.3786, 4);
  });

  it('skips a round whose denominator answered nothing rather than dividing by zero', () => {
    const bare = summarize([segment(1000, 1), segment(0, 1)]);
    const tally = summarize([segment(500, 1), segment(500, 1)]);
    expect(roundRatios(tally, bare)).toEqual([0.5]);
  });

  it('counts the rounds that meet a minimum or a maximum and gives the median and range', () => {
    expect(roundsNote([0.4, 0.45, 0.3], { min: 0.4 })).toBe(
      'rounds: 2 of 3 >= 0.4, median 0.400x, 0.300x-0.450x',
    );
    expect(roundsNote([0.3, 0.5, 0.45, 0.35], { min: 0.4 })).toBe(
      'rounds: 2 of 4 >= 0.4, median 0.400x, 0.300x-0.500x',
    );
    expect(roundsNote([2.5, 1.5, 1.9], { max: 2 }, ' ms')).toBe(
      'rounds: 2 of 3 <= 2, median 1.90 ms, 1.50 ms-2.50 ms',
    );
    expect(roundsNote([], { min: 0.4 })).toBe('');
  });

  it('puts the rounds beside every kind of target', () => {
    const bare = summarize([segment(1000, 1), segment(1000, 1)]);
    const rateLimited = summarize([segment(700, 2.5), segment(600, 1.5)]);
    const unlimited = summarize([segment(700, 1), segment(700, 1)]);
    const at = (connections: number) =>
      scenarioResults([
        {
          scenario: scenario('has'),
          connections,
          pipelining: 1,
          bare,
          headerControl: bare,
          tallyLabel: 'tally',
          tally: rateLimited,
          bareSharedWith: null,
        },
        {
          scenario: scenario('has-unlimited'),
          connections,
          pipelining: 1,
          bare,
          headerControl: bare,
          tallyLabel: 'tally-rl-off',
          tally: unlimited,
          bareSharedWith: 'has',
        },
      ])[0];
    const notes = (connections: number) =>
      at(connections)?.targets.map(
        (t) => `${t.pass === null ? 'n/a' : t.pass ? 'PASS' : 'FAIL'} ${t.note ?? ''}`,
      );
    expect(at(256)?.ratioByRound).toEqual([0.7, 0.6]);
    // The figure is the median of the rounds' ratios.
    expect(at(256)?.ratio).toBeCloseTo(0.65, 10);
    expect(notes(256)).toEqual([
      'FAIL measured 0.650x; rounds: 0 of 2 >= 0.8, median 0.650x, 0.600x-0.700x',
      'n/a ran at 256x1',
      // The header control answered as fast as bare, so net and raw agree.
      'FAIL median net 0.929x (raw 0.929x, bare with the headers vs without 1.000x); net ' +
        'rounds: 1 of 2 >= 0.95, median 0.929x, 0.857x-1.000x',
    ]);
    expect(notes(50)).toEqual([
      'n/a ran at 50',
      // Half the answers took 2.5 ms, so the run's p99 fails while one round passes.
      expect.stringMatching(
        /^FAIL measured 2\.5\d ms; rounds: 1 of 2 <= 2, median 2\.0\d ms, 1\.5\d ms-2\.5\d ms$/,
      ),
      'FAIL median net 0.929x (raw 0.929x, bare with the headers vs without 1.000x); net ' +
        'rounds: 1 of 2 >= 0.95, median 0.929x, 0.857x-1.000x',
    ]);
  });

  it(
    "judges the limiter's price net of the load generator's cost of parsing the three " +
      'headers, round by round',
    () => {
      const bare = summarize([segment(1000, 1), segment(1000, 1)]);
      // The bare server that adds the lines: 10% and 20% slower in the two rounds.
      const headerControl = summarize([segment(900, 1), segment(800, 1)]);
      const rateLimited = summarize([segment(700, 1), segment(600, 1)]);
      const unlimited = summarize([segment(700, 1), segment(700, 1)]);
      const measured = (headers: typeof headerControl | null) =>
        scenarioResults([
          {
            scenario: scenario('has'),
            connections: 50,
            pipelining: 1,
            bare,
            headerControl: headers,
            tallyLabel: 'tally',
            tally: rateLimited,
            bareSharedWith: null,
          },
          {
            scenario: scenario('has-unlimited'),
            connections: 50,
            pipelining: 1,
            bare,
            headerControl: headers,
            tallyLabel: 'tally-rl-off',
            tally: unlimited,
            bareSharedWith: 'has',
          },
        ])[0]?.targets[2];
      // Raw rounds 700/700 = 1.0 and 600/700 = 0.857 (median 0.929); the generator's share
      // 0.9 and 0.8 (median 0.85); net rounds 1.0/0.9 = 1.111 and 0.857/0.8 = 1.071 (median 1.091).
      expect(measured(headerControl)).toMatchObject({
        pass: true,
        note:
          'median net 1.091x (raw 0.929x, bare with the headers vs without 0.850x); net ' +
          'rounds: 2 of 2 >= 0.95, median 1.091x, 1.071x-1.111x',
      });
      // Without the control there is no verdict rather than a raw one.
      expect(measured(null)).toMatchObject({ pass: null, note: 'the header control did not run' });
    },
  );
});

describe('CPU per request and the Markdown report', () => {
  it("divides each thread group's CPU seconds by the answered requests, front end first", () => {
    const stats = summarize(
      [segment(1000, 1), segment(1000, 1)],
      new Map([
        ['other', 0.002],
        ['tally-shard-0', 0.01],
        ['main', 0.03],
      ]),
    );
    expect(Object.keys(stats.cpuUsPerRequest)).toEqual(['main', 'tally-shard-0', 'other']);
    expect(stats.cpuUsPerRequest['main']).toBeCloseTo(15, 10);
    expect(stats.cpuUsPerRequest['tally-shard-0']).toBeCloseTo(5, 10);
    expect(summarize([segment(0, 1)], new Map([['main', 1]])).cpuUsPerRequest).toEqual({});
  });

  it(
    'replaces only the generated block of the document, ' + 'keeping what is written around it',
    async () => {
      const { mkdtemp, readFile, writeFile } = await import('node:fs/promises');
      const { tmpdir } = await import('node:os');
      const { join } = await import('node:path');
      const { writeMarkdownReport } = await import('../bench/report-markdown.js');
      const file = join(await mkdtemp(join(tmpdir(), 'perf-md-')), 'performance.md');
      await writeFile(file, '# Performance\n\nWhat bounds each figure: kept.\n');
      const bare = summarize([segment(1000, 1), segment(1000, 1)]);
      const tally = summarize([segment(700, 1), segment(600, 1)], new Map([['main', 0.013]]));
      const report = {
        startedAt: '2026-01-02T03:04:05.000Z',
        node: 'v20.0.0',
        availableParallelism: 2,
        loadAverage1mAtStart: 0.5,
        loadAverage1m: 0.7,
        cpuModel: 'cpu',
        platform: 'linux-x64',
        loadGenerator: 'wrk (1 thread)',
        options: { rounds: 2, durationSec: 5 },
        tally: { ran: true, note: 'one worker' },
        rateLimitHeaderSeen: true,
        rateLimitOffHeaderSeen: null,
        scenarios: scenarioResults([
          {
            scenario: scenario('consume'),
            connections: 256,
            pipelining: 1,
            bare,
            headerControl: null,
            tallyLabel: 'tally',
            tally,
            bareSharedWith: null,
          },
        ]),
      };
      await writeMarkdownReport(file, report, ['--rounds', '2']);
      // a second run replaces, never appends
      await writeMarkdownReport(file, report, ['--rounds', '2']);
      const text = await readFile(file, 'utf8');
      expect(text.match(/## Latest run/g)).toHaveLength(1);
      expect(text).toContain('What bounds each figure: kept.');
      expect(text).toContain('| `consume` | 256 | 1000 | 650 | **0.65×** (0.60–0.70) |');
      expect(text).toContain('main 10.0');
      expect(text).toContain('Command: `npm run bench -- --rounds 2`');
      expect(text).toMatch(
        /`consume` at 256 connections: median tally\/bare >= 0\.55 at 256 connections: met/,
      );
    },
  );
});

describe('soak plot', () => {
  it('draws own memory on its own scale above RSS, and the probe in a panel below', async () => {
    const { plotSoak } = await import('../bench/soak-plot.js');
    const windows = [15, 30, 45].map((atSec, i) => ({
      atSec,
      // File pages grow with the data, to many times the process's own memory.
      rssMiB: 2000 + 3000 * i,
      rssFileMiB: 1700 + 3000 * i,
      ownMiBMedian: 300 + 5 * i,
      ownMiBMax: 320 + 5 * i,
      heapMiB: 100,
      memoryKeys: 0,
      keptKeys: 0,
      runs: 0,
      filterMiB: 0,
      snapshots: 0,
      snapshotMsMax: null,
      snapshotPauseMsMax: null,
      snapshotWorkMsMax: null,
      snapshotStoreMs: null,
      snapshotStoreWorkMs: null,
      probeMsP99: 1 + i,
      probeMsP999: 2,
      probeMsMax: 5 * (i + 1),
      probeLatenciesMs: [],
      probeFailures: 0,
      bareProbeMsP99: 0.5 + i,
      bareProbeMsMax: 1,
      bareProbeLatenciesMs: [],
      stealPercent: 0,
      loadRequests: 0,
      loadMsP99: 0,
      loadNon2xx: 0,
      gcPauseMsMax: 0,
      gcLongestMs: 0,
      gcLongestInSoakMs: null,
    }));
    const svg = plotSoak(windows);
    expect(svg.startsWith('<svg')).toBe(true);
    const lines = [...svg.matchAll(/<polyline[^>]*points="([^"]+)"/g)].map((m) =>
      (m[1] ?? '').split(' ').map((p) => p.split(',').map(Number)),
    );
    expect(lines).toHaveLength(6);
    // Two panels of 165 px: memory from y 24, the probe from y 219 (30 px between them).
    const panels = [
      [24, 189],
      [219, 384],
    ] as const;
    for (const [n, line] of lines.entries()) {
      const [top, bottom] = panels[n < 3 ? 0 : 1];
      expect(line).toHaveLength(3);
      for (const [x, y] of line) {
        expect(x).toBeGreaterThanOrEqual(56);
        expect(x).toBeLessThanOrEqual(720 - 56);
        expect(y).toBeGreaterThanOrEqual(top);
        expect(y).toBeLessThanOrEqual(bottom);
      }
    }
    const [own, highest, rss, p99, , bareP99] = lines.map((line) => line.map(([, y]) => y ?? 0));
    // The own memory (~300 of RSS's 2–8 GiB) is drawn on its own scale: in the panel's
    // upper half, not pressed to its floor; each window's highest reading above it.
    for (const [i, y] of (own ?? []).entries()) {
      expect(y).toBeLessThan((24 + 189) / 2);
      expect((highest ?? [])[i]).toBeLessThan(y);
    }
    // RSS rises, so its line climbs (smaller y further right).
    expect((rss ?? [])[2]).toBeLessThan((rss ?? [])[0] ?? 0);
    // The bare server's p99 is below Tally's at every point, so lower on the chart.
    for (const [i, y] of (bareP99 ?? []).entries()) expect(y).toBeGreaterThan((p99 ?? [])[i] ?? 0);
  });
});

describe('soak verdicts', () => {
  /** 100 probes of 2 ms, `slow` of them 8 ms instead (the first window: 40 ms). */
  const probes = (i: number, slow: number): number[] =>
    Array.from({ length: 100 }, (_, n) => (i === 0 ? 40 : n < slow ? 8 : 2));
  const window = (
    i: number,
    gcLongestMs: number | null,
    slow = i === 3 ? 4 : 0,
    hold: { readonly clockMs: number; readonly workMs: number | null } = {
      clockMs: 4.5,
      workMs: null,
    },
    /** The window's GC bucket bound, and a pause that set a thread's record in it. */
    gc: { readonly bucketMs: number; readonly recordMs: number | null } = {
      bucketMs: i === 2 ? 30 : 10,
      recordMs: null,
    },
  ) => ({
    atSec: 15 * (i + 1),
    rssMiB: 300 + (i % 2) * 20,
    rssFileMiB: 100 + (i % 2) * 20, // own memory 200 MiB in every window
    ownMiBMedian: 200,
    ownMiBMax: i === 4 ? 296 : 205, // a moment's peak in window 4 (an era's image written)
    heapMiB: 100,
    memoryKeys: 0,
    keptKeys: 0,
    runs: 0,
    filterMiB: 0,
    snapshots: i === 4 ? 1 : 0,
    snapshotMsMax: i === 4 ? 120 : null,
    snapshotPauseMsMax: i === 4 ? hold.clockMs : null,
    snapshotWorkMsMax: i === 4 ? hold.workMs : null,
    snapshotStoreMs: null,
    snapshotStoreWorkMs: null,
    probeMsP99: i === 0 ? 40 : slow > 0 ? 8 : 2, // the first window is warm-up
    probeMsP999: 5,
    probeMsMax: 12,
    probeLatenciesMs: probes(i, slow),
    probeFailures: 0,
    bareProbeMsP99: 3,
    bareProbeMsMax: 9,
    // 100 answers of the bare server a window, one of them slow: its p99 is 1 ms.
    bareProbeLatenciesMs: Array.from({ length: 100 }, (_, n) => (n === 0 ? 9 : 1)),
    stealPercent: i === 5 ? Number.NaN : i, // the last window could not read /proc/stat
    loadRequests: 1000,
    loadMsP99: 25,
    loadNon2xx: 0,
    gcPauseMsMax: gc.bucketMs,
    gcLongestMs,
    gcLongestInSoakMs: gc.recordMs,
  });

  it('judges GC pauses in the soak by the buckets; earlier ones are only shown', async () => {
    const { verdicts } = await import('../bench/soak-verdicts.js');
    // A 20.6 ms pause before the soak (the gauges' since start), 17.2 ms in window 3.
    const gauged = [0, 1, 2, 3, 4, 5].map((i) =>
      window(i, 20.6, undefined, undefined, {
        bucketMs: i === 3 ? 20 : 10,
        recordMs: i === 3 ? 17.2 : null,
      }),
    );
    const clean = { errors: 0, non2xx: 0 };
    const lines = verdicts(gauged, { ...clean, msP99: 30 }, { ...clean, msP99: 10 });
    expect(lines).toHaveLength(6);
    // Flat by the windows' medians; the moment's peak is named, not judged.
    expect(lines[0]).toBe(
      'Memory of its own (RSS less file-backed pages) after warm-up within 0.0% (target ' +
        "10%; 200–200 MiB, each window's median of its readings once a second): held; the " +
        'highest reading 296 MiB (the window ending at 75 s); all of RSS within 6.7% ' +
        "(file-backed pages: LMDB's page cache).",
    );
    // Memory that climbs window by window misses, whatever its peaks.
    const climbing = [0, 1, 2, 3, 4, 5].map((i) => ({
      ...window(i, 8),
      ownMiBMedian: 200 + 10 * i,
      ownMiBMax: 200 + 10 * i,
    }));
    expect(verdicts(climbing, { ...clean, msP99: 30 }, { ...clean, msP99: 10 })[0]).toMatch(
      /within 13\.6% \(target 10%; 220–250 MiB, .*\): missed; the highest reading 250 MiB /,
    );
    // One window's p99 is 8 ms, but 4 slow probes of 400 after warm-up leave the p99 at 2.
    expect(lines[1]).toMatch(/^Probe p99 2\.00 ms after warm-up \(target 5 ms; at most 8\.00 ms /);
    expect(lines[1]).toMatch(/in a 15-second window\) and max 12\.0 ms .*: held;/);
    // The bare server's p99 over all its answers after warm-up, its worst window beside it,
    // and the host's share of the CPU over the windows that could read it (0–4%).
    expect(lines[1]).toMatch(
      /server probed the same way at the same time: p99 1\.00 ms \(at most 3\.00 ms in a /,
    );
    expect(lines[1]).toMatch(
      /window\), max 9\.0 ms \(the machine's share\); the host took 2\.0% of the machine's CPU /,
    );
    expect(lines[1]).toMatch(/time during the soak \(steal; at most 4\.0% in a window\)\.$/);
    const slower = [0, 1, 2, 3, 4, 5].map((i) => window(i, 8, i === 3 ? 10 : 0));
    expect(verdicts(slower, { ...clean, msP99: 30 }, { ...clean, msP99: 10 })[1]).toMatch(
      /^Probe p99 8\.00 ms after warm-up .*: missed;/,
    );
    expect(lines[2]).toBe(
      'Load p99 30.0 ms against 10.0 ms in a 5-second run of the same load before the soak: ' +
        '3.00× (target 3×): held.',
    );
    expect(lines[3]).toBe(
      'Longest GC pause of a thread answering requests during the soak at most 20 ms by ' +
        "the histograms' buckets (target 20 ms): held; of the pauses that set a thread's " +
        'record during the soak, the longest: 17.2 ms; since the process started (the ' +
        "warm-up and the 5-second run included), by the threads' own gauges: 20.6 ms.",
    );
    expect(lines[4]).toMatch(/snapshot 4\.5 ms \(target about 5 ms\): held/);
    expect(lines[5]).toMatch(/: 0 \(target 0\): held/);
    const bare = [0, 1, 2, 3, 4, 5].map((i) => window(i, null));
    expect(
      verdicts(bare, { errors: 0, non2xx: 2, msP99: 31 }, { errors: 1, non2xx: 0, msP99: 10 }),
    ).toEqual([
      expect.anything(),
      expect.anything(),
      expect.stringMatching(/: 3\.10× \(target 3×\): missed\.$/),
      'Longest GC pause of a thread answering requests during the soak at most 30 ms by ' +
        "the histograms' buckets (target 20 ms): missed.",
      expect.anything(),
      expect.stringMatching(/: 3 \(target 0\): missed/),
    ]);
  });
});

describe('soak verdict on snapshot holds', () => {
  const clean = { errors: 0, non2xx: 0, msP99: 10 };
  interface Hold {
    readonly clockMs: number;
    readonly workMs: number | null;
    /** The storing transaction's figures (by the clock, less waits), if known. */
    readonly stored?: { readonly clockMs: number; readonly workMs: number | null };
  }
  const holds = (held: ReadonlyArray<Hold | null>) =>
    held.map((hold, i) => ({
      atSec: 15 * (i + 1),
      rssMiB: 300,
      rssFileMiB: 100,
      ownMiBMedian: 200,
      ownMiBMax: 200,
      heapMiB: 100,
      memoryKeys: 0,
      keptKeys: 0,
      runs: 0,
      filterMiB: 0,
      snapshots: hold === null ? 0 : 1,
      snapshotMsMax: hold === null ? null : 100,
      snapshotPauseMsMax: hold?.clockMs ?? null,
      snapshotWorkMsMax: hold?.workMs ?? null,
      snapshotStoreMs: hold?.stored?.clockMs ?? null,
      snapshotStoreWorkMs: hold?.stored?.workMs ?? null,
      probeMsP99: 2,
      probeMsP999: 3,
      probeMsMax: 4,
      probeLatenciesMs: [2],
      probeFailures: 0,
      bareProbeMsP99: 2,
      bareProbeMsMax: 3,
      bareProbeLatenciesMs: [2],
      stealPercent: 0,
      loadRequests: 1000,
      loadMsP99: 10,
      loadNon2xx: 0,
      gcPauseMsMax: 5,
      gcLongestMs: 5,
      gcLongestInSoakMs: null,
    }));
  const line = async (windows: ReturnType<typeof holds>): Promise<string> => {
    const { verdicts } = await import('../bench/soak-verdicts.js');
    return verdicts(windows, clean, clean)[4] as string;
  };

  it('judges a hold less its waits for a core when every window knows them', async () => {
    const slowClock = holds([null, { clockMs: 7.2, workMs: 3.1 }, null, { clockMs: 4, workMs: 2 }]);
    expect(await line(slowClock)).toBe(
      "Longest hold of a shard's thread by a snapshot 3.10 ms less its waits for a core " +
        '(target about 5 ms): held; by the clock, waits included, 7.2 ms (1 of 2 snapshot ' +
        'windows over 5 ms).',
    );
    const longWork = holds([
      { clockMs: 6.1, workMs: 5.6 },
      { clockMs: 2, workMs: 1.5 },
    ]);
    expect(await line(longWork)).toMatch(
      /snapshot 5\.60 ms less its waits for a core \(target about 5 ms\): missed;/,
    );
  });

  it('names the part of the snapshot the longest hold was', async () => {
    // Less the waits, the longest (3.1 ms) was the storing transaction; by the clock the
    // longest (7.2 ms, another window) was a slice, which the verdict does not judge.
    const stored = holds([
      { clockMs: 7.2, workMs: 2.5, stored: { clockMs: 2.9, workMs: 2.1 } },
      { clockMs: 4, workMs: 3.1, stored: { clockMs: 4, workMs: 3.1 } },
    ]);
    expect(await line(stored)).toMatch(
      /^Longest hold .* 3\.10 ms less its waits .*: held \(the transaction that stored it\); by/,
    );
    const slice = holds([
      { clockMs: 7.2, workMs: 5.6, stored: { clockMs: 2.9, workMs: 2.1 } },
      { clockMs: 4, workMs: 3.1, stored: { clockMs: 4, workMs: 3.1 } },
    ]);
    expect(await line(slice)).toMatch(/: missed \(a slice of the copy\); by the clock/);
    // By the clock alone, when the waits are unknown.
    const clock = holds([{ clockMs: 5.4, workMs: null, stored: { clockMs: 1.2, workMs: null } }]);
    expect(await line(clock)).toBe(
      "Longest hold of a shard's thread by a snapshot 5.4 ms (target about 5 ms): missed " +
        '(a slice of the copy).',
    );
  });

  it('judges the clock when any snapshot window lacks the waits', async () => {
    const unknown = holds([
      { clockMs: 4.8, workMs: 2 },
      { clockMs: 5.4, workMs: null },
    ]);
    expect(await line(unknown)).toBe(
      "Longest hold of a shard's thread by a snapshot 5.4 ms (target about 5 ms): missed.",
    );
  });
});

describe('soak metrics reading', () => {
  const consumeBucket = 'tally_http_request_duration_seconds_bucket{route="/v1/usage/:key/consume"';
  const text = (fast: number, slow: number): string =>
    [
      '# TYPE tally_http_request_duration_seconds histogram',
      `${consumeBucket},method="POST",le="0.001"} ${fast}`,
      `${consumeBucket},method="POST",le="0.01"} ${fast + slow}`,
      `${consumeBucket},method="POST",le="+Inf"} ${fast + slow}`,
      'tally_http_request_duration_seconds_bucket{route="/healthz",method="GET",le="0.001"} 7',
      'tally_http_request_duration_seconds_bucket{route="/healthz",method="GET",le="0.01"} 9',
      'tally_http_request_duration_seconds_bucket{route="/healthz",method="GET",le="+Inf"} 9',
      'tally_shard_heap_used_bytes{shard="0"} 100',
      'tally_shard_heap_used_bytes{shard="1"} 50',
    ].join('\n');

  it('takes what was observed between two scrapes, for the series it picks', async () => {
    const m = await import('../bench/metrics-text.js');
    const consume = (labels: Readonly<Record<string, string>>): boolean =>
      labels['route'] === '/v1/usage/:key/consume';
    const before = m.buckets(
      m.samples(text(100, 0)),
      'tally_http_request_duration_seconds',
      consume,
    );
    const after = m.buckets(
      m.samples(text(198, 2)),
      'tally_http_request_duration_seconds',
      consume,
    );
    const between = m.since(after, before);
    expect(m.total(between)).toBe(100);
    expect(m.quantileBound(between, 0.98)).toBe(0.001);
    expect(m.quantileBound(between, 0.99)).toBe(0.01);
    expect(m.maxBound(between)).toBe(0.01);
    expect(m.maxBound(m.since(before, before))).toBe(0);
    expect(m.gaugeSum(m.samples(text(0, 0)), 'tally_shard_heap_used_bytes')).toBe(150);
    expect(m.gaugeMax(m.samples(text(0, 0)), 'tally_shard_heap_used_bytes')).toBe(100);
  });
});

describe('machine check', () => {
  it("reads the requests a second from wrk's summary", async () => {
    const { requestsPerSecOf } = await import('../bench/wrk.js');
    const stdout = [
      'Running 5s test @ http://127.0.0.1:18557/',
      '  1 threads and 256 connections',
      '  Thread Stats   Avg      Stdev     Max   +/- Stdev',
      '    Latency     3.18ms    1.21ms  11.40ms   66.39%',
      '    Req/Sec    70.87k     3.11k   75.40k    72.00%',
      '  352614 requests in 5.00s, 24.21MB read',
      'Requests/sec:  70517.69',
      'Transfer/sec:      4.84MB',
    ].join('\n');
    expect(requestsPerSecOf(stdout)).toBeCloseTo(70517.69, 2);
    expect(requestsPerSecOf('wrk: connection refused')).toBeNaN();
  });

  it("parses a script's WRK_JSON line; throws with wrk's output without one", async () => {
    const { wrkSummaryOf } = await import('../bench/wrk.js');
    const stdout = 'Running 5s test\nWRK_JSON{"requests":1200,"p99Us":850}\nRequests/sec: 240\n';
    expect(wrkSummaryOf(stdout)).toEqual({ requests: 1200, p99Us: 850 });
    expect(() => wrkSummaryOf('Running 5s test\nRequests/sec: 240\n')).toThrow(
      /wrk printed no summary:\nRunning 5s test/,
    );
  });
});
