/**
 * config/egress — the egress policy every proxy we run applies (docs/operations.md, "Security
 * model"): the default deny list, the effective deny list once a provider's `allowCIDRs` and
 * `denyCIDRs` are applied, and the address matcher the local proxy checks resolved addresses
 * with. Squid gets the same effective list as `dst` ACLs, so both kinds of proxy decide alike.
 * IPv6 addresses that stand for an IPv4 one are decided by that IPv4 address: IPv4-mapped ones
 * here (canonicalAddress), NAT64 and 6to4 ones through their images in the effective list.
 */
import { isIP } from 'node:net';

/** The providers-config block (`<type>.egressPolicy`), every field optional. */
export interface EgressPolicyConfig {
  allowCIDRs?: string[];
  denyCIDRs?: string[];
  connectPorts?: number[];
}

/**
 * What a lease holder must never reach through a proxy: this host and its loopback services,
 * link-local (cloud metadata at 169.254.169.254), private and carrier-grade NAT ranges (the
 * cluster's Pods and Services, the VPC, the home LAN), and the unspecified addresses, which
 * Linux connects to loopback. Also the ranges no public site lives in and that reach something
 * local instead: IETF protocol assignments (192.0.0.0/24: DS-Lite and NAT64 translator
 * endpoints), multicast (224.0.0.0/4, ff00::/8), the reserved 240.0.0.0/4 with the broadcast
 * address, and the local-use NAT64 prefix (64:ff9b:1::/48, a translator of this network).
 * Documentation ranges (192.0.2.0/24, 2001:db8::/32 …) are not listed: they route nowhere.
 */
export const DEFAULT_DENY_RANGES: readonly { cidr: string; what: string }[] = [
  { cidr: '0.0.0.0/8', what: 'this network, which connects to this host' },
  { cidr: '10.0.0.0/8', what: 'private' },
  { cidr: '100.64.0.0/10', what: 'carrier-grade NAT' },
  { cidr: '127.0.0.0/8', what: 'loopback' },
  { cidr: '169.254.0.0/16', what: 'link-local, cloud metadata' },
  { cidr: '172.16.0.0/12', what: 'private' },
  { cidr: '192.0.0.0/24', what: 'IETF protocol assignments' },
  { cidr: '192.168.0.0/16', what: 'private' },
  { cidr: '224.0.0.0/4', what: 'multicast' },
  { cidr: '240.0.0.0/4', what: 'reserved' },
  { cidr: '::/128', what: 'unspecified' },
  { cidr: '::1/128', what: 'loopback' },
  { cidr: '64:ff9b:1::/48', what: 'local-use NAT64' },
  { cidr: 'fc00::/7', what: 'unique local' },
  { cidr: 'fe80::/10', what: 'link-local' },
  { cidr: 'ff00::/8', what: 'multicast' },
];

/** The default deny list as CIDRs (DEFAULT_DENY_RANGES without the descriptions). */
export const DEFAULT_DENY_CIDRS: readonly string[] = DEFAULT_DENY_RANGES.map((r) => r.cidr);

/**
 * IPv6 prefixes whose addresses carry an IPv4 address a translator or relay forwards to: the
 * well-known NAT64 prefix (RFC 6052: the IPv4 address in the last 32 bits) and 6to4 (RFC 3056:
 * in the 32 bits after 2002::/16). A denied IPv4 range is denied inside both too.
 */
const IPV4_EMBEDDING: readonly { name: string; prefix: bigint; shift: bigint }[] = [
  { name: 'NAT64', prefix: 0x64ff9bn << 96n, shift: 0n },
  { name: '6to4', prefix: 0x2002n << 112n, shift: 80n },
];
/** CONNECT tunnels go to HTTPS only unless a provider says otherwise. */
export const DEFAULT_CONNECT_PORTS: readonly number[] = [443];
/** Absolute-form `http://` requests may use port 80 and every CONNECT port. */
export const HTTP_PORT = 80;

/**
 * The operator's own listeners as seen from a proxy it runs elsewhere (a Pod, a VM): the
 * addresses it is reachable at and the ports it listens on. Squid denies (one of these
 * addresses AND one of these ports) before any other rule, whatever `allowCIDRs` opens; the
 * local proxies apply the same rule to this host (provider/local/egress).
 */
