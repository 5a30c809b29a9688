/**
 * lease/store — the in-memory lease store behind the discovery API (see docs/lease-api.md): which
 * proxies may be handed out right now, to whom, for how long, and which are cooling down
 * globally or for one target. A facade over its parts, each with one job: the fleet
 * (lease/fleet), choosing a proxy (lease/selection), cooldowns (lease/cooldowns), the live and
 * recently ended leases (lease/lease-table) and the durable state (lease/durability). It checks
 * what clients send, brings the parts up to the clock before every call, and hands the call on.
 *
 * Memory is bounded (docs/operations.md): ended cooldowns are purged on the sweep timer, live
 * leases are capped (`maxActiveLeases`, then TooManyLeasesError), per-target cooldowns are
 * capped evicting the soonest-ending first, and ended leases stay reportable for 15 minutes
 * within a byte budget (lease/ended).
 */
import { silentLogger } from '../log/index.ts';
import { type Clock, systemClock, type TimerHandle } from '../runtime/clock.ts';
import { ChangeCounter } from './changes.ts';
import { Cooldowns } from './cooldowns.ts';
import { Durability } from './durability.ts';
import type { LeaseState } from './durable.ts';
import {
  DEFAULT_ENDED_CONNECTION_BYTES,
  DEFAULT_ENDED_LEASE_BYTES,
  type LateReports,
  REPORTABLE_AFTER_END_MS,
} from './ended.ts';
import { LeaseInputError } from './errors.ts';
import { Fleet } from './fleet.ts';
import { checkNamespace, checkReport, checkSeconds, toSelector } from './input.ts';
import { LeaseTable } from './lease-table.ts';
import { DEFAULT_DRAIN_TIMEOUT_MS, DEFAULT_MAX_ACTIVE_LEASES, type LeaseStoreOptions } from './options.ts';
import { Selection } from './selection.ts';
import { normalizeTarget } from './target.ts';
import { DEFAULT_MAX_TARGET_COOLDOWNS } from './target-cooldowns.ts';
import {
  type CooldownOrigin,
  DEFAULT_BLOCKED_COOLDOWN_SECONDS,
  DEFAULT_FAILED_COOLDOWN_SECONDS,
  DEFAULT_TTL_SECONDS,
  type LeaseOutcome,
  type LeaseRequest,
  type LeaseVia,
  type LiveLeases,
  MAX_TTL_SECONDS,
  type ProxyInfo,
  type ProxyReportRequest,
  type ProxySnapshot,
  type ReportRequest,
  type SnapshotFilter,
} from './types.ts';

/**
 * What an adapter building on the store (gateway/lease-adapter) may use of its parts besides the
 * methods: read the fleet, hear of target cooldowns, and grant on a proxy it chose by the leasing
 * rules (lease/entry), after `sweep()` and `checkRoom()`.
 */
export interface LeaseStoreParts {
  fleet: Pick<Fleet, 'get' | 'all'>;
  cooldowns: Pick<Cooldowns, 'watch'>;
  table: Pick<LeaseTable, 'checkRoom' | 'grant' | 'get'>;
}

export class LeaseStore {
  readonly parts: LeaseStoreParts;
  private readonly fleet: Fleet;
  private readonly cooldowns: Cooldowns;
  private readonly table: LeaseTable;
  private readonly selection: Selection;
  private readonly durability: Durability;
  private readonly changeCounter = new ChangeCounter();
  private readonly clock: Clock;
  private readonly maxTtl: number;
  private readonly sweepIntervalMs: number;
  private timer: TimerHandle | undefined;
  private closed = false;

