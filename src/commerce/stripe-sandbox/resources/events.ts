/**
 * Events: `/v1/events` retrieve and list (filter by `type`, which may end in `.*`, or
 * `types[]`), newest first, from the sandbox's bounded event log.
 */
import type Stripe from 'stripe';
import { invalidParam } from '../errors.js';
import { render, renderList } from '../expand.js';
import { allowOnly, optString, optStringArray, type Params } from '../form.js';
import { LIST_PARAMS, listPage } from '../list.js';
import type { Router } from '../router.js';
import type { SandboxState } from '../state.js';

function typeMatcher(params: Params): (type: string) => boolean {
  const type = optString(params, 'type');
  const types = optStringArray(params, 'types');
  if (type !== undefined && types !== undefined)
    throw invalidParam('types', 'You may pass either `type` or `types`, but not both.');
  if (types !== undefined) return (t) => types.includes(t);
  if (type === undefined) return () => true;
  if (type.endsWith('.*')) return (t) => t.startsWith(type.slice(0, -1));
  return (t) => t === type;
}

function listEvents(state: SandboxState, params: Params): Stripe.ApiList<Stripe.Event> {
  allowOnly(params, [...LIST_PARAMS, 'type', 'types']);
  const matches = typeMatcher(params);
  return listPage(
    state.events.collection.newestFirst().filter((event) => matches(event.type)),
    params,
    '/v1/events',
    'event',
  );
}

export function registerEvents(router: Router): void {
  router
    .add('GET', '/v1/events/:id', ({ state, path, expand }) =>
      render(state, state.events.collection.get(path['id'] as string), expand),
    )
    .add('GET', '/v1/events', ({ state, params, expand }) =>
      renderList(state, listEvents(state, params), expand),
    );
}
