/**
 * lease/retry-at — when a refused grant is worth asking again (the `retryAt` of a 409, see
 * docs/lease-api.md): the earliest instant at which some matching proxy stops being held back by time
 * alone — a global cooldown, a cooldown for the target, a lease that will expire at a full
 * proxy. Proxies held back by something time does not end (not ready, unhealthy, draining,
 * being deleted) do not count; when only those match, there is no such instant.
 */
import { coolingFor, type Entry, notLeasableReason } from './entry.ts';

/** The earliest expiry among each proxy's live leases. */
export function earliestLeaseEnds(leases: Iterable<{ entry: Entry; expiresAt: number }>): Map<Entry, number> {
  const out = new Map<Entry, number>();
  for (const l of leases) {
    const known = out.get(l.entry);
    if (known === undefined || l.expiresAt < known) out.set(l.entry, l.expiresAt);
  }
  return out;
}

/** When `e` would be leasable for `target` if nothing else changed, or undefined for never. */
export function leasableAt(
  e: Entry,
  target: string | undefined,
  now: number,
  leaseEnds: Map<Entry, number>,
): number | undefined {
  const reason = notLeasableReason(e, target, now);
  if (reason === undefined) return now;
  if (reason !== 'CoolingDown' && reason !== 'CoolingDownForTarget' && reason !== 'AtCapacity')
    return undefined;
  let at = Math.max(now, e.globalUntil);
  if (target !== undefined && coolingFor(e, target, now))
    at = Math.max(at, e.targetUntil.get(target)?.at ?? at);
  if (e.maxLeases > 0 && e.active >= e.maxLeases) {
    const freed = leaseEnds.get(e);
    if (freed === undefined) return undefined;
    at = Math.max(at, freed);
  }
  return at;
}

/** The earliest leasableAt over `entries`, or undefined when none will become leasable by itself. */
export function retryAt(
  entries: Iterable<Entry>,
  target: string | undefined,
  now: number,
  leaseEnds: Map<Entry, number>,
): number | undefined {
  let best: number | undefined;
  for (const e of entries) {
    const at = leasableAt(e, target, now, leaseEnds);
    if (at !== undefined && (best === undefined || at < best)) best = at;
  }
  return best;
}
