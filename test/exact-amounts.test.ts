/**
 * Amounts stay exact beyond a double's precision, at both ends: a number literal that
 * JSON.parse rounds is read from the body's text (memberSource + parseAmount's literal),
 * and totals of 10^9 units and more are written as exact JSON numbers (formatMicros +
 * exactJson). The HTTP half checks the same through a real server.
 */
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { roundedNumberPath } from '../src/http/json-source.js';
import {
  exactAmountValue,
  exactJson,
  formatMicros,
  mayRoundInJson,
  microsToDecimal,
  parseAmount,
} from '../actors/fixed.js';
import { memberSource } from '../src/http/json-source.js';
import { call, startServerProcess, type ServerProcess } from './support/server-process.js';

/** What the client wrote, as parseAmount receives it from the front end. */
function amountOfBody(text: string) {
  const body = JSON.parse(text) as { amount: unknown };
  return parseAmount(body.amount, mayRoundInJson(text) ? memberSource(text, 'amount') : undefined);
}

describe('reading amounts exactly', () => {
  it.each([
    ['123456789012.345678', 123_456_789_012_345_678n],
    ['123456789.345678', 123_456_789_345_678n],
    ['999999999999.999999', 999_999_999_999_999_999n],
    ['1000000000000', 1_000_000_000_000_000_000n],
    ['1000000000000.000001', 'too_large'],
    ['1.0000000000000000000001', 'too_many_decimals'],
    ['1.000000000000000000000', 1_000_000n],
    ['0.0000000000000000001', 'too_many_decimals'],
    ['12345678901.2345678', 'too_many_decimals'],
    ['1234567890.12345E+2', 123_456_789_012_345_000n],
    ['5', 5_000_000n],
  ])('%s → %s', (literal, expected) => {
    const parsed = amountOfBody(`{"customerId":"c","amount":${literal}}`);
    expect(parsed).toEqual(
      typeof expected === 'bigint'
        ? { ok: true, micros: expected }
        : { ok: false, reason: expected },
    );
  });

  it('an amount written with more digits than a double holds is never silently rounded', () => {
    // 17 significant digits: a double cannot tell these apart, the literal can.
    expect(amountOfBody('{"amount":99999999999.999999,"customerId":"c"}')).toEqual({
      ok: true,
      micros: 99_999_999_999_999_999n,
    });
    expect(amountOfBody('{"amount":99999999999.999998,"customerId":"c"}')).toEqual({
      ok: true,
      micros: 99_999_999_999_999_998n,
    });
  });

  it(
    'finds the member JSON.parse keeps: the last one, names decoded, nesting and strings ' +
      'skipped',
    () => {
      const text =
        ' { "amount" : 1 , "x" : {"amount": 2, "s": "}\\"{"}, "am\\u006funt":\t3.50 ' +
        ',"y":[1,{"amount":4}] } ';
      expect(memberSource(text, 'amount')).toBe('3.50');
      expect(memberSource('{"a":[[]],"b":"]","amount":-0.5e-3}', 'amount')).toBe('-0.5e-3');
      expect(memberSource('{"a":1}', 'amount')).toBeUndefined();
      expect(memberSource('[1]', 'amount')).toBeUndefined();
      expect(memberSource('{}', 'amount')).toBeUndefined();
    },
  );

  it('property: memberSource finds the text of any top-level member of any JSON object', () => {
    fc.assert(
      fc.property(
        fc.dictionary(fc.string(), fc.jsonValue()),
        fc.double({ noNaN: true, noDefaultInfinity: true }),
        fc.boolean(),
        (obj, amount, spaced) => {
          const doc = { ...obj, amount };
          const text = spaced ? JSON.stringify(doc, null, 2) : JSON.stringify(doc);
          expect(memberSource(text, 'amount')).toBe(JSON.stringify(amount));
        },
      ),
      { numRuns: 300 },
    );
  });

  it('only text with 16 digits in a row takes the exact path', () => {
    expect(mayRoundInJson('{"customerId":"c","amount":123456789.123456}')).toBe(false);
    expect(mayRoundInJson('{"customerId":"c","amount":1234567890.123456}')).toBe(true);
    expect(mayRoundInJson('{"amount":1.0000000000000000000001}')).toBe(true);
  });
});

