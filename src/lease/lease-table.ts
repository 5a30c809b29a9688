/**
 * lease/lease-table — the live leases and the ones that ended lately: grants, renewals, releases
 * and expiry (a heap of expiry times, so expiry does not walk the table), capped at
 * `maxActiveLeases`. Released and expired leases stay reportable for a while (lease/ended): an
 * API client's in one table, a gateway sticky session's in another with its own budget, so the
 * gateway's connections never push API leases out; leases nobody can name later are not kept.
 */
import { proxyUrlWithCredentials } from '../api/url.ts';
import type { ChangeCounter } from './changes.ts';
import { type EndedLease, EndedLeases, type LateReports } from './ended.ts';
import { countLease, type Entry } from './entry.ts';
import { TooManyLeasesError } from './errors.ts';
import { drainStart, iso, type Lease, newLeaseId } from './lease.ts';
import { issueLeaseCredentials, leaseIdOfUser, passwordMatches } from './lease-credentials.ts';
import { IndexedHeap } from './ordered.ts';
import type { Selection } from './selection.ts';
import type { LeaseGrant, LeaseVia, LiveLease, LiveLeases } from './types.ts';

export interface LeaseTableOptions {
  defaultTtlSeconds: number;
  /** Live leases at most (at least 1). */
  maxActiveLeases: number;
  drainTimeoutMs: number;
  reportableAfterEndMs: number;
  /** Byte budgets of the ended leases API clients, and gateway sessions, may still report. */
  endedLeaseBytes: number;
  endedConnectionBytes: number;
  /** Called once per ended lease forgotten before its 15 minutes for want of budget. */
  onEndedLeaseEvicted: (holder: 'client' | 'session') => void;
  /** Whether the instance a proxy serves from checks credentials per lease. */
  perLeaseCredentials: ((instance: string) => boolean) | undefined;
}

/** A lease as it is restored from a checkpoint. */
export interface RestoredLease {
  id: string;
  entry: Entry;
  target: string | undefined;
  instance: string;
  expiresAt: number;
  secret: string | undefined;
}

export class LeaseTable {
  private readonly opts: LeaseTableOptions;
  private readonly selection: Selection;
  private readonly changes: ChangeCounter;
  private readonly leases = new Map<string, Lease>();
  private readonly expiries = new IndexedHeap<Lease>((a, b) => a.expiresAt < b.expiresAt);
  private readonly ended: EndedLeases;
  private readonly endedConnections: EndedLeases;
  private grantSeq = 0;

  constructor(opts: LeaseTableOptions, selection: Selection, changes: ChangeCounter) {
    this.opts = opts;
    this.selection = selection;
    this.changes = changes;
    this.ended = new EndedLeases({
      retentionMs: opts.reportableAfterEndMs,
      maxBytes: opts.endedLeaseBytes,
      onEvictedEarly: () => opts.onEndedLeaseEvicted('client'),
    });
    this.endedConnections = new EndedLeases({
      retentionMs: opts.reportableAfterEndMs,
      maxBytes: opts.endedConnectionBytes,
      onEvictedEarly: () => opts.onEndedLeaseEvicted('session'),
    });
  }

  get size(): number {
    return this.leases.size;
  }

  live(): IterableIterator<Lease> {
    return this.leases.values();
  }

  get(id: string): Lease | undefined {
    return this.leases.get(id);
  }

  /** A lease released or expired recently enough to be reported, or undefined. */
  recentlyEnded(id: string, now: number): EndedLease | undefined {
    return this.ended.get(id, now) ?? this.endedConnections.get(id, now);
  }

  /** Ended leases held and the bytes they take, per holder (metrics). */
  endedStats(): Record<'client' | 'session', { leases: number; bytes: number }> {
    return {
      client: { leases: this.ended.size, bytes: this.ended.bytes },
      session: { leases: this.endedConnections.size, bytes: this.endedConnections.bytes },
    };
  }

  /**
   * Every API client's lease kept reportable at `now`, oldest first: what a checkpoint carries.
   * Gateway sessions' leases are left out, as the sessions do not outlive the process.
   */
  *reportable(now: number): Iterable<[string, EndedLease]> {
    for (const [id, x] of this.ended.entries()) {
      if (x.endedAt + this.opts.reportableAfterEndMs > now) yield [id, x];
    }
  }

  /**
   * Every live lease counted by origin, and the newest `limit` of them, newest first. The table
   * keeps grant order (restored leases first), so the newest are the last ones met in one pass.
   */
  newest(limit: number): LiveLeases {
    const counts = { api: 0, gateway: 0, 'gateway-share': 0, unknown: 0 };
    const ring: Lease[] = [];
    let next = 0;
    for (const lease of this.leases.values()) {
      counts[lease.via ?? 'unknown']++;
      if (limit <= 0) continue;
      if (ring.length < limit) ring.push(lease);
      else ring[next] = lease;
      next = (next + 1) % limit;
    }
    // The ring's oldest is at `next` once it has wrapped; read it backwards from the newest.
    const newest: LiveLease[] = [];
    for (let i = 1; i <= ring.length; i++) {
      const lease = ring[(next - i + ring.length) % ring.length] as Lease;
      newest.push({
        id: lease.id,
        proxy: lease.entry.key,
        target: lease.target ?? null,
        grantedAt: lease.grantedAt ?? null,
        expiresAt: lease.expiresAt,
        via: lease.via ?? null,
      });
    }
    return { counts, newest };
  }

