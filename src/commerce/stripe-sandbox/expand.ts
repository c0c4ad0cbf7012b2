/**
 * Rendering stored objects for a response, with Stripe's `expand[]`.
 *
 * Stored objects reference each other by id. `expand[]=customer` swaps the `customer` id
 * for the customer object; paths nest with dots (`expand[]=subscription.latest_invoice`)
 * and reach into lists through `data` (`expand[]=data.customer`). Some fields are only
 * returned when asked for ("includable", such as a checkout session's `line_items`).
 * A path that does not name an expandable field is a 400, as on Stripe, and paths are
 * limited to four levels.
 */
import { invalidParam } from './errors.js';
import type { SandboxState } from './state.js';
import { wireCopy } from './store.js';

const MAX_DEPTH = 4;

/** Fields left out of an object unless expanded, by object type. */
const INCLUDABLE: Readonly<Record<string, readonly string[]>> = {
  'checkout.session': ['line_items'],
};

type Json = Record<string, unknown>;

function isRecord(value: unknown): value is Json {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** A copy of `object` without the includable fields that `paths` do not ask for. */
function withoutIncludable(object: Json, paths: readonly string[]): Json {
  const hidden = INCLUDABLE[String(object['object'])] ?? [];
  const copy = { ...object };
  for (const field of hidden) {
    if (!paths.some((path) => path === field || path.startsWith(`${field}.`))) delete copy[field];
  }
  return copy;
}

function cannotExpand(path: string): never {
  throw invalidParam('expand', `This property cannot be expanded (${path}).`);
}

function expandAt(
  state: SandboxState,
  node: Json,
  segments: readonly string[],
  path: string,
): void {
  const [field, ...rest] = segments;
  if (field === undefined) return;
  const value = node[field];
  if (field === 'data' && Array.isArray(value)) {
    for (const item of value) if (isRecord(item)) expandAt(state, item, rest, path);
    return;
  }
  if (value === null) return;
  if (typeof value === 'string') {
    const target = state.lookup(value);
    if (target === undefined) cannotExpand(path);
    const expanded = withoutIncludable(wireCopy(target) as unknown as Json, []);
    node[field] = expanded;
    expandAt(state, expanded, rest, path);
    return;
  }
  if (
    isRecord(value) &&
    (rest.length > 0 || INCLUDABLE[String(node['object'])]?.includes(field) === true)
  ) {
    expandAt(state, value, rest, path);
    return;
  }
  cannotExpand(path);
}

/** The response body for `object`: a deep copy with `paths` expanded. */
export function render(state: SandboxState, object: object, paths: readonly string[] = []): Json {
  const root = withoutIncludable(wireCopy(object) as Json, paths);
  for (const path of paths) {
    const segments = path.split('.');
    if (segments.length > MAX_DEPTH)
      throw invalidParam(
        'expand',
        `You cannot expand more than ${MAX_DEPTH} levels of a property (${path}).`,
      );
    expandAt(state, root, segments, path);
  }
  return root;
}

/** A list page with each path applied under `data`. */
export function renderList(
  state: SandboxState,
  list: { readonly data: readonly object[] },
  paths: readonly string[],
): Json {
  const dataPaths = paths.map((path) => {
    if (!path.startsWith('data.')) cannotExpand(path);
    return path.slice('data.'.length);
  });
  return { ...list, data: list.data.map((item) => render(state, item, dataPaths)) };
}
