/**
 * dashboard/lease-holders — who holds which lease for which target: the newest live leases
 * (a bounded list, however many there are) with the counts of all of them by origin. A lease id
 * lets whoever has the API token renew, release and report that lease, so the page gets only
 * its first characters: enough to match a client's log line, never enough to act on the lease.
 */
import type { LiveLeases } from '../lease/types.ts';
import type { LeaseHolders } from './web/types.ts';

/** Leases listed at most; the rest are counted ("N more"). */
export const MAX_LEASE_HOLDERS = 50;

/** Characters of a lease id shown: 32 random bits, a recognisable tag that cannot be guessed onward. */
export const LEASE_ID_SHOWN = 8;

function iso(ms: number): string {
  return new Date(ms).toISOString();
}

export function leaseHolders(live: LiveLeases, limit = MAX_LEASE_HOLDERS): LeaseHolders {
  const { counts } = live;
  const total = counts.api + counts.gateway + counts['gateway-share'] + counts.unknown;
  const newest = live.newest.slice(0, limit).map((l) => ({
    id: l.id.slice(0, LEASE_ID_SHOWN),
    proxy: l.proxy,
    target: l.target,
    grantedAt: l.grantedAt === null ? null : iso(l.grantedAt),
    expiresAt: iso(l.expiresAt),
    via: l.via,
  }));
  return {
    total,
    api: counts.api,
    gateway: counts.gateway,
    gatewayShare: counts['gateway-share'],
    restored: counts.unknown,
    newest,
    more: total - newest.length,
  };
}
