/**
 * lease/store — the in-memory lease store behind the discovery API (see docs/api.md): which
 * proxies may be handed out right now, to whom, for how long, and which are cooling down
 * globally or for one target.
 *
 * Grants do not scan the fleet. Every eligible proxy (see lease/entry: serving at an address,
 * healthy, not draining/deleting, not in a global cooldown, below maxLeases) sits in a *view*
 * (lease/view): buckets by active-lease count, each a sorted list by (least recently leased,
 * latency, name). A grant walks the lowest bucket from the front and skips only proxies
 * cooling down for the requested target. Views exist per distinct (namespace, selector) a
 * client asks for (LRU-bounded); the unfiltered view always exists. Cost per grant:
 * O(views + log n + skipped), where skipped = proxies in the lowest non-empty buckets that are
 * cooling down for this target. The "why nothing" arithmetic of a refused grant scans the
 * fleet once (O(n)), only on that failure path.
 *
 * Memory is bounded (docs/operations.md): ended cooldowns are purged on the sweep timer, live
 * leases are capped (`maxActiveLeases`, then TooManyLeasesError), per-target cooldowns are
 * capped evicting the soonest-ending first, and ended leases stay reportable for 15 minutes
 * under a count cap. `exportState`/`restoreState` (lease/durable) carry the decisions across a
 * restart or a change of leader.
 */
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { proxyUrlWithCredentials } from '../api/url.ts';
import { silentLogger } from '../log/index.ts';
import { type Clock, systemClock, type TimerHandle } from '../runtime/clock.ts';
import type { Selector } from '../runtime/selector.ts';
import { DEFAULT_MAX_TARGET_COOLDOWNS, TargetCooldowns } from './cooldowns.ts';
import { LEASE_STATE_VERSION, type LeaseState, type ProxyRecord } from './durable.ts';
import { EndedLeases, REPORTABLE_AFTER_END_MS } from './ended.ts';
import { coolingFor, type Entry, isEligible, newEntry, refusalCounts, snapshotOf } from './entry.ts';
import { checkNamespace, checkSeconds, toSelector } from './input.ts';
import { IndexedHeap } from './ordered.ts';
import { LeaseInputError, normalizeTarget } from './target.ts';
import {
  DEFAULT_BLOCKED_COOLDOWN_SECONDS,
  DEFAULT_FAILED_COOLDOWN_SECONDS,
  DEFAULT_TTL_SECONDS,
  type LeaseOutcome,
  type LeaseRequest,
  MAX_COOLDOWN_SECONDS,
  MAX_TTL_SECONDS,
  type NoneLeasableCounts,
  type ProxyInfo,
  type ProxySnapshot,
  type ReportRequest,
  type SnapshotFilter,
} from './types.ts';
import { matchesFilter, ViewSet } from './view.ts';

export { LeaseInputError } from './target.ts';

export const DEFAULT_MAX_ACTIVE_LEASES = 100_000;
export const DEFAULT_DRAIN_TIMEOUT_MS = 10 * 60_000;

/** A grant refused because `maxActiveLeases` leases are live (503 too_many_leases). */
export class TooManyLeasesError extends Error {
  readonly limit: number;
  constructor(limit: number) {
    super(`${limit} leases are active, the most this operator holds (--max-active-leases)`);
    this.name = 'TooManyLeasesError';
    this.limit = limit;
  }
}
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

export interface LeaseStoreOptions {
  clock?: Clock;
  log?: Logger;
  /** Called with the proxy key when a lease reports `failed`: re-probe it now. */
  requestProbe?: (key: string) => void;
  defaultTtlSeconds?: number;
  maxTtlSeconds?: number;
  blockedCooldownSeconds?: number;
  failedCooldownSeconds?: number;
  /** How often expired leases are released without traffic. Default 1000 ms. */
  sweepIntervalMs?: number;
  /** Bound on cached (namespace, selector) views. Default 64. */
  maxViews?: number;
  /** Live leases at most; a grant beyond answers TooManyLeasesError. Default 100,000. */
  maxActiveLeases?: number;
  /** Per-target cooldown entries at most, fleet-wide; the soonest-ending is evicted first. Default 200,000. */
  maxTargetCooldowns?: number;
  /** Called once per per-target cooldown evicted by the cap (a metric counts them). */
  onCooldownEvicted?: () => void;
  /** A draining proxy's leases are not renewed past drain start + this. Default 10 min. */
  drainTimeoutMs?: number;
  /** How long a released or expired lease id stays reportable. Default 15 min. */
  reportableAfterEndMs?: number;
}

interface Lease {
  id: string;
  entry: Entry;
  target: string | undefined;
  expiresAt: number;
  /** Position in the expiry heap (-1 when not in it). */
  heapIndex: number;
}

