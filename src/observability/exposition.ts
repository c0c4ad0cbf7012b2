/**
 * A writer for the Prometheus text exposition format (version 0.0.4): `# HELP` and
 * `# TYPE` once per family, then its samples; histograms as cumulative `_bucket{le}`
 * series ending in `+Inf`, then `_sum` and `_count`.
 *
 * Hand-written rather than prom-client because the counting happens elsewhere, in flat
 * arrays the hot path updates directly (http-metrics.ts) and in the shard workers; this
 * only turns those numbers into text, once per scrape.
 */
import type { HistogramData } from '../../actors/histogram.js';

export const PROMETHEUS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8';

export type MetricType = 'counter' | 'gauge' | 'histogram';
export type Labels = Readonly<Record<string, string>>;

function escapeLabel(value: string): string {
  return value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

function escapeHelp(text: string): string {
  return text.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
}

export function formatValue(value: number): string {
  if (Number.isNaN(value)) return 'NaN';
  if (value === Infinity) return '+Inf';
  if (value === -Infinity) return '-Inf';
  return String(value);
}

function formatLabels(labels: Labels): string {
  const pairs = Object.entries(labels).map(([name, value]) => `${name}="${escapeLabel(value)}"`);
  return pairs.length === 0 ? '' : `{${pairs.join(',')}}`;
}

export class Exposition {
  private readonly lines: string[] = [];

  /** Starts a metric family; its samples must follow before the next family starts. */
  family(name: string, type: MetricType, help: string): this {
    this.lines.push(`# HELP ${name} ${escapeHelp(help)}`, `# TYPE ${name} ${type}`);
    return this;
  }

  sample(name: string, labels: Labels, value: number): this {
    this.lines.push(`${name}${formatLabels(labels)} ${formatValue(value)}`);
    return this;
  }

  /**
   * One histogram series from per-bucket counts. `scale` converts the recorded unit to
   * the exported one (milliseconds → seconds: 0.001) for the bounds and the sum.
   */
  histogram(name: string, labels: Labels, data: HistogramData, scale = 1): this {
    let cumulative = 0;
    data.bounds.forEach((bound, i) => {
      cumulative += data.counts[i] ?? 0;
      this.sample(
        `${name}_bucket`,
        { ...labels, le: formatValue(Number((bound * scale).toPrecision(12))) },
        cumulative,
      );
    });
    cumulative += data.counts[data.bounds.length] ?? 0;
    this.sample(`${name}_bucket`, { ...labels, le: '+Inf' }, cumulative);
    this.sample(`${name}_sum`, labels, data.sum * scale);
    this.sample(`${name}_count`, labels, data.count);
    return this;
  }

  text(): string {
    return `${this.lines.join('\n')}\n`;
  }
}
