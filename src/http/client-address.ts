/**
 * The client address a client-key request's per-address rate limit is kept under.
 *
 * By default it is the connection's peer, as the socket reports it. Behind a reverse
 * proxy every connection comes from the proxy, so the operator names the header the
 * proxy writes the client's address into (TALLY_CLIENT_ADDRESS_HEADER). Only that
 * proxy's word is trusted: of `x-forwarded-for` the last entry is taken, the one the
 * proxy itself appended (earlier entries are whatever the client sent); of any other
 * header the whole value. A request without the header, or with one that is not an
 * address, falls back to the socket's peer.
 *
 * An IPv6 client is kept under its /64 prefix, the block one subscriber is given: a
 * per-address budget keyed by the full address would let one host take a fresh budget
 * with every one of its 2^64 addresses. An IPv4 address (also IPv4-mapped IPv6) is kept
 * as a number, so the common case builds no string.
 */
import { isIPv4, isIPv6 } from 'node:net';
import type { HttpRequest, HttpResponse } from 'uWebSockets.js';

/** An IPv4 address as an unsigned 32-bit number, or an IPv6 /64 prefix as 16 hex digits. */
export type AddressKey = number | string;

/** The key of the socket's peer (uWS reports 4 or 16 bytes). */
export function socketAddressKey(res: HttpResponse): AddressKey {
  return addressKeyOfBytes(new Uint8Array(res.getRemoteAddress()));
}

export function addressKeyOfBytes(bytes: Uint8Array): AddressKey {
  if (bytes.length === 4) return ipv4Number(bytes, 0);
  if (bytes.length !== 16) return 0;
  let mapped = bytes[10] === 0xff && bytes[11] === 0xff;
  for (let i = 0; mapped && i < 10; i++) mapped = bytes[i] === 0;
  if (mapped) return ipv4Number(bytes, 12);
  let prefix = '';
  for (let i = 0; i < 8; i++) prefix += (bytes[i] as number).toString(16).padStart(2, '0');
  return prefix;
}

function ipv4Number(bytes: Uint8Array, at: number): number {
  return (
    (((bytes[at] as number) << 24) |
      ((bytes[at + 1] as number) << 16) |
      ((bytes[at + 2] as number) << 8) |
      (bytes[at + 3] as number)) >>>
    0
  );
}

/**
 * The key of an address written as text (a proxy header's), or null when it is not an
 * IPv4 or IPv6 address.
 */
export function addressKeyOfText(text: string): AddressKey | null {
  if (isIPv4(text)) return ipv4Number(Uint8Array.from(text.split('.'), Number), 0);
  if (!isIPv6(text)) return null;
  return addressKeyOfBytes(ipv6Bytes(text));
}

/** The 16 bytes of a valid IPv6 address (`::`, and a dotted IPv4 tail, included). */
function ipv6Bytes(text: string): Uint8Array {
  let groups: string[];
  const tail = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  let body = text;
  if (tail !== null) {
    const [a, b, c, d] = (tail[1] as string).split('.').map(Number) as [
      number,
      number,
      number,
      number,
    ];
    const high = ((a << 8) | b).toString(16);
    const low = ((c << 8) | d).toString(16);
    body = `${text.slice(0, tail.index)}${high}:${low}`;
  }
  const gap = body.indexOf('::');
  if (gap === -1) groups = body.split(':');
  else {
    const head = body
      .slice(0, gap)
      .split(':')
      .filter((g) => g !== '');
    const rest = body
      .slice(gap + 2)
      .split(':')
      .filter((g) => g !== '');
    groups = [...head, ...Array<string>(8 - head.length - rest.length).fill('0'), ...rest];
  }
  const bytes = new Uint8Array(16);
  groups.forEach((group, i) => {
    const value = Number.parseInt(group, 16);
    bytes[i * 2] = value >> 8;
    bytes[i * 2 + 1] = value & 0xff;
  });
  return bytes;
}

/**
 * Where client addresses come from: the socket, or (behind a proxy) a header the proxy
 * writes. `header` is the header's name in lower case, or null for the socket.
 */
export class ClientAddresses {
  private readonly lastEntry: boolean;

  constructor(private readonly header: string | null) {
    this.lastEntry = header === 'x-forwarded-for';
  }

  /** The address key of the request being handled (read synchronously, in its handler). */
  of(res: HttpResponse, req: HttpRequest): AddressKey {
    if (this.header === null) return socketAddressKey(res);
    let value = req.getHeader(this.header);
    if (this.lastEntry) value = value.slice(value.lastIndexOf(',') + 1);
    return addressKeyOfText(value.trim()) ?? socketAddressKey(res);
  }
}
