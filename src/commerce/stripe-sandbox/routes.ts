/**
 * The route table of the sandbox's API: every `/v1/...` endpoint it serves, one
 * resource module each.
 */
import { registerCheckoutSessions } from './resources/checkout-sessions.js';
import { registerCustomers } from './resources/customers.js';
import { registerEvents } from './resources/events.js';
import { registerInvoiceItems } from './resources/invoice-items.js';
import { registerInvoices } from './resources/invoices.js';
import { registerPayments } from './resources/payments.js';
import { registerPrices } from './resources/prices.js';
import { registerProducts } from './resources/products.js';
import { registerRefunds } from './resources/refunds.js';
import { registerSubscriptions } from './resources/subscriptions.js';
import { registerTestClocks } from './resources/test-clocks.js';
import { registerWebhookEndpoints } from './resources/webhook-endpoints.js';
import { Router } from './router.js';

export function buildSandboxRouter(): Router {
  const router = new Router();
  for (const register of [
    registerCustomers,
    registerProducts,
    registerPrices,
    registerCheckoutSessions,
    registerSubscriptions,
    registerInvoices,
    registerInvoiceItems,
    registerPayments,
    registerRefunds,
    registerTestClocks,
    registerWebhookEndpoints,
    registerEvents,
  ]) {
    register(router);
  }
  return router;
}