function iso(ms: number): string {
  return new Date(ms).toISOString();
}

export class LeaseStore {
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly requestProbe: ((key: string) => void) | undefined;
  private readonly defaultTtl: number;
  private readonly maxTtl: number;
  private readonly blockedCooldown: number;
  private readonly failedCooldown: number;
  private readonly sweepIntervalMs: number;
  private readonly maxActive: number;
  private readonly drainTimeoutMs: number;

  private readonly proxies = new Map<string, Entry>();
  private readonly leases = new Map<string, Lease>();
  private readonly expiries = new IndexedHeap<Lease>((a, b) => a.expiresAt < b.expiresAt);
  private readonly cooldownEnds = new IndexedHeap<{ at: number; entry: Entry; heapIndex: number }>(
    (a, b) => a.at < b.at,
  );
  private readonly views: ViewSet;
  private readonly targetCooldowns: TargetCooldowns;
  private readonly ended: EndedLeases;
  /** Entries restored from a checkpoint whose Proxy the feed has not delivered yet. */
  private readonly restored = new Map<string, Entry>();
  /** Bumped on every decision a checkpoint must carry; lets a checkpointer skip idle rounds. */
  private changeCount = 0;
  private grantSeq = 0;
  private timer: TimerHandle | undefined;
  private closed = false;

  constructor(opts: LeaseStoreOptions = {}) {
    this.clock = opts.clock ?? systemClock;
    this.log = opts.log ?? silentLogger();
    this.requestProbe = opts.requestProbe;
    this.defaultTtl = opts.defaultTtlSeconds ?? DEFAULT_TTL_SECONDS;
    this.maxTtl = opts.maxTtlSeconds ?? MAX_TTL_SECONDS;
    this.blockedCooldown = opts.blockedCooldownSeconds ?? DEFAULT_BLOCKED_COOLDOWN_SECONDS;
    this.failedCooldown = opts.failedCooldownSeconds ?? DEFAULT_FAILED_COOLDOWN_SECONDS;
    this.sweepIntervalMs = opts.sweepIntervalMs ?? 1000;
    this.views = new ViewSet(opts.maxViews ?? 64);
    this.maxActive = Math.max(1, opts.maxActiveLeases ?? DEFAULT_MAX_ACTIVE_LEASES);
    this.drainTimeoutMs = opts.drainTimeoutMs ?? DEFAULT_DRAIN_TIMEOUT_MS;
    this.targetCooldowns = new TargetCooldowns(
      opts.maxTargetCooldowns ?? DEFAULT_MAX_TARGET_COOLDOWNS,
      opts.onCooldownEvicted ?? (() => {}),
    );
    // As many recently ended leases as live ones: one lease's worth of memory each.
    this.ended = new EndedLeases(opts.reportableAfterEndMs ?? REPORTABLE_AFTER_END_MS, this.maxActive);
    this.schedule();
  }

  get maxTtlSeconds(): number {
    return this.maxTtl;
  }

  /** Changes since construction; equal values mean nothing a checkpoint carries has changed. */
  get changes(): number {
    return this.changeCount;
  }

  /** Per-target cooldown entries held now (ended ones are purged on the sweep timer). */
  targetCooldownCount(): number {
    this.tick();
    return this.targetCooldowns.size;
  }

  /** Stops the expiry timer. The store stays usable (expiry then happens lazily on calls). */
  close(): void {
    this.closed = true;
    if (this.timer) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
  }

  private schedule(): void {
    if (this.closed) return;
    this.timer = this.clock.setTimeout(() => {
      this.tick();
      this.schedule();
    }, this.sweepIntervalMs);
  }

  // ---- inputs from the feed and the health engine ----

  upsertProxy(info: ProxyInfo): void {
    this.tick();
    let existing = this.proxies.get(info.key);
    if (!existing) existing = this.adoptRestored(info.key, info.uid);
    if (existing && existing.uid === info.uid) {
      this.update(existing, () => this.assign(existing, info));
      return;
    }
    if (existing) this.detach(existing);
    const e = newEntry(info);
    this.assign(e, info);
    this.proxies.set(info.key, e);
    this.update(e, () => {});
  }

  private assign(e: Entry, info: ProxyInfo): void {
    e.labels = { ...info.labels };
    e.phase = info.phase;
    if (!e.healthFromVerdict) {
      e.healthy = info.healthy;
      if (info.latencyMillis !== undefined) e.latencyMillis = info.latencyMillis;
    }
    if (info.draining && !e.draining && e.drainingSince === 0) e.drainingSince = this.clock.now();
    if (!info.draining) e.drainingSince = 0;
    e.draining = info.draining;
    e.deleting = info.deleting;
    e.maxLeases = Math.max(0, Math.floor(info.maxLeases));
    e.host = info.host;
    e.port = info.port;
    e.url = info.host ? proxyUrlWithCredentials(info.host, info.port, info.credentials) : '';
    e.problem = info.problem;
  }

