/**
 * The metadata keys Tally puts on the processor's objects, so that an object (a checkout
 * session, a subscription, a payment, a refund) names the Tally environment and customer
 * it belongs to, and a refund what it refunded.
 */

/** On checkout sessions, subscriptions, payment intents and refunds. */
export const META = {
  environment: 'tally_environment',
  customerId: 'tally_customer_id',
  productKey: 'tally_product_key',
} as const;

/** On refunds, with META's environment and customer id. */
export const REFUND_META = {
  target: 'tally_refund_target',
  targetId: 'tally_refund_of',
  mode: 'tally_refund_mode',
  key: 'tally_idempotency_key',
} as const;

/** On a customer's contract price: the customer (catalog sync never archives these). */
export const CONTRACT_CUSTOMER_META = 'tally_contract_customer';

/** On an expansion price: the limit it expands (catalog sync never archives these). */
export const EXPANSION_LIMIT_META = 'tally_expansion_limit';
