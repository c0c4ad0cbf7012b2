/**
 * Calendar periods in UTC for meter resets.
 *
 * A meter's usage belongs to the period that contains the moment it was recorded:
 * day (00:00), week (Monday 00:00), month (the 1st), year (1 January), or never.
 * Pure arithmetic on epoch milliseconds: the caller injects the clock.
 */

export type ResetInterval = 'day' | 'week' | 'month' | 'year' | 'never';

export interface Period {
  /** Epoch ms of the period's first instant; 0 for `never`. */
  readonly startMs: number;
  /** Epoch ms of the next period's first instant; null for `never`. */
  readonly endMs: number | null;
}

const DAY_MS = 86_400_000;

/**
 * The last period computed per interval. Almost every call falls in the same period as
 * the one before (a month is 2.6 billion ms), so this memo of a pure function saves a
 * Date and its calendar arithmetic on every balance answered.
 */
const lastPeriod = new Map<ResetInterval, Period>();

export function periodAt(reset: ResetInterval, nowMs: number): Period {
  const cached = lastPeriod.get(reset);
  if (
    cached !== undefined &&
    nowMs >= cached.startMs &&
    (cached.endMs === null || nowMs < cached.endMs)
  )
    return cached;
  const period = computePeriod(reset, nowMs);
  lastPeriod.set(reset, period);
  return period;
}

function computePeriod(reset: ResetInterval, nowMs: number): Period {
  const d = new Date(nowMs);
  const y = d.getUTCFullYear();
  const m = d.getUTCMonth();
  const day = d.getUTCDate();
  switch (reset) {
    case 'never':
      return { startMs: 0, endMs: null };
    case 'day': {
      const startMs = Date.UTC(y, m, day);
      return { startMs, endMs: startMs + DAY_MS };
    }
    case 'week': {
      const sinceMonday = (d.getUTCDay() + 6) % 7;
      const startMs = Date.UTC(y, m, day - sinceMonday);
      return { startMs, endMs: startMs + 7 * DAY_MS };
    }
    case 'month':
      return { startMs: Date.UTC(y, m, 1), endMs: Date.UTC(y, m + 1, 1) };
    case 'year':
      return { startMs: Date.UTC(y, 0, 1), endMs: Date.UTC(y + 1, 0, 1) };
  }
}
