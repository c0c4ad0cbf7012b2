/**
 * `tally/better-auth/client`: the client plugin for Better Auth's `createAuthClient`.
 *
 * It adds `authClient.tally.customer.sync()`, `.has({key})`, `.usage.balance({key})`,
 * `.usage.consume({key, amount})`, `.checkout.create({...})`, `.context({...})` and
 * `.clientToken({ttlSeconds?})` (with `customerTokenSource` to keep it fresh), typed
 * from the server plugin. They call the application's own endpoints (never Tally), return
 * Better Auth's `{data, error}` envelope and do not throw. This module holds no code of
 * the server plugin (the import below is a type) and is safe to bundle for the browser.
 */
import type { BetterAuthClientPlugin } from 'better-auth/client';
import type { tally } from './index.js';

export {
  customerTokenSource,
  type MintedToken,
  type TokenSource,
  type TokenSourceOptions,
} from '../client/token-source.js';

export const tallyClient = () =>
  ({
    id: 'tally',
    $InferServerPlugin: {} as ReturnType<typeof tally>,
    // Endpoints called without a body would otherwise be sent as GET.
    pathMethods: {
      '/tally/customer/sync': 'POST',
      '/tally/context': 'POST',
      '/tally/client-token': 'POST',
    },
  }) satisfies BetterAuthClientPlugin;
