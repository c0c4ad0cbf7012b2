/**
 * Keeps the recovery benchmark from rotting, and checks that what it measures is a
 * correct recovery: builds a tiny data dir with the bench's own machinery (2,000
 * customers, 20,000 consume events, two shard workers, so both the journal and the
 * snapshot paths of each worker and the customer routing are exercised), starts the real
 * server on it as the bench does, and asks it for balances. Expected usage comes from the
 * workload's schedule, summed here, never from Tally. Needs the compiled dist/ (`npm
 * test` builds first).
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import {
  buildDataDir,
  customerIdOf,
  eventOf,
  RECOVERY_METERS,
  removeDataDir,
  type Workload,
} from '../bench/recovery-data.js';
import { startAndMeasure, stopServer } from '../bench/recovery-start.js';

const MAIN_SCRIPT = fileURLToPath(new URL('../dist/src/main.js', import.meta.url));
const WORKLOAD: Workload = { customers: 2_000, events: 20_000 };
const EVENTS_PER_RECORD = 64;
const WORKERS = 2;
/** First, last, and a few in between (both workers own some of them). */
const CHECKED = [0, 1, 2, 3, 999, 1_000, 1_998, 1_999];

/** Every meter's included amount in RECOVERY_CONFIG, in micro-units. */
const INCLUDED_MICROS = 1_000_000_000n * 1_000_000n;

/** customer → meter → consumed micro-units, straight from the schedule. */
function expectedConsumedMicros(): Map<number, bigint[]> {
  const micros = new Map(CHECKED.map((c) => [c, RECOVERY_METERS.map(() => 0n)]));
  for (let k = 0; k < WORKLOAD.events; k++) {
    const event = eventOf(k, WORKLOAD.customers);
    const sums = micros.get(event.customer);
    if (sums !== undefined) sums[event.meter] = (sums[event.meter] ?? 0n) + event.amountMicros;
  }
  return micros;
}

/** As the API renders micro-units. */
const units = (micros: bigint): number => Number(micros) / 1e6;

async function checkRecovery(tailEvents: number | null): Promise<void> {
  const dataDir = await mkdtemp(join(tmpdir(), 'tally-recovery-test-'));
  try {
    const built = await buildDataDir({
      ...WORKLOAD,
      dataDir,
      workers: WORKERS,
      eventsPerRecord: EVENTS_PER_RECORD,
      tailEvents,
      mainScript: MAIN_SCRIPT,
    });
    expect(built.records).toBeGreaterThanOrEqual(WORKLOAD.events / EVENTS_PER_RECORD);
    for (const shard of built.shards) expect(shard.snapshotSeq > 0).toBe(tailEvents !== null);
    const server = await startAndMeasure(MAIN_SCRIPT, dataDir, { TALLY_WORKERS: String(WORKERS) });
    try {
      const { measurement } = server;
      expect(measurement.msToHealthz).toBeGreaterThan(0);
      expect(measurement.peakRssBytes).toBeGreaterThanOrEqual(measurement.rssBytes);
      const shards = measurement.shards as Array<{
        customers: number;
        lastSeq: number;
        snapshotSeq: number;
        replayedBatches: number;
      }>;
      expect(shards.reduce((sum, s) => sum + s.customers, 0)).toBe(WORKLOAD.customers);
      expect(shards.map((s) => [s.lastSeq, s.snapshotSeq])).toEqual(
        built.shards.map((s) => [s.lastSeq, s.snapshotSeq]),
      );
      for (const s of shards) expect(s.replayedBatches).toBe(s.lastSeq - s.snapshotSeq);
      for (const [customer, consumed] of expectedConsumedMicros()) {
        for (const [m, meter] of RECOVERY_METERS.entries()) {
          const consumedMicros = consumed[m] ?? 0n;
          expect(consumedMicros).toBeGreaterThan(0n);
          const response = await fetch(
            `${server.baseUrl}/v1/usage/${meter}/balance?customerId=${customerIdOf(customer)}`,
            {
              headers: { 'x-tally-key': built.serverKey },
            },
          );
          const body: unknown = await response.json();
          expect(response.status, `${meter} of customer ${customer}`).toBe(200);
          expect(body, `${meter} of customer ${customer}`).toMatchObject({
            consumed: units(consumedMicros),
            balance: units(INCLUDED_MICROS - consumedMicros),
            included: units(INCLUDED_MICROS),
            overage: 0,
          });
        }
      }
    } finally {
      await stopServer(server);
    }
  } finally {
    await removeDataDir(dataDir);
  }
}

describe('recovery bench (tiny)', () => {
  it(
    'recovers exactly the journaled balances from the journal alone',
    () => checkRecovery(null),
    30_000,
  );
  it(
    'recovers exactly the journaled balances from a snapshot plus the journal tail',
    () => checkRecovery(5_000),
    30_000,
  );
});
