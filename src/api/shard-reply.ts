/**
 * Turns a shard's reply into the HTTP status and body the client sees. The shard answers
 * with what happened (protocol.ts, ShardReply): a success carries its JSON body ready to
 * write, and a rejection carries the core's Rejection, rendered here from the one error
 * catalog. Error bodies that carry usage amounts go through `exactJson`, which writes
 * amounts of 10^9 units and more exactly (actors/fixed.ts).
 */
import type { Rejection } from '../../actors/customer.js';
import { exactJson } from '../../actors/fixed.js';
import type { ReplyOutcome } from '../../actors/protocol.js';
import { METADATA_KEYS_MAX } from '../../shared/limits.js';
import { ERRORS, errorBody, type ErrorCode, type ErrorParams } from '../errors.js';

export interface Rendered {
  readonly status: number;
  readonly body: string;
}

/** The status of a reply that is not a rejection. */
export function successStatus(outcome: Exclude<ReplyOutcome, 'rejected'>): number {
  switch (outcome) {
    case 'ok':
      return 200;
    case 'created':
      return 201;
    case 'deleted':
      return 204;
  }
}

/** The status and body a shard's reply is answered with. */
export function renderReply(outcome: ReplyOutcome, body: string): Rendered {
  return outcome === 'rejected'
    ? renderRejectionReply(body)
    : { status: successStatus(outcome), body };
}

/** A rejection reply's status and error body; `json` is the reply's body (the Rejection). */
export function renderRejectionReply(json: string): Rendered {
  return renderRejection(JSON.parse(json) as Rejection);
}

function fail(code: ErrorCode, params: ErrorParams = {}, extra?: object): Rendered {
  const body = errorBody(code, params, extra);
  return { status: ERRORS[code].status, body: extra === undefined ? body : exactJson(body) };
}

function renderRejection(rejection: Rejection): Rendered {
  switch (rejection.kind) {
    case 'not_configured':
      return fail('not_configured', { environment: rejection.environment });
    case 'quota_exceeded':
      return fail('quota_exceeded', { detail: quotaDetail(rejection) });
    case 'entitlement_not_found':
    case 'overage_not_allowed':
    case 'too_many_lots':
      return fail(rejection.kind, { key: rejection.key });
    case 'wrong_entitlement_type':
      return fail('wrong_entitlement_type', {
        key: rejection.key,
        actual: rejection.actual,
        expected: rejection.expected,
      });
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
    case 'too_many_records':
      return fail('invalid_request', {
        detail: 'the customer holds the maximum number of subscriptions or purchases',
      });
    case 'refund_target_not_found':
      return fail(`${rejection.target}_not_found`, { id: rejection.id });
    case 'refund_mode_not_allowed':
      return fail('refund_mode_not_allowed', { detail: rejection.detail });
    case 'already_refunded':
      return fail('already_refunded', { detail: rejection.detail });
    case 'metadata_too_large':
      return fail('invalid_request', {
        detail:
          `metadata may hold at most ${METADATA_KEYS_MAX} keys ` + `(would hold ${rejection.keys})`,
      });
  }
}

/**
 * The message of a quota refusal, wherever it is decided (a shard, or the front end for a config
 * push).
 */
export function quotaDetail(rejection: Extract<Rejection, { kind: 'quota_exceeded' }>): string {
  if (rejection.quota === 'auditEntriesPerDay') {
    return (
      `the ${rejection.environment} environment wrote its quota of ${rejection.limit} ` +
      `audit entries today (UTC, set by the operator); audited changes resume tomorrow`
    );
  }
  const what = rejection.quota === 'customers' ? 'customers' : 'idempotency keys';
  return (
    `the ${rejection.environment} environment holds its quota ` +
    `of ${rejection.limit} ${what} (set by the operator); no new ones are accepted`
  );
}
