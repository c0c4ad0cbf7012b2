/**
 * A billing configuration that uses every part of the format (a free default product, a
 * recurring plan with expansion and overage, a one-time credit pack, webhook forwarding),
 * shared by the tests that check it validates, compiles and documents.
 */
import type { BillingConfig } from '../../actors/billing-config.js';

export const PRODUCT_EXAMPLE_CONFIG = {
  entitlements: {
    sso: { type: 'feature', name: 'Single sign-on' },
    seats: { type: 'limit', name: 'Seats' },
    api_calls: { type: 'meter', name: 'API calls', reset: 'month' },
  },
  products: {
    free: {
      name: 'Free',
      default: true,
      entitlements: { api_calls: { included: 100 }, seats: { included: 1 } },
    },
    pro: {
      name: 'Pro',
      price: { amount: 2000, currency: 'usd', interval: 'month' },
      entitlements: {
        sso: true,
        seats: { included: 5, expansion: { unitAmount: 500 } },
        api_calls: { included: 10000, overage: { unitAmount: 1 } },
      },
    },
    credits_5k: {
      name: '5k API credits',
      price: { amount: 1000, currency: 'usd' },
      grants: { api_calls: 5000 },
    },
  },
  webhooks: {
    devTunnel: true,
    forwarding: [
      {
        key: 'app',
        path: '/api/auth/tally',
        events: '*',
        integration: 'better-auth',
        autoRegister: true,
      },
    ],
  },
} satisfies BillingConfig;
