/**
 * `GET /v1/admin/metrics`: every metric Tally exports, in the Prometheus text format,
 * for the operator key (in `x-tally-key` or as `Authorization: Bearer`, which is what a
 * Prometheus scrape config sends). docs/operations.md, "Metrics", lists them.
 *
 * Front-end metrics (HTTP, queue depths) are read where they are kept; shard metrics
 * (journal flush latency and group size, customers, idempotency entries, snapshot age)
 * come from each worker's stats reply, so a scrape waits behind the batches already
 * queued to a busy worker but never blocks one.
 */
import type { StorageWatch } from '../storage-watch.js';
import { GcPauses, type GcPauseStats } from '../../actors/gc-pauses.js';
import type { ShardLiveStats } from '../../actors/protocol.js';
import type { AdminRouteEntry } from '../api/admin-routes.js';
import type { ShardPool } from '../shard-pool.js';
import type { FrontEndCounts } from '../front-ends/threads.js';
import { Exposition, PROMETHEUS_CONTENT_TYPE } from './exposition.js';
import { HttpMetrics, statusLabel, type HttpMetricsData } from './http-metrics.js';
import type { Observability } from './observability.js';

export interface MetricsDeps {
  readonly pool: Pick<ShardPool, 'queueDepths' | 'liveStats' | 'viewStats'>;
  readonly obs: Observability;
  readonly startedAtMs: number;
  readonly storage: Pick<StorageWatch, 'freeBytes' | 'full' | 'refused'>;
  /** The front end's own GC pauses (each shard worker ships its own). */
  readonly gc?: Pick<GcPauses, 'stats'>;
  /** The webhook delivery thread's GC pauses as it last sent them (null: none yet). */
  readonly webhooksGc?: () => GcPauseStats | null;
  /**
   * The other front-end threads' HTTP counts and GC pauses (TALLY_FRONTENDS), second front
   * end first.
   */
  readonly frontEnds?: { collect(): Promise<FrontEndCounts[]> };
}

const MS = 0.001;

/** Milliseconds as seconds, or null (a gauge left out) where unknown. */
const seconds = (ms: number | null): number | null => (ms === null ? null : ms / 1000);

function renderHttp(out: Exposition, metrics: HttpMetrics): void {
  const used = metrics.series.filter((series) => series.latencyMs.count > 0);
  out.family(
    'tally_http_requests_total',
    'counter',
    'HTTP requests answered, by route pattern (unmatched: answered before a route ' +
      'matched), method and status.',
  );
  for (const series of used) {
    series.statuses.forEach((count, slot) => {
      if (count > 0)
        out.sample(
          'tally_http_requests_total',
          { route: series.route, method: series.method, status: statusLabel(slot) },
          count,
        );
    });
  }
  out.family(
    'tally_http_request_duration_seconds',
    'histogram',
    'Time from receiving a request to writing its answer, by route pattern and method.',
  );
  for (const series of used)
    out.histogram(
      'tally_http_request_duration_seconds',
      { route: series.route, method: series.method },
      series.latencyMs.data(),
      MS,
    );
  out.family(
    'tally_http_requests_aborted_total',
    'counter',
    'Requests whose client went away before the answer.',
  );
  out.sample('tally_http_requests_aborted_total', {}, metrics.aborted);
}