  constructor(opts: LeaseStoreOptions = {}) {
    this.clock = opts.clock ?? systemClock;
    this.maxTtl = opts.maxTtlSeconds ?? MAX_TTL_SECONDS;
    this.sweepIntervalMs = opts.sweepIntervalMs ?? 1000;
    const changes = this.changeCounter;
    this.selection = new Selection(
      { maxViews: opts.maxViews ?? 64, hotTargetSkips: opts.hotTargetSkips },
      this.clock,
      changes,
      { proxies: () => this.fleet.all(), leases: () => this.table.live() },
    );
    this.cooldowns = new Cooldowns(
      {
        blockedCooldownSeconds: opts.blockedCooldownSeconds ?? DEFAULT_BLOCKED_COOLDOWN_SECONDS,
        failedCooldownSeconds: opts.failedCooldownSeconds ?? DEFAULT_FAILED_COOLDOWN_SECONDS,
        maxTargetCooldowns: opts.maxTargetCooldowns ?? DEFAULT_MAX_TARGET_COOLDOWNS,
        onCooldownEvicted: opts.onCooldownEvicted ?? (() => {}),
        requestProbe: opts.requestProbe,
        log: opts.log ?? silentLogger(),
      },
      this.selection,
      changes,
    );
    this.fleet = new Fleet(this.selection, this.cooldowns, this.clock);
    this.table = new LeaseTable(
      {
        defaultTtlSeconds: opts.defaultTtlSeconds ?? DEFAULT_TTL_SECONDS,
        maxActiveLeases: Math.max(1, opts.maxActiveLeases ?? DEFAULT_MAX_ACTIVE_LEASES),
        drainTimeoutMs: opts.drainTimeoutMs ?? DEFAULT_DRAIN_TIMEOUT_MS,
        reportableAfterEndMs: opts.reportableAfterEndMs ?? REPORTABLE_AFTER_END_MS,
        perLeaseCredentials: opts.perLeaseCredentials,
        endedLeaseBytes: opts.endedLeaseBytes ?? DEFAULT_ENDED_LEASE_BYTES,
        endedConnectionBytes: opts.endedConnectionBytes ?? DEFAULT_ENDED_CONNECTION_BYTES,
        onEndedLeaseEvicted: opts.onEndedLeaseEvicted ?? (() => {}),
      },
      this.selection,
      changes,
    );
    this.durability = new Durability(this.fleet, this.cooldowns, this.table, changes);
    this.parts = { fleet: this.fleet, cooldowns: this.cooldowns, table: this.table };
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
    return this.changeCounter.decisions;
  }

  /**
   * Brings the parts up to now — ends expired leases, forgets ended cooldowns, lets proxies
   * whose cooldown ended back in — and returns now. Every call does this first; the sweep timer
   * does it without traffic.
   */
  sweep(): number {
    const now = this.clock.now();
    this.table.expire(now);
    this.cooldowns.purge(now);
    return now;
  }

  /** Stops the sweep timer. The store stays usable (every call still sweeps first). */
  close(): void {
    this.closed = true;
    if (this.timer) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
  }

  // ---- inputs from the feed and the health engine ----

  upsertProxy(info: ProxyInfo): void {
    this.sweep();
    this.fleet.upsert(info);
  }

  /** Forgets a proxy: no new leases; existing leases stay valid until released or expired. */
  removeProxy(key: string): void {
    this.sweep();
    this.fleet.remove(key);
  }

  /** A health verdict; see Fleet.setHealth. Returns whether it applied. */
  setHealth(
    key: string,
    uid: string | undefined,
    health: { healthy: boolean; latencyMillis?: number },
  ): boolean {
    this.sweep();
    return this.fleet.setHealth(key, uid, health);
  }

  // ---- the lease API ----

  /**
   * `affinity`: bind by rendezvous hashing of this key instead of least-used (lease/view).
   * `via`: who asks (the gateway for its connections; the dashboard shows it); `lateReports`: who
   * may report the lease once it has ended (lease/ended), an API client by default.
   */
  lease(
    req: LeaseRequest = {},
    affinity?: string,
    via: LeaseVia = 'api',
    lateReports: LateReports = 'client',
  ): LeaseOutcome {
    const target = normalizeTarget(req.target);
    const selector = toSelector(req.selector);
    checkSeconds('ttlSeconds', req.ttlSeconds, this.maxTtl);
    checkNamespace(req.namespace);
    const namespace = req.namespace === '' ? undefined : req.namespace;
    const now = this.sweep();
    this.table.checkRoom();
    const view = this.selection.view(namespace, selector);
    const e = affinity === undefined ? view.pick(target, now) : view.pickFor(affinity, target, now);
    if (!e) return { granted: false, ...this.selection.refusal(view, target, now) };
    return { granted: true, grant: this.table.grant(e, target, req.ttlSeconds, now, via, lateReports) };
  }

  /** Extends a live lease to now + ttl; undefined when it is unknown or expired. */
  renew(id: string, ttlSeconds?: number): { id: string; expiresAt: string } | undefined {
    checkSeconds('ttlSeconds', ttlSeconds, this.maxTtl);
    const now = this.sweep();
    return this.table.renew(id, ttlSeconds, now);
  }

  /** Idempotent; returns whether a live lease was released. */
  release(id: string): boolean {
    const now = this.sweep();
    const lease = this.table.get(id);
    if (!lease) return false;
    this.table.end(lease, now);
    return true;
  }

