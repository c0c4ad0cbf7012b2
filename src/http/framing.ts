/**
 * Refuses requests whose message framing two HTTP parsers could read differently.
 *
 * uWebSockets.js takes the first of several `Content-Length` headers, treats an empty one
 * as zero, accepts `Transfer-Encoding` lists such as `chunked, identity`, and decodes
 * chunk lines that end in a bare LF. A proxy in front of Tally may read the same bytes
 * another way, and the bytes one side takes for a body the other runs as a second
 * request (request smuggling: a `GET /healthz` whose "body" was a complete consume).
 * So a request is refused, and its connection closed, unless its framing is
 * unambiguous: no body headers at all, or exactly one `Content-Length` of digits.
 * Chunked bodies are refused as a whole (411): Tally cannot see the raw chunk lines to
 * check them, and every body it takes is a JSON document of at most 1 MiB that a client
 * can send with its length.
 */
import type { HttpRequest } from 'uWebSockets.js';

export interface FramingProblem {
  readonly code: 'invalid_framing' | 'length_required';
  readonly detail: string;
}

// One visit per header of every request: module state instead of a closure per request.
let lengthCount = 0;
let encodingCount = 0;
let lengthValue = '';

function visit(name: string, value: string): void {
  // uWS hands header names over in lower case.
  if (name === 'content-length') {
    lengthCount++;
    lengthValue = value;
  } else if (name === 'transfer-encoding') {
    encodingCount++;
  }
}

const DIGITS = /^[0-9]+$/;

/** What is wrong with the request's framing headers, or null when they are unambiguous. */
export function framingProblem(req: HttpRequest): FramingProblem | null {
  lengthCount = 0;
  encodingCount = 0;
  req.forEach(visit);
  if (lengthCount === 0 && encodingCount === 0) return null;
  if (lengthCount > 0 && encodingCount > 0) {
    return {
      code: 'invalid_framing',
      detail: 'both Content-Length and Transfer-Encoding are present',
    };
  }
  if (lengthCount > 1)
    return { code: 'invalid_framing', detail: 'more than one Content-Length header' };
  if (encodingCount > 0)
    return { code: 'length_required', detail: 'Transfer-Encoding is not accepted' };
  if (!DIGITS.test(lengthValue))
    return { code: 'invalid_framing', detail: 'Content-Length is not a decimal number' };
  return null;
}
