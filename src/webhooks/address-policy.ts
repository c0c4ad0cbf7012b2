/**
 * Which addresses a webhook delivery may connect to: the server-side request forgery guard.
 *
 * A live endpoint may reach public addresses only: never loopback, private (RFC 1918, IPv6
 * unique local), link-local (which holds the cloud metadata address 169.254.169.254),
 * carrier-grade NAT (which holds another provider's metadata address, 100.100.100.200),
 * multicast, reserved or documentation ranges, IPv4 or IPv6, including IPv4 written inside
 * IPv6 (mapped, NAT64). A test endpoint may also reach loopback, for local development. Hosts
 * the operator names in TALLY_WEBHOOK_ALLOWED_HOSTS may reach any address.
 *
 * Names are checked twice: every address a name resolves to when the endpoint is registered,
 * and at every delivery the address actually connected to (the connection's own resolution
 * goes through `guardedLookup`, and the socket's remote address is checked once connected),
 * so a name that resolves to a public address at registration and to an internal one later
 * (DNS rebinding) is refused at delivery.
 */
import { lookup } from 'node:dns/promises';
import { BlockList, isIP } from 'node:net';
import type { Environment } from '../../shared/environment.js';

function blockList(ranges: ReadonlyArray<readonly [string, number]>, type: 'ipv4' | 'ipv6') {
  const list = new BlockList();
  for (const [network, prefix] of ranges) list.addSubnet(network, prefix, type);
  return list;
}

const LOOPBACK_V4 = blockList([['127.0.0.0', 8]], 'ipv4');

/** IPv4 ranges that are not public unicast. */
const NOT_PUBLIC_V4 = blockList(
  [
    ['0.0.0.0', 8], // "this network"
    ['10.0.0.0', 8], // private
    ['100.64.0.0', 10], // carrier-grade NAT
    ['127.0.0.0', 8], // loopback
    ['169.254.0.0', 16], // link-local, cloud metadata
    ['172.16.0.0', 12], // private
    ['192.0.0.0', 24], // IETF protocol assignments
    ['192.0.2.0', 24], // documentation
    ['192.88.99.0', 24], // 6to4 relay
    ['192.168.0.0', 16], // private
    ['198.18.0.0', 15], // benchmarking
    ['198.51.100.0', 24], // documentation
    ['203.0.113.0', 24], // documentation
    ['224.0.0.0', 4], // multicast
    ['240.0.0.0', 4], // reserved, broadcast
  ],
  'ipv4',
);

/** IPv6 ranges that are not public unicast (IPv4 inside IPv6 is unwrapped first). */
const NOT_PUBLIC_V6 = blockList(
  [
    ['::', 128], // unspecified
    ['::1', 128], // loopback
    ['100::', 64], // discard
    ['2001::', 23], // IETF protocol assignments (Teredo, ORCHID, …)
    ['2001:db8::', 32], // documentation
    ['2002::', 16], // 6to4 (embeds any IPv4)
    ['fc00::', 7], // unique local (holds fd00:ec2::254, a metadata address)
    ['fe80::', 10], // link-local
    ['fec0::', 10], // site-local (deprecated)
    ['ff00::', 8], // multicast
  ],
  'ipv6',
);

