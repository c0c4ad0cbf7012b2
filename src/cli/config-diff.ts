/**
 * The difference between the deployed billing configuration and the one about to be
 * pushed, as `tally push` shows it before asking: entitlements and products added,
 * removed and changed (with each changed value), then any other setting (webhooks).
 *
 * Pure functions over parsed JSON: key order, whitespace and `$schema` (an editor hint)
 * are not differences, so a file written by `tally pull` diffs as "no changes" against
 * the deployment it came from. Arrays are compared as whole values.
 */

export interface LeafChange {
  /** Dotted path inside the entitlement or product (or from the root, for other settings). */
  readonly path: string;
  /** `undefined` = absent on that side. */
  readonly before: unknown;
  readonly after: unknown;
}

export interface SectionDiff {
  /** Keys only in the new document, each with its new definition. */
  readonly added: ReadonlyArray<{ readonly key: string; readonly value: unknown }>;
  readonly removed: ReadonlyArray<{ readonly key: string; readonly value: unknown }>;
  readonly changed: ReadonlyArray<{
    readonly key: string;
    readonly changes: readonly LeafChange[];
  }>;
}

export interface ConfigDiff {
  readonly entitlements: SectionDiff;
  readonly products: SectionDiff;
  /** Everything else but `$schema` (today: `webhooks`), leaf by leaf from the root. */
  readonly other: readonly LeafChange[];
}

const SECTIONS = ['entitlements', 'products'] as const;
const IGNORED_TOP_LEVEL: ReadonlySet<string> = new Set(['$schema', ...SECTIONS]);
/** Changed values listed per entitlement or product before "… and N more". */
const CHANGES_LISTED_MAX = 20;
/** A value longer than this (as JSON) is cut in the listing. */
const VALUE_SHOWN_LENGTH_MAX = 80;

type Json = Record<string, unknown>;

function asRecord(value: unknown): Json | null {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
    ? (value as Json)
    : null;
}

/** `deployed` null: nothing is deployed yet, so everything in `next` is added. */
export function diffConfigs(deployed: unknown, next: unknown): ConfigDiff {
  const before = asRecord(deployed) ?? {};
  const after = asRecord(next) ?? {};
  const rest = (doc: Json): Json =>
    Object.fromEntries(Object.entries(doc).filter(([key]) => !IGNORED_TOP_LEVEL.has(key)));
  return {
    entitlements: diffSection(
      asRecord(before.entitlements) ?? {},
      asRecord(after.entitlements) ?? {},
    ),
    products: diffSection(asRecord(before.products) ?? {}, asRecord(after.products) ?? {}),
    other: leafChanges(rest(before), rest(after), []),
  };
}

export function changeCount(diff: ConfigDiff): number {
  const section = (s: SectionDiff): number => s.added.length + s.removed.length + s.changed.length;
  return section(diff.entitlements) + section(diff.products) + diff.other.length;
}

function diffSection(before: Json, after: Json): SectionDiff {
  const added: Array<{ key: string; value: unknown }> = [];
  const removed: Array<{ key: string; value: unknown }> = [];
  const changed: Array<{ key: string; changes: LeafChange[] }> = [];
  for (const [key, value] of Object.entries(after)) {
    if (!Object.hasOwn(before, key)) {
      added.push({ key, value });
      continue;
    }
    const changes = leafChanges(before[key], value, []);
    if (changes.length > 0) changed.push({ key, changes });
  }
  for (const [key, value] of Object.entries(before)) {
    if (!Object.hasOwn(after, key)) removed.push({ key, value });
  }
  return { added, removed, changed };
}

/** Every path where the two values differ, descending through objects only. */
function leafChanges(before: unknown, after: unknown, path: readonly string[]): LeafChange[] {
  if (deepEqual(before, after)) return [];
  const a = asRecord(before);
  const b = asRecord(after);
  if (a === null || b === null) return [{ path: joinPath(path), before, after }];
  const keys = [...Object.keys(b), ...Object.keys(a).filter((key) => !Object.hasOwn(b, key))];
  return keys.flatMap((key) => leafChanges(a[key], b[key], [...path, key]));
}

function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    return a.every((item, index) => deepEqual(item, b[index]));
  }
  const x = asRecord(a);
  const y = asRecord(b);
  if (x === null || y === null) return false;
  const keys = Object.keys(x);
  if (keys.length !== Object.keys(y).length) return false;
  return keys.every((key) => Object.hasOwn(y, key) && deepEqual(x[key], y[key]));
}

/** `entitlements.seats.included`; a key that is not a plain word is quoted: `["a.b"]`. */
function joinPath(path: readonly string[]): string {
  let text = '';
  for (const segment of path) {
    if (/^[A-Za-z0-9_:-]+$/.test(segment)) text += text === '' ? segment : `.${segment}`;
    else text += `[${JSON.stringify(segment)}]`;
  }
  return text === '' ? '(root)' : text;
}

function showValue(value: unknown): string {
  if (value === undefined) return '(absent)';
  const text = JSON.stringify(value);
  return text.length > VALUE_SHOWN_LENGTH_MAX
    ? `${text.slice(0, VALUE_SHOWN_LENGTH_MAX - 1)}…`
    : text;
}

function showChanges(changes: readonly LeafChange[], indent: string): string[] {
  const lines = changes
    .slice(0, CHANGES_LISTED_MAX)
    .map((c) => `${indent}${c.path}: ${showValue(c.before)} → ${showValue(c.after)}`);
  if (changes.length > CHANGES_LISTED_MAX)
    lines.push(`${indent}… and ${changes.length - CHANGES_LISTED_MAX} more`);
  return lines;
}

/** What an added or removed item is, in a word: an entitlement's type, a product's name. */
function describeItem(section: (typeof SECTIONS)[number], value: unknown): string {
  const record = asRecord(value);
  const label = section === 'entitlements' ? record?.type : record?.name;
  return typeof label === 'string' ? ` (${label})` : '';
}

/** The diff as the lines `tally push` prints; empty when nothing differs. */
export function formatDiff(diff: ConfigDiff): string[] {
  const lines: string[] = [];
  for (const section of SECTIONS) {
    const { added, removed, changed } = diff[section];
    if (added.length + removed.length + changed.length === 0) continue;
    const title = section === 'entitlements' ? 'Entitlements' : 'Products';
    lines.push(
      `${title}: ${added.length} added, ${removed.length} removed, ${changed.length} changed`,
    );
    for (const item of added) lines.push(`  + ${item.key}${describeItem(section, item.value)}`);
    for (const item of removed) lines.push(`  - ${item.key}${describeItem(section, item.value)}`);
    for (const item of changed)
      lines.push(`  ~ ${item.key}`, ...showChanges(item.changes, '      '));
  }
  if (diff.other.length > 0) lines.push('Other settings:', ...showChanges(diff.other, '  ~ '));
  return lines;
}
