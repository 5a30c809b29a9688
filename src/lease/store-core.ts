/**
 * lease/store-core — the in-memory lease store behind the discovery API (see docs/api.md): which
 * proxies may be handed out right now, to whom, for how long, and which are cooling down
 * globally or for one target.
 *
 * Grants do not scan the fleet. Every eligible proxy (see lease/entry: serving at an address,
 * healthy, not draining/deleting, not in a global cooldown, below maxLeases) sits in a *view*
 * (lease/view): buckets by active-lease count, each a sorted list by (least recently leased,
 * latency, name). A grant walks the lowest bucket from the front; for a target many proxies cool
 * down for, the view keeps the proxies not cooling for it (lease/view), so the walk does not
 * skip them one by one. Views exist per distinct (namespace, selector) a client asks for
 * (LRU-bounded); the unfiltered view always exists. Cost per grant: O(views + log n). A refused
 * grant's "why nothing" counts come from each view's census (lease/census), kept as proxies
 * change: O(1), after one walk the first time a view is refused for a target; its retryAt
 * (lease/retry-at) walks the view's proxies once and is kept until anything in the store changes.
 *
 * Memory is bounded (docs/operations.md): ended cooldowns are purged on the sweep timer, live
 * leases are capped (`maxActiveLeases`, then TooManyLeasesError), per-target cooldowns are
 * capped evicting the soonest-ending first, and ended leases stay reportable for 15 minutes
 * under a count cap. lease/store adds the durable state on top.
 */
import type { Logger } from 'pino';
import { proxyUrlWithCredentials } from '../api/url.ts';
import { silentLogger } from '../log/index.ts';
import { type Clock, systemClock, type TimerHandle } from '../runtime/clock.ts';
import { standingOf } from './census.ts';
import { DEFAULT_MAX_TARGET_COOLDOWNS, TargetCooldowns } from './cooldowns.ts';
import { EgressGroups } from './egress-groups.ts';
import { EndedLeases, REPORTABLE_AFTER_END_MS } from './ended.ts';
import { countLease, type Entry, newEntry } from './entry.ts';
import { checkNamespace, checkSeconds, toSelector } from './input.ts';
import { drainStart, iso, type Lease, newLeaseId } from './lease.ts';
import { issueLeaseCredentials } from './lease-credentials.ts';
import { IndexedHeap } from './ordered.ts';
import { earliestLeaseEnds, retryAt } from './retry-at.ts';
import { normalizeTarget } from './target.ts';
import {
  DEFAULT_BLOCKED_COOLDOWN_SECONDS,
  DEFAULT_FAILED_COOLDOWN_SECONDS,
  DEFAULT_TTL_SECONDS,
  type LeaseGrant,
  type LeaseOutcome,
  type LeaseRequest,
  MAX_TTL_SECONDS,
  type ProxyInfo,
} from './types.ts';
import { type View, ViewSet } from './view.ts';

export { LeaseInputError } from './target.ts';

import {
  DEFAULT_DRAIN_TIMEOUT_MS,
  DEFAULT_MAX_ACTIVE_LEASES,
  type LeaseStoreOptions,
  TooManyLeasesError,
} from './options.ts';

export {
  DEFAULT_DRAIN_TIMEOUT_MS,
  DEFAULT_MAX_ACTIVE_LEASES,
  type LeaseStoreOptions,
  TooManyLeasesError,
} from './options.ts';

export class LeaseStoreCore {
  protected readonly clock: Clock;
  protected readonly log: Logger;
  protected readonly requestProbe: ((key: string) => void) | undefined;
  protected readonly defaultTtl: number;
  protected readonly maxTtl: number;
  protected readonly blockedCooldown: number;
  protected readonly failedCooldown: number;
  protected readonly sweepIntervalMs: number;
  protected readonly maxActive: number;
  protected readonly drainTimeoutMs: number;
  protected readonly perLease: ((instance: string) => boolean) | undefined;

