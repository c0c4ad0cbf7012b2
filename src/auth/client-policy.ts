/**
 * What each environment lets a web page do with its client keys, from the `client`
 * section of its billing configuration: which origins may call Tally (CORS), and
 * whether a customer token must come with every customer read.
 *
 * Until an environment's configuration says otherwise, the test environment allows
 * every origin and the live one none, so trying Tally from a local page works at once
 * and nothing is exposed in live by accident. A configuration without a `client`
 * section keeps these defaults.
 *
 * The CORS headers of a reply are one precomputed string per origin, written in one
 * `writeHeader` call (uWS writes a header's value as given, so the value carries the
 * other lines): no string is built per request.
 */
import type { Environment } from '../../actors/protocol.js';

/** The `client` section of a billing configuration (src/config/billing-schema.ts). */
export interface ClientSettings {
  readonly allowedOrigins?: readonly string[];
  readonly requireCustomerToken?: boolean;
}

/** Lower case, as browsers serialize an origin: scheme, host, optional port; no path. */
export const ORIGIN_PATTERN =
  '^[a-z][a-z0-9+.-]*://(?:[a-z0-9-]+(?:\\.[a-z0-9-]+)*|\\[[0-9a-f:.]+\\])(?::[0-9]{1,5})?$';
const ORIGIN = new RegExp(ORIGIN_PATTERN);
/** Origins echoed under `*` are kept (with their header value) up to this many, then forgotten. */
const ECHOED_MAX = 1000;
export const ORIGIN_LENGTH_MAX = 255;

/** Headers a page may send: the keys, and a content type. */
export const CORS_ALLOW_HEADERS = 'x-tally-key, x-tally-customer-token, content-type';
/** Client keys only read. */
export const CORS_ALLOW_METHODS = 'GET';
/**
 * How long a browser may reuse a preflight answer (Chromium caps it at 7200). A preflight
 * only lets a request be sent: whether its reply may be read is decided anew on every
 * reply, so a long cache lets no origin keep access after it is removed.
 */
export const CORS_MAX_AGE_SEC = 7200;
/** Reply headers a page may read besides the safelisted ones. */
const CORS_EXPOSE_HEADERS =
  'x-ratelimit-limit, x-ratelimit-remaining, x-ratelimit-reset, ' + 'retry-after, x-request-id';

interface Policy {
  readonly anyOrigin: boolean;
  readonly origins: ReadonlySet<string>;
  readonly requireCustomerToken: boolean;
}

const DEFAULTS: Record<Environment, Policy> = {
  test: { anyOrigin: true, origins: new Set(), requireCustomerToken: false },
  live: { anyOrigin: false, origins: new Set(), requireCustomerToken: false },
};

/** The value written under `access-control-allow-origin` on a reply to `origin`. */
function replyValue(origin: string): string {
  return `${origin}\r\nvary: Origin\r\naccess-control-expose-headers: ${CORS_EXPOSE_HEADERS}`;
}

export class ClientPolicies {
  private readonly policies = new Map<Environment, Policy>(Object.entries(DEFAULTS) as never);
  /** Origin → its reply header value, for every origin allowed so far. */
  private readonly values = new Map<string, string>();

  /** Applies a newly pushed (or recovered) configuration's `client` section. */
  set(environment: Environment, settings: ClientSettings | undefined): void {
    const origins = settings?.allowedOrigins;
    this.policies.set(environment, {
      anyOrigin: origins === undefined ? DEFAULTS[environment].anyOrigin : origins.includes('*'),
      origins: new Set(origins ?? []),
      requireCustomerToken: settings?.requireCustomerToken === true,
    });
    this.values.clear();
  }

  requiresCustomerToken(environment: Environment): boolean {
    return (this.policies.get(environment) as Policy).requireCustomerToken;
  }

  /**
   * The header value that lets `origin` read a reply of `environment`, or null when the
   * environment does not allow it (an origin that is not well formed never is).
   */
  replyHeader(environment: Environment, origin: string): string | null {
    const known = this.values.get(origin);
    const policy = this.policies.get(environment) as Policy;
    if (known !== undefined && (policy.anyOrigin || policy.origins.has(origin))) return known;
    if (!policy.origins.has(origin) && !(policy.anyOrigin && isOrigin(origin))) return null;
    return this.remember(origin);
  }

  /**
   * The header value for `origin` when some environment allows it, else null: a
   * preflight, and an answer to a request without a valid key, cannot know the environment.
   */
  replyHeaderForAny(origin: string): string | null {
    return this.replyHeader('test', origin) ?? this.replyHeader('live', origin);
  }

  private remember(origin: string): string {
    if (this.values.size >= ECHOED_MAX) this.values.clear();
    const value = replyValue(origin);
    this.values.set(origin, value);
    return value;
  }
}

export function isOrigin(text: string): boolean {
  return text.length <= ORIGIN_LENGTH_MAX && ORIGIN.test(text);
}
