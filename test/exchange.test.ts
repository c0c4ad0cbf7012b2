/**
 * Exchange: the only writer of replies. Checked with a recording stand-in for uWS's
 * response object: status line, headers, one reply per request, nothing after an abort,
 * and a 500 (not a crash) when a handler step throws.
 */
import { describe, expect, it, vi } from 'vitest';
import type { HttpResponse } from 'uWebSockets.js';
import { Exchange } from '../src/http/exchange.js';

function recorder() {
  const written: string[] = [];
  let abort: () => void = () => undefined;
  const res = {
    onAborted(handler: () => void) {
      abort = handler;
      return res;
    },
    cork(fn: () => void) {
      fn();
      return res;
    },
    writeStatus(status: string) {
      written.push(`status ${status}`);
      return res;
    },
    writeHeader(name: string, value: string) {
      written.push(`${name}: ${value}`);
      return res;
    },
    end(body: string) {
      written.push(`body ${body}`);
      return res;
    },
  };
  return { res: res as unknown as HttpResponse, written, abort: () => abort() };
}

describe('Exchange', () => {
  it('writes 200 without a status line (uWS default) and other statuses with one', () => {
    const a = recorder();
    new Exchange(a.res, 'GET', '/x').send(200, 'true');
    expect(a.written).toEqual(['content-type: application/json', 'body true']);
    const b = recorder();
    new Exchange(b.res, 'GET', '/x').fail('route_not_found', { method: 'GET', path: '/x' }, [['x-extra', '1']]);
    expect(b.written).toEqual(['status 404 Not Found', 'content-type: application/json', 'x-extra: 1', 'body {"error":"no route GET /x"}']);
  });

  it('answers once, and never after the client aborted', () => {
    const a = recorder();
    const ex = new Exchange(a.res, 'GET', '/x');
    ex.send(200, '1');
    ex.send(200, '2');
    expect(a.written.filter((w) => w.startsWith('body'))).toEqual(['body 1']);
    const b = recorder();
    const aborted = new Exchange(b.res, 'GET', '/x');
    b.abort();
    aborted.send(200, '1');
    expect(b.written).toEqual([]);
  });

  it('turns a throwing step into a logged 500', () => {
    const a = recorder();
    const stderr = vi.spyOn(process.stderr, 'write').mockImplementation(() => true);
    new Exchange(a.res, 'POST', '/v1/x').guard(() => {
      throw new Error('boom');
    });
    expect(a.written).toContain('status 500 Internal Server Error');
    expect(a.written).toContain('body {"error":"internal error"}');
    expect(String(stderr.mock.calls[0]?.[0])).toContain('boom');
    stderr.mockRestore();
  });
});
