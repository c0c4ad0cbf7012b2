import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  jsonWithRateLimitValue,
  RATE_LIMIT_HEADER_NAME,
  rateLimitHeaderValue,
  rateLimitLines,
} from '../src/http/rate-limit-header.js';

const text = (bytes: Uint8Array): string => Buffer.from(bytes).toString('latin1');
/** What uWS puts on the wire for one writeHeader(name, value) call. */
const wire = (name: string, value: Uint8Array): string => `${name}: ${text(value)}\r\n`;
const expected = (limit: number, remaining: number, reset: number): string =>
  `x-ratelimit-limit: ${limit}\r\nx-ratelimit-reset: ${reset}\r\nx-ratelimit-remaining: ` +
  `${remaining}\r\n`;

describe('rateLimitHeaderValue', () => {
  it.each([
    [200, 0, 1_795_328_520],
    [200, 199, 1_795_328_520],
    [1000, 10, 60],
    [1_000_000_000, 999_999_999, 1_795_328_520],
    [1, Number.MAX_SAFE_INTEGER, 1],
    [Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER],
  ])(
    'limit %d, remaining %d, reset %d: three header lines, digits as String() writes them',
    (limit, remaining, reset) => {
      expect(
        wire(RATE_LIMIT_HEADER_NAME, rateLimitHeaderValue(rateLimitLines(limit, reset), remaining)),
      ).toBe(expected(limit, remaining, reset));
    },
  );

  it.each([-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, Number.MAX_SAFE_INTEGER + 1])(
    'refuses remaining %d',
    (remaining) => {
      expect(() => rateLimitHeaderValue(rateLimitLines(1, 1), remaining)).toThrow(RangeError);
    },
  );

  it.each([-1, 1.5, Number.MAX_SAFE_INTEGER + 1])('refuses a limit or reset of %d', (value) => {
    expect(() => rateLimitLines(value, 1)).toThrow(RangeError);
    expect(() => rateLimitLines(1, value)).toThrow(RangeError);
  });
});

describe('jsonWithRateLimitValue', () => {
  it(
    'puts the content type and the three lines on the wire in one call, whatever prefixes ' +
      'and forms the calls before used',
    () => {
      // The scratch buffer keeps the last prefix; a reused prefix, a new one of another length and
      // the two value forms must each still read back exactly.
      fc.assert(
        fc.property(
          fc.array(fc.tuple(fc.maxSafeNat(), fc.maxSafeNat()), { minLength: 1, maxLength: 4 }),
          fc.array(fc.tuple(fc.nat(), fc.boolean(), fc.maxSafeNat()), {
            minLength: 1,
            maxLength: 30,
          }),
          (windows, calls) => {
            const made = windows.map(([limit, reset]) => ({
              limit,
              reset,
              lines: rateLimitLines(limit, reset),
            }));
            for (const [which, withJson, remaining] of calls) {
              const { limit, reset, lines } = made[which % made.length] as (typeof made)[number];
              if (withJson) {
                expect(wire('content-type', jsonWithRateLimitValue(lines, remaining))).toBe(
                  `content-type: application/json\r\n${expected(limit, remaining, reset)}`,
                );
              } else {
                expect(wire(RATE_LIMIT_HEADER_NAME, rateLimitHeaderValue(lines, remaining))).toBe(
                  expected(limit, remaining, reset),
                );
              }
            }
          },
        ),
      );
    },
  );
});
