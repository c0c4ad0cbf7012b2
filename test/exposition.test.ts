/**
 * The Prometheus text writer (src/observability/exposition.ts) and the strict parser the
 * HTTP tests check it with (test/support/prometheus-text.ts): what one writes the other
 * reads back exactly, and the parser refuses the mistakes it exists to catch — so a
 * passing metrics test means a valid exposition, not a lenient parser.
 */
import { describe, expect, it } from 'vitest';
import { Histogram } from '../actors/histogram.js';
import { Exposition } from '../src/observability/exposition.js';
import { parsePrometheusText, sampleValue } from './support/prometheus-text.js';

describe('Exposition', () => {
  it('writes families, escaped labels and cumulative histograms that parse back exactly', () => {
    const h = new Histogram([1, 5, 10]);
    for (const v of [0.5, 1, 3, 7, 12, 100]) h.observe(v);
    const text = new Exposition()
      .family('t_requests_total', 'counter', 'Requests; a "quoted" \\ help')
      .sample('t_requests_total', { route: '/a/:key', odd: 'q"uo\\te\nnl' }, 3)
      .family('t_latency_seconds', 'histogram', 'Latency.')
      .histogram('t_latency_seconds', { route: '/a' }, h.data(), 0.001)
      .text();
    const families = parsePrometheusText(text);
    expect(sampleValue(families, 't_requests_total', { odd: 'q"uo\\te\nnl' })).toBe(3);
    const buckets = families
      .get('t_latency_seconds')
      ?.samples.filter((s) => s.name.endsWith('_bucket'));
    expect(buckets?.map((s) => [s.labels['le'], s.value])).toEqual([
      ['0.001', 2],
      ['0.005', 3],
      ['0.01', 4],
      ['+Inf', 6],
    ]);
    expect(sampleValue(families, 't_latency_seconds_sum')).toBeCloseTo(0.1235, 10);
    expect(sampleValue(families, 't_latency_seconds_count')).toBe(6);
  });

  it('a histogram refuses bounds that do not ascend', () => {
    expect(() => new Histogram([1, 1])).toThrow();
    expect(() => new Histogram([])).toThrow();
  });
});

describe('the test parser refuses invalid expositions', () => {
  const head = '# HELP h_seconds H.\n# TYPE h_seconds histogram\n';
  const cases: Array<[string, string]> = [
    ['no trailing newline', '# HELP a_total A.\n# TYPE a_total counter\na_total 1'],
    ['sample before its TYPE', 'a_total 1\n'],
    ['TYPE without HELP', '# TYPE a_total counter\na_total 1\n'],
    ['bad metric name', '# HELP 1a A.\n# TYPE 1a gauge\n1a 1\n'],
    ['bad value', '# HELP a A.\n# TYPE a gauge\na one\n'],
    ['unquoted label', '# HELP a A.\n# TYPE a gauge\na{x=1} 1\n'],
    ['bad escape', '# HELP a A.\n# TYPE a gauge\na{x="\\t"} 1\n'],
    ['duplicate series', '# HELP a A.\n# TYPE a gauge\na{x="1"} 1\na{x="1"} 2\n'],
    ['sample of another family', '# HELP a A.\n# TYPE a gauge\nb 1\n'],
    ['family declared twice', '# HELP a A.\n# TYPE a gauge\na 1\n# HELP a A.\n# TYPE a gauge\n'],
    [
      'buckets not cumulative',
      `${head}h_seconds_bucket{le="1"} 2\nh_seconds_bucket{le="+Inf"} 1\nh_seconds_sum ` +
        `1\nh_seconds_count 1\n`,
    ],
    [
      '+Inf differs from _count',
      `${head}h_seconds_bucket{le="1"} 1\nh_seconds_bucket{le="+Inf"} 1\nh_seconds_sum ` +
        `1\nh_seconds_count 2\n`,
    ],
    ['no +Inf bucket', `${head}h_seconds_bucket{le="1"} 1\nh_seconds_sum 1\nh_seconds_count 1\n`],
    [
      'le not ascending',
      `${head}h_seconds_bucket{le="2"} 1\nh_seconds_bucket{le="1"} ` +
        `1\nh_seconds_bucket{le="+Inf"} 1\nh_seconds_sum 1\nh_seconds_count 1\n`,
    ],
  ];
  it.each(cases)('%s', (_what, text) => {
    expect(() => parsePrometheusText(text)).toThrow();
  });
});
