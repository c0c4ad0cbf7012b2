/**
 * A small exact-segment router, so that Tally (not uWS) decides between 404, 405 (with
 * `Allow`) and a match, after authenticating the key: a key error (401) comes before
 * 404 and 405 (the error precedence in docs/api.md, Errors).
 */

export interface RouteMatch<R> {
  readonly route: R;
  /** Raw (still percent-encoded) values of the `:name` segments, in order. */
  readonly params: readonly string[];
  /** The route's position in registration order (as in `list()`): its metrics series. */
  readonly index: number;
}

export type RouteLookup<R> =
  | { readonly kind: 'match'; readonly match: RouteMatch<R> }
  | { readonly kind: 'method_not_allowed'; readonly allow: string }
  | { readonly kind: 'not_found' };

interface Entry<R> {
  readonly method: string;
  readonly segments: readonly string[];
  /** Per segment: whether it is a `:name` parameter. */
  readonly isParam: readonly boolean[];
  readonly route: R;
  /** Its position in registration order. */
  readonly index: number;
}

export class Router<R> {
  private readonly entries: Entry<R>[] = [];
  /** The entries by their number of segments, each list in registration order. */
  private readonly bySegments = new Map<number, Entry<R>[]>();

  add(method: string, pattern: string, route: R): this {
    const segments = pattern.split('/');
    const entry: Entry<R> = {
      method: method.toUpperCase(),
      segments,
      isParam: segments.map((segment) => segment.startsWith(':')),
      route,
      index: this.entries.length,
    };
    this.entries.push(entry);
    const sameLength = this.bySegments.get(segments.length);
    if (sameLength === undefined) this.bySegments.set(segments.length, [entry]);
    else sameLength.push(entry);
    return this;
  }

  /**
   * Every registered method and pattern, in order: the OpenAPI test compares them with the
   * document.
   */
  list(): Array<{ readonly method: string; readonly pattern: string }> {
    return this.entries.map((entry) => ({
      method: entry.method,
      pattern: entry.segments.join('/'),
    }));
  }

  /** The first route registered whose pattern matches (only patterns as long as the path). */
  lookup(method: string, path: string): RouteLookup<R> {
    const segments = path.split('/');
    const candidates = this.bySegments.get(segments.length) ?? [];
    let allowed: string[] | null = null;
    for (const entry of candidates) {
      if (!matches(entry, segments)) continue;
      if (entry.method === method)
        return {
          kind: 'match',
          match: { route: entry.route, params: paramsOf(entry, segments), index: entry.index },
        };
      (allowed ??= []).push(entry.method);
    }
    if (allowed !== null) return { kind: 'method_not_allowed', allow: allowed.join(', ') };
    return { kind: 'not_found' };
  }
}

/** Whether `actual`, as long as the pattern, matches it: literals equal, parameters not empty. */
function matches<R>(entry: Entry<R>, actual: readonly string[]): boolean {
  for (let i = 0; i < actual.length; i++) {
    const a = actual[i] as string;
    if (entry.isParam[i] === true ? a === '' : a !== entry.segments[i]) return false;
  }
  return true;
}

function paramsOf<R>(entry: Entry<R>, actual: readonly string[]): string[] {
  const params: string[] = [];
  for (let i = 0; i < actual.length; i++)
    if (entry.isParam[i] === true) params.push(actual[i] as string);
  return params;
}
