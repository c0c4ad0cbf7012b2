/**
 * Exchange: the only writer of replies. Checked with a recording stand-in for uWS's
 * response object: status line, headers, one reply per request, nothing after an abort,
 * a 500 (not a crash, and a log line with the request id) when a handler step throws,
 * and the request-id echo rule.
 */
import { describe, expect, it } from 'vitest';
import type { HttpResponse } from 'uWebSockets.js';
import { Exchange } from '../src/http/exchange.js';
import { createLogger, type LogLevel } from '../src/observability/log.js';
import { Observability } from '../src/observability/observability.js';

/** An Observability whose log lines land in `lines` (parsed). */
function observer(level: LogLevel = 'info') {
  const lines: Array<Record<string, unknown>> = [];
  const obs = new Observability(
    createLogger(level, {
      write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>),
    }),
  );
  return { obs, lines };
}

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
    const { obs } = observer();
    const a = recorder();
    new Exchange(a.res, 'GET', '/x', obs).send(200, 'true');
    expect(a.written).toEqual(['content-type: application/json', 'body true']);
    const b = recorder();
    new Exchange(b.res, 'GET', '/x', obs, 'req-1').fail(
      'route_not_found',
      { method: 'GET', path: '/x' },
      [['x-extra', '1']],
    );
    expect(b.written).toEqual([
      'status 404 Not Found',
      'content-type: application/json',
      'x-request-id: req-1',
      'x-extra: 1',
      'body {"error":"no route GET /x","code":"route_not_found"}',
    ]);
  });

  it('answers once, and never after the client aborted', () => {
    const { obs } = observer();
    const a = recorder();
    const ex = new Exchange(a.res, 'GET', '/x', obs);
    ex.send(200, '1');
    ex.send(200, '2');
    expect(a.written.filter((w) => w.startsWith('body'))).toEqual(['body 1']);
    const b = recorder();
    const aborted = new Exchange(b.res, 'GET', '/x', obs);
    // Not answered inside the handler: the server arms the abort callback before returning.
    aborted.armAbort();
    b.abort();
    aborted.send(200, '1');
    expect(b.written).toEqual([]);
    expect(obs.metrics.aborted).toBe(1);
  });

  it('turns a throwing step into a 500 and one error line with its request id and stack', () => {
    const { obs, lines } = observer();
    const a = recorder();
    const ex = new Exchange(a.res, 'POST', '/v1/x', obs);
    ex.guard(() => {
      throw new Error('boom');
    });
    expect(a.written).toContain('status 500 Internal Server Error');
    expect(a.written).toContain('body {"error":"internal error","code":"internal"}');
    expect(a.written).toContain(`x-request-id: ${ex.requestId}`);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({
      level: 'error',
      msg: 'request handler failed',
      requestId: ex.requestId,
      method: 'POST',
      route: 'unmatched',
      status: 500,
    });
    expect(JSON.stringify(lines[0]?.['err'])).toContain('boom');
  });

  it('echoes x-request-id on errors and to clients that sent one; not on a plain 200', () => {
    const { obs } = observer();
    const header = (written: string[]) =>
      written.find((w) => w.startsWith('x-request-id: '))?.slice('x-request-id: '.length);
    const plain = recorder();
    new Exchange(plain.res, 'GET', '/x', obs).send(200, 'true');
    expect(header(plain.written)).toBeUndefined();
    const asked = recorder();
    new Exchange(asked.res, 'GET', '/x', obs, 'abc-123_X.y:z').send(200, 'true');
    expect(header(asked.written)).toBe('abc-123_X.y:z');
    // Malformed (a space; too long): replaced by one of ours, and still echoed.
    for (const bad of ['has space', 'x'.repeat(129)]) {
      const replaced = recorder();
      new Exchange(replaced.res, 'GET', '/x', obs, bad).send(200, 'true');
      expect(header(replaced.written)).toMatch(/^[0-9a-f]{8}-[0-9a-z]+$/);
    }
    const failed = recorder();
    new Exchange(failed.res, 'GET', '/x', obs).fail('key_missing');
    expect(header(failed.written)).toMatch(/^[0-9a-f]{8}-[0-9a-z]+$/);
  });

  it(
    'counts each answer under its series and status, and logs 5xx (and, at debug, every ' +
      'request)',
    () => {
      const { obs, lines } = observer('debug');
      const slot = obs.metrics.fixedSlot('/healthz', 'GET');
      const ok = new Exchange(recorder().res, 'GET', '/healthz', obs);
      ok.slot = slot;
      ok.send(200, '{"ok":true}');
      const down = new Exchange(recorder().res, 'GET', '/healthz', obs);
      down.slot = slot;
      down.fail('not_ready');
      const series = obs.metrics.series[slot];
      expect(series?.latencyMs.count).toBe(2);
      expect(lines.map((l) => [l['level'], l['msg'], l['route'], l['status']])).toEqual([
        ['debug', 'request', '/healthz', 200],
        ['warn', 'request refused: service unavailable', '/healthz', 503],
      ]);
      expect(lines[1]?.['requestId']).toBe(down.requestId);
      // A method outside the fixed list never becomes a label value of its own.
      expect(obs.metrics.series[obs.metrics.fixedSlot('unmatched', 'BREW')]).toMatchObject({
        route: 'unmatched',
        method: 'other',
      });
    },
  );
});