describe('writing amounts exactly', () => {
  it.each([
    [0n, '0'],
    [1n, '0.000001'],
    [1_500_000n, '1.5'],
    [999_999_999_999_999n, '999999999.999999'],
    [1_000_000_000_000_000n, '1000000000'],
    [123_456_789_012_345_678n, '123456789012.345678'],
    [25_000_000_000_000_000_005n, '25000000000000.000005'],
    [-3_000_001n, '-3.000001'],
  ])('%s micro-units → %s', (micros, text) => {
    expect(microsToDecimal(micros)).toBe(text);
    expect(exactJson(JSON.stringify({ balance: formatMicros(micros), resets: null }))).toBe(
      `{"balance":${text},"resets":null}`,
    );
  });

  it('property: any total renders as its exact decimal, small ones as plain numbers', () => {
    fc.assert(
      fc.property(fc.bigInt({ min: -(10n ** 25n), max: 10n ** 25n }), (micros) => {
        const rendered = exactJson(JSON.stringify([formatMicros(micros)]));
        expect(rendered).toBe(`[${microsToDecimal(micros)}]`);
        if (micros < 10n ** 15n && micros > -(10n ** 15n))
          expect(typeof formatMicros(micros)).toBe('number');
      }),
      { numRuns: 500 },
    );
  });

  it(
    'property: whole units below 10^15 are plain numbers that print exactly; larger ones ' +
      'are marked',
    () => {
      fc.assert(
        fc.property(fc.bigInt({ min: -(10n ** 16n), max: 10n ** 16n }), (units) => {
          const micros = units * 1_000_000n;
          const value = formatMicros(micros);
          const small = units < 10n ** 15n && units > -(10n ** 15n);
          expect(typeof value).toBe(small ? 'number' : 'string');
          expect(exactJson(JSON.stringify([value]))).toBe(`[${units}]`);
        }),
        { numRuns: 1000 },
      );
      expect(formatMicros(999_999_999_999_999_000_000n)).toBe(999_999_999_999_999);
      expect(formatMicros(1_000_000_000_000_000_000_000n)).not.toBe(1e15);
    },
  );

  it(
    'property: marks are found beside any client text, escapes included (the backslash ' +
      'pre-check)',
    () => {
      fc.assert(
        fc.property(
          fc.string(),
          fc.constantFrom('', '\\', '"', '\n', '\\udfff1'),
          fc.bigInt({ min: -(10n ** 25n), max: 10n ** 25n }),
          (text, extra, micros) => {
            const name = text + extra;
            expect(exactJson(JSON.stringify({ name, balance: formatMicros(micros) }))).toBe(
              `{"name":${JSON.stringify(name)},"balance":${microsToDecimal(micros)}}`,
            );
          },
        ),
        { numRuns: 500 },
      );
    },
  );

  it('leaves strings that only look like a mark alone', () => {
    const json = JSON.stringify({ name: '\\udfff12', other: 'udfff3' });
    expect(exactJson(json)).toBe(json);
  });

  it('stored records get a number while a double is exact, else the decimal text', () => {
    expect(exactAmountValue(2_500_000n)).toBe(2.5);
    expect(exactAmountValue(123_456_789_012_345_678n)).toBe('123456789012.345678');
    expect(exactAmountValue(1_000_000_000_000_000n)).toBe(1_000_000_000);
  });
});

describe('numbers JSON.parse did not keep exactly', () => {
  it.each([
    ['{"a":1}', null],
    ['{"a":99999999999.999999}', 'a'],
    ['{"entitlements":{"t":{"included":99999999999.999999}}}', 'entitlements.t.included'],
    ['{"x":[1,2,12345678901234567890]}', 'x.2'],
    ['{"a":100000000000.0000}', null],
    ['{"a":1.0000000000000000000001}', 'a'],
    ['{"s":"99999999999.999999"}', null],
    ['{"a":-12345678901234567}', 'a'],
    ['{"a":9007199254740993}', 'a'],
    ['{"a":9007199254740992}', null],
    ['{"a":0.0000000000000000}', null],
    ['{"a":1.2345678901234567e300}', null],
    ['{"a":1.23456789012345678901e300}', 'a'],
    ['{"k\\"ey":{"x y":12345678901234567}}', 'k"ey.x y'],
    [' [ {"a" : 1} , { "b" : [ 12345678901234567 ] } ] ', '1.b.0'],
  ])('%s → %s', (text, path) => {
    JSON.parse(text); // the walker only ever sees text JSON.parse accepted
    expect(roundedNumberPath(text)).toBe(path);
  });

  it('property: whatever JSON.stringify writes comes back unchanged', () => {
    fc.assert(
      fc.property(fc.jsonValue(), (value) => {
        expect(roundedNumberPath(JSON.stringify(value) ?? 'null')).toBeNull();
      }),
      { numRuns: 500 },
    );
  });
});