function renderShards(
  out: Exposition,
  depths: readonly number[],
  shards: readonly ShardLiveStats[],
  nowMs: number,
): void {
  const gauge = (
    name: string,
    help: string,
    value: (s: ShardLiveStats, shard: number) => number | null,
  ): void => {
    out.family(name, 'gauge', help);
    shards.forEach((s, shard) => {
      const v = value(s, shard);
      if (v !== null) out.sample(name, { shard: String(shard) }, v);
    });
  };
  gauge(
    'tally_shard_queue_depth',
    'Commands queued or in flight to the shard worker (503 past TALLY_QUEUE_MAX).',
    (_s, shard) => depths[shard] ?? 0,
  );
  gauge(
    'tally_shard_customers',
    'Customers held in memory by the shard worker.',
    (s) => s.customers,
  );
  gauge(
    'tally_shard_idempotency_entries',
    'Idempotency keys the shard worker keeps: in runs on disk (expired ones not yet ' +
      'dropped included) and in memory.',
    (s) => s.idempotencyEntries,
  );
  gauge(
    'tally_shard_idempotency_keys_in_memory',
    'Idempotency keys the shard worker holds in memory, not yet sealed into a run.',
    (s) => s.idempotencyKeysInMemory,
  );
  gauge(
    'tally_shard_idempotency_runs',
    "Sealed runs of idempotency keys on the shard worker's disk.",
    (s) => s.idempotencyRuns,
  );
  gauge(
    'tally_shard_idempotency_eras',
    "Eras of groups of runs of idempotency keys (one filter each) on the shard worker's disk " +
      'and in memory, the open one included.',
    (s) => s.idempotencyEras,
  );
  gauge(
    'tally_shard_idempotency_open_era_groups',
    "Groups of runs the shard worker's open era of idempotency filters holds at most (0: " +
      "none open): sized by the keys' rate unless TALLY_IDEMPOTENCY_ERA_GROUPS sets it.",
    (s) => s.idempotencyOpenEraGroups,
  );
  gauge(
    'tally_shard_idempotency_groups_outside_eras',
    'Groups of runs of idempotency keys outside any era, each probed by its own filter for ' +
      'every key that misses memory (after a crash, until an era is rebuilt over them).',
    (s) => s.idempotencyGroupsOutsideEras,
  );
  gauge(
    'tally_shard_idempotency_filter_bytes',
    "The shard worker's memory the filters of its eras, groups and runs of idempotency keys " +
      'take (closed eras read from the memory map not counted).',
    (s) => s.idempotencyFilterBytes,
  );
  gauge(
    'tally_shard_idempotency_filter_mapped_bytes',
    "Closed eras' filters the shard worker reads from LMDB's memory map (file pages).",
    (s) => s.idempotencyFilterMappedBytes,
  );
  gauge(
    'tally_shard_heap_used_bytes',
    "Bytes of the shard worker's V8 heap in use (each worker has a heap of its own).",
    (s) => s.heapUsedBytes,
  );
  gauge(
    'tally_shard_snapshots_taken',
    'Automatic snapshots the shard stored since the process started.',
    (s) => s.snapshotsTaken,
  );
  gauge(
    'tally_shard_snapshot_duration_seconds',
    "The shard's latest automatic snapshot, from its cut to stored (absent: none yet).",
    (s) => seconds(s.lastSnapshotMs),
  );
  gauge(
    'tally_shard_snapshot_pause_max_seconds',
    "The longest the latest snapshot held the shard's thread at once (a slice of the copy, " +
      'or the transaction that stored it).',
    (s) => seconds(s.lastSnapshotPauseMsMax),
  );
  gauge(
    'tally_shard_snapshot_work_max_seconds',
    "The longest the latest snapshot held the shard's thread at once, less the thread's " +
      'waits for a core while other threads ran (absent: not known on this system; Linux ' +
      'only).',
    (s) => seconds(s.lastSnapshotWorkMsMax),
  );
  gauge(
    'tally_shard_snapshot_store_seconds',
    "How long the transaction that stored the latest snapshot held the shard's thread " +
      '(a longer pause_max was a slice of the copy).',
    (s) => seconds(s.lastSnapshotStoreMs),
  );
  gauge(
    'tally_shard_snapshot_store_work_seconds',
    "The same less the thread's waits for a core (absent: not known on this system; " +
      'Linux only).',
    (s) => seconds(s.lastSnapshotStoreWorkMs),
  );
  gauge(
    'tally_shard_journal_records',
    'Journal records not yet covered by a snapshot.',
    (s) => s.journalRecords,
  );
  gauge(
    'tally_shard_store_bytes',
    "Bytes in use in the shard's LMDB environment (journal, snapshot, customer index).",
    (s) => s.usedBytes,
  );
  gauge(
    'tally_shard_snapshot_age_seconds',
    'Seconds since the shard last stored a snapshot (absent: none yet).',
    (s) => (s.lastSnapshotAtMs === null ? null : Math.max(0, nowMs - s.lastSnapshotAtMs) / 1000),
  );
  out.family(
    'tally_journal_flush_duration_seconds',
    'histogram',
    'Time from a journal append being issued to it being durable (fsynced), per shard worker.',
  );
  shards.forEach((s, shard) =>
    out.histogram(
      'tally_journal_flush_duration_seconds',
      { shard: String(shard) },
      s.journalFlushMs,
      MS,
    ),
  );
  out.family(
    'tally_journal_batch_events',
    'histogram',
    'Events per journal record, i.e. per group commit (one fsync), per shard worker.',
  );
  shards.forEach((s, shard) =>
    out.histogram('tally_journal_batch_events', { shard: String(shard) }, s.journalBatchEvents),
  );
}

function renderProcess(out: Exposition, deps: MetricsDeps): void {
  const memory = process.memoryUsage();
  out.family(
    'tally_process_start_time_seconds',
    'gauge',
    'When this process started (Unix epoch seconds).',
  );
  out.sample('tally_process_start_time_seconds', {}, Math.floor(deps.startedAtMs / 1000));
  out.family(
    'tally_process_resident_memory_bytes',
    'gauge',
    'Resident set size of the process (all threads).',
  );
  out.sample('tally_process_resident_memory_bytes', {}, memory.rss);
  out.family('tally_process_heap_used_bytes', 'gauge', "V8 heap in use by the front end's thread.");
  out.sample('tally_process_heap_used_bytes', {}, memory.heapUsed);
  out.family(
    'tally_log_lines_suppressed_total',
    'counter',
    'Error log lines not written because more than the per-second budget came at once.',
  );
  out.sample('tally_log_lines_suppressed_total', {}, deps.obs.suppressedTotal);
  const { storage } = deps;
  if (storage.freeBytes !== null) {
    out.family(
      'tally_storage_free_bytes',
      'gauge',
      "Free bytes on the data directory's filesystem at the last poll.",
    );
    out.sample('tally_storage_free_bytes', {}, storage.freeBytes);
  }
  out.family(
    'tally_storage_full',
    'gauge',
    '1 while the free space is below the reserve and writes are refused.',
  );
  out.sample('tally_storage_full', {}, storage.full ? 1 : 0);
  out.family('tally_storage_refused_total', 'counter', 'Requests refused with 503 storage_full.');
  out.sample('tally_storage_refused_total', {}, storage.refused);
}

