/**
 * Keeps a customer token fresh for a page that calls Tally directly with the client key.
 * `mint` asks the application's server for a token (the Better Auth plugin's
 * `authClient.tally.clientToken()`, or any endpoint of yours that calls
 * `TallyClient.createClientToken`); `get()` answers the current token and mints a new one
 * when it expires within `refreshBeforeMs`. Concurrent calls share one mint. No platform
 * API beyond `Date`: safe in a browser bundle.
 */
export interface MintedToken {
  readonly token: string;
  /** ISO 8601. */
  readonly expiresAt: string;
}

export interface TokenSourceOptions {
  /** Mint again when the token expires within this many ms (default 60 s). */
  readonly refreshBeforeMs?: number;
  /** The clock (tests). */
  readonly now?: () => number;
}

export interface TokenSource {
  /** The token to send as `x-tally-customer-token`. */
  get(): Promise<string>;
  /** Forgets the token (the signed-in user changed): the next `get()` mints. */
  clear(): void;
}

export const TOKEN_REFRESH_BEFORE_MS_DEFAULT = 60_000;

export function customerTokenSource(
  mint: () => Promise<MintedToken>,
  options: TokenSourceOptions = {},
): TokenSource {
  const refreshBeforeMs = options.refreshBeforeMs ?? TOKEN_REFRESH_BEFORE_MS_DEFAULT;
  const now = options.now ?? Date.now;
  let current: { token: string; expiresAtMs: number } | null = null;
  let pending: Promise<string> | null = null;
  const fresh = (): boolean => current !== null && current.expiresAtMs - refreshBeforeMs > now();
  return {
    get() {
      if (current !== null && fresh()) return Promise.resolve(current.token);
      pending ??= mint()
        .then((minted) => {
          const expiresAtMs = Date.parse(minted.expiresAt);
          if (typeof minted.token !== 'string' || Number.isNaN(expiresAtMs))
            throw new Error('the minted customer token has no token or no valid expiresAt');
          current = { token: minted.token, expiresAtMs };
          return minted.token;
        })
        .finally(() => {
          pending = null;
        });
      return pending;
    },
    clear() {
      current = null;
    },
  };
}
