/**
 * The two tables the plugin declares in Better Auth's `schema`, so Better Auth's
 * migrations (or its CLI) create them beside its own: the registered webhook endpoint
 * (its id and signing secret, one row per receiver URL and registration key) and the
 * `webhook-id`s of deliveries already handled, which makes at-least-once delivery
 * effectively once.
 */

export const ENDPOINT_MODEL = 'tallyWebhookEndpoint';
export const DELIVERY_MODEL = 'tallyWebhookDelivery';

/** A stored registration, as the adapter reads it back. */
export interface StoredEndpoint {
  readonly id: string;
  readonly url: string;
  readonly registrationKey: string;
  readonly endpointId: string;
  readonly secret: string;
  /** The registered event filter as Tally answered it (`*` or comma-separated kinds). */
  readonly events: string;
  readonly createdAt: Date;
}

export const webhookSchema = {
  [ENDPOINT_MODEL]: {
    fields: {
      url: { type: 'string', required: true },
      registrationKey: { type: 'string', required: true },
      endpointId: { type: 'string', required: true },
      secret: { type: 'string', required: true },
      events: { type: 'string', required: true },
      createdAt: { type: 'date', required: true },
    },
    indexes: [
      { fields: ['url', 'registrationKey'], unique: true, name: 'tally_webhook_endpoint_url_key' },
    ],
  },
  [DELIVERY_MODEL]: {
    fields: {
      webhookId: { type: 'string', required: true, unique: true },
      eventType: { type: 'string', required: true },
      receivedAt: { type: 'date', required: true, index: true },
    },
  },
} as const;
