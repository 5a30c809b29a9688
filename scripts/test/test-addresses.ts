/**
 * scripts/test/test-addresses — the IPv6 addresses the egress-address tests bind on this host
 * (docs/testing.md): loopback has only ::1, so `npm test` adds a few addresses of a private
 * (ULA) prefix to `lo` when run as root, and leaves them there — harmless, reachable only from
 * this host, and needed again by every direct `vitest` run. Not root, `npm test` names the
 * missing ones and the `sudo ip -6 addr add …` commands (scripts/test/prerequisites.ts). Where
 * IPv6 is disabled there is nothing to add and the tests say so.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

/** A ULA prefix of our own (RFC 4193), never routed anywhere. */
export const TEST_IPV6_PREFIX = 'fd7e:57e9:e55::';
/** `<prefix>1` … `<prefix>4`: proxies' source addresses in the tests. */
export const TEST_IPV6_ADDRESSES: readonly string[] = [1, 2, 3, 4].map((i) => `${TEST_IPV6_PREFIX}${i}`);

/** Why IPv6 cannot be used on this host at all, or undefined when it can. */
export function ipv6Disabled(): string | undefined {
  try {
    if (readFileSync('/proc/sys/net/ipv6/conf/all/disable_ipv6', 'utf8').trim() === '1') {
      return 'IPv6 is disabled on this host (net.ipv6.conf.all.disable_ipv6 = 1)';
    }
    if (readFileSync('/proc/sys/net/ipv6/conf/lo/disable_ipv6', 'utf8').trim() === '1') {
      return 'IPv6 is disabled on lo (net.ipv6.conf.lo.disable_ipv6 = 1)';
    }
  } catch {
    return 'this kernel has no IPv6 (/proc/sys/net/ipv6 is missing)';
  }
  return undefined;
}

/** The command that adds the test addresses by hand (root). */
export function addTestAddressesCommand(): string {
  return TEST_IPV6_ADDRESSES.map((a) => `ip -6 addr add ${a}/128 dev lo`).join(' && ');
}

/** `addr` as the 32 hex digits /proc/net/if_inet6 writes (no colons, zeros filled in). */
export function ipv6Hex(addr: string): string {
  const [head = '', tail] = addr.toLowerCase().split('::');
  const groups = (part: string | undefined) => (part ? part.split(':') : []);
  const h = groups(head);
  const t = groups(tail);
  const fill = tail === undefined ? [] : Array<string>(8 - h.length - t.length).fill('0');
  return [...h, ...fill, ...t].map((g) => g.padStart(4, '0')).join('');
}

/**
 * The test addresses `/proc/net/if_inet6` (its text given) does not list on `lo`. Lines are
 * `<32 hex digits> <ifindex> <prefix length> <scope> <flags> <device>`.
 */
export function testAddressesMissingIn(ifInet6: string): string[] {
  const onLo = new Set<string>();
  for (const line of ifInet6.split('\n')) {
    const f = line.trim().split(/\s+/);
    if (f.length >= 6 && f[5] === 'lo' && f[0]) onLo.add(f[0].toLowerCase());
  }
  return TEST_IPV6_ADDRESSES.filter((a) => !onLo.has(ipv6Hex(a)));
}

/**
 * The test addresses `lo` lacks on this host, read without root or `ip`; none where IPv6 is
 * disabled (there is nothing to add; the IPv6 test skips and says so).
 */
export function missingTestAddresses(
  disabled: string | undefined = ipv6Disabled(),
  readIfInet6: () => string = () => readFileSync('/proc/net/if_inet6', 'utf8'),
): string[] {
  if (disabled !== undefined) return [];
  try {
    return testAddressesMissingIn(readIfInet6());
  } catch {
    return [...TEST_IPV6_ADDRESSES];
  }
}

/** One `sudo ip -6 addr add …` per address: what someone who is not root runs once. */
export function sudoAddCommands(addresses: readonly string[]): string[] {
  return addresses.map((a) => `sudo ip -6 addr add ${a}/128 dev lo`);
}

/**
 * Adds the missing test addresses to `lo` (root only); returns a problem to report, or
 * undefined when they are there (or IPv6 is off, which the tests themselves report).
 */
export function ensureTestAddresses(): string | undefined {
  if (ipv6Disabled()) return undefined;
  const shown = spawnSync('ip', ['-6', 'addr', 'show', 'dev', 'lo'], { encoding: 'utf8' });
  if (shown.status !== 0) return `ip -6 addr show dev lo failed: ${shown.stderr.trim()}`;
  for (const a of TEST_IPV6_ADDRESSES) {
    if (shown.stdout.includes(`inet6 ${a}/128`)) continue;
    const r = spawnSync('ip', ['-6', 'addr', 'add', `${a}/128`, 'dev', 'lo'], { encoding: 'utf8' });
    if (r.status !== 0) return `adding ${a} to lo failed: ${r.stderr.trim()}`;
  }
  return undefined;
}
