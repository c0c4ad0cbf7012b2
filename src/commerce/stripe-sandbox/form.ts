/**
 * Form parameters: Stripe's wire format for requests.
 *
 * The SDK sends `application/x-www-form-urlencoded` bodies (and query strings for GET and
 * DELETE) with bracketed keys: `line_items[0][price]=price_…`, `expand[0]=customer`,
 * `metadata[plan]=pro`. They are parsed with `qs` under fixed limits (nesting depth,
 * array length, parameter count) so a hostile body cannot blow up memory or prototypes.
 * The readers below turn the parsed tree into typed values and throw Stripe-shaped
 * errors naming the parameter when a value is missing or malformed.
 */
import qs from 'qs';
import { invalidParam, missingParam, unknownParam } from './errors.js';

export type Params = Readonly<Record<string, unknown>>;

const PARSE_OPTIONS = {
  depth: 5,
  arrayLimit: 100,
  parameterLimit: 1000,
  allowPrototypes: false,
  plainObjects: true,
  strictDepth: false,
} as const;

/** Parses a form-encoded body or query string (without the leading `?`). */
export function parseForm(text: string): Params {
  if (text === '') return {};
  return qs.parse(text, PARSE_OPTIONS) as Params;
}

/** Refuses any top-level parameter not in `allowed` (`expand` is always allowed). */
export function allowOnly(params: Params, allowed: readonly string[]): void {
  for (const key of Object.keys(params)) {
    if (key !== 'expand' && !allowed.includes(key)) throw unknownParam(key);
  }
}

/** The parameter as a string, or undefined when absent. */
export function optString(params: Params, name: string): string | undefined {
  const value = params[name];
  if (value === undefined) return undefined;
  if (typeof value !== 'string')
    throw invalidParam(
      name,
      `Invalid string: ${name} must be a string.`,
      'parameter_invalid_string',
    );
  return value;
}

/** A required, non-empty string. */
export function reqString(params: Params, name: string): string {
  const value = optString(params, name);
  if (value === undefined) throw missingParam(name);
  if (value === '')
    throw invalidParam(
      name,
      `You passed an empty string for '${name}'. We assume empty values are an attempt to ` +
        `unset a parameter; however '${name}' cannot be unset. You should remove ` +
        `'${name}' from your request or supply a non-empty value.`,
      'parameter_invalid_empty',
    );
  return value;
}

/** A non-negative integer, or undefined when absent. */
export function optInteger(
  params: Params,
  name: string,
  max = Number.MAX_SAFE_INTEGER,
): number | undefined {
  const value = optString(params, name);
  if (value === undefined) return undefined;
  if (!/^\d{1,16}$/.test(value) || Number(value) > max) {
    throw invalidParam(name, `Invalid integer: ${value}`, 'parameter_invalid_integer');
  }
  return Number(value);
}

/** `true`/`false`, or undefined when absent. */
export function optBoolean(params: Params, name: string): boolean | undefined {
  const value = optString(params, name);
  if (value === undefined) return undefined;
  if (value !== 'true' && value !== 'false') throw invalidParam(name, `Invalid boolean: ${value}`);
  return value === 'true';
}

/** One of `choices`, or undefined when absent. */
export function optEnum<T extends string>(
  params: Params,
  name: string,
  choices: readonly T[],
): T | undefined {
  const value = optString(params, name);
  if (value === undefined) return undefined;
  if (!(choices as readonly string[]).includes(value)) {
    throw invalidParam(name, `Invalid ${name}: must be one of ${choices.join(', ')}`);
  }
  return value as T;
}

/** A nested hash (`name[key]=…`), or undefined when absent. */
export function optObject(params: Params, name: string): Params | undefined {
  const value = params[name];
  if (value === undefined) return undefined;
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw invalidParam(name, `Invalid object: ${name} must be a hash.`, 'parameter_invalid_object');
  }
  return value as Params;
}

/** An array of strings (`name[0]=a&name[1]=b` or `name[]=a`), or undefined when absent. */
export function optStringArray(params: Params, name: string): string[] | undefined {
  const value = params[name];
  if (value === undefined) return undefined;
  const items = Array.isArray(value)
    ? value
    : typeof value === 'object' && value !== null
      ? Object.values(value)
      : [value];
  if (!items.every((item): item is string => typeof item === 'string'))
    throw invalidParam(name, `Invalid array: ${name} must be an array of strings.`);
  return items;
}

/** An array of hashes (`name[0][price]=…`), or undefined when absent. */
export function optObjectArray(params: Params, name: string): Params[] | undefined {
  const value = params[name];
  if (value === undefined) return undefined;
  const items = Array.isArray(value)
    ? value
    : typeof value === 'object' && value !== null
      ? Object.values(value)
      : [value];
  if (!items.every((item) => typeof item === 'object' && item !== null && !Array.isArray(item))) {
    throw invalidParam(name, `Invalid array: ${name} must be an array of hashes.`);
  }
  return items as Params[];
}

/** The `expand[]` paths of a request. */
export function expandPaths(params: Params): string[] {
  return optStringArray(params, 'expand') ?? [];
}

const METADATA_KEYS_MAX = 50;

/**
 * Applies a `metadata` parameter to `current` as Stripe does: keys with an empty value
 * are removed, `metadata=` (empty string) clears everything; at most 50 keys, keys up to
 * 40 characters, values up to 500.
 */
export function mergeMetadata(
  params: Params,
  current: Readonly<Record<string, string>> = {},
): Record<string, string> {
  const raw = params['metadata'];
  if (raw === undefined) return { ...current };
  if (raw === '') return {};
  const given = optObject(params, 'metadata') ?? {};
  const merged: Record<string, string> = { ...current };
  for (const [key, value] of Object.entries(given)) {
    if (typeof value !== 'string')
      throw invalidParam(`metadata[${key}]`, 'Metadata values must be strings.');
    if (key.length > 40)
      throw invalidParam(`metadata[${key}]`, 'Metadata keys can be at most 40 characters long.');
    if (value.length > 500)
      throw invalidParam(`metadata[${key}]`, 'Metadata values can be at most 500 characters long.');
    if (value === '') delete merged[key];
    else merged[key] = value;
  }
  if (Object.keys(merged).length > METADATA_KEYS_MAX)
    throw invalidParam('metadata', `Metadata can have at most ${METADATA_KEYS_MAX} keys.`);
  return merged;
}
