/**
 * The error table of docs/api.md and the error catalog (src/errors.ts) must say the same thing:
 * every catalog entry has a row with its status and message, and every row is an entry.
 */
import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ERRORS, errorBody, errorMessage } from '../src/errors.js';

const apiDoc = fs.readFileSync(new URL('../docs/api.md', import.meta.url), 'utf8');
const rows = new Map<string, { status: number; message: string }>();
for (const line of apiDoc.split('\n')) {
  const match = /^\| `([a-z_]+)` \| (\d{3}) \| (.*?) \| .* \|$/.exec(line);
  if (match) rows.set(match[1] as string, { status: Number(match[2]), message: match[3] as string });
}

describe('error catalog', () => {
  it('the docs/api.md table lists exactly the catalog', () => {
    expect([...rows.keys()].sort()).toEqual(Object.keys(ERRORS).sort());
    for (const [code, entry] of Object.entries(ERRORS)) {
      expect(rows.get(code), code).toEqual({ status: entry.status, message: entry.message });
    }
  });

  it('fills placeholders and keeps unknown ones visible', () => {
    expect(errorMessage('entitlement_not_found', { key: 'sso' })).toBe('entitlement sso not found');
    expect(errorMessage('entitlement_not_found')).toBe('entitlement {key} not found');
  });

  it('bodies are {"error"} plus optional extra fields', () => {
    expect(JSON.parse(errorBody('insufficient_balance', { key: 'm' }, { balance: 1 }))).toEqual({ error: 'insufficient balance for m', balance: 1 });
  });

  it('only 500 is a server error, and nothing a client sends maps to it', () => {
    const serverErrors = Object.entries(ERRORS).filter(([, e]) => e.status >= 500 && e.status !== 503);
    expect(serverErrors.map(([code]) => code)).toEqual(['internal']);
  });
});