export interface OperatorEndpoints {
  /** IP addresses in canonical text form (canonicalAddressText), sorted, no duplicates. */
  addresses: string[];
  /** Discovery API, metrics, health probes, gateway; sorted, no duplicates. */
  ports: number[];
  /** The discovery API's port: `GET`/`HEAD /generate_204` there stays open (the public probe). */
  probePort?: number;
}

/** A policy with every default applied and the deny list resolved. */
export interface EgressPolicy {
  /** Effective deny list: (defaults − allowCIDRs) ∪ denyCIDRs, merged, in canonical CIDR form. */
  deniedCIDRs: string[];
  /** Sorted, without duplicates. */
  connectPorts: number[];
  /** Ports absolute-form http:// requests may use: 80 plus connectPorts. */
  httpPorts: number[];
}

interface Range {
  family: 4 | 6;
  start: bigint;
  end: bigint;
}

const BITS = { 4: 32n, 6: 128n } as const;

/** The address as an integer, or undefined when it is not an IP address. */
export function ipToBigInt(address: string): { family: 4 | 6; value: bigint } | undefined {
  // isIP accepts a zone index (fe80::1%eth0); it names an interface, not an address.
  const family = address.includes('%') ? 0 : isIP(address);
  if (family === 4) {
    const v = address.split('.').reduce((acc, o) => (acc << 8n) | BigInt(Number(o)), 0n);
    return { family: 4, value: v };
  }
  if (family !== 6) return undefined;
  let text = address;
  // A trailing dotted quad (::ffff:1.2.3.4) becomes two hex groups.
  const quad = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (quad?.[1]) {
    const v4 = ipToBigInt(quad[1])?.value ?? 0n;
    text = `${text.slice(0, -quad[1].length)}${(v4 >> 16n).toString(16)}:${(v4 & 0xffffn).toString(16)}`;
  }
  const [head = '', tail] = text.split('::');
  const h = head === '' ? [] : head.split(':');
  const t = tail === undefined || tail === '' ? [] : tail.split(':');
  const groups = tail === undefined ? h : [...h, ...Array(8 - h.length - t.length).fill('0'), ...t];
  return { family: 6, value: groups.reduce((acc, g) => (acc << 16n) | BigInt(`0x${g}`), 0n) };
}

/**
 * The address a socket would really reach: an IPv4-mapped IPv6 address (`::ffff:127.0.0.1`)
 * is the IPv4 address, so it is checked against the IPv4 ranges.
 */
export function canonicalAddress(address: string): { family: 4 | 6; value: bigint } | undefined {
  const ip = ipToBigInt(address);
  if (ip?.family === 6 && ip.value >> 32n === 0xffffn) return { family: 4, value: ip.value & 0xffffffffn };
  return ip;
}

/**
 * canonicalAddress as text: IPv4 dotted-decimal, IPv6 in RFC 5952 form without brackets;
 * undefined when `address` is not an IP address. The one spelling sites, egress checks and
 * dialled addresses use, so `::ffff:1.2.3.4` and `1.2.3.4` are one destination.
 */
export function canonicalAddressText(address: string): string | undefined {
  const ip = canonicalAddress(address);
  return ip && formatAddress(ip.family, ip.value);
}

/** Why `s` is not a usable CIDR range, or undefined when it is one. */
export function cidrProblem(s: string): string | undefined {
  const slash = s.indexOf('/');
  const addr = slash < 0 ? s : s.slice(0, slash);
  const ip = ipToBigInt(addr);
  if (!ip) return 'must be a CIDR range such as 10.0.0.0/8 or fd00::/8';
  if (slash < 0) return `needs a prefix length, e.g. ${addr}/${ip.family === 4 ? 32 : 128}`;
  const bitsText = s.slice(slash + 1);
  const max = Number(BITS[ip.family]);
  if (!/^\d{1,3}$/.test(bitsText) || Number(bitsText) > max) {
    return `has prefix length ${JSON.stringify(bitsText)}; it must be 0-${max} for IPv${ip.family}`;
  }
  const r = toRange(ip.family, ip.value, BigInt(bitsText));
  if (r.start !== ip.value) {
    return `has host bits set; the range it names is ${formatCidr(r.family, r.start, BigInt(bitsText))}`;
  }
  return undefined;
}

function toRange(family: 4 | 6, value: bigint, bits: bigint): Range {
  const size = 1n << (BITS[family] - bits);
  const start = value - (value % size);
  return { family, start, end: start + size - 1n };
}

