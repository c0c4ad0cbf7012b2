/**
 * Strict parsing of query strings and path segments.
 *
 * `URLSearchParams` silently keeps malformed percent-escapes; Tally answers 400 naming
 * the parameter instead, and refuses a parameter given twice rather than guessing.
 */

export type QueryParse =
  | { readonly ok: true; readonly params: Record<string, string> }
  | { readonly ok: false; readonly message: string };

/** Decodes one component (`+` is a space in queries); null on bad percent-encoding. */
export function decodeComponent(raw: string, plusIsSpace: boolean): string | null {
  const text = plusIsSpace ? raw.replace(/\+/g, ' ') : raw;
  if (!text.includes('%')) return text;
  try {
    return decodeURIComponent(text);
  } catch {
    return null;
  }
}

/** The hot path's only query, `customerId=<plain text>`, needs no splitting or decoding. */
const PLAIN_CUSTOMER_ID = /^customerId=([^&%+=]+)$/;

export function parseQuery(raw: string): QueryParse {
  const plain = PLAIN_CUSTOMER_ID.exec(raw);
  if (plain !== null) return { ok: true, params: { customerId: plain[1] as string } };
  // A null-prototype map: a parameter named __proto__ or constructor is just a name.
  const params: Record<string, string> = Object.create(null) as Record<string, string>;
  if (raw === '') return { ok: true, params };
  for (const pair of raw.split('&')) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    const name = decodeComponent(eq === -1 ? pair : pair.slice(0, eq), true);
    if (name === null) return { ok: false, message: 'query string has invalid percent-encoding' };
    const value = decodeComponent(eq === -1 ? '' : pair.slice(eq + 1), true);
    if (value === null) return { ok: false, message: `${name} has invalid percent-encoding` };
    if (name in params) return { ok: false, message: `${name} is given more than once` };
    params[name] = value;
  }
  return { ok: true, params };
}

/**
 * The query of a request to a route. A route that reads a query (`takesQuery`) gets it
 * parsed, and its own schema judges the names; a route that reads none refuses any
 * parameter, as an unknown body field is refused, so that `?dryRun=1` on a push or
 * `?customerId=` on a consume never passes silently.
 */
export function routeQuery(raw: string, takesQuery: boolean): QueryParse {
  const query = parseQuery(raw);
  if (!query.ok || takesQuery) return query;
  for (const name in query.params) return { ok: false, message: `${name} is not a known field` };
  return query;
}
