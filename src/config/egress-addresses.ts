/**
 * config/egress-addresses — the `local.egressAddresses` setting (docs/providers/local.md, "Many
 * egress IPs"): the rules a list or a `{cidr, count}` block must follow, the addresses it names
 * in canonical text form, and the one check that needs the machine: which of them this host
 * cannot bind, so such a config fails at load time naming them instead of at the first create.
 */
import net from 'node:net';
import { cidrProblem, formatAddress, ipToBigInt } from './egress.ts';
import type { LocalEgressAddresses } from './schema.ts';

/** More addresses than this is a typo (a /64 has 2^64); a process cannot hold that many listeners. */
export const MAX_EGRESS_ADDRESSES = 65_536;

/** One problem: the field below `local.egressAddresses` ('' for the block itself) and the sentence. */
export interface EgressAddressProblem {
  field: string;
  message: string;
}

const q = (s: string) => JSON.stringify(s);

/** `a.b.c.d` / IPv6 text in the one form status and the lease store compare (RFC 5952). */
export function canonicalIp(address: string): string | undefined {
  if (net.isIP(address) === 0) return undefined;
  const ip = ipToBigInt(address);
  return ip ? formatAddress(ip.family, ip.value) : undefined;
}

/**
 * The addresses of a block that can be hosts: a network's first address (the network itself,
 * IPv6's subnet-router anycast) is never used, nor IPv4's broadcast address; /31, /32, /127
 * and /128 use every address they have (point-to-point links and single hosts).
 */
function usableRange(cidr: string): { family: 4 | 6; first: bigint; size: bigint } {
  const [addr = '', bitsText = ''] = cidr.split('/');
  const ip = ipToBigInt(addr) as { family: 4 | 6; value: bigint };
  const width = ip.family === 4 ? 32 : 128;
  const bits = Number(bitsText);
  const total = 1n << BigInt(width - bits);
  const skipFirst = bits < width - 1 ? 1n : 0n;
  const skipLast = ip.family === 4 && bits < 31 ? 1n : 0n;
  return { family: ip.family, first: ip.value + skipFirst, size: total - skipFirst - skipLast };
}

/** Every rule a schema cannot state; an empty list when the setting is usable. */
export function egressAddressProblems(spec: LocalEgressAddresses): EgressAddressProblem[] {
  const out: EgressAddressProblem[] = [];
  if (Array.isArray(spec)) {
    if (spec.length === 0) {
      out.push({ field: '', message: 'names no address; leave it out to let the system choose' });
    }
    if (spec.length > MAX_EGRESS_ADDRESSES) {
      out.push({ field: '', message: `names ${spec.length} addresses; at most ${MAX_EGRESS_ADDRESSES}` });
    }
    const seen = new Map<string, number>();
    spec.forEach((a, i) => {
      const c = canonicalIp(a);
      if (c === undefined) {
        out.push({ field: `[${i}]`, message: `${q(a)} must be an IP address such as 203.0.113.10` });
      } else if (c === '0.0.0.0' || c === '::') {
        out.push({ field: `[${i}]`, message: `${q(a)} is the unspecified address; name a real one` });
      } else if (seen.has(c)) {
        out.push({ field: `[${i}]`, message: `${q(a)} is listed twice (also [${seen.get(c)}])` });
      } else seen.set(c, i);
    });
    return out;
  }
  const problem = cidrProblem(spec.cidr);
  if (problem) return [{ field: '.cidr', message: `${q(spec.cidr)} ${problem}` }];
  if (spec.count < 1) out.push({ field: '.count', message: `${spec.count} must be at least 1` });
  if (spec.count > MAX_EGRESS_ADDRESSES) {
    out.push({ field: '.count', message: `${spec.count} is more than ${MAX_EGRESS_ADDRESSES}` });
  }
  const { size } = usableRange(spec.cidr);
  if (BigInt(spec.count) > size) {
    out.push({
      field: '.count',
      message: `${spec.count} is more than the ${size} usable addresses of ${spec.cidr}`,
    });
  }
  return out;
}

/**
 * The addresses the setting names, canonical, in order: the list as written, or the first
 * `count` usable addresses of the block. Call only on a setting without problems.
 */
export function expandEgressAddresses(spec: LocalEgressAddresses): string[] {
  if (Array.isArray(spec)) return spec.map((a) => canonicalIp(a) as string);
  const { family, first } = usableRange(spec.cidr);
  return Array.from({ length: spec.count }, (_, i) => formatAddress(family, first + BigInt(i)));
}

/** An address this host refused, with the system's reason (EADDRNOTAVAIL and friends). */
export interface Unbindable {
  address: string;
  code: string;
}

/** Binds a TCP socket to `address` on a free port and lets go; the error code when that fails. */
export function bindProblem(address: string): Promise<string | undefined> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'EUNKNOWN'));
    srv.listen({ host: address, port: 0, exclusive: true }, () => srv.close(() => resolve(undefined)));
  });
}

/** The addresses among `addresses` this host cannot bind, checked a few hundred at a time. */
export async function unbindableAddresses(addresses: readonly string[]): Promise<Unbindable[]> {
  const out: Unbindable[] = [];
  const batch = 256;
  for (let i = 0; i < addresses.length; i += batch) {
    const part = addresses.slice(i, i + batch);
    const codes = await Promise.all(part.map(bindProblem));
    codes.forEach((code, j) => {
      if (code !== undefined) out.push({ address: part[j] as string, code });
    });
  }
  return out;
}
