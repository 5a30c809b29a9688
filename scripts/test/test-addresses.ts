/**
 * scripts/test/test-addresses — the IPv6 addresses the egress-address tests bind on this host
 * (docs/testing.md): loopback has only ::1, so `npm test` adds a few addresses of a private
 * (ULA) prefix to `lo` when run as root, and leaves them there — harmless, reachable only from
 * this host, and needed again by every direct `vitest` run. Where IPv6 is disabled there is
 * nothing to add and the tests say so.
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