  /** Forgets a proxy: no new leases; existing leases stay valid until released or expired. */
  removeProxy(key: string): void {
    this.tick();
    const e = this.proxies.get(key);
    if (e) this.detach(e);
  }

  private detach(e: Entry): void {
    this.update(e, () => {
      e.removed = true;
    });
    this.proxies.delete(e.key);
  }

  /**
   * A health verdict (and optionally the latest probe latency). From the first call on, verdicts
   * win over the Healthy condition the feed passes in, which may lag behind. A stale uid (the
   * object was recreated under the same name) is ignored; returns whether it applied.
   */
  setHealth(
    key: string,
    uid: string | undefined,
    health: { healthy: boolean; latencyMillis?: number },
  ): boolean {
    this.tick();
    const e = this.proxies.get(key);
    if (!e || (uid !== undefined && uid !== '' && e.uid !== uid)) return false;
    if (
      e.healthFromVerdict &&
      e.healthy === health.healthy &&
      (health.latencyMillis === undefined || health.latencyMillis === e.latencyMillis)
    ) {
      return true;
    }
    this.update(e, () => {
      e.healthy = health.healthy;
      e.healthFromVerdict = true;
      if (health.latencyMillis !== undefined) e.latencyMillis = health.latencyMillis;
    });
    return true;
  }

  // ---- lease operations ----

  lease(req: LeaseRequest = {}): LeaseOutcome {
    const target = normalizeTarget(req.target);
    const selector = toSelector(req.selector);
    checkSeconds('ttlSeconds', req.ttlSeconds, this.maxTtl);
    checkNamespace(req.namespace);
    const namespace = req.namespace === '' ? undefined : req.namespace;
    this.tick();
    if (this.leases.size >= this.maxActive) throw new TooManyLeasesError(this.maxActive);
    const now = this.clock.now();
    const view = this.views.get(namespace, selector, this.proxies.values());
    const e = view.pick((c) => target === undefined || !coolingFor(c, target, now));
    if (!e) return { granted: false, counts: this.explain(namespace, selector, target, now) };
    this.grantSeq++;
    this.changeCount++;
    this.update(e, () => {
      e.active++;
      e.lastLeasedSeq = this.grantSeq;
      e.lastLeasedAt = now;
    });
    const lease: Lease = {
      id: randomUUID(),
      entry: e,
      target,
      expiresAt: now + (req.ttlSeconds ?? this.defaultTtl) * 1000,
      heapIndex: -1,
    };
    this.leases.set(lease.id, lease);
    this.expiries.push(lease);
    return {
      granted: true,
      grant: {
        id: lease.id,
        proxy: { namespace: e.namespace, name: e.name, url: e.url, host: e.host, port: e.port },
        target: target ?? null,
        expiresAt: iso(lease.expiresAt),
      },
    };
  }

  /** Extends a live lease to now + ttl; undefined when it is unknown or expired. */
  renew(id: string, ttlSeconds?: number): { id: string; expiresAt: string } | undefined {
    checkSeconds('ttlSeconds', ttlSeconds, this.maxTtl);
    this.tick();
    const lease = this.leases.get(id);
    if (!lease) return undefined;
    const now = this.clock.now();
    let expiresAt = now + (ttlSeconds ?? this.defaultTtl) * 1000;
    const e = lease.entry;
    if (e.draining && e.drainingSince > 0) {
      // A draining proxy is deleted at most the drain timeout after the drain began: no lease on
      // it outlives that, so the instance is never deleted under a renewed lease.
      const deadline = e.drainingSince + this.drainTimeoutMs;
      if (deadline <= now) {
        this.drop(lease, now);
        return undefined;
      }
      expiresAt = Math.min(expiresAt, deadline);
    }
    this.changeCount++;
    lease.expiresAt = expiresAt;
    this.expiries.update(lease);
    return { id, expiresAt: iso(lease.expiresAt) };
  }

  /** Idempotent; returns whether a live lease was released. */
  release(id: string): boolean {
    this.tick();
    const lease = this.leases.get(id);
    if (!lease) return false;
    this.drop(lease, this.clock.now());
    return true;
  }

  private drop(lease: Lease, now: number): void {
    this.changeCount++;
    this.ended.add(lease.id, { entry: lease.entry, target: lease.target, endedAt: now });
    this.leases.delete(lease.id);
    this.expiries.remove(lease);
    const e = lease.entry;
    this.update(e, () => {
      e.active--;
    });
  }

