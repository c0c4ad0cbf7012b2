/**
 * The fault simulator (support/durability-sim.ts) over a fixed set of seeds: the real
 * shard and shard store on a simulated disk with out-of-order, slow and failing syncs,
 * failing commits, kill -9 and power cuts (also during recovery), torn tails, sliced
 * snapshots taken while appends are in flight, idempotency keys sealed into runs a slice at
 * a time, and the recovery barrier. `SIM_SEED=<n>`
 * replays one seed; the long random-seed run is `npm run sim -- --seconds N`. A negative
 * control recovers without the barrier and must be caught.
 */
import { describe, expect, it } from 'vitest';
import {
  simulate,
  SimulationFailure,
  type SimOptions,
  type SimStats,
} from './support/durability-sim.js';

const STEPS = 400;
const seeds =
  process.env['SIM_SEED'] !== undefined
    ? [Number(process.env['SIM_SEED'])]
    : Array.from({ length: 48 }, (_, i) => 7 + i * 7919);

describe('durability simulation', () => {
  const totals: Partial<Record<keyof SimStats, number>> = {};
  it.each(seeds)('seed %i', async (seed) => {
    const stats = await simulate(seed, STEPS);
    for (const [k, v] of Object.entries(stats))
      totals[k as keyof SimStats] = (totals[k as keyof SimStats] ?? 0) + v;
  });

  it.skipIf(process.env['SIM_SEED'] !== undefined)('the seed set exercises every fault', () => {
    // A pass means little if the schedule never got there.
    process.stdout.write(`durability simulation totals: ${JSON.stringify(totals)}\n`);
    for (const key of [
      'writesAcked',
      'syncsOutOfOrder',
      'syncFailures',
      'commitFailures',
      'processCrashes',
      'machineCrashes',
      'crashesDuringRecovery',
      'tornTails',
      'snapshots',
      'sealedRuns',
      'keysFoundInRuns',
      'heldBackBatches',
      'recoveryBarriers',
      'crashesAwaitingBarrier',
      'outboxEvents',
      'outboxMarksRaised',
      'outboxEventsForgotten',
      'indexRepairs',
    ] as const) {
      expect(totals[key] ?? 0, `${key} over all seeds`).toBeGreaterThan(0);
    }
  });

  /** The failure of the first seed of the set that fails with `options`, if any. */
  async function firstFailure(options: SimOptions): Promise<string | undefined> {
    for (const seed of seeds) {
      try {
        await simulate(seed, STEPS, options);
      } catch (error) {
        if (!(error instanceof SimulationFailure)) throw error;
        return error.message;
      }
    }
    return undefined;
  }

  it.skipIf(process.env['SIM_SEED'] !== undefined)(
    'negative control: a recovery that serves before its barrier is durable is caught',
    async () => {
      // A reply computed from records a killed process never synced must be reported as
      // not durable.
      const failure = await firstFailure({ skipRecoveryBarrier: true });
      expect(failure, 'no seed caught a recovery without its barrier').toBeDefined();
      expect(failure).toMatch(/recovered from the page cache and never synced\) is not durable/);
    },
  );

  it.skipIf(process.env['SIM_SEED'] !== undefined)(
    'negative control: an outbox mark raised before the recovery barrier is caught',
    async () => {
      const failure = await firstFailure({
        skipRecoveryBarrier: true,
        markOutboxWithoutBarrier: true,
      });
      expect(failure, 'no seed caught an outbox mark raised too early').toBeDefined();
      expect(failure).toMatch(
        /outbox mark raised to row \d+ while journal record \d+ is not durable/,
      );
    },
  );
});
