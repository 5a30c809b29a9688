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
 */
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { proxyUrlWithCredentials } from '../api/url.ts';
import { silentLogger } from '../log/index.ts';
import { type Clock, systemClock, type TimerHandle } from '../runtime/clock.ts';
import type { Selector } from '../runtime/selector.ts';
import {
  coolingFor,
  countLease,
  type Entry,
  isEligible,
  newEntry,
  refusalCounts,
  snapshotOf,
} from './entry.ts';
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
}

interface Lease {
  id: string;
  entry: Entry;
  target: string | undefined;
  /** The instance (providerID) the proxy served from at the grant: a drain waits for it. */
  instance: string;
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

  private readonly proxies = new Map<string, Entry>();
  private readonly leases = new Map<string, Lease>();
  private readonly expiries = new IndexedHeap<Lease>((a, b) => a.expiresAt < b.expiresAt);
  private readonly cooldownEnds = new IndexedHeap<{ at: number; entry: Entry; heapIndex: number }>(
    (a, b) => a.at < b.at,
  );
  private readonly views: ViewSet;
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
    this.schedule();
  }

  get maxTtlSeconds(): number {
    return this.maxTtl;
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
    const existing = this.proxies.get(info.key);
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
    e.draining = info.draining;
    e.deleting = info.deleting;
    e.maxLeases = Math.max(0, Math.floor(info.maxLeases));
    e.host = info.host;
    e.port = info.port;
    e.url = info.host ? proxyUrlWithCredentials(info.host, info.port, info.credentials) : '';
    e.problem = info.problem;
    e.instance = info.instance ?? '';
    e.drainingInstances = info.drainingInstances ?? [];
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
    const now = this.clock.now();
    const view = this.views.get(namespace, selector, this.proxies.values());
    const e = view.pick((c) => target === undefined || !coolingFor(c, target, now));
    if (!e) return { granted: false, counts: this.explain(namespace, selector, target, now) };
    this.grantSeq++;
    this.update(e, () => {
      e.active++;
      e.lastLeasedSeq = this.grantSeq;
      e.lastLeasedAt = now;
    });
    const lease: Lease = {
      id: randomUUID(),
      entry: e,
      target,
      instance: e.instance,
      expiresAt: now + (req.ttlSeconds ?? this.defaultTtl) * 1000,
      heapIndex: -1,
    };
    countLease(e, lease.instance, 1);
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
    lease.expiresAt = this.clock.now() + (ttlSeconds ?? this.defaultTtl) * 1000;
    this.expiries.update(lease);
    return { id, expiresAt: iso(lease.expiresAt) };
  }

  /** Idempotent; returns whether a live lease was released. */
  release(id: string): boolean {
    this.tick();
    const lease = this.leases.get(id);
    if (!lease) return false;
    this.drop(lease);
    return true;
  }

  private drop(lease: Lease): void {
    this.leases.delete(lease.id);
    this.expiries.remove(lease);
    const e = lease.entry;
    countLease(e, lease.instance, -1);
    this.update(e, () => {
      e.active--;
    });
  }

  /**
   * Outcome of using a lease. `blocked` cools the proxy down for the lease's target only
   * (a lease without a target cannot be blocked: LeaseInputError on `result`), `failed` cools
   * it down for everyone and asks for a re-probe. Returns false when the lease is not live.
   */
  report(id: string, req: ReportRequest): boolean {
    checkSeconds('cooldownSeconds', req.cooldownSeconds, MAX_COOLDOWN_SECONDS);
    if (req.result === 'success' && req.cooldownSeconds !== undefined) {
      throw new LeaseInputError('cooldownSeconds', 'cooldownSeconds applies only to blocked and failed');
    }
    this.tick();
    const lease = this.leases.get(id);
    if (!lease) return false;
    const e = lease.entry;
    const now = this.clock.now();
    if (req.result === 'blocked') {
      if (lease.target === undefined) {
        throw new LeaseInputError(
          'result',
          'result "blocked" needs a lease granted for a target; report "failed" for a proxy-wide problem',
        );
      }
      const until = now + (req.cooldownSeconds ?? this.blockedCooldown) * 1000;
      e.targetUntil.set(lease.target, Math.max(until, e.targetUntil.get(lease.target) ?? 0));
    } else if (req.result === 'failed') {
      const until = Math.max(e.globalUntil, now + (req.cooldownSeconds ?? this.failedCooldown) * 1000);
      this.update(e, () => {
        e.globalUntil = until;
      });
      this.cooldownEnds.push({ at: until, entry: e, heapIndex: -1 });
      try {
        this.requestProbe?.(e.key);
      } catch (err) {
        this.log.warn({ err, proxy: e.key }, 'requestProbe hook failed');
      }
    }
    if (req.release !== false) this.drop(lease);
    return true;
  }

  activeLeases(): number {
    this.tick();
    return this.leases.size;
  }

  /** Live leases of proxy `key` granted while it served from `instance` (a drain waits for them). */
  leasesOn(key: string, instance: string): number {
    this.tick();
    return this.proxies.get(key)?.activeByInstance.get(instance) ?? 0;
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

  // ---- internals ----

  /** Releases expired leases and re-admits proxies whose global cooldown ended. */
  private tick(): void {
    const now = this.clock.now();
    for (let top = this.expiries.peek(); top && top.expiresAt <= now; top = this.expiries.peek()) {
      this.drop(top);
    }
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
