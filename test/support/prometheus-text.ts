/**
 * A strict parser of the Prometheus text exposition format (0.0.4), for tests: it throws
 * on anything a Prometheus server would reject or that the format's rules forbid —
 * bad names, bad label syntax or escapes, unparsable values, a sample before its
 * family's HELP/TYPE, a family split or declared twice, a duplicate series — and checks
 * every histogram: `le` ascending and ending in `+Inf`, buckets cumulative, `+Inf`
 * equal to `_count`, `_sum` present.
 */

export interface Sample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

export interface Family {
  readonly name: string;
  readonly type: string;
  readonly help: string;
  readonly samples: Sample[];
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const TYPES = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped']);

function parseValue(raw: string, line: string): number {
  if (raw === 'NaN') return NaN;
  if (raw === '+Inf') return Infinity;
  if (raw === '-Inf') return -Infinity;
  if (!/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(raw))
    throw new Error(`bad value ${JSON.stringify(raw)} in: ${line}`);
  return Number(raw);
}

/**
 * Parses `{a="x",b="y"}` starting at `start` (the `{`); returns the labels and the index after `}`.
 */
function parseLabels(line: string, start: number): { labels: Record<string, string>; end: number } {
  const labels: Record<string, string> = {};
  let i = start + 1;
  while (line[i] !== '}') {
    const eq = line.indexOf('=', i);
    if (eq < 0) throw new Error(`bad labels in: ${line}`);
    const name = line.slice(i, eq);
    if (!LABEL_NAME.test(name))
      throw new Error(`bad label name ${JSON.stringify(name)} in: ${line}`);
    if (name in labels) throw new Error(`label ${name} repeated in: ${line}`);
    if (line[eq + 1] !== '"') throw new Error(`label value not quoted in: ${line}`);
    let value = '';
    let j = eq + 2;
    for (;;) {
      const c = line[j];
      if (c === undefined) throw new Error(`unterminated label value in: ${line}`);
      if (c === '"') break;
      if (c === '\\') {
        const next = line[j + 1];
        if (next === '\\') value += '\\';
        else if (next === '"') value += '"';
        else if (next === 'n') value += '\n';
        else throw new Error(`bad escape in: ${line}`);
        j += 2;
      } else {
        value += c;
        j++;
      }
    }
    labels[name] = value;
    i = j + 1;
    if (line[i] === ',') i++;
    else if (line[i] !== '}') throw new Error(`expected , or } in: ${line}`);
  }
  return { labels, end: i + 1 };
}

function parseSample(line: string): Sample {
  const brace = line.indexOf('{');
  const space = line.indexOf(' ');
  let name: string;
  let labels: Record<string, string> = {};
  let rest: string;
  if (brace >= 0 && (space < 0 || brace < space)) {
    name = line.slice(0, brace);
    const parsed = parseLabels(line, brace);
    labels = parsed.labels;
    if (line[parsed.end] !== ' ') throw new Error(`expected a space after the labels in: ${line}`);
    rest = line.slice(parsed.end + 1);
  } else {
    if (space < 0) throw new Error(`no value in: ${line}`);
    name = line.slice(0, space);
    rest = line.slice(space + 1);
  }
  if (!METRIC_NAME.test(name)) throw new Error(`bad metric name ${JSON.stringify(name)}`);
  const parts = rest.split(' ');
  if (parts.length > 2 || (parts.length === 2 && !/^-?\d+$/.test(parts[1] as string)))
    throw new Error(`bad value/timestamp in: ${line}`);
  return { name, labels, value: parseValue(parts[0] as string, line) };
}

function familyOf(sample: string, family: Family): boolean {
  if (family.type !== 'histogram') return sample === family.name;
  return [`${family.name}_bucket`, `${family.name}_sum`, `${family.name}_count`].includes(sample);
}

const seriesKey = (name: string, labels: Readonly<Record<string, string>>): string =>
  `${name}${JSON.stringify(Object.entries(labels).sort(([a], [b]) => a.localeCompare(b)))}`;

function checkHistogram(family: Family): void {
  const groups = new Map<
    string,
    { buckets: Array<[number, number]>; sum?: number; count?: number }
  >();
  for (const s of family.samples) {
    const { le, ...rest } = s.labels;
    const key = seriesKey('', rest);
    const group = groups.get(key) ?? { buckets: [] };
    groups.set(key, group);
    if (s.name.endsWith('_bucket')) {
      if (le === undefined) throw new Error(`${family.name}: bucket without le`);
      group.buckets.push([parseValue(le, s.name), s.value]);
    } else if (le !== undefined) {
      throw new Error(`${family.name}: le on ${s.name}`);
    } else if (s.name.endsWith('_sum')) group.sum = s.value;
    else group.count = s.value;
  }
  for (const [key, group] of groups) {
    const where = `${family.name}${key}`;
    if (group.sum === undefined || group.count === undefined)
      throw new Error(`${where}: _sum or _count missing`);
    const last = group.buckets.at(-1);
    if (last === undefined || last[0] !== Infinity)
      throw new Error(`${where}: no +Inf bucket last`);
    for (let i = 1; i < group.buckets.length; i++) {
      const [lePrev, countPrev] = group.buckets[i - 1] as [number, number];
      const [le, count] = group.buckets[i] as [number, number];
      if (!(le > lePrev)) throw new Error(`${where}: le not ascending`);
      if (count < countPrev) throw new Error(`${where}: buckets not cumulative`);
    }
    if (last[1] !== group.count)
      throw new Error(`${where}: +Inf bucket ${last[1]} != _count ${group.count}`);
  }
}

/** Parses and validates an exposition; throws with the offending line on any violation. */
export function parsePrometheusText(text: string): Map<string, Family> {
  if (!text.endsWith('\n')) throw new Error('exposition must end with a newline');
  const families = new Map<string, Family>();
  const seen = new Set<string>();
  let current: Family | null = null;
  let pendingHelp: { name: string; help: string } | null = null;
  for (const line of text.slice(0, -1).split('\n')) {
    if (line.startsWith('# HELP ')) {
      const [, name = '', help = ''] = /^# HELP (\S+) ?(.*)$/.exec(line) ?? [];
      if (!METRIC_NAME.test(name) || families.has(name))
        throw new Error(`bad or repeated HELP: ${line}`);
      pendingHelp = { name, help };
    } else if (line.startsWith('# TYPE ')) {
      const [, name = '', type = ''] = /^# TYPE (\S+) (\S+)$/.exec(line) ?? [];
      if (!METRIC_NAME.test(name) || !TYPES.has(type) || families.has(name))
        throw new Error(`bad or repeated TYPE: ${line}`);
      if (pendingHelp?.name !== name)
        throw new Error(`TYPE without its HELP right before: ${line}`);
      current = { name, type, help: pendingHelp.help, samples: [] };
      families.set(name, current);
      pendingHelp = null;
    } else if (line.startsWith('#') || line === '') {
      throw new Error(`unexpected line: ${JSON.stringify(line)}`);
    } else {
      const sample = parseSample(line);
      if (current === null || !familyOf(sample.name, current))
        throw new Error(`sample outside its family: ${line}`);
      const key = seriesKey(sample.name, sample.labels);
      if (seen.has(key)) throw new Error(`duplicate series: ${line}`);
      seen.add(key);
      current.samples.push(sample);
    }
  }
  for (const family of families.values()) if (family.type === 'histogram') checkHistogram(family);
  return families;
}

/** Every sample named `name` whose labels include `labels`. */
function* matchingSamples(
  families: Map<string, Family>,
  name: string,
  labels: Readonly<Record<string, string>>,
): Generator<Sample> {
  for (const family of families.values()) {
    for (const s of family.samples) {
      if (s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)) yield s;
    }
  }
}

/** The value of the one sample named `name` whose labels include `labels`; undefined if none. */
export function sampleValue(
  families: Map<string, Family>,
  name: string,
  labels: Readonly<Record<string, string>> = {},
): number | undefined {
  for (const s of matchingSamples(families, name, labels)) return s.value;
  return undefined;
}

/**
 * The sum of every sample named `name` whose labels include `labels` (0 if none): a metric over all
 * shards.
 */
export function sampleSum(
  families: Map<string, Family>,
  name: string,
  labels: Readonly<Record<string, string>> = {},
): number {
  let sum = 0;
  for (const s of matchingSamples(families, name, labels)) sum += s.value;
  return sum;
}
