/**
 * periodAt is memoised; whatever order times arrive in, it must answer exactly what the
 * calendar says (checked against an independent reference built from date parts).
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { periodAt, type ResetInterval } from '../actors/periods.js';
import { isoOf } from '../shared/iso-time.js';

function reference(reset: ResetInterval, ms: number): { startMs: number; endMs: number | null } {
  const d = new Date(ms);
  const [y, m, day] = [d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate()];
  if (reset === 'never') return { startMs: 0, endMs: null };
  if (reset === 'day') return { startMs: Date.UTC(y, m, day), endMs: Date.UTC(y, m, day + 1) };
  if (reset === 'week') {
    const back = (d.getUTCDay() + 6) % 7;
    return { startMs: Date.UTC(y, m, day - back), endMs: Date.UTC(y, m, day - back + 7) };
  }
  if (reset === 'month') return { startMs: Date.UTC(y, m, 1), endMs: Date.UTC(y, m + 1, 1) };
  return { startMs: Date.UTC(y, 0, 1), endMs: Date.UTC(y + 1, 0, 1) };
}

describe('periodAt (memoised)', () => {
  it('agrees with the calendar for any sequence of times and intervals', () => {
    const reset = fc.constantFrom<ResetInterval>('day', 'week', 'month', 'year', 'never');
    const time = fc.integer({ min: Date.UTC(1990, 0, 1), max: Date.UTC(2100, 0, 1) });
    fc.assert(
      fc.property(fc.array(fc.tuple(reset, time), { minLength: 1, maxLength: 50 }), (calls) => {
        for (const [r, t] of calls) {
          expect(periodAt(r, t)).toEqual(reference(r, t));
          // Nearby times in the same or the neighbouring period, to exercise the memo.
          expect(periodAt(r, t + 1)).toEqual(reference(r, t + 1));
          expect(periodAt(r, t - 1)).toEqual(reference(r, t - 1));
        }
      }),
      { numRuns: 300 },
    );
  });

  it('isoOf renders milliseconds in UTC', () => {
    expect(isoOf(Date.UTC(2026, 3, 1))).toBe('2026-04-01T00:00:00.000Z');
    expect(isoOf(Date.UTC(2026, 3, 1, 0, 0, 0, 7))).toBe('2026-04-01T00:00:00.007Z');
    expect(isoOf(Date.UTC(2026, 3, 1))).toBe('2026-04-01T00:00:00.000Z');
  });
});
