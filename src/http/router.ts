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
  readonly route: R;
}

export class Router<R> {
  private readonly entries: Entry<R>[] = [];

  add(method: string, pattern: string, route: R): this {
    this.entries.push({ method: method.toUpperCase(), segments: pattern.split('/'), route });
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

  lookup(method: string, path: string): RouteLookup<R> {
    const segments = path.split('/');
    const allowed: string[] = [];
    for (let index = 0; index < this.entries.length; index++) {
      const entry = this.entries[index] as Entry<R>;
      const params = matchSegments(entry.segments, segments);
      if (params === null) continue;
      if (entry.method === method)
        return { kind: 'match', match: { route: entry.route, params, index } };
      allowed.push(entry.method);
    }
    if (allowed.length > 0) return { kind: 'method_not_allowed', allow: allowed.join(', ') };
    return { kind: 'not_found' };
  }
}

function matchSegments(pattern: readonly string[], actual: readonly string[]): string[] | null {
  if (pattern.length !== actual.length) return null;
  const params: string[] = [];
  for (let i = 0; i < pattern.length; i++) {
    const p = pattern[i] as string;
    const a = actual[i] as string;
    if (p.startsWith(':')) {
      if (a === '') return null;
      params.push(a);
    } else if (p !== a) {
      return null;
    }
  }
  return params;
}