  /**
   * Outcome of using a lease. `blocked` cools the proxy down for the lease's target only
   * (a lease without a target cannot be blocked: LeaseInputError on `result`), `failed` cools
   * it down for everyone and asks for a re-probe. A lease released or expired within the last
   * 15 minutes can still be reported (nothing left to release). Returns false when the lease is
   * unknown.
   */
  report(id: string, req: ReportRequest): boolean {
    checkSeconds('cooldownSeconds', req.cooldownSeconds, MAX_COOLDOWN_SECONDS);
    if (req.result === 'success' && req.cooldownSeconds !== undefined) {
      throw new LeaseInputError('cooldownSeconds', 'cooldownSeconds applies only to blocked and failed');
    }
    this.tick();
    const now = this.clock.now();
    const lease = this.leases.get(id);
    const used = lease ?? this.ended.get(id, now);
    if (!used) return false;
    const e = used.entry;
    if (req.result === 'blocked') {
      if (used.target === undefined) {
        throw new LeaseInputError(
          'result',
          'result "blocked" needs a lease granted for a target; report "failed" for a proxy-wide problem',
        );
      }
      const until = now + (req.cooldownSeconds ?? this.blockedCooldown) * 1000;
      this.targetCooldowns.set(e, used.target, until);
      this.changeCount++;
    } else if (req.result === 'failed') {
      this.coolDown(e, now + (req.cooldownSeconds ?? this.failedCooldown) * 1000);
      try {
        this.requestProbe?.(e.key);
      } catch (err) {
        this.log.warn({ err, proxy: e.key }, 'requestProbe hook failed');
      }
    }
    if (lease && req.release !== false) this.drop(lease, now);
    return true;
  }

  private coolDown(e: Entry, until: number): void {
    if (until <= e.globalUntil) return;
    this.changeCount++;
    this.update(e, () => {
      e.globalUntil = until;
    });
    this.cooldownEnds.push({ at: until, entry: e, heapIndex: -1 });
  }

  activeLeases(): number {
    this.tick();
    return this.leases.size;
  }

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

  // ---- durable state (lease/durable) ----

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
      for (const [t, until] of e.targetUntil) if (until > now) targets.push([t, until]);
      const global = e.globalUntil > now ? e.globalUntil : 0;
      if (global === 0 && targets.length === 0 && e.drainingSince === 0) return;
      proxies.push([e.key, e.uid, global, e.drainingSince, targets]);
    };
    for (const e of this.proxies.values()) record(e);
    for (const e of this.restored.values()) record(e);
    const leases: LeaseState['leases'] = [];
    for (const l of this.leases.values()) {
      leases.push([l.id, l.entry.key, l.entry.uid, l.target ?? null, l.expiresAt]);
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
    for (const [id, key, uid, target, expiresAt] of state.leases) {
      if (expiresAt <= now || this.leases.has(id)) continue;
      const e = this.entryFor(key, uid);
      if (!e) continue;
      const lease: Lease = { id, entry: e, target: target ?? undefined, expiresAt, heapIndex: -1 };
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

  /** A restored entry for `key`, moved into the fleet when the feed delivers the same uid. */
  private adoptRestored(key: string, uid: string): Entry | undefined {
    const held = this.restored.get(key);
    if (!held) return undefined;
    this.restored.delete(key);
    if (held.uid !== uid) return undefined;
    this.proxies.set(key, held);
    return held;
  }

  // ---- internals ----

  /** Releases expired leases, re-admits proxies whose global cooldown ended, purges what ended. */
  private tick(): void {
    const now = this.clock.now();
    for (let top = this.expiries.peek(); top && top.expiresAt <= now; top = this.expiries.peek()) {
      this.drop(top, now);
    }
    this.targetCooldowns.purge(now);
    this.ended.purge(now);
    for (let top = this.cooldownEnds.peek(); top && top.at <= now; top = this.cooldownEnds.peek()) {
      this.cooldownEnds.pop();
      const e = top.entry;
      if (!e.indexed && e.globalUntil <= now) this.update(e, () => {});
    }
  }

  /** Takes `e` out of every view, applies the change, and puts it back where it now belongs. */
  private update(e: Entry, mutate: () => void): void {
    if (e.indexed) {
      this.views.remove(e);
      e.indexed = false;
    }
    mutate();
    if (isEligible(e, this.clock.now())) {
      this.views.add(e);
      e.indexed = true;
    }
  }

  /** The refusal funnel: scans the fleet, but only on the failure path. */
  private explain(
    namespace: string | undefined,
    selector: Selector | undefined,
    target: string | undefined,
    now: number,
  ): NoneLeasableCounts {
    const matching = [...this.proxies.values()].filter((e) => matchesFilter(e, namespace, selector));
    return refusalCounts(matching, target, now);
  }
}