/** Parses a CIDR that passed cidrProblem (callers validate first; a bad one throws). */
function parseCidr(s: string): Range {
  const problem = cidrProblem(s);
  if (problem) throw new Error(`${JSON.stringify(s)} ${problem}`);
  const [addr = '', bits = ''] = s.split('/');
  const ip = ipToBigInt(addr) as { family: 4 | 6; value: bigint };
  return toRange(ip.family, ip.value, BigInt(bits));
}

function merge(ranges: Range[]): Range[] {
  const sorted = [...ranges].sort((a, b) =>
    a.family !== b.family ? a.family - b.family : a.start < b.start ? -1 : a.start > b.start ? 1 : 0,
  );
  const out: Range[] = [];
  for (const r of sorted) {
    const last = out.at(-1);
    if (last && last.family === r.family && r.start <= last.end + 1n) {
      if (r.end > last.end) last.end = r.end;
    } else out.push({ ...r });
  }
  return out;
}

function subtract(ranges: Range[], hole: Range): Range[] {
  return ranges.flatMap((r) => {
    if (r.family !== hole.family || hole.end < r.start || hole.start > r.end) return [r];
    const parts: Range[] = [];
    if (hole.start > r.start) parts.push({ family: r.family, start: r.start, end: hole.start - 1n });
    if (hole.end < r.end) parts.push({ family: r.family, start: hole.end + 1n, end: r.end });
    return parts;
  });
}

/** Where the addresses of an IPv4 range appear inside each IPv4-embedding IPv6 prefix. */
function embeddedImages(r: Range): Range[] {
  if (r.family !== 4) return [];
  return IPV4_EMBEDDING.map(({ prefix, shift }) => ({
    family: 6 as const,
    start: prefix | (r.start << shift),
    end: prefix | (r.end << shift) | ((1n << shift) - 1n),
  }));
}

/** The fewest CIDR blocks covering exactly the range. */
function rangeToCidrs(r: Range): string[] {
  const out: string[] = [];
  const width = BITS[r.family];
  let start = r.start;
  while (start <= r.end) {
    let bits = width;
    // Grow the block while it stays aligned at `start` and inside the range.
    while (bits > 0n) {
      const size = 1n << (width - bits + 1n);
      if (start % size !== 0n || start + size - 1n > r.end) break;
      bits -= 1n;
    }
    out.push(formatCidr(r.family, start, bits));
    start += 1n << (width - bits);
  }
  return out;
}

function formatCidr(family: 4 | 6, value: bigint, bits: bigint): string {
  return `${formatAddress(family, value)}/${bits}`;
}

export function formatAddress(family: 4 | 6, value: bigint): string {
  if (family === 4) return [24n, 16n, 8n, 0n].map((s) => String((value >> s) & 0xffn)).join('.');
  const groups = [112n, 96n, 80n, 64n, 48n, 32n, 16n, 0n].map((s) => ((value >> s) & 0xffffn).toString(16));
  // Compress the longest run of zero groups (RFC 5952).
  let best = { at: -1, len: 0 };
  for (let i = 0; i < 8; ) {
    let j = i;
    while (j < 8 && groups[j] === '0') j++;
    if (j - i > best.len && j - i > 1) best = { at: i, len: j - i };
    i = j === i ? i + 1 : j;
  }
  if (best.at < 0) return groups.join(':');
  return `${groups.slice(0, best.at).join(':')}::${groups.slice(best.at + best.len).join(':')}`;
}

/**
 * Applies the defaults: `allowCIDRs` punches holes in the default deny list only, and
 * `denyCIDRs` always win, so an operator can open a lab subnet and still close one host in it.
 * Every IPv4 range denied in the end is then denied at its NAT64 and 6to4 images as well
 * (10.0.0.0/8 adds 64:ff9b::a00:0/104 and 2002:a00::/24): the same list serves the local
 * matcher and Squid's `dst` ACLs, and NAT64 to a public address (DNS64 in an IPv6-only
 * cluster) keeps working. An IPv6 `allowCIDRs` entry does not open an image; allowing the IPv4
 * range does. Throws on a CIDR the validator would have refused.
 */