  /**
   * Outcome of using a lease. `blocked` cools the proxy down for the lease's target only, with
   * every proxy sharing its egress IP (a lease without a target cannot be blocked:
   * LeaseInputError on `result`), `failed` cools it down for everyone and asks for a re-probe.
   * A lease released or expired within the last 15 minutes can still be reported (nothing left
   * to release). Returns false when the lease is unknown.
   */
  report(id: string, req: ReportRequest): boolean {
    checkReport(req);
    const now = this.sweep();
    const lease = this.table.get(id);
    const used = lease ?? this.table.recentlyEnded(id, now);
    if (!used) return false;
    if (req.result === 'blocked' && used.target === undefined) {
      throw new LeaseInputError(
        'result',
        'result "blocked" needs a lease granted for a target; report "failed" for a proxy-wide problem',
      );
    }
    this.cooldowns.report(used.entry, used.target, req, now);
    if (lease && req.release !== false) this.table.end(lease, now);
    return true;
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
    const now = this.sweep();
    const e = this.fleet.get(`${req.namespace}/${req.name}`);
    if (!e) return false;
    this.cooldowns.report(e, target, req, now);
    return true;
  }

  /** What the store knows about every proxy matching the filter, by namespace and name. */
  snapshot(filter: SnapshotFilter = {}): ProxySnapshot[] {
    return this.snapshotPage(filter).proxies;
  }

  /**
   * `GET /v1/proxies`: the proxies matching the filter, all or one page of at most `limit`
   * starting after `after` (the `continue` of the page before), and where the next page starts.
   */
  snapshotPage(
    filter: SnapshotFilter,
    page: { limit?: number; after?: string } = {},
  ): { proxies: ProxySnapshot[]; continue?: string } {
    const target = normalizeTarget(filter.target);
    const selector = toSelector(filter.selector);
    checkNamespace(filter.namespace);
    const namespace = filter.namespace === '' ? undefined : filter.namespace;
    const now = this.sweep();
    const { proxies, more } = this.fleet.snapshot(namespace, selector, target, now, page);
    const last = proxies[proxies.length - 1];
    return more && last ? { proxies, continue: `${last.namespace}/${last.name}` } : { proxies };
  }

  // ---- for the dashboard ----

  /** Every live lease counted by origin, and the newest `limit` (full ids: the caller cuts them). */
  liveLeases(limit: number): LiveLeases {
    this.sweep();
    return this.table.newest(limit);
  }

  /**
   * The live per-target cooldowns proxies took on from another proxy on their egress address:
   * proxy key → target → where it came from. Their own cooldowns are not listed.
   */
  cooldownOrigins(): Map<string, Map<string, CooldownOrigin>> {
    const now = this.sweep();
    const out = new Map<string, Map<string, CooldownOrigin>>();
    for (const e of this.fleet.all()) {
      for (const c of e.targetUntil.values()) {
        if (!c.from || c.at <= now) continue;
        let byTarget = out.get(e.key);
        if (!byTarget) {
          byTarget = new Map();
          out.set(e.key, byTarget);
        }
        byTarget.set(c.target, c.from);
      }
    }
    return out;
  }

  // ---- counts for drains, metrics and proxies that enforce leases ----

  /** Live leases of proxy `key` granted while it served from `instance` (a drain waits for them). */
  leasesOn(key: string, instance: string): number {
    this.sweep();
    return this.fleet.leasesOn(key, instance);
  }

  activeLeases(): number {
    this.sweep();
    return this.table.size;
  }

  /** Ended leases still held for late reports, and their bytes, per holder (lease/ended). */
  endedLeaseStats(): Record<'client' | 'session', { leases: number; bytes: number }> {
    this.sweep();
    return this.table.endedStats();
  }

  /** Per-target cooldown entries held now (ended ones are purged on the sweep timer). */
  targetCooldownCount(): number {
    this.sweep();
    return this.cooldowns.targetCount;
  }

  /**
   * Whether `username`/`password` are the credentials of a live lease granted on `instance`
   * (asked by a proxy that enforces leases on every request and CONNECT).
   */
  acceptsLeaseCredentials(instance: string, username: string, password: string): boolean {
    this.sweep();
    return this.table.acceptsCredentials(instance, username, password);
  }

  // ---- durable state (lease/checkpoint) ----

  /** Everything a restart or a new leader must not forget, as of now. */
  exportState(): LeaseState {
    return this.durability.exportState(this.sweep());
  }

  /** Merges a checkpoint in, normally into an empty store before serving (lease/durability). */
  restoreState(state: LeaseState): { leases: number; proxies: number } {
    return this.durability.restoreState(state, this.sweep());
  }

  private schedule(): void {
    if (this.closed) return;
    this.timer = this.clock.setTimeout(() => {
      this.sweep();
      this.schedule();
    }, this.sweepIntervalMs);
  }
}
