/**
 * gateway/lease-adapter — what the gateway asks of the lease store beyond the lease API: the
 * upstreams as the hub hands them to replicas, the per-target cooldowns as they begin (pushed to
 * replicas), and a lease on one named upstream (sticky sessions and slot leases, see
 * docs/gateway.md). Built on the store's parts (lease/store, `LeaseStoreParts`) with the same
 * leasing rule as every grant (lease/entry), so the store itself carries nothing gateway-only.
 */
import type { Location } from '../api/location.ts';
import type { LateReports } from '../lease/ended.ts';
import { notLeasableReason } from '../lease/entry.ts';
import { checkSeconds } from '../lease/input.ts';
import type { LeaseStore } from '../lease/store.ts';
import { normalizeTarget } from '../lease/target.ts';
import type { CooldownWatcher } from '../lease/target-cooldowns.ts';
import type { LeaseGrant, LeaseVia, NotLeasableReason } from '../lease/types.ts';

/** One proxy as gateway replicas see it (GatewayLeaseAdapter.upstreams). */
export interface GatewayUpstream {
  key: string;
  namespace: string;
  labels: Record<string, string>;
  /** Where it runs (status.location), when known: replicas select on it as the leader does. */
  location?: Location;
  /** 0 = unlimited. */
  maxLeases: number;
  /** Why no connection may use it now, capacity and target cooldowns aside; null = usable. */
  reason: NotLeasableReason | null;
  latencyMillis: number | null;
  /** Live per-target cooldowns: [target, end in ms of the store's clock]. */
  cooldowns?: [string, number][];
}

export type UpstreamLeaseOutcome =
  | { granted: true; grant: LeaseGrant }
  | { granted: false; reason: NotLeasableReason | 'Gone' };

export class GatewayLeaseAdapter {
  private readonly store: LeaseStore;

  constructor(store: LeaseStore) {
    this.store = store;
  }

  /**
   * Every proxy the store knows, as the gateway hub hands them to replicas (gateway/hub): its
   * labels, capacity, and the first leasing rule it fails for any target, capacity aside.
   * With `cooldowns`, also its live per-target cooldowns (target, end).
   */
  upstreams(cooldowns = false): GatewayUpstream[] {
    const now = this.store.sweep();
    const out: GatewayUpstream[] = [];
    for (const e of this.store.parts.fleet.all()) {
      const reason = notLeasableReason(e, undefined, now);
      const u: GatewayUpstream = {
        key: e.key,
        namespace: e.namespace,
        labels: e.labels,
        maxLeases: e.maxLeases,
        reason: reason === 'AtCapacity' || reason === undefined ? null : reason,
        latencyMillis: e.latencyMillis ?? null,
      };
      if (e.location) u.location = e.location;
      if (cooldowns) {
        u.cooldowns = [];
        for (const c of e.targetUntil.values()) if (c.at > now) u.cooldowns.push([c.target, c.at]);
      }
      out.push(u);
    }
    return out;
  }

  /**
   * Whether the live lease `id` was granted on an instance its proxy has replaced since by
   * another one that serves now (the old instance drains while leases granted on it live), and
   * the proxy is unlimited (`maxLeases` 0), so a lease on the new instance can be granted beside
   * it at once.
   */
  onReplacedUnlimited(id: string): boolean {
    const l = this.store.parts.table.get(id);
    if (l === undefined || l.entry.maxLeases !== 0 || l.instance === '') return false;
    return l.entry.instance !== '' && l.entry.instance !== l.instance;
  }

  /** Calls `w` for every per-target cooldown that begins or lengthens; returns the unsubscribe. */
  watchTargetCooldowns(w: CooldownWatcher): () => void {
    return this.store.parts.cooldowns.watch(w);
  }

  /**
   * A lease on the proxy `key` itself, if the leasing rules let it take one for `target` now;
   * otherwise the first rule it fails, or 'Gone' when the store does not know it. Counts like
   * any grant (TooManyLeasesError when the store is full). `via`: a connection's lease, or a
   * replica's share of the proxy (the hub's slot leases); `lateReports`: who may report it once
   * it has ended (lease/ended).
   */
  leaseProxy(
    key: string,
    target: string | undefined,
    ttlSeconds: number | undefined,
    via: Exclude<LeaseVia, 'api'>,
    lateReports: LateReports,
  ): UpstreamLeaseOutcome {
    const host = normalizeTarget(target);
    checkSeconds('ttlSeconds', ttlSeconds, this.store.maxTtlSeconds);
    const now = this.store.sweep();
    const { fleet, table } = this.store.parts;
    const e = fleet.get(key);
    if (!e || e.removed) return { granted: false, reason: 'Gone' };
    const reason = notLeasableReason(e, host, now);
    if (reason) return { granted: false, reason };
    table.checkRoom();
    return { granted: true, grant: table.grant(e, host, ttlSeconds, now, via, lateReports) };
  }
}
