import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { asciiBytes, jsonWithRateLimitValue, RATE_LIMIT_HEADER_NAME, rateLimitHeaderValue } from '../src/http/rate-limit-header.js';

const text = (bytes: Uint8Array): string => Buffer.from(bytes).toString('latin1');
/** What uWS puts on the wire for one writeHeader(name, value) call. */
const wire = (value: Uint8Array): string => `${RATE_LIMIT_HEADER_NAME}: ${text(value)}\r\n`;
const expected = (limit: number, remaining: number, reset: number): string =>
  `x-ratelimit-limit: ${limit}\r\nx-ratelimit-remaining: ${remaining}\r\nx-ratelimit-reset: ${reset}\r\n`;

describe('rateLimitHeaderValue', () => {
  it.each([
    [200, 0, 1_795_328_520],
    [200, 199, 1_795_328_520],
    [1000, 10, 60],
    [1_000_000_000, 999_999_999, 1_795_328_520],
    [1, Number.MAX_SAFE_INTEGER, 1],
  ])('limit %d, remaining %d, reset %d: three header lines, digits as String() writes them', (limit, remaining, reset) => {
    expect(wire(rateLimitHeaderValue(asciiBytes(String(limit)), remaining, asciiBytes(String(reset))))).toBe(expected(limit, remaining, reset));
  });

  it('matches String() for any values, call after call (the scratch buffer is reused)', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.maxSafeNat(), fc.maxSafeNat(), fc.maxSafeNat()), { minLength: 1, maxLength: 20 }), (calls) => {
        for (const [limit, remaining, reset] of calls) {
          expect(wire(rateLimitHeaderValue(asciiBytes(String(limit)), remaining, asciiBytes(String(reset))))).toBe(expected(limit, remaining, reset));
        }
      }),
    );
  });

  it.each([-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, Number.MAX_SAFE_INTEGER + 1])('refuses remaining %d', (remaining) => {
    expect(() => rateLimitHeaderValue(asciiBytes('1'), remaining, asciiBytes('1'))).toThrow(RangeError);
  });

  it('refuses a limit or reset longer than 16 digits', () => {
    expect(() => rateLimitHeaderValue(asciiBytes('1'.repeat(17)), 1, asciiBytes('1'))).toThrow(RangeError);
    expect(() => rateLimitHeaderValue(asciiBytes('1'), 1, asciiBytes('1'.repeat(17)))).toThrow(RangeError);
  });
});

describe('jsonWithRateLimitValue', () => {
  it('puts the content type and the three lines on the wire in one call, interleaved with the other value as the buffer is reused', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.boolean(), fc.maxSafeNat(), fc.maxSafeNat(), fc.maxSafeNat()), { minLength: 1, maxLength: 20 }), (calls) => {
        for (const [withJson, limit, remaining, reset] of calls) {
          if (!withJson) {
            expect(wire(rateLimitHeaderValue(asciiBytes(String(limit)), remaining, asciiBytes(String(reset))))).toBe(expected(limit, remaining, reset));
            continue;
          }
          const value = jsonWithRateLimitValue(asciiBytes(String(limit)), remaining, asciiBytes(String(reset)));
          expect(`content-type: ${text(value)}\r\n`).toBe(`content-type: application/json\r\n${expected(limit, remaining, reset)}`);
        }
      }),
    );
  });
});
