/**
 * The server-side request forgery guard: which addresses are public (a table over IPv4,
 * IPv6 and IPv4 inside IPv6), and the check at delivery time against the address actually
 * connected to, with a real receiver on loopback: a live endpoint whose name resolves to it,
 * or whose URL is the loopback address itself, never gets the request.
 */
import { describe, expect, it } from 'vitest';
import { AddressPolicy, isPublicAddress } from '../src/webhooks/address-policy.js';
import { endpointAgent, postEvent } from '../src/webhooks/post.js';
import { startReceiver } from './support/webhook-receiver.js';

describe('isPublicAddress', () => {
  it.each([
    ['93.184.216.34', true],
    ['8.8.8.8', true],
    ['2606:2800:220:1:248:1893:25c8:1946', true],
    ['127.0.0.1', false],
    ['127.255.0.9', false],
    ['10.0.0.1', false],
    ['172.16.5.4', false],
    ['172.32.0.1', true],
    ['192.168.1.1', false],
    ['169.254.169.254', false],
    ['100.64.0.1', false],
    ['100.100.100.200', false],
    ['0.0.0.0', false],
    ['224.0.0.1', false],
    ['255.255.255.255', false],
    ['198.18.0.1', false],
    ['::1', false],
    ['::', false],
    ['fe80::1', false],
    ['fc00::1', false],
    ['fd00:ec2::254', false],
    ['ff02::1', false],
    ['::ffff:127.0.0.1', false],
    ['::ffff:7f00:1', false],
    ['::ffff:169.254.169.254', false],
    ['::ffff:93.184.216.34', true],
    ['64:ff9b::a9fe:a9fe', false],
    ['2001:db8::1', false],
    ['not an address', false],
  ])('%s → %s', (address, expected) => {
    expect(isPublicAddress(address)).toBe(expected);
  });
});

describe('at delivery', () => {
  const attempt = (policy: AddressPolicy, environment: 'test' | 'live', url: string) =>
    postEvent({ url, environment, headers: {}, body: '{}', agent: endpointAgent(url, 1) }, policy);

  it('refuses a live endpoint whose name resolves to loopback: nothing reaches it', async () => {
    const receiver = await startReceiver();
    try {
      const policy = new AddressPolicy({
        allowedHosts: new Set(),
        pinned: new Map([['rebound.example', '127.0.0.1']]),
      });
      const url = `http://rebound.example:${receiver.port}/hooks`;
      const live = await attempt(policy, 'live', url);
      expect(live.status).toBeNull();
      expect(live.error).toContain('127.0.0.1, which is not a public address');
      const literal = await attempt(policy, 'live', `http://127.0.0.1:${receiver.port}/hooks`);
      expect(literal.status).toBeNull();
      expect(literal.error).toContain('not a public address');
      await new Promise((resolve) => setTimeout(resolve, 100));
      expect(receiver.received).toHaveLength(0);
      // The same name in the test environment, and an operator-allowed host, are delivered.
      expect((await attempt(policy, 'test', url)).status).toBe(200);
      const allowed = new AddressPolicy({
        allowedHosts: new Set(['rebound.example']),
        pinned: new Map([['rebound.example', '127.0.0.1']]),
      });
      expect((await attempt(allowed, 'live', url)).status).toBe(200);
      expect(receiver.received).toHaveLength(2);
    } finally {
      await receiver.close();
    }
  });

  it('does not follow a redirect, and reports a timeout-free refusal as an error', async () => {
    const receiver = await startReceiver();
    try {
      receiver.answer = () => 302;
      const policy = new AddressPolicy();
      const result = await attempt(policy, 'test', receiver.url);
      expect(result.status).toBe(302);
      expect(result.error).toContain('redirect');
      expect(receiver.received).toHaveLength(1);
    } finally {
      await receiver.close();
    }
    const closed = await attempt(new AddressPolicy(), 'test', 'http://127.0.0.1:9/hooks');
    expect(closed.status).toBeNull();
    expect(closed.error).toMatch(/ECONNREFUSED|connect/);
  });
});
