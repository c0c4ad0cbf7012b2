/**
 * Routing for the sandbox's API: `METHOD /v1/path/:param` patterns to handlers.
 *
 * Handlers are synchronous: they read the parsed parameters, change the state and return
 * the response object (or throw a `StripeApiError`). Keeping them synchronous means a
 * request is applied whole before the next one starts, and the events it raises form
 * one batch.
 */
import type { Params } from './form.js';
import type { SandboxState } from './state.js';

export type Method = 'GET' | 'POST' | 'DELETE';

export interface RequestContext {
  readonly state: SandboxState;
  /** Query and body parameters merged (body wins). */
  readonly params: Params;
  /** `:name` segments of the matched pattern. */
  readonly path: Readonly<Record<string, string>>;
  /** `expand[]` of the request. */
  readonly expand: readonly string[];
}

/** Returns the response body; Stripe answers every success with 200. */
export type Handler = (ctx: RequestContext) => object;

interface Route {
  readonly method: Method;
  readonly segments: readonly string[];
  readonly handler: Handler;
}

export interface Match {
  readonly handler: Handler;
  readonly path: Record<string, string>;
}

export class Router {
  readonly #routes: Route[] = [];

  add(method: Method, pattern: string, handler: Handler): this {
    this.#routes.push({ method, segments: pattern.split('/').filter((s) => s !== ''), handler });
    return this;
  }

  match(method: string, pathname: string): Match | undefined {
    const parts = pathname.split('/').filter((s) => s !== '');
    for (const route of this.#routes) {
      if (route.method !== method || route.segments.length !== parts.length) continue;
      const path = matchSegments(route.segments, parts);
      if (path !== undefined) return { handler: route.handler, path };
    }
    return undefined;
  }

  /** `METHOD /pattern` of every route, for documentation checks. */
  list(): string[] {
    return this.#routes.map((route) => `${route.method} /${route.segments.join('/')}`);
  }
}

function matchSegments(
  segments: readonly string[],
  parts: readonly string[],
): Record<string, string> | undefined {
  const path: Record<string, string> = {};
  for (let i = 0; i < segments.length; i += 1) {
    const segment = segments[i] as string;
    const part = parts[i] as string;
    if (segment.startsWith(':')) path[segment.slice(1)] = part;
    else if (segment !== part) return undefined;
  }
  return path;
}