/** The IPv4 address inside an IPv4-mapped (::ffff:a.b.c.d) or NAT64 (64:ff9b::) address. */
function embeddedV4(address: string): string | null {
  const lower = address.toLowerCase();
  const dotted = /^(?:::ffff:|64:ff9b::)(\d+\.\d+\.\d+\.\d+)$/.exec(lower);
  if (dotted?.[1] !== undefined) return dotted[1];
  const hex = /^(?:::ffff:|64:ff9b::)([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(lower);
  if (hex?.[1] === undefined || hex[2] === undefined) return null;
  const high = Number.parseInt(hex[1], 16);
  const low = Number.parseInt(hex[2], 16);
  return [high >> 8, high & 255, low >> 8, low & 255].join('.');
}

/** Whether `address` (an IP literal) is a public unicast address. */
export function isPublicAddress(address: string): boolean {
  const family = isIP(address);
  if (family === 4) return !NOT_PUBLIC_V4.check(address, 'ipv4');
  if (family !== 6) return false;
  const v4 = embeddedV4(address);
  if (v4 !== null) return isPublicAddress(v4);
  return !NOT_PUBLIC_V6.check(address, 'ipv6');
}

function isLoopback(address: string): boolean {
  const family = isIP(address);
  if (family === 4) return LOOPBACK_V4.check(address, 'ipv4');
  const v4 = family === 6 ? embeddedV4(address) : null;
  if (v4 !== null) return isLoopback(v4);
  return family === 6 && (address === '::1' || address === '0:0:0:0:0:0:0:1');
}

export interface AddressPolicyOptions {
  /** Host names (lower case) that may reach any address (TALLY_WEBHOOK_ALLOWED_HOSTS). */
  readonly allowedHosts: ReadonlySet<string>;
  /** Fixed answers for names, like a hosts file (TALLY_WEBHOOK_RESOLVE: `name=ip,…`). */
  readonly pinned: ReadonlyMap<string, string>;
}

export const OPEN_POLICY_OPTIONS: AddressPolicyOptions = {
  allowedHosts: new Set(),
  pinned: new Map(),
};

/** The rules for one environment's endpoints, and the resolver deliveries connect through. */
export class AddressPolicy {
  constructor(private readonly options: AddressPolicyOptions = OPEN_POLICY_OPTIONS) {}

  /** Why connecting to `address` for `host` is refused, or null when it is allowed. */
  refusal(environment: Environment, host: string, address: string): string | null {
    if (this.options.allowedHosts.has(host.toLowerCase())) return null;
    if (isPublicAddress(address)) return null;
    if (environment === 'test' && isLoopback(address)) return null;
    return `${host} resolves to ${address}, which is not a public address`;
  }

  /** Every address `host` resolves to (an IP literal is its own). Rejects when it does not. */
  async resolve(host: string): Promise<Array<{ address: string; family: number }>> {
    const bare = host.startsWith('[') ? host.slice(1, -1) : host;
    const family = isIP(bare);
    if (family !== 0) return [{ address: bare, family }];
    const pinned = this.options.pinned.get(bare.toLowerCase());
    if (pinned !== undefined) return [{ address: pinned, family: isIP(pinned) }];
    return lookup(bare, { all: true, verbatim: true });
  }

  /**
   * Why an endpoint on `host` is refused at registration (a name that does not resolve, or
   * any address it resolves to being refused), or null when it is allowed.
   */
  async checkHost(environment: Environment, host: string): Promise<string | null> {
    let addresses: Array<{ address: string }>;
    try {
      addresses = await this.resolve(host);
    } catch {
      return `${host} does not resolve`;
    }
    if (addresses.length === 0) return `${host} does not resolve`;
    for (const { address } of addresses) {
      const refused = this.refusal(environment, host, address);
      if (refused !== null) return refused;
    }
    return null;
  }

  /**
   * A `lookup` for `http.request` that resolves through `resolve` and hands the connection
   * only an allowed address (the first one); refuses with an error naming the address.
   */
  guardedLookup(environment: Environment) {
    return (
      hostname: string,
      options: { all?: boolean },
      callback: (error: Error | null, address: unknown, family?: number) => void,
    ): void => {
      this.resolve(hostname).then(
        (addresses) => {
          const first = addresses[0];
          if (first === undefined) return callback(new Error(`${hostname} does not resolve`), '');
          const refused = this.refusal(environment, hostname, first.address);
          if (refused !== null) return callback(new Error(refused), '');
          // Node asks for every address when it may try several families (`all`).
          if (options.all === true) return callback(null, [first]);
          callback(null, first.address, first.family);
        },
        (error: unknown) => callback(error as Error, ''),
      );
    };
  }
}

/** The policy options from the environment variables an operator sets. Throws on a bad one. */
export function policyOptionsFromEnv(env: NodeJS.ProcessEnv): AddressPolicyOptions {
  const allowedHosts = new Set(
    (env['TALLY_WEBHOOK_ALLOWED_HOSTS'] ?? '')
      .split(',')
      .map((host) => host.trim().toLowerCase())
      .filter((host) => host !== ''),
  );
  const pinned = new Map<string, string>();
  for (const entry of (env['TALLY_WEBHOOK_RESOLVE'] ?? '').split(',')) {
    if (entry.trim() === '') continue;
    const [name, address] = entry.split('=').map((part) => part.trim());
    if (name === undefined || address === undefined || isIP(address) === 0)
      throw new Error(`TALLY_WEBHOOK_RESOLVE: ${JSON.stringify(entry)} is not name=ip`);
    pinned.set(name.toLowerCase(), address);
  }
  return { allowedHosts, pinned };
}
