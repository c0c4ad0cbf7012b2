import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { decimalBytes } from '../src/http/decimal-bytes.js';

const text = (bytes: Uint8Array): string => Buffer.from(bytes).toString('latin1');

describe('decimalBytes', () => {
  it.each([0, 1, 9, 10, 199, 200, 999_999_999, 1_000_000_000, Number.MAX_SAFE_INTEGER])('writes %d as String() would', (n) => {
    expect(text(decimalBytes(n))).toBe(String(n));
  });

  it('matches String() for any non-negative safe integer, calls in a row', () => {
    fc.assert(
      fc.property(fc.array(fc.maxSafeNat(), { minLength: 1, maxLength: 20 }), (values) => {
        for (const n of values) expect(text(decimalBytes(n))).toBe(String(n));
      }),
    );
  });

  it.each([-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, Number.MAX_SAFE_INTEGER + 1])('refuses %d', (n) => {
    expect(() => decimalBytes(n)).toThrow(RangeError);
  });
});