  protected readonly proxies = new Map<string, Entry>();
  protected readonly leases = new Map<string, Lease>();
  protected readonly expiries = new IndexedHeap<Lease>((a, b) => a.expiresAt < b.expiresAt);
  protected readonly cooldownEnds = new IndexedHeap<{ at: number; entry: Entry; heapIndex: number }>(
    (a, b) => a.at < b.at,
  );
  protected readonly views: ViewSet;
  protected readonly targetCooldowns: TargetCooldowns;
  /** Proxies by source address: one `blocked` report cools down every proxy leaving from it. */
  protected readonly egressGroups: EgressGroups;
  protected readonly ended: EndedLeases;
  /** Entries restored from a checkpoint whose Proxy the feed has not delivered yet. */
  protected readonly restored = new Map<string, Entry>();
  /** Bumped on every decision a checkpoint must carry; lets a checkpointer skip idle rounds. */
  protected changeCount = 0;
  /** Bumped on every change to an entry or a cooldown; with changeCount, whether anything changed. */
  private updates = 0;
  protected grantSeq = 0;
  protected timer: TimerHandle | undefined;
  protected closed = false;

  constructor(opts: LeaseStoreOptions = {}) {
    this.clock = opts.clock ?? systemClock;
    this.log = opts.log ?? silentLogger();
    this.requestProbe = opts.requestProbe;
    this.defaultTtl = opts.defaultTtlSeconds ?? DEFAULT_TTL_SECONDS;
    this.maxTtl = opts.maxTtlSeconds ?? MAX_TTL_SECONDS;
    this.blockedCooldown = opts.blockedCooldownSeconds ?? DEFAULT_BLOCKED_COOLDOWN_SECONDS;
    this.failedCooldown = opts.failedCooldownSeconds ?? DEFAULT_FAILED_COOLDOWN_SECONDS;
    this.sweepIntervalMs = opts.sweepIntervalMs ?? 1000;
    this.views = new ViewSet(opts.maxViews ?? 64, opts.hotTargetSkips);
    this.maxActive = Math.max(1, opts.maxActiveLeases ?? DEFAULT_MAX_ACTIVE_LEASES);
    this.drainTimeoutMs = opts.drainTimeoutMs ?? DEFAULT_DRAIN_TIMEOUT_MS;
    this.perLease = opts.perLeaseCredentials;
    this.targetCooldowns = new TargetCooldowns(
      opts.maxTargetCooldowns ?? DEFAULT_MAX_TARGET_COOLDOWNS,
      opts.onCooldownEvicted ?? (() => {}),
      (e, target, sign) => {
        this.updates++;
        this.views.cooling(e, target, sign);
      },
    );
    this.egressGroups = new EgressGroups(opts.maxTargetCooldowns ?? DEFAULT_MAX_TARGET_COOLDOWNS);
    // As many recently ended leases as live ones: one lease's worth of memory each.
    this.ended = new EndedLeases(opts.reportableAfterEndMs ?? REPORTABLE_AFTER_END_MS, this.maxActive);
    this.schedule();
  }

