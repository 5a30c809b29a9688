/**
 * lease/store — the lease store the discovery API serves from (lease/store-core: grants,
 * cooldowns, bounds) plus its durable state: `exportState`/`restoreState` (lease/durable) carry
 * live leases, cooldowns, drain start times and still-reportable ended leases across a restart
 * or a change of leader — per-lease credentials included (as digests) — plus
 * `acceptsLeaseCredentials`, the check a proxy that enforces leases makes, and `leaseProxy`,
 * the grant on one named proxy that the gateway's sticky sessions use.
 */

import { proxyUrlWithCredentials } from '../api/url.ts';
import { LEASE_STATE_VERSION, type LeaseState, type ProxyRecord } from './durable.ts';
import { countLease, type Entry, newEntry, notLeasableReason, snapshotOf } from './entry.ts';
import { checkNamespace, checkSeconds, toSelector } from './input.ts';
import { iso, type Lease, newLeaseId } from './lease.ts';
import { issueLeaseCredentials, leaseIdOfUser, passwordMatches } from './lease-credentials.ts';
import { LeaseStoreCore, TooManyLeasesError } from './store-core.ts';
import { normalizeTarget } from './target.ts';
import type { LeaseGrant, NotLeasableReason, ProxySnapshot, SnapshotFilter } from './types.ts';
import { matchesFilter } from './view.ts';

export {
  DEFAULT_DRAIN_TIMEOUT_MS,
  DEFAULT_MAX_ACTIVE_LEASES,
  LeaseInputError,
  type LeaseStoreOptions,
  TooManyLeasesError,
} from './store-core.ts';
export {
  DEFAULT_BLOCKED_COOLDOWN_SECONDS,
  DEFAULT_FAILED_COOLDOWN_SECONDS,
  DEFAULT_TTL_SECONDS,
  type LeaseGrant,
  type LeaseOutcome,
  type LeaseRequest,
  MAX_COOLDOWN_SECONDS,
  MAX_TTL_SECONDS,
  type NoneLeasableCounts,
  type NotLeasableReason,
  type ProxyInfo,
  type ProxySnapshot,
  type ReportRequest,
  type ReportResult,
  type SnapshotFilter,
} from './types.ts';

export class LeaseStore extends LeaseStoreCore {
  /** What the store knows about every proxy matching the filter, for `GET /v1/proxies`. */
  snapshot(filter: SnapshotFilter = {}): ProxySnapshot[] {
    const target = normalizeTarget(filter.target);
    const selector = toSelector(filter.selector);
    checkNamespace(filter.namespace);
    const namespace = filter.namespace === '' ? undefined : filter.namespace;
    this.tick();
    const now = this.clock.now();
    const out: ProxySnapshot[] = [];
    for (const e of this.proxies.values()) {
      if (matchesFilter(e, namespace, selector)) out.push(snapshotOf(e, target, now));
    }
    return out.sort((a, b) =>
      a.namespace === b.namespace ? (a.name < b.name ? -1 : 1) : a.namespace < b.namespace ? -1 : 1,
    );
  }

  /**
   * A lease on the proxy `key` itself, if the leasing rules let it take one for `target` now
   * (the gateway's sticky sessions keep their upstream this way, see docs/gateway.md); otherwise
   * the first rule it fails, or 'Gone' when the store does not know it. Counts like any grant.
   */
  leaseProxy(
    key: string,
    target: string | undefined,
    ttlSeconds?: number,
  ): { granted: true; grant: LeaseGrant } | { granted: false; reason: NotLeasableReason | 'Gone' } {
    const host = normalizeTarget(target);
    checkSeconds('ttlSeconds', ttlSeconds, this.maxTtl);
    this.tick();
    const e = this.proxies.get(key);
    if (!e || e.removed) return { granted: false, reason: 'Gone' };
    const now = this.clock.now();
    const reason = notLeasableReason(e, host, now);
    if (reason) return { granted: false, reason };
    if (this.leases.size >= this.maxActive) throw new TooManyLeasesError(this.maxActive);
    this.grantSeq++;
    this.changeCount++;
    this.update(e, () => {
      e.active++;
      e.lastLeasedSeq = this.grantSeq;
      e.lastLeasedAt = now;
    });
    const lease: Lease = {
      id: newLeaseId(),
      entry: e,
      target: host,
      instance: e.instance,
      expiresAt: now + (ttlSeconds ?? this.defaultTtl) * 1000,
      heapIndex: -1,
    };
    let url = e.url;
    if (e.instance !== '' && this.perLease?.(e.instance)) {
      const own = issueLeaseCredentials(lease.id);
      lease.secret = own.digest;
      url = proxyUrlWithCredentials(e.host, e.port, own);
    }
    countLease(e, lease.instance, 1);
    this.leases.set(lease.id, lease);
    this.expiries.push(lease);
    const proxy = { namespace: e.namespace, name: e.name, url, host: e.host, port: e.port };
    return {
      granted: true,
      grant: { id: lease.id, proxy, target: host ?? null, expiresAt: iso(lease.expiresAt) },
    };
  }