/** The front end's `has` view: answers served from it, and what it holds. */
function renderView(out: Exposition, view: { hits: number; customers: number }): void {
  out.family(
    'tally_has_view_hits_total',
    'counter',
    '`has` requests the front end answered from the answers the shards published, without ' +
      'a round trip to a worker.',
  );
  out.sample('tally_has_view_hits_total', {}, view.hits);
  out.family(
    'tally_has_view_customers',
    'gauge',
    'Customers whose `has` answers the front end holds.',
  );
  out.sample('tally_has_view_customers', {}, view.customers);
}

/**
 * GC pauses per thread: the first front end's (`main`), the later ones' (`front-n`), each
 * shard worker's, the webhook delivery thread's.
 */
function renderGc(
  out: Exposition,
  main: GcPauseStats | null,
  others: readonly FrontEndCounts[],
  shards: readonly ShardLiveStats[],
  webhooks: GcPauseStats | null,
): void {
  const threads: Array<[string, GcPauseStats]> = [];
  if (main !== null) threads.push(['main', main]);
  others.forEach((other, i) => threads.push([`front-${i + 1}`, other.gc]));
  shards.forEach((s, shard) => threads.push([`shard-${shard}`, s.gc]));
  if (webhooks !== null) threads.push(['webhooks', webhooks]);
  out.family(
    'tally_gc_pause_seconds',
    'histogram',
    'Garbage-collection pauses since start, per thread (main: the first front end; front-n: ' +
      'a later one; shard-n: a worker; webhooks: the delivery thread, as it last reported, ' +
      'within a second).',
  );
  for (const [thread, gc] of threads)
    out.histogram('tally_gc_pause_seconds', { thread }, gc.pausesMs, MS);
  out.family(
    'tally_gc_pause_max_seconds',
    'gauge',
    'The longest GC pause since start, per thread.',
  );
  for (const [thread, gc] of threads)
    out.sample('tally_gc_pause_max_seconds', { thread }, gc.pauseMsMax / 1000);
}

/**
 * Requests each front end answered: the first's include those the others relayed to it.
 * `others`: the other front ends' counts, second first.
 */
function renderFrontEnds(out: Exposition, first: HttpMetricsData, others: HttpMetricsData[]): void {
  out.family(
    'tally_front_end_requests_total',
    'counter',
    'HTTP requests answered per front-end thread (0: the first, which also answers what the ' +
      'others relay to it).',
  );
  [first, ...others].forEach((data, frontEnd) => {
    let total = 0;
    for (const series of data.series) total += series.latencyMs.count;
    out.sample('tally_front_end_requests_total', { front_end: String(frontEnd) }, total);
  });
}

/** The whole exposition, from numbers already gathered (`others`: other front ends' counts). */
export function renderMetrics(
  deps: MetricsDeps,
  depths: readonly number[],
  shards: readonly ShardLiveStats[],
  nowMs: number,
  others: readonly FrontEndCounts[] = [],
): string {
  const out = new Exposition();
  const first = deps.obs.metrics.data();
  const othersHttp = others.map((o) => o.http);
  if (others.length === 0) renderHttp(out, deps.obs.metrics);
  else {
    const all = new HttpMetrics();
    all.absorb(first);
    for (const data of othersHttp) all.absorb(data);
    renderHttp(out, all);
  }
  renderFrontEnds(out, first, othersHttp);
  renderShards(out, depths, shards, nowMs);
  renderView(out, deps.pool.viewStats());
  renderGc(out, deps.gc?.stats() ?? null, others, shards, deps.webhooksGc?.() ?? null);
  renderProcess(out, deps);
  return out.text();
}

export function metricsRoute(deps: MetricsDeps): AdminRouteEntry[2] {
  const withGc: MetricsDeps = deps.gc === undefined ? { ...deps, gc: new GcPauses() } : deps;
  return {
    keys: 'operator',
    audited: false,
    handle(ctx) {
      const depths = deps.pool.queueDepths();
      const others = deps.frontEnds?.collect() ?? Promise.resolve([]);
      Promise.all([deps.pool.liveStats(), others]).then(
        ([shards, frontEnds]) =>
          ctx.ex.sendText(
            200,
            PROMETHEUS_CONTENT_TYPE,
            renderMetrics(withGc, depths, shards, Date.now(), frontEnds),
          ),
        (error: unknown) => ctx.ex.failInternal(error),
      );
    },
  };
}
