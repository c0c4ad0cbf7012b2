/**
 * Time in the sandbox: the wall clock (injectable, so tests can pin it) and calendar
 * arithmetic for billing periods.
 *
 * Stripe timestamps are whole Unix seconds. Billing periods are counted from the
 * subscription's billing cycle anchor in UTC, so a period that starts on 31 January ends
 * on the last day of February and the next one ends on 31 March again, as Stripe does.
 */
/** The recurring intervals Stripe prices take. */
export const INTERVALS = ['day', 'week', 'month', 'year'] as const;
export type Interval = (typeof INTERVALS)[number];

/** Narrows an SDK interval (an open string union) to one the sandbox bills by. */
export function asInterval(value: string): Interval {
  const found = INTERVALS.find((interval) => interval === value);
  if (found === undefined) throw new Error(`unsupported interval ${value}`);
  return found;
}

export interface SandboxClock {
  /** Current time in Unix seconds. */
  nowSeconds(): number;
}

/** A clock reading `now()` (milliseconds, like `Date.now`). */
export function wallClock(now: () => number = Date.now): SandboxClock {
  return { nowSeconds: () => Math.floor(now() / 1000) };
}

const DAY = 86_400;

function addMonthsUtc(seconds: number, months: number): number {
  const date = new Date(seconds * 1000);
  const targetMonth = date.getUTCMonth() + months;
  const year = date.getUTCFullYear() + Math.floor(targetMonth / 12);
  const month = ((targetMonth % 12) + 12) % 12;
  const lastDay = new Date(Date.UTC(year, month + 1, 0)).getUTCDate();
  const day = Math.min(date.getUTCDate(), lastDay);
  const ms = Date.UTC(
    year,
    month,
    day,
    date.getUTCHours(),
    date.getUTCMinutes(),
    date.getUTCSeconds(),
  );
  return Math.floor(ms / 1000);
}

/** `anchor` moved forward by `count` intervals. */
export function addIntervals(anchor: number, interval: Interval, count: number): number {
  switch (interval) {
    case 'day':
      return anchor + count * DAY;
    case 'week':
      return anchor + count * 7 * DAY;
    case 'month':
      return addMonthsUtc(anchor, count);
    case 'year':
      return addMonthsUtc(anchor, count * 12);
  }
}

const LONGEST_DAYS: Record<Interval, number> = { day: 1, week: 7, month: 31, year: 366 };

/**
 * The end of the period that follows the one ending at `periodEnd`: the first
 * `anchor + n·(interval × intervalCount)` after it. The search starts from a step count
 * that cannot overshoot (every interval assumed as long as it can be) and walks up.
 */
export function nextPeriodEnd(
  anchor: number,
  interval: Interval,
  intervalCount: number,
  periodEnd: number,
): number {
  const stepDays = LONGEST_DAYS[interval] * intervalCount;
  let step = Math.max(1, Math.floor((periodEnd - anchor) / (stepDays * DAY)));
  for (;;) {
    const end = addIntervals(anchor, interval, step * intervalCount);
    if (end > periodEnd) return end;
    step += 1;
  }
}
