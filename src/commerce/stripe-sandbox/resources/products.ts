/**
 * Products: `/v1/products` create, retrieve, update (including `active: false` to retire
 * one), list (filter by `active`, `ids[]`).
 */
import type Stripe from 'stripe';
import { render, renderList } from '../expand.js';
import { previousAttributes } from '../events.js';
import {
  allowOnly,
  mergeMetadata,
  optBoolean,
  optString,
  optStringArray,
  reqString,
  type Params,
} from '../form.js';
import { invalidParam } from '../errors.js';
import { LIST_PARAMS, listPage } from '../list.js';
import type { Router } from '../router.js';
import type { SandboxState } from '../state.js';
import { newId } from '../store.js';

const EDITABLE = ['name', 'active', 'description', 'metadata', 'url'] as const;

function createProduct(state: SandboxState, params: Params): Stripe.Product {
  allowOnly(params, [...EDITABLE, 'id']);
  const id = optString(params, 'id') ?? newId('prod');
  if (state.products.find(id) !== undefined)
    throw invalidParam('id', `Product already exists.`, 'resource_already_exists');
  const now = state.clock.nowSeconds();
  const product: Stripe.Product = {
    id,
    object: 'product',
    active: optBoolean(params, 'active') ?? true,
    created: now,
    default_price: null,
    description: optString(params, 'description') || null,
    images: [],
    livemode: false,
    marketing_features: [],
    metadata: mergeMetadata(params),
    name: reqString(params, 'name'),
    package_dimensions: null,
    shippable: null,
    statement_descriptor: null,
    tax_code: null,
    tax_details: null,
    type: 'service',
    unit_label: null,
    updated: now,
    url: optString(params, 'url') || null,
  };
  state.products.insert(product);
  state.events.emit('product.created', product);
  return product;
}

function updateProduct(state: SandboxState, id: string, params: Params): Stripe.Product {
  allowOnly(params, EDITABLE);
  const before = state.products.get(id);
  const after: Stripe.Product = {
    ...before,
    ...(params['name'] === undefined ? {} : { name: reqString(params, 'name') }),
    ...(params['description'] === undefined
      ? {}
      : { description: optString(params, 'description') || null }),
    ...(params['url'] === undefined ? {} : { url: optString(params, 'url') || null }),
    active: optBoolean(params, 'active') ?? before.active,
    metadata: mergeMetadata(params, before.metadata),
  };
  const previous = previousAttributes(before, after);
  if (Object.keys(previous).length === 0) return before;
  after.updated = state.clock.nowSeconds();
  state.products.update(after);
  state.events.emit('product.updated', after, previous);
  return after;
}

function listProducts(state: SandboxState, params: Params): Stripe.ApiList<Stripe.Product> {
  allowOnly(params, [...LIST_PARAMS, 'active', 'ids']);
  const active = optBoolean(params, 'active');
  const ids = optStringArray(params, 'ids');
  const items = state.products
    .newestFirst()
    .filter(
      (p) =>
        (active === undefined || p.active === active) && (ids === undefined || ids.includes(p.id)),
    );
  return listPage(items, params, '/v1/products', 'product');
}

export function registerProducts(router: Router): void {
  router
    .add('POST', '/v1/products', ({ state, params, expand }) =>
      render(state, createProduct(state, params), expand),
    )
    .add('GET', '/v1/products/:id', ({ state, path, expand }) =>
      render(state, state.products.get(path['id'] as string), expand),
    )
    .add('POST', '/v1/products/:id', ({ state, path, params, expand }) =>
      render(state, updateProduct(state, path['id'] as string, params), expand),
    )
    .add('GET', '/v1/products', ({ state, params, expand }) =>
      renderList(state, listProducts(state, params), expand),
    );
}
