/**
 * Turns the core's outcomes into HTTP status and JSON body, inside the shard worker, so
 * that the front end's single thread only writes bytes. Uses the one error catalog, so
 * the errors a shard answers carry their `code` like every other.
 * Replies that carry usage amounts go through `exactJson`, which writes amounts of 10^9
 * units and more exactly (actors/fixed.ts).
 */
import type { Outcome, Rejection } from './customer.js';
import { exactJson } from './fixed.js';
import { METADATA_KEYS_MAX } from './limits.js';
import { CONTEXT_WROTE_STATUS, UNCHANGED_STATUS } from './protocol.js';
import { ERRORS, errorBody, type ErrorCode, type ErrorParams } from '../src/errors.js';

export interface Rendered {
  readonly status: number;
  readonly body: string;
}

export function renderOutcome(outcome: Outcome): Rendered {
  switch (outcome.kind) {
    case 'has':
      return { status: 200, body: outcome.value ? 'true' : 'false' };
    case 'limit':
      return { status: outcome.unchanged === true ? UNCHANGED_STATUS : 200, body: JSON.stringify(outcome.view) };
    case 'contract':
      return { status: 200, body: JSON.stringify(outcome.view) };
    case 'balance':
      return { status: outcome.unchanged === true ? UNCHANGED_STATUS : 200, body: exactJson(JSON.stringify(outcome.view)) };
    case 'deleted':
      return { status: 204, body: '' };
    case 'customer':
      return { status: outcome.created ? 201 : outcome.changed ? 200 : UNCHANGED_STATUS, body: JSON.stringify(outcome.view) };
    case 'context':
      return { status: outcome.wrote ? CONTEXT_WROTE_STATUS : 200, body: exactJson(JSON.stringify(outcome.view)) };
    case 'rejected':
      return renderRejection(outcome.rejection);
  }
}

function fail(code: ErrorCode, params: ErrorParams = {}, extra?: object): Rendered {
  const body = errorBody(code, params, extra);
  return { status: ERRORS[code].status, body: extra === undefined ? body : exactJson(body) };
}

function renderRejection(rejection: Rejection): Rendered {
  switch (rejection.kind) {
    case 'not_configured':
      return fail('not_configured', { environment: rejection.environment });
    case 'entitlement_not_found':
    case 'overage_not_allowed':
    case 'too_many_lots':
      return fail(rejection.kind, { key: rejection.key });
    case 'wrong_entitlement_type':
      return fail('wrong_entitlement_type', { key: rejection.key, actual: rejection.actual, expected: rejection.expected });
    case 'idempotency_key_reused':
      return fail('idempotency_key_reused');
    case 'expansion_not_allowed':
      return fail('expansion_not_allowed', { key: rejection.key, field: rejection.field });
    case 'insufficient_balance':
    case 'refund_exceeds_usage':
      return fail(rejection.kind, { key: rejection.key }, rejection.view);
    case 'contract_not_found':
      return fail('contract_not_found', { customerId: rejection.customerId });
    case 'contract_invalid':
      return fail('invalid_request', { detail: rejection.detail });
    case 'metadata_too_large':
      return fail('invalid_request', { detail: `metadata may hold at most ${METADATA_KEYS_MAX} keys (would hold ${rejection.keys})` });
  }
}