export function resolveEgressPolicy(cfg: EgressPolicyConfig = {}): EgressPolicy {
  let denied = merge(DEFAULT_DENY_CIDRS.map(parseCidr));
  for (const hole of (cfg.allowCIDRs ?? []).map(parseCidr)) denied = subtract(denied, hole);
  denied = merge([...denied, ...(cfg.denyCIDRs ?? []).map(parseCidr)]);
  denied = merge([...denied, ...denied.flatMap(embeddedImages)]);
  const connectPorts = [...new Set(cfg.connectPorts ?? DEFAULT_CONNECT_PORTS)].sort((a, b) => a - b);
  const httpPorts = [...new Set([HTTP_PORT, ...connectPorts])].sort((a, b) => a - b);
  return { deniedCIDRs: denied.flatMap(rangeToCidrs), connectPorts, httpPorts };
}

/**
 * Answers whether an address falls in a policy's deny list (IPv4-mapped IPv6 counts as IPv4;
 * NAT64 and 6to4 addresses are in the list as images of the denied IPv4 ranges).
 */
export function deniedAddressMatcher(policy: EgressPolicy): (address: string) => boolean {
  const ranges = merge(policy.deniedCIDRs.map(parseCidr));
  return (address) => {
    const ip = canonicalAddress(address);
    // Not an address at all: refuse rather than guess what it would connect to.
    if (!ip) return true;
    return ranges.some((r) => r.family === ip.family && ip.value >= r.start && ip.value <= r.end);
  };
}

/**
 * Which rule of a policy denies an address, in the terms of its providers-config block: a
 * `denyCIDRs` entry, a default range `allowCIDRs` did not open, or (a policy whose block is not
 * known) the block of the effective list. A NAT64 or 6to4 address that is denied as the image of
 * an IPv4 range names that IPv4 address in `embedded`.
 */
export interface DenyingRule {
  cidr: string;
  source: 'denyCIDRs' | 'default' | 'policy';
  /** What a default range is: `loopback`, `private` … */
  what?: string;
  /** The IPv4 address a NAT64 or 6to4 address carries, when the rule matched that. */
  embedded?: { address: string; via: string };
}

/**
 * The rule denying `address` (any spelling; IPv4-mapped counts as IPv4) under `policy`, resolved
 * from `cfg`; undefined when it is not denied or not an address. Mirrors resolveEgressPolicy:
 * `denyCIDRs` win over everything, a default range counts unless an `allowCIDRs` entry covers
 * the address, and an image is opened only by allowing its IPv4 address.
 */
export function denyingRule(
  address: string,
  cfg: EgressPolicyConfig | undefined,
  policy: EgressPolicy,
): DenyingRule | undefined {
  const ip = canonicalAddress(address);
  if (!ip) return undefined;
  const contains = (cidr: string, at: { family: 4 | 6; value: bigint }): boolean => {
    const r = parseCidr(cidr);
    return r.family === at.family && at.value >= r.start && at.value <= r.end;
  };
  const direct = { at: ip, embedded: undefined };
  const images = ip.family === 6 ? embeddedIPv4(ip.value) : [];
  const candidates: { at: { family: 4 | 6; value: bigint }; embedded?: { address: string; via: string } }[] =
    [
      direct,
      ...images.map((e) => ({
        at: { family: 4 as const, value: e.value },
        embedded: { address: formatAddress(4, e.value), via: e.via },
      })),
    ];
  const withEmbedded = (rule: DenyingRule, embedded?: { address: string; via: string }): DenyingRule =>
    embedded ? { ...rule, embedded } : rule;
  for (const c of candidates) {
    const hit = (cfg?.denyCIDRs ?? []).find((d) => contains(d, c.at));
    if (hit) return withEmbedded({ cidr: hit, source: 'denyCIDRs' }, c.embedded);
  }
  for (const c of candidates) {
    if ((cfg?.allowCIDRs ?? []).some((a) => contains(a, c.at))) continue;
    const hit = DEFAULT_DENY_RANGES.find((d) => contains(d.cidr, c.at));
    if (hit) return withEmbedded({ cidr: hit.cidr, source: 'default', what: hit.what }, c.embedded);
  }
  const block = policy.deniedCIDRs.find((d) => contains(d, ip));
  return block === undefined ? undefined : { cidr: block, source: 'policy' };
}

/** The IPv4 addresses an IPv6 address carries under the NAT64 and 6to4 prefixes (zero or one). */
function embeddedIPv4(value: bigint): { value: bigint; via: string }[] {
  return IPV4_EMBEDDING.filter(({ prefix, shift }) => value >> (32n + shift) === prefix >> (32n + shift)).map(
    ({ name, shift }) => ({ value: (value >> shift) & 0xffffffffn, via: name }),
  );
}
