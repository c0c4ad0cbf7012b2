/**
 * Webhook endpoints: `/v1/webhook_endpoints` create, retrieve, update, list, delete.
 *
 * Creating one answers with its signing `secret` (`whsec_…`), shown only then, as on
 * Stripe. `enabled_events` lists event types or `*`. The sandbox only delivers to this
 * machine, so a URL that is not loopback (127.0.0.0/8, localhost, [::1]) is refused.
 * `disabled=true` pauses deliveries. At most 16 endpoints, Stripe's test-mode limit.
 */
import Stripe from 'stripe';
import { invalidParam } from '../errors.js';
import { render, renderList } from '../expand.js';
import {
  allowOnly,
  mergeMetadata,
  optBoolean,
  optString,
  optStringArray,
  reqString,
  type Params,
} from '../form.js';
import { LIST_PARAMS, listPage } from '../list.js';
import type { Router } from '../router.js';
import type { SandboxState } from '../state.js';
import { newId, randomToken } from '../store.js';
import { isLoopbackUrl } from '../webhooks.js';

function checkedUrl(params: Params): string {
  const url = reqString(params, 'url');
  if (!isLoopbackUrl(url))
    throw invalidParam(
      'url',
      'The Stripe sandbox only delivers webhooks to loopback URLs (http://127.0.0.1:…, ' +
        'http://localhost:…, http://[::1]:…).',
      'url_invalid',
    );
  return url;
}

function checkedEvents(params: Params, required: boolean): string[] | undefined {
  const events = optStringArray(params, 'enabled_events');
  if (events === undefined) {
    if (required)
      throw invalidParam(
        'enabled_events',
        'Missing required param: enabled_events.',
        'parameter_missing',
      );
    return undefined;
  }
  if (events.length === 0)
    throw invalidParam('enabled_events', 'enabled_events must name at least one event type.');
  for (const [index, type] of events.entries()) {
    if (type !== '*' && !/^[a-z_]+(\.[a-z_]+){1,4}$/.test(type))
      throw invalidParam(`enabled_events[${index}]`, `Invalid event type: ${type}`);
  }
  return events;
}

function createEndpoint(state: SandboxState, params: Params): Stripe.WebhookEndpoint {
  allowOnly(params, ['url', 'enabled_events', 'description', 'metadata', 'api_version']);
  const apiVersion = optString(params, 'api_version');
  if (apiVersion !== undefined && apiVersion !== Stripe.API_VERSION)
    throw invalidParam(
      'api_version',
      `The Stripe sandbox speaks API version ${Stripe.API_VERSION} only.`,
    );
  const endpoint: Stripe.WebhookEndpoint = {
    id: newId('we'),
    object: 'webhook_endpoint',
    api_version: Stripe.API_VERSION,
    application: null,
    created: state.clock.nowSeconds(),
    description: optString(params, 'description') || null,
    enabled_events: checkedEvents(params, true) ?? [],
    livemode: false,
    metadata: mergeMetadata(params),
    status: 'enabled',
    url: checkedUrl(params),
  };
  state.webhookEndpoints.insert(endpoint);
  const secret = `whsec_${randomToken(32)}`;
  state.webhookSecrets.set(endpoint.id, secret);
  return { ...endpoint, secret };
}

function updateEndpoint(state: SandboxState, id: string, params: Params): Stripe.WebhookEndpoint {
  allowOnly(params, ['url', 'enabled_events', 'description', 'metadata', 'disabled']);
  const before = state.webhookEndpoints.get(id);
  const disabled = optBoolean(params, 'disabled');
  const after: Stripe.WebhookEndpoint = {
    ...before,
    ...(params['url'] === undefined ? {} : { url: checkedUrl(params) }),
    ...(params['description'] === undefined
      ? {}
      : { description: optString(params, 'description') || null }),
    enabled_events: checkedEvents(params, false) ?? before.enabled_events,
    metadata: mergeMetadata(params, before.metadata),
    status: disabled === undefined ? before.status : disabled ? 'disabled' : 'enabled',
  };
  return state.webhookEndpoints.update(after);
}

function deleteEndpoint(state: SandboxState, id: string): Stripe.DeletedWebhookEndpoint {
  state.webhookEndpoints.get(id);
  state.webhookEndpoints.delete(id);
  state.webhookSecrets.delete(id);
  return { id, object: 'webhook_endpoint', deleted: true };
}

export function registerWebhookEndpoints(router: Router): void {
  router
    .add('POST', '/v1/webhook_endpoints', ({ state, params, expand }) =>
      render(state, createEndpoint(state, params), expand),
    )
    .add('GET', '/v1/webhook_endpoints/:id', ({ state, path, expand }) =>
      render(state, state.webhookEndpoints.get(path['id'] as string), expand),
    )
    .add('POST', '/v1/webhook_endpoints/:id', ({ state, path, params, expand }) =>
      render(state, updateEndpoint(state, path['id'] as string, params), expand),
    )
    .add('DELETE', '/v1/webhook_endpoints/:id', ({ state, path }) =>
      deleteEndpoint(state, path['id'] as string),
    )
    .add('GET', '/v1/webhook_endpoints', ({ state, params, expand }) => {
      allowOnly(params, LIST_PARAMS);
      return renderList(
        state,
        listPage(
          state.webhookEndpoints.newestFirst(),
          params,
          '/v1/webhook_endpoints',
          'webhook_endpoint',
        ),
        expand,
      );
    });
}
