/**
 * lease/lease — one lease as the store holds it, and the small rules about a single lease: its
 * id, and when the drain that limits its renewals began.
 */
import { randomUUID } from 'node:crypto';
import type { Entry } from './entry.ts';

export interface Lease {
  id: string;
  entry: Entry;
  target: string | undefined;
  /** The instance (providerID) the proxy served from at the grant: a drain waits for it. */
  instance: string;
  expiresAt: number;
  /**
   * Digest of the lease's own password (lease/lease-credentials) when its proxy is served per
   * lease; absent when the grant handed out the proxy's credentials.
   */
  secret?: string;
  /** Position in the expiry heap (-1 when not in it). */
  heapIndex: number;
}

/**
 * A random UUID as a flat string: Node assembles `randomUUID()` from many small pieces, and kept
 * as such tree (live and ended leases keep their ids) it costs ~600 bytes instead of ~60.
 */
export function newLeaseId(): string {
  return Buffer.from(randomUUID(), 'latin1').toString('latin1');
}

export function iso(ms: number): string {
  return new Date(ms).toISOString();
}

/** When the drain that concerns a lease on `instance` began (ms), or 0 when nothing drains it. */
export function drainStart(e: Entry, instance: string): number {
  if (e.draining && e.drainingSince > 0) return e.drainingSince;
  if (instance === '' || instance === e.instance) return 0;
  const d = e.drainingInstances.find((x) => x.providerID === instance);
  return d ? Date.parse(d.since) : 0;
}
