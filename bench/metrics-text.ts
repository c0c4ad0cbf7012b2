/**
 * Reading Tally's Prometheus text (`GET /v1/admin/metrics`) in a benchmark: gauge sums and
 * maxima, and histograms summed over chosen series, so that a run can report what
 * happened between two scrapes (a quantile or the worst bucket of the difference).
 * Quantiles from buckets are upper bounds: the bound of the bucket the rank falls in.
 */

type Labels = Readonly<Record<string, string>>;

interface Sample {
  readonly name: string;
  readonly labels: Labels;
  readonly value: number;
}

/** Every sample of the text (comments skipped). */
export function samples(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const match = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (match === null) continue;
    const labels: Record<string, string> = {};
    for (const [, key, value] of (match[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g))
      labels[key as string] = value as string;
    out.push({ name: match[1] as string, labels, value: Number(match[3]) });
  }
  return out;
}

export function gaugeSum(all: readonly Sample[], name: string): number {
  return all.filter((s) => s.name === name).reduce((sum, s) => sum + s.value, 0);
}

export function gaugeMax(all: readonly Sample[], name: string): number | null {
  const values = all.filter((s) => s.name === name).map((s) => s.value);
  return values.length === 0 ? null : Math.max(...values);
}

/** A histogram summed over the series `pick` accepts: cumulative counts by upper bound. */
export interface Buckets {
  readonly bounds: readonly number[];
  readonly cumulative: readonly number[];
}

export function buckets(
  all: readonly Sample[],
  name: string,
  pick: (labels: Labels) => boolean = () => true,
): Buckets {
  const byBound = new Map<number, number>();
  for (const s of all) {
    if (s.name !== `${name}_bucket` || !pick(s.labels)) continue;
    const le = s.labels['le'] === '+Inf' ? Number.POSITIVE_INFINITY : Number(s.labels['le']);
    byBound.set(le, (byBound.get(le) ?? 0) + s.value);
  }
  const bounds = [...byBound.keys()].sort((a, b) => a - b);
  return { bounds, cumulative: bounds.map((b) => byBound.get(b) ?? 0) };
}

/** `now` minus `before` (same bounds, or `before` empty): what was observed in between. */
export function since(now: Buckets, before: Buckets | null): Buckets {
  if (before === null || before.bounds.length !== now.bounds.length) return now;
  return {
    bounds: now.bounds,
    cumulative: now.cumulative.map((c, i) => c - (before.cumulative[i] ?? 0)),
  };
}

export function total(b: Buckets): number {
  return b.cumulative.at(-1) ?? 0;
}

/** The upper bound of the bucket holding quantile q; 0 when nothing was observed. */
export function quantileBound(b: Buckets, q: number): number {
  const count = total(b);
  if (count === 0) return 0;
  const rank = Math.max(1, Math.ceil(q * count));
  const i = b.cumulative.findIndex((c) => c >= rank);
  return b.bounds[i] ?? Number.POSITIVE_INFINITY;
}

/** The upper bound of the highest bucket that observed anything; 0 when none did. */
export function maxBound(b: Buckets): number {
  for (let i = 0; i < b.bounds.length; i++)
    if ((b.cumulative[i] ?? 0) === total(b) && total(b) > 0) return b.bounds[i] ?? 0;
  return 0;
}
