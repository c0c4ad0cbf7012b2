/**
 * The options of the Better Auth plugin (`tally/better-auth`) and the session shape it
 * reads. Kept apart from the plugin so the client plugin and the docs can name them
 * without pulling in any server code.
 */
import type { EventKind, TallyEvent } from '../webhooks/verify.js';

export type { EventKind, TallyEvent };

/** The signed-in session as Better Auth's `sessionMiddleware` provides it. */
export interface TallySession {
  readonly session: {
    readonly id: string;
    readonly userId: string;
    /** Set by Better Auth's organization plugin. */
    readonly activeOrganizationId?: string | null | undefined;
    /** Set by the organization plugin when teams are enabled. */
    readonly activeTeamId?: string | null | undefined;
    readonly [field: string]: unknown;
  };
  readonly user: {
    readonly id: string;
    readonly name: string;
    readonly email: string;
    readonly [field: string]: unknown;
  };
}

/** Where a customer id comes from: a built-in source, or `custom` for a function. */
export type CustomerIdSource = 'user' | 'organization' | 'team' | 'custom';

export interface TallyWebhookOptions {
  /** Receiver path below Better Auth's base path: `/tally` answers at `/api/auth/tally`. */
  readonly path?: string;
  /** Event kinds to receive: `'*'` (all), a comma-separated string or an array. */
  readonly events?: '*' | string | readonly EventKind[];
  /**
   * The registration key sent with the receiver's URL; Tally keeps one endpoint per
   * (environment, url, key). A configuration forwarding entry for this receiver names
   * the same key. Default `better-auth`.
   */
  readonly key?: string;
  /**
   * Register the receiver with Tally when it is first needed (an inbound delivery or a
   * status call with no endpoint stored). With false, only a status call registers it.
   */
  readonly autoRegister?: boolean;
  /** Called once per delivered event (deduplicated by `webhook-id`); a throw asks for a retry. */
  readonly onEvent?: (event: TallyEvent) => void | Promise<void>;
}

export interface TallyPluginOptions {
  /** Tally server key (`sk_test_…` / `sk_live_…`). It stays on the server. */
  readonly apiKey: string;
  /** Tally's base URL, e.g. `http://localhost:8787`. */
  readonly baseUrl: string;
  /**
   * Which id names the customer: the signed-in user (default), the session's active
   * organization or team (Better Auth's organization plugin), or a function of the
   * session. The native id is used unchanged unless `mapCustomerId` is set.
   */
  readonly customerId?: 'user' | 'organization' | 'team' | ((session: TallySession) => string);
  /** Answers the final customer id for a session; `mapCustomerId` is not applied to it. */
  readonly resolveCustomerId?: (session: TallySession) => string | Promise<string>;
  /** Namespaces an id (`org_${id}`); applied to every `customerId` source when set. */
  readonly mapCustomerId?: (input: { source: CustomerIdSource; id: string }) => string;
  /**
   * Create the Tally customer (name, email) when a user signs up. Only with the `user`
   * source: other sources have no customer until a session chooses one.
   */
  readonly syncCustomerOnSignUp?: boolean;
  /** Milliseconds before a call to Tally is abandoned (answered 502). Default 10 s. */
  readonly timeoutMs?: number;
  readonly webhook?: TallyWebhookOptions;
}
