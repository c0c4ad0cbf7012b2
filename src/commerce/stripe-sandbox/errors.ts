/**
 * Stripe-shaped API errors.
 *
 * Stripe answers every failure as `{"error": {type, code?, message, param?}}` and the
 * `stripe` SDK picks its error class from the HTTP status and the type (400/404 →
 * `StripeInvalidRequestError`, 401 → `StripeAuthenticationError`, 400 with type
 * `idempotency_error` → `StripeIdempotencyError`, …). Handlers throw `StripeApiError`;
 * the server renders it. The factories keep messages close to Stripe's own wording so
 * that code written against the sandbox sees what it would see against Stripe.
 */

export type StripeErrorType =
  | 'invalid_request_error'
  | 'idempotency_error'
  | 'api_error'
  | 'card_error';

export interface StripeErrorBody {
  readonly type: StripeErrorType;
  readonly message: string;
  readonly code?: string;
  readonly param?: string;
}

export class StripeApiError extends Error {
  constructor(
    readonly status: number,
    readonly body: StripeErrorBody,
  ) {
    super(body.message);
    this.name = 'StripeApiError';
  }

  /** The JSON document Stripe answers for this error. */
  toJSON(): { error: StripeErrorBody } {
    return { error: this.body };
  }
}

/** 404 `resource_missing`: an id that names nothing (`No such customer: 'cus_…'`). */
export function resourceMissing(noun: string, id: string, param = 'id'): StripeApiError {
  return new StripeApiError(404, {
    type: 'invalid_request_error',
    code: 'resource_missing',
    param,
    message: `No such ${noun}: '${id}'`,
  });
}

/** 400 for a parameter with a bad value. */
export function invalidParam(
  param: string,
  message: string,
  code = 'parameter_invalid',
): StripeApiError {
  return new StripeApiError(400, { type: 'invalid_request_error', code, param, message });
}

/** 400 `parameter_missing`. */
export function missingParam(param: string): StripeApiError {
  return new StripeApiError(400, {
    type: 'invalid_request_error',
    code: 'parameter_missing',
    param,
    message: `Missing required param: ${param}.`,
  });
}

/** 400 `parameter_unknown`: Stripe refuses parameters an endpoint does not take. */
export function unknownParam(param: string): StripeApiError {
  return new StripeApiError(400, {
    type: 'invalid_request_error',
    code: 'parameter_unknown',
    param,
    message: `Received unknown parameter: ${param}`,
  });
}

/** 400 for a request that is well formed but not allowed in the object's current state. */
export function invalidState(message: string, param?: string): StripeApiError {
  return new StripeApiError(400, {
    type: 'invalid_request_error',
    message,
    ...(param === undefined ? {} : { param }),
  });
}

/** 401: no key, or not the sandbox's key. Stripe types these `invalid_request_error`. */
export function authenticationFailed(given: string | undefined): StripeApiError {
  const message =
    given === undefined
      ? 'You did not provide an API key. You need to provide your API key in the ' +
        "Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY')."
      : `Invalid API Key provided: ${redactKey(given)}`;
  return new StripeApiError(401, { type: 'invalid_request_error', message });
}

/** 400 `idempotency_error`: the key was first used with other parameters. */
export function idempotencyMismatch(key: string): StripeApiError {
  return new StripeApiError(400, {
    type: 'idempotency_error',
    message:
      `Keys for idempotent requests can only be used with the same parameters they were ` +
      `first used with. Try using a key other than '${key}' if you meant to execute a ` +
      `different request.`,
  });
}

/** 404 for a path the sandbox does not serve. */
export function unrecognizedUrl(method: string, path: string): StripeApiError {
  return new StripeApiError(404, {
    type: 'invalid_request_error',
    message:
      `Unrecognized request URL (${method}: ${path}). The Stripe sandbox serves only the ` +
      `part of the API it models.`,
  });
}

/** 500 for a failure inside the sandbox itself. */
export function internalError(): StripeApiError {
  return new StripeApiError(500, {
    type: 'api_error',
    message: 'An unexpected error occurred in the Stripe sandbox.',
  });
}

/** Shows a key the way Stripe does in its messages: prefix and last four characters. */
export function redactKey(key: string): string {
  const shown =
    key.length > 12
      ? `${key.slice(0, 8)}${'*'.repeat(Math.min(key.length - 12, 24))}${key.slice(-4)}`
      : '*'.repeat(key.length);
  return shown.replace(/[^\x20-\x7e]/g, '?');
}
