/**
 * The public routes, answered without a key before any other check but framing:
 * readiness (`/healthz`) and the billing configuration's JSON Schema. Records like every
 * other route (route-record.ts), so the OpenAPI document describes them from here too.
 */
import { billingConfigSchema } from '../config/billing-schema.js';
import type { Router } from '../http/router.js';
import {
  routerOf,
  type AnyRouteRecord,
  type CompiledRoute,
  type PublicCaller,
  type RouteRecord,
} from './route-record.js';

export interface PublicDeps {
  /** Recovery has finished and the shards serve. */
  readonly isReady: () => boolean;
  /**
   * The data directory's free space is below its reserve (storage-watch.ts): writes are refused.
   */
  readonly storageFull: () => boolean;
}

export type PublicRoute = CompiledRoute<PublicDeps, PublicCaller>;

/** The public JSON Schema document (`GET /v1/schema/billing`), serialised once. */
export const BILLING_SCHEMA_JSON = JSON.stringify(billingConfigSchema);

function route(
  record: RouteRecord<PublicDeps, undefined, undefined, PublicCaller>,
): AnyRouteRecord<PublicDeps, PublicCaller> {
  return record;
}

export const PUBLIC_ROUTES: ReadonlyArray<AnyRouteRecord<PublicDeps, PublicCaller>> = [
  route({
    method: 'GET',
    path: '/healthz',
    keys: 'none',
    audited: false,
    doc: {
      operationId: 'getHealth',
      tag: 'service',
      summary: 'Readiness',
      description:
        'Answers 200 once recovery from disk has finished; 503 ' +
        '`{"ok":false,"storage":"full"}` while the data directory is below its free-space ' +
        'reserve (writes refused, reads served).',
      ok: { description: 'The service is ready.', schema: { $ref: '#/components/schemas/Health' } },
      errors: ['not_ready'],
    },
    handle(ctx, deps) {
      if (!deps.isReady()) return ctx.ex.fail('not_ready', {}, [['retry-after', '1']]);
      if (deps.storageFull())
        return ctx.ex.send(503, '{"ok":false,"storage":"full"}', [['retry-after', '5']]);
      ctx.ex.send(200, '{"ok":true}');
    },
  }),
  route({
    method: 'GET',
    path: '/v1/schema/billing',
    keys: 'none',
    audited: false,
    doc: {
      operationId: 'getBillingSchema',
      tag: 'configuration',
      summary: 'JSON Schema of the billing configuration',
      description: 'Public: no key is needed.',
      ok: {
        description: 'A JSON Schema (draft 2020-12).',
        schema: { $ref: '#/components/schemas/JsonSchemaDocument' },
      },
      errors: [],
    },
    handle: (ctx) => ctx.ex.send(200, BILLING_SCHEMA_JSON),
  }),
];

export function buildPublicRouter(deps: PublicDeps): Router<PublicRoute> {
  return routerOf(PUBLIC_ROUTES, deps);
}
