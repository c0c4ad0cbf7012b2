/**
 * `tally/better-auth`: the server plugin that binds Better Auth's session to Tally.
 *
 * It runs inside the application's process, not Tally's, so it imports only the typed
 * client (`tally/client`) and the webhook verifier, never the service's internals (a
 * layer rule checks it). The server key stays here: the browser talks to the
 * application's own endpoints through the client plugin (`tally/better-auth/client`).
 *
 * `init` registers nothing with Tally: it checks that the options fit the other plugins
 * (an organization or team source needs Better Auth's organization plugin), warns when
 * the memory adapter weakens the receiver's guarantees, and adds the opt-in sign-up hook.
 * The webhook receiver registers itself lazily (receiver.ts).
 */
import type { BetterAuthPlugin } from 'better-auth';
import { TallyClient } from '../client/index.js';
import { billingEndpoints } from './endpoints.js';
import type { TallyPluginOptions } from './options.js';
import { MEMORY_ADAPTER_WARNING, receiverEndpoints, receiverSettings } from './receiver.js';
import { webhookSchema } from './webhook-schema.js';

export type {
  CustomerIdSource,
  EventKind,
  TallyEvent,
  TallyPluginOptions,
  TallySession,
  TallyWebhookOptions,
} from './options.js';

/**
 * The receiver's request limit per sending address. Tally keeps at most 4 deliveries in
 * flight to one endpoint, so this is never reached by Tally; it still bounds what one
 * address can send.
 */
const RECEIVER_RATE_LIMIT = { windowSec: 10, max: 1000 } as const;

/** The plugin's id in Better Auth's plugin list. */
export const TALLY_PLUGIN_ID = 'tally';

/**
 * The server plugin. Throws `TypeError` at once for a missing key or a base URL that is
 * not http(s); an option that needs another plugin fails Better Auth's start-up (`init`).
 */
export const tally = (options: TallyPluginOptions) => {
  const client = new TallyClient({
    apiKey: options.apiKey,
    baseUrl: options.baseUrl,
    ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
  });
  const receiver = receiverSettings(options.webhook);
  return {
    id: TALLY_PLUGIN_ID,
    endpoints: {
      ...billingEndpoints({ client, options }),
      ...receiverEndpoints(client, receiver),
    },
    schema: webhookSchema,
    // Every delivery comes from Tally's one address: Better Auth's default per-address
    // limit (100 per 10 s) would refuse a burst of events.
    rateLimit: [
      {
        window: RECEIVER_RATE_LIMIT.windowSec,
        max: RECEIVER_RATE_LIMIT.max,
        pathMatcher: (path: string) => path === receiver.path,
      },
    ],
    init(ctx) {
      checkPluginOrder(options, ctx.options.plugins ?? []);
      if (ctx.adapter.id === 'memory') ctx.logger.warn(MEMORY_ADAPTER_WARNING);
      if (options.syncCustomerOnSignUp !== true) return;
      return {
        options: {
          databaseHooks: {
            user: {
              create: {
                async after(user) {
                  const id =
                    options.mapCustomerId === undefined
                      ? user.id
                      : options.mapCustomerId({ source: 'user', id: user.id });
                  try {
                    await client.upsertCustomer({ id, name: user.name, email: user.email });
                  } catch (error) {
                    // Sign-up has already succeeded; the customer is created by the next
                    // sync, context or consume instead.
                    ctx.logger.error(`tally plugin: customer sync on sign-up failed: ${error}`);
                  }
                },
              },
            },
          },
        },
      };
    },
  } satisfies BetterAuthPlugin;
};

interface PluginLike {
  readonly id: string;
  readonly options?: unknown;
}

/**
 * Refuses options that cannot work with the configured plugins, with a message saying
 * what to add. Throws `Error`.
 */
function checkPluginOrder(options: TallyPluginOptions, plugins: readonly PluginLike[]): void {
  const source = options.customerId ?? 'user';
  if (options.syncCustomerOnSignUp === true) {
    if (source !== 'user' || options.resolveCustomerId !== undefined) {
      throw new Error(
        "tally plugin: syncCustomerOnSignUp works only with customerId 'user' and no " +
          'resolveCustomerId (other sources have no customer at sign-up)',
      );
    }
  }
  if (source !== 'organization' && source !== 'team') return;
  if (options.resolveCustomerId !== undefined) return;
  const organization = plugins.find((plugin) => plugin.id === 'organization');
  if (organization === undefined) {
    throw new Error(
      `tally plugin: customerId '${source}' reads the active ${source} of the session, ` +
        "which Better Auth's organization plugin provides: add organization() to plugins",
    );
  }
  const teams = (organization.options as { teams?: { enabled?: boolean } } | undefined)?.teams;
  if (source === 'team' && teams?.enabled !== true) {
    throw new Error(
      "tally plugin: customerId 'team' needs teams: organization({ teams: { enabled: true } })",
    );
  }
}