describe('exact amounts over HTTP', () => {
  let server: ServerProcess;
  let sk: string;
  const config = {
    entitlements: { tokens: { type: 'meter', reset: 'never' } },
    products: {
      free: {
        default: true,
        entitlements: { tokens: { included: 10, overage: { unitAmount: 1 } } },
      },
    },
  };

  beforeAll(async () => {
    server = await startServerProcess({ config });
    sk = server.keys.test.server;
    expect(
      (
        await call(server.base, 'POST', '/v1/usage/tokens/settings', {
          key: sk,
          body: { customerId: 'x', overageEnabled: true },
        })
      ).status,
    ).toBe(200);
  });
  afterAll(async () => {
    await server?.stop();
  });

  /**
   * POSTs raw JSON and returns the status and the reply's text (not parsed: a double would round
   * it).
   */
  async function raw(
    path: string,
    text: string,
    method = 'POST',
  ): Promise<{ status: number; text: string }> {
    const res = await fetch(server.base + path, {
      method,
      headers: { 'x-tally-key': sk, 'content-type': 'application/json' },
      body: text,
    });
    return { status: res.status, text: await res.text() };
  }

  it(
    'refuses, naming the field, a stored number JSON.parse would have changed; stores one ' +
      'it keeps',
    async () => {
      const refused = (path: string) => ({
        status: 400,
        text: JSON.stringify({
          error:
            `${path} cannot be stored exactly: a JSON number keeps at most 15 significant ` +
            `digits`,
          code: 'invalid_request',
        }),
      });
      const contract = (included: string) =>
        `{"priceAmount":100,"priceInterval":"month","entitlements":{"tokens":{"included":` +
        `${included}}}}`;
      expect(await raw('/v1/contracts/lit', contract('99999999999.999999'), 'PUT')).toEqual(
        refused('entitlements.tokens.included'),
      );
      expect(await raw('/v1/contracts/lit', contract('1.0000000000000000000001'), 'PUT')).toEqual(
        refused('entitlements.tokens.included'),
      );
      expect(
        await raw(
          '/v1/contracts/lit',
          '{"priceAmount":5.0000000000000001,"priceInterval":"month"}',
          'PUT',
        ),
      ).toEqual(refused('priceAmount'));
      expect((await call(server.base, 'GET', '/v1/contracts/lit', { key: sk })).status).toBe(404);
      expect(
        await raw('/v1/customers', '{"id":"lit","metadata":{"order":12345678901234567890}}'),
      ).toEqual(refused('metadata.order'));
      expect(
        await raw('/v1/context', '{"customer":{"id":"lit","metadata":{"n":12345678901234567890}}}'),
      ).toEqual(refused('customer.metadata.n'));
      expect((await call(server.base, 'GET', '/v1/customers/lit', { key: sk })).status).toBe(404);
      const pushed =
        `{"entitlements":{"tokens":{"type":"meter","reset":"never"}},` +
        `"products":{"free":{"default":true,` +
        `"entitlements":{"tokens":{"included":99999999999.999999}}}}}`;
      expect(await raw('/v1/sync/push', pushed)).toEqual(
        refused('products.free.entitlements.tokens.included'),
      );
      expect((await call(server.base, 'GET', '/v1/sync/pull', { key: sk })).body.version).toBe(1);
      // Sixteen digits a double holds exactly are fine.
      expect((await raw('/v1/contracts/lit', contract('100000000000.0000'), 'PUT')).status).toBe(
        200,
      );
      expect(
        (await call(server.base, 'GET', '/v1/usage/tokens/balance?customerId=lit', { key: sk }))
          .body,
      ).toMatchObject({ included: 100_000_000_000 });
    },
  );

  it(
    'records and answers an amount of 17 significant digits exactly, ' + 'and refunds it exactly',
    async () => {
      const consumed = await raw(
        '/v1/usage/tokens/consume',
        '{"customerId":"x","amount":99999999999.999999}',
      );
      expect(consumed.status).toBe(200);
      expect(consumed.text).toContain('"consumed":99999999999.999999,');
      expect(consumed.text).toContain('"overage":99999999989.999999,');
      const again = await raw('/v1/usage/tokens/consume', '{"customerId":"x","amount":0.000001}');
      expect(again.text).toContain('"consumed":100000000000,');
      const refunded = await raw(
        '/v1/usage/tokens/refund',
        '{"customerId":"x","amount":99999999999.999998}',
      );
      expect(refunded.status).toBe(200);
      expect(refunded.text).toContain('"consumed":0.000002,');
      const audit = await call(server.base, 'GET', '/v1/audit?action=usage.refund', { key: sk });
      expect(audit.body.data[0].data.amount).toBe('99999999999.999998');
    },
  );

  it(
    'refuses digits a double would have dropped: too many decimals, or just over the ' +
      'largest amount',
    async () => {
      expect(
        await raw(
          '/v1/usage/tokens/consume',
          '{"customerId":"x","amount":1.0000000000000000000001}',
        ),
      ).toMatchObject({ status: 400, text: expect.stringContaining('at most 6 decimal places') });
      expect(
        await raw('/v1/usage/tokens/consume', '{"customerId":"x","amount":1000000000000.000001}'),
      ).toMatchObject({ status: 400, text: expect.stringContaining('at most 1000000000000') });
    },
  );
});
