/**
 * List objects and cursor paging, as Stripe's list endpoints answer them.
 *
 * `{object: 'list', data, has_more, url}`, newest first; `limit` (1–100, default 10)
 * and the cursors `starting_after` (the page after that object) and `ending_before`
 * (the page before it). A cursor naming an object that is not in the list is a 404
 * `resource_missing` on that parameter, as on Stripe.
 */
import type Stripe from 'stripe';
import { resourceMissing } from './errors.js';
import { optInteger, optString, type Params } from './form.js';
import type { Identified } from './store.js';

export const LIST_PARAMS = ['limit', 'starting_after', 'ending_before'] as const;

function pageLimit(params: Params): number {
  const limit = optInteger(params, 'limit', 100) ?? 10;
  return Math.max(1, limit);
}

/** One page of `items` (already newest first and filtered). */
export function listPage<T extends Identified>(
  items: readonly T[],
  params: Params,
  url: string,
  noun: string,
): Stripe.ApiList<T> {
  const limit = pageLimit(params);
  const after = optString(params, 'starting_after');
  const before = optString(params, 'ending_before');
  if (after !== undefined) {
    const index = items.findIndex((item) => item.id === after);
    if (index < 0) throw resourceMissing(noun, after, 'starting_after');
    const rest = items.slice(index + 1);
    return { object: 'list', data: rest.slice(0, limit), has_more: rest.length > limit, url };
  }
  if (before !== undefined) {
    const index = items.findIndex((item) => item.id === before);
    if (index < 0) throw resourceMissing(noun, before, 'ending_before');
    const head = items.slice(0, index);
    return {
      object: 'list',
      data: head.slice(Math.max(0, head.length - limit)),
      has_more: head.length > limit,
      url,
    };
  }
  return { object: 'list', data: items.slice(0, limit), has_more: items.length > limit, url };
}