  /** Throws TooManyLeasesError when no lease more may be granted. */
  checkRoom(): void {
    if (this.leases.size >= this.opts.maxActiveLeases)
      throw new TooManyLeasesError(this.opts.maxActiveLeases);
  }

  /**
   * Grants a lease on `e` (which the leasing rules allow now) for `target`, asked for `via`;
   * `lateReports` says who may report it once it has ended (lease/ended).
   */
  grant(
    e: Entry,
    target: string | undefined,
    ttlSeconds: number | undefined,
    now: number,
    via: LeaseVia,
    lateReports: LateReports = 'client',
  ): LeaseGrant {
    this.grantSeq++;
    this.changes.decided();
    this.selection.update(e, () => {
      e.active++;
      e.lastLeasedSeq = this.grantSeq;
      e.lastLeasedAt = now;
    });
    const lease: Lease = {
      id: newLeaseId(),
      entry: e,
      target,
      instance: e.instance,
      expiresAt: now + (ttlSeconds ?? this.opts.defaultTtlSeconds) * 1000,
      grantedAt: now,
      via,
      lateReports,
      heapIndex: -1,
    };
    let url = e.url;
    if (e.instance !== '' && this.opts.perLeaseCredentials?.(e.instance)) {
      // The proxy checks this lease's own credentials (and stops accepting them when it ends);
      // the proxy's credentials stay with the operator's probes.
      const own = issueLeaseCredentials(lease.id);
      lease.secret = own.digest;
      url = proxyUrlWithCredentials(e.host, e.port, own);
    }
    countLease(e, lease.instance, 1);
    this.leases.set(lease.id, lease);
    this.expiries.push(lease);
    return {
      id: lease.id,
      proxy: { namespace: e.namespace, name: e.name, url, host: e.host, port: e.port },
      target: target ?? null,
      expiresAt: iso(lease.expiresAt),
    };
  }

  /** Extends a live lease to now + ttl; undefined when it is unknown or past its drain deadline. */
  renew(
    id: string,
    ttlSeconds: number | undefined,
    now: number,
  ): { id: string; expiresAt: string } | undefined {
    const lease = this.leases.get(id);
    if (!lease) return undefined;
    let expiresAt = now + (ttlSeconds ?? this.opts.defaultTtlSeconds) * 1000;
    // A draining proxy, or the replaced instance a lease was granted on, is deleted at most the
    // drain timeout after the drain began: no lease on it outlives that, so the instance is
    // never deleted under a renewed lease.
    const since = drainStart(lease.entry, lease.instance);
    if (since > 0) {
      const deadline = since + this.opts.drainTimeoutMs;
      if (deadline <= now) {
        this.end(lease, now);
        return undefined;
      }
      expiresAt = Math.min(expiresAt, deadline);
    }
    this.changes.decided();
    lease.expiresAt = expiresAt;
    this.expiries.update(lease);
    return { id, expiresAt: iso(lease.expiresAt) };
  }

  /** Ends a live lease; it stays reportable. */
  end(lease: Lease, now: number): void {
    this.changes.decided();
    const ended = { entry: lease.entry, target: lease.target, endedAt: now };
    if (lease.lateReports === 'client') this.ended.add(lease.id, ended);
    else if (lease.lateReports === 'session') this.endedConnections.add(lease.id, ended);
    this.leases.delete(lease.id);
    this.expiries.remove(lease);
    const e = lease.entry;
    countLease(e, lease.instance, -1);
    this.selection.update(e, () => {
      e.active--;
    });
  }

  /** Ends the leases expired by `now` and forgets ended ones no longer reportable. */
  expire(now: number): void {
    for (let top = this.expiries.peek(); top && top.expiresAt <= now; top = this.expiries.peek()) {
      this.end(top, now);
    }
    this.ended.purge(now);
    this.endedConnections.purge(now);
  }

  /**
   * Whether `username`/`password` are the credentials of a live lease granted on `instance`
   * (lease/lease-credentials).
   */
  acceptsCredentials(instance: string, username: string, password: string): boolean {
    const id = leaseIdOfUser(username);
    if (id === undefined) return false;
    const lease = this.leases.get(id);
    if (!lease?.secret || lease.instance !== instance) return false;
    return passwordMatches(password, lease.secret);
  }

  /** Puts a checkpointed live lease back, counted on its proxy like a grant. */
  restore(r: RestoredLease): void {
    const e = r.entry;
    const lease: Lease = {
      id: r.id,
      entry: e,
      target: r.target,
      instance: r.instance,
      expiresAt: r.expiresAt,
      // Checkpoints carry no holder: a restored lease may be any client's.
      lateReports: 'client',
      heapIndex: -1,
      ...(r.secret ? { secret: r.secret } : {}),
    };
    countLease(e, lease.instance, 1);
    this.selection.update(e, () => {
      e.active++;
    });
    this.leases.set(r.id, lease);
    this.expiries.push(lease);
  }

  /** Puts a checkpointed ended lease back (reportable until its retention runs out). */
  restoreEnded(id: string, ended: EndedLease): void {
    this.ended.add(id, ended);
  }
}