  /** The store's clock reading: the time its answers (expiresAt, retryAt) are measured in. */
  now(): number {
    return this.clock.now();
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

  protected schedule(): void {
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

  protected assign(e: Entry, info: ProxyInfo): void {
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
    e.instance = info.instance ?? '';
    e.drainingInstances = info.drainingInstances ?? [];
    this.egressGroups.place(e, info.egressIP, this.targetCooldowns, this.clock.now());
  }

  /** Forgets a proxy: no new leases; existing leases stay valid until released or expired. */
  removeProxy(key: string): void {
    this.tick();
    const e = this.proxies.get(key);
    if (e) this.detach(e);
  }

  protected detach(e: Entry): void {
    this.update(e, () => {
      e.removed = true;
    });
    this.egressGroups.leave(e);
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

  /** `affinity`: bind by rendezvous hashing of this key instead of least-used (lease/view). */
  lease(req: LeaseRequest = {}, affinity?: string): LeaseOutcome {
    const target = normalizeTarget(req.target);
    const selector = toSelector(req.selector);
    checkSeconds('ttlSeconds', req.ttlSeconds, this.maxTtl);
    checkNamespace(req.namespace);
    const namespace = req.namespace === '' ? undefined : req.namespace;
    this.tick();
    if (this.leases.size >= this.maxActive) throw new TooManyLeasesError(this.maxActive);
    const now = this.clock.now();
    const view = this.views.get(namespace, selector, this.proxies.values());
    const e = affinity === undefined ? view.pick(target, now) : view.pickFor(affinity, target, now);
    if (!e) {
      const counts = view.refusal(target, this.proxies.values());
      return { granted: false, counts, retryAt: this.retryAt(view, target, now) };
    }
    return { granted: true, grant: this.grant(e, target, req.ttlSeconds, now) };
  }

  /** Grants a lease on `e` (which the leasing rules allow now) for `target`. */
  protected grant(
    e: Entry,
    target: string | undefined,
    ttlSeconds: number | undefined,
    now: number,
  ): LeaseGrant {
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
      target,
      instance: e.instance,
      expiresAt: now + (ttlSeconds ?? this.defaultTtl) * 1000,
      heapIndex: -1,
    };
    let url = e.url;
    if (e.instance !== '' && this.perLease?.(e.instance)) {
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

  /** Extends a live lease to now + ttl; undefined when it is unknown or expired. */
  renew(id: string, ttlSeconds?: number): { id: string; expiresAt: string } | undefined {
    checkSeconds('ttlSeconds', ttlSeconds, this.maxTtl);
    this.tick();
    const lease = this.leases.get(id);
    if (!lease) return undefined;
    const now = this.clock.now();
    let expiresAt = now + (ttlSeconds ?? this.defaultTtl) * 1000;
    const e = lease.entry;
    // A draining proxy, or the replaced instance a lease was granted on, is deleted at most the
    // drain timeout after the drain began: no lease on it outlives that, so the instance is
    // never deleted under a renewed lease.
    const since = drainStart(e, lease.instance);
    if (since > 0) {
      const deadline = since + this.drainTimeoutMs;
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

  protected drop(lease: Lease, now: number): void {
    this.changeCount++;
    this.ended.add(lease.id, { entry: lease.entry, target: lease.target, endedAt: now });
    this.leases.delete(lease.id);
    this.expiries.remove(lease);
    const e = lease.entry;
    countLease(e, lease.instance, -1);
    this.update(e, () => {
      e.active--;
    });
  }

  protected coolDown(e: Entry, until: number): void {
    if (until <= e.globalUntil) return;
    this.changeCount++;
    this.update(e, () => {
      e.globalUntil = until;
    });
    this.cooldownEnds.push({ at: until, entry: e, heapIndex: -1 });
  }

  /** Live leases of proxy `key` granted while it served from `instance` (a drain waits for them). */
  leasesOn(key: string, instance: string): number {
    this.tick();
    return this.proxies.get(key)?.activeByInstance.get(instance) ?? 0;
  }

  activeLeases(): number {
    this.tick();
    return this.leases.size;
  }

  // ---- internals ----

  /** A restored entry for `key`, moved into the fleet when the feed delivers the same uid. */
  protected adoptRestored(key: string, uid: string): Entry | undefined {
    const held = this.restored.get(key);
    if (!held) return undefined;
    this.restored.delete(key);
    if (held.uid !== uid) return undefined;
    this.proxies.set(key, held);
    return held;
  }

  /** Releases expired leases, re-admits proxies whose global cooldown ended, purges what ended. */
  protected tick(): void {
    const now = this.clock.now();
    for (let top = this.expiries.peek(); top && top.expiresAt <= now; top = this.expiries.peek()) {
      this.drop(top, now);
    }
    this.targetCooldowns.purge(now);
    this.egressGroups.purge(now);
    this.ended.purge(now);
    for (let top = this.cooldownEnds.peek(); top && top.at <= now; top = this.cooldownEnds.peek()) {
      this.cooldownEnds.pop();
      const e = top.entry;
      if (!e.indexed && e.globalUntil <= now) this.update(e, () => {});
    }
  }

  /**
   * Takes `e` out of every view and census, applies the change, and puts it back where it now
   * belongs. While `mutate` runs `e` is uncounted, so cooldowns set inside it are counted once,
   * afterwards.
   */
  protected update(e: Entry, mutate: () => void): void {
    this.updates++;
    if (e.indexed) {
      this.views.remove(e);
      e.indexed = false;
    }
    if (e.standing !== undefined) {
      this.views.count(e, e.standing, -1);
      e.standing = undefined;
    }
    mutate();
    const standing = standingOf(e, this.clock.now());
    if (standing === undefined) return;
    e.standing = standing;
    this.views.count(e, standing, 1);
    if (standing === 'leasable') {
      this.views.add(e);
      e.indexed = true;
    }
  }

  /**
   * When to ask again after a refusal (lease/retry-at). One walk of the view's proxies and
   * leases, kept for repeated refusals until anything in the store changes.
   */
  protected retryAt(view: View, target: string | undefined, now: number): number | undefined {
    return view.retryAt(target, this.changeCount + this.updates, () =>
      retryAt(view.counted(this.proxies.values()), target, now, earliestLeaseEnds(this.leases.values())),
    );
  }
}
