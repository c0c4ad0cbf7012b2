/**
 * Collects a request body under the 1 MiB cap and parses it as JSON.
 *
 * The 413 goes out as soon as the declared `content-length` or the bytes received pass
 * the cap (and the connection is closed, so the rest is never read). uWS hands out
 * chunks whose memory is reused after the callback returns, so each is copied or
 * decoded before returning.
 */
import { BODY_BYTES_MAX } from '../../actors/limits.js';
import type { Exchange } from './exchange.js';

/** Checks the content type and length headers; answers and returns false on failure. */
export function checkBodyHeaders(ex: Exchange, contentType: string, contentLength: string): boolean {
  if (contentLength !== '' && Number(contentLength) > BODY_BYTES_MAX) {
    ex.fail('body_too_large', {}, [], true);
    return false;
  }
  const mediaType = contentType.split(';', 1)[0]?.trim().toLowerCase();
  if (mediaType !== 'application/json') {
    ex.fail('content_type');
    return false;
  }
  return true;
}

/** Reads the body, then calls `onJson` with the parsed value; answers 400/413 itself. */
export function readJsonBody(ex: Exchange, onJson: (value: unknown) => void): void {
  const chunks: Buffer[] = [];
  let size = 0;
  ex.res.onData((chunk, isLast) => {
    if (ex.done || ex.aborted) return;
    size += chunk.byteLength;
    if (size > BODY_BYTES_MAX) {
      ex.fail('body_too_large', {}, [], true);
      return;
    }
    if (isLast && chunks.length === 0) {
      parseAndDeliver(ex, Buffer.from(chunk).toString('utf8'), onJson);
      return;
    }
    chunks.push(Buffer.from(chunk.slice(0)));
    if (isLast) parseAndDeliver(ex, Buffer.concat(chunks).toString('utf8'), onJson);
  });
}

function parseAndDeliver(ex: Exchange, text: string, onJson: (value: unknown) => void): void {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    ex.fail('invalid_json');
    return;
  }
  ex.guard(() => onJson(value));
}
