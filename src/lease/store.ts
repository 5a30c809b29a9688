/**
 * lease/store — the lease store the discovery API serves from (lease/store-core: grants,
 * cooldowns, bounds) plus its durable state: `exportState`/`restoreState` (lease/durable) carry
 * live leases, cooldowns, drain start times and still-reportable ended leases across a restart
 * or a change of leader — per-lease credentials included (as digests) — plus
 * `acceptsLeaseCredentials`, the check a proxy that enforces leases makes, `leaseProxy`, the
 * grant on one named proxy that the gateway's sticky sessions use, and reports — by lease or by
 * proxy — of how a proxy did.
 */

import type { CooldownWatcher } from './cooldowns.ts';
import { LEASE_STATE_VERSION, type LeaseState, type ProxyRecord } from './durable.ts';
import { countLease, type Entry, newEntry, notLeasableReason, snapshotOf } from './entry.ts';
import { checkNamespace, checkReport, checkSeconds, toSelector } from './input.ts';
import type { Lease } from './lease.ts';
import { leaseIdOfUser, passwordMatches } from './lease-credentials.ts';
import { LeaseStoreCore, TooManyLeasesError } from './store-core.ts';
import { LeaseInputError, normalizeTarget } from './target.ts';
import type {
  LeaseGrant,
  NotLeasableReason,
  ProxyReportRequest,
  ProxySnapshot,
  ReportRequest,
  SnapshotFilter,
} from './types.ts';
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
  type ProxyReportRequest,
  type ProxySnapshot,
  type ReportRequest,
  type ReportResult,
  type SnapshotFilter,
} from './types.ts';

/** One proxy as gateway replicas see it (LeaseStore.gatewayUpstreams). */
export interface GatewayUpstream {
  key: string;
  namespace: string;
  labels: Record<string, string>;
  /** 0 = unlimited. */
  maxLeases: number;
  /** Why no connection may use it now, capacity and target cooldowns aside; null = usable. */
  reason: NotLeasableReason | null;
  latencyMillis: number | null;
  /** Live per-target cooldowns: [target, end in ms of the store's clock]. */
  cooldowns?: [string, number][];
}

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
   * Outcome of using a lease. `blocked` cools the proxy down for the lease's target only, with
   * every proxy sharing its egress IP (a lease without a target cannot be blocked:
   * LeaseInputError on `result`), `failed` cools
   * it down for everyone and asks for a re-probe. A lease released or expired within the last
   * 15 minutes can still be reported (nothing left to release). Returns false when the lease is
   * unknown.
   */
  report(id: string, req: ReportRequest): boolean {
    checkReport(req);
    this.tick();
    const now = this.clock.now();
    const lease = this.leases.get(id);
    const used = lease ?? this.ended.get(id, now);
    if (!used) return false;
    if (req.result === 'blocked' && used.target === undefined) {
      throw new LeaseInputError(
        'result',
        'result "blocked" needs a lease granted for a target; report "failed" for a proxy-wide problem',
      );
    }
    this.applyReport(used.entry, used.target, req, now);
    if (lease && req.release !== false) this.drop(lease, now);
    return true;
  }

  /**
   * What a report does to a proxy: `blocked` cools it down for `target`, `failed` for everyone
   * plus a re-probe. Cooldowns only ever lengthen, so a repeated report changes nothing more.
   */
  protected applyReport(e: Entry, target: string | undefined, req: ReportRequest, now: number): void {
    if (req.result !== 'success') {
      // Which site refuses which proxy, and which proxies fail: worth a line each (never the lease id).
      const cooldownSeconds =
        req.cooldownSeconds ?? (req.result === 'blocked' ? this.blockedCooldown : this.failedCooldown);
      this.log.info({ proxy: e.key, target, result: req.result, cooldownSeconds }, 'proxy reported');
    }
    if (req.result === 'blocked' && target !== undefined) {
      const until = now + (req.cooldownSeconds ?? this.blockedCooldown) * 1000;
      // The site blocked an address: every proxy leaving from it is blocked there too.
      this.egressGroups.block(e, target, until, this.targetCooldowns);
      this.changeCount++;
    } else if (req.result === 'failed') {
      this.coolDown(e, now + (req.cooldownSeconds ?? this.failedCooldown) * 1000);
      try {
        this.requestProbe?.(e.key);
      } catch (err) {
        this.log.warn({ err, proxy: e.key }, 'requestProbe hook failed');
      }
    }
  }

  /**
   * A report about a proxy rather than a lease (`POST /v1/reports`): for crawlers whose lease is
   * shared or long gone. Same effects as a lease report, nothing released; idempotent, since
   * cooldowns only lengthen. Returns false when no such proxy is known.
   */
  reportProxy(req: ProxyReportRequest): boolean {
    checkReport(req);
    const target = normalizeTarget(req.target);
    if (req.result === 'blocked' && target === undefined) {
      throw new LeaseInputError('target', 'result "blocked" needs the target that blocked the proxy');
    }
    this.tick();
    const e = this.proxies.get(`${req.namespace}/${req.name}`);
    if (!e) return false;
    this.applyReport(e, target, req, this.clock.now());
    return true;
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
    return { granted: true, grant: this.grant(e, host, ttlSeconds, now) };
  }

  /**
   * Every proxy the store knows, as the gateway hub hands them to replicas (gateway/hub): its
   * labels, capacity, and the first leasing rule it fails for any target, capacity aside.
   * With `cooldowns`, also its live per-target cooldowns (target, end).
   */
  gatewayUpstreams(cooldowns = false): GatewayUpstream[] {
    this.tick();
    const now = this.clock.now();
    const out: GatewayUpstream[] = [];
    for (const e of this.proxies.values()) {
      const reason = notLeasableReason(e, undefined, now);
      const u: GatewayUpstream = {
        key: e.key,
        namespace: e.namespace,
        labels: e.labels,
        maxLeases: e.maxLeases,
        reason: reason === 'AtCapacity' || reason === undefined ? null : reason,
        latencyMillis: e.latencyMillis ?? null,
      };
      if (cooldowns) {
        u.cooldowns = [];
        for (const c of e.targetUntil.values()) if (c.at > now) u.cooldowns.push([c.target, c.at]);
      }
      out.push(u);
    }
    return out;
  }

  /** Calls `w` for every per-target cooldown that begins or lengthens; returns the unsubscribe. */
  watchTargetCooldowns(w: CooldownWatcher): () => void {
    return this.targetCooldowns.watch(w);
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