  /**
   * Whether `username`/`password` are the credentials of a live lease granted on `instance`
   * (asked by a proxy that enforces leases on every request and CONNECT).
   */
  acceptsLeaseCredentials(instance: string, username: string, password: string): boolean {
    const id = leaseIdOfUser(username);
    if (id === undefined) return false;
    this.tick();
    const lease = this.leases.get(id);
    if (!lease?.secret || lease.instance !== instance) return false;
    return passwordMatches(password, lease.secret);
  }

  /** Everything a restart or a new leader must not forget, as of now. */
  exportState(): LeaseState {
    this.tick();
    const now = this.clock.now();
    const proxies: ProxyRecord[] = [];
    const seen = new Set<Entry>();
    const record = (e: Entry) => {
      if (seen.has(e)) return;
      seen.add(e);
      const targets: [string, number][] = [];
      for (const c of e.targetUntil.values()) if (c.at > now) targets.push([c.target, c.at]);
      const global = e.globalUntil > now ? e.globalUntil : 0;
      if (global === 0 && targets.length === 0 && e.drainingSince === 0) return;
      proxies.push([e.key, e.uid, global, e.drainingSince, targets]);
    };
    for (const e of this.proxies.values()) record(e);
    for (const e of this.restored.values()) record(e);
    const leases: LeaseState['leases'] = [];
    for (const l of this.leases.values()) {
      const r: LeaseState['leases'][number] = [
        l.id,
        l.entry.key,
        l.entry.uid,
        l.target ?? null,
        l.expiresAt,
        l.instance,
      ];
      if (l.secret) r.push(l.secret);
      leases.push(r);
    }
    const ended: LeaseState['ended'] = [];
    for (const [id, x] of this.ended.entries()) {
      if (this.ended.get(id, now)) ended.push([id, x.entry.key, x.entry.uid, x.target ?? null, x.endedAt]);
    }
    return { v: LEASE_STATE_VERSION, at: now, leases, proxies, ended };
  }

  /**
   * Merges a checkpoint in (normally into an empty store, before serving): what has ended by now
   * is skipped; cooldowns only ever lengthen; a proxy recreated under the same name (another
   * uid) does not inherit the old one's state. Proxies the feed has not delivered yet are held
   * aside and adopted when it does.
   */
  restoreState(state: LeaseState): { leases: number; proxies: number } {
    this.tick();
    const now = this.clock.now();
    let restoredProxies = 0;
    for (const [key, uid, global, drainingSince, targets] of state.proxies) {
      const e = this.entryFor(key, uid);
      if (!e) continue;
      restoredProxies++;
      if (global > now) this.coolDown(e, global);
      for (const [t, until] of targets) if (until > now) this.targetCooldowns.set(e, t, until);
      if (drainingSince > 0 && (e.drainingSince === 0 || drainingSince < e.drainingSince)) {
        e.drainingSince = drainingSince;
      }
    }
    let restoredLeases = 0;
    for (const [id, key, uid, target, expiresAt, instance, secret] of state.leases) {
      if (expiresAt <= now || this.leases.has(id)) continue;
      const e = this.entryFor(key, uid);
      if (!e) continue;
      const lease: Lease = {
        id,
        entry: e,
        target: target ?? undefined,
        instance: instance ?? e.instance,
        expiresAt,
        heapIndex: -1,
        ...(secret ? { secret } : {}),
      };
      countLease(e, lease.instance, 1);
      this.update(e, () => {
        e.active++;
      });
      this.leases.set(id, lease);
      this.expiries.push(lease);
      restoredLeases++;
    }
    for (const [id, key, uid, target, endedAt] of state.ended) {
      if (this.leases.has(id)) continue;
      const e = this.entryFor(key, uid);
      if (e) this.ended.add(id, { entry: e, target: target ?? undefined, endedAt });
    }
    this.ended.purge(now);
    this.changeCount++;
    return { leases: restoredLeases, proxies: restoredProxies };
  }

  /** The entry a checkpoint record belongs to: the live one with that uid, or one held aside. */
  private entryFor(key: string, uid: string): Entry | undefined {
    const live = this.proxies.get(key);
    if (live) return live.uid === uid ? live : undefined;
    const held = this.restored.get(key);
    if (held) return held.uid === uid ? held : undefined;
    const slash = key.indexOf('/');
    const e = newEntry({ key, namespace: key.slice(0, slash), name: key.slice(slash + 1), uid });
    this.restored.set(key, e);
    return e;
  }
}
