/**
 * gateway/replica — upstream choice on a gateway replica in cluster mode (docs/architecture.md,
 * "Gateway scale-out"), with no call to the leader per connection. The replica keeps a lease
 * store of its own, a mirror of the upstreams the leader's hub last described (their state,
 * labels and per-target cooldowns) whose capacity is the share this replica holds (slot
 * leases), and chooses with the same LeaseStoreChooser (gateway/upstreams) standalone runs over
 * the real store: selector, health, cooldowns, least-used order, sticky sessions by rendezvous
 * hashing and capacity are one code path in both modes. It asks its link for more share when an
 * upstream runs short, gives back what it no longer needs, and reports blocks and failures to
 * the leader, which the mirror applies at once for LOCAL_COOLDOWN_SECONDS until the leader's
 * cooldown arrives.
 */

import { selectableLabels } from '../api/location.ts';
import { LeaseInputError } from '../lease/errors.ts';
import { toSelector } from '../lease/input.ts';
import { LeaseStore } from '../lease/store.ts';
import { normalizeTarget } from '../lease/target.ts';
import type { ProxyInfo, ReportResult } from '../lease/types.ts';
import { MAX_COOLDOWN_SECONDS } from '../lease/types.ts';
import type { Clock } from '../runtime/clock.ts';
import { matchesSelector } from '../runtime/selector.ts';
import type { SessionTable } from './sessions.ts';
import {
  parseSyncAnswer,
  type SessionAnswer,
  type Slot,
  type SyncAnswer,
  type SyncReport,
  type UpstreamState,
} from './share.ts';
import {
  type Acquired,
  type AcquireOutcome,
  LeaseStoreChooser,
  type Upstream,
  type UpstreamChooser,
} from './upstreams.ts';
import type { RoutingOptions } from './username.ts';

/** How long a replica keeps an upstream it saw blocked or fail out, before the leader's cooldown arrives. */
export const LOCAL_COOLDOWN_SECONDS = 60;
/** How long a connection waits for this replica's share to grow before it gets 503. */
export const SHARE_WAIT_MS = 3000;
/** The mirror never ends a connection for a drain: the leader's share decides (see renew). */
const MIRROR_DRAIN_TIMEOUT_MS = 365 * 24 * 3_600_000;

interface Known extends UpstreamState {
  /** What selectors match: labels plus the location's topology keys (api/location). */
  selectable: Readonly<Record<string, string>>;
  slots: Slot[];
  inUse: number;
  upstream: Upstream | undefined;
  /** What the mirror store was last told about it (skips unchanged upserts). */
  mirrored: string;
}

/**
 * What the link sends next: wanted shares, give-backs and reports. With `shareToken` a delta:
 * `want` holds only the upstreams whose wanted share changed (0 = none), and no `held`.
 */
export interface ShareRequest {
  shareToken?: string;
  want: Record<string, number>;
  release: string[];
  held?: Record<string, string[]>;
  reports: SyncReport[];
  sessionAnswers: SessionAnswer[];
}

export class ReplicaChooser implements UpstreamChooser {
  private readonly clock: Clock;
  /** The leader's fleet with this replica's share as each upstream's capacity. */
  private readonly mirror: LeaseStore;
  private readonly chooser: LeaseStoreChooser;
  private known = new Map<string, Known>();
  /** Open connections: lease in the mirror → upstream. */
  private readonly open = new Map<string, string>();
  private reports: SyncReport[] = [];
  private sessionAnswers: SessionAnswer[] = [];
  /** Slot leases given back whose sync failed: sent again with the next one. */
  private releaseBacklog: string[] = [];
  /** Session asks already handled (bounded, oldest first). */
  private readonly askedSessions = new Set<string>();
  /** The newest session ask seen, per hub epoch. */
  askCursor = 0;
  /** The hub epoch and last upstream change this replica's upstreams reflect (gateway/share). */
  upstreamEpoch = '';
  upstreamCursor = 0;
  /** The hub's token for this replica's share, once a full share request was answered. */
  private shareToken: string | undefined;
  /** Per upstream, the share wanted as the hub last acknowledged it. */
  private readonly sentWant = new Map<string, number>();
  /** The share wanted in the request in flight, acknowledged by its answer. */
  private pendingWant: Map<string, number> | undefined;
  private askEpoch = '';
  private readonly short = new Set<string>();
  /** Routings whose matching upstreams were checked for shortness since the last share round. */
  private readonly scanned = new Set<string>();
  private heard = false;
  /** Replicas sharing the fleet, as the hub last said. */
  private replicas = 1;
  /** Upstreams the last share request asked slots for. */
  private asked = new Set<string>();
  /** Connections waiting for the next share answer. */
  private shareWaiters: (() => void)[] = [];
  /** Called when the replica needs the link to sync soon (a report, or a share running short). */
  onNeed: () => void = () => {};

  constructor(clock: Clock, maxSessions?: number) {
    this.clock = clock;
    this.mirror = new LeaseStore({
      clock,
      blockedCooldownSeconds: LOCAL_COOLDOWN_SECONDS,
      failedCooldownSeconds: LOCAL_COOLDOWN_SECONDS,
      drainTimeoutMs: MIRROR_DRAIN_TIMEOUT_MS,
    });
    this.chooser = new LeaseStoreChooser(this.mirror, clock, maxSessions);
  }

  get sessions(): SessionTable {
    return this.chooser.sessions;
  }

  /** Per upstream: slot leases held and connections open on this replica (the share metrics). */
  shares(): { upstream: string; slots: number; inUse: number }[] {
    return [...this.known.values()].map((k) => ({ upstream: k.key, slots: k.slots.length, inUse: k.inUse }));
  }

  /** Whether it has had its share from the leader at least once. */
  get ready(): boolean {
    return this.heard;
  }

  /** Stops the mirror's timer. */
  close(): void {
    this.mirror.close();
  }

  /**
   * Takes in a hub answer (gateway/share), checked first: a malformed one throws SyncInputError
   * naming the field and changes nothing here. Returns the checked answer.
   */
  applyAnswer(raw: unknown): SyncAnswer {
    const a = parseSyncAnswer(raw);
    if (a.replicas !== undefined) this.replicas = Math.max(1, a.replicas);
    const next = this.takeUpstreams(a);
    // What the mirror must hear again: everything after a whole answer, else what the answer names.
    const wholeUpstreams = next !== this.known && a.upstreamsFull !== false;
    const wholeSlots = a.slots !== undefined && !a.slotsPartial;
    const touched = new Set<Known>();
    if (next !== this.known && !wholeUpstreams)
      for (const u of a.upstreams) touched.add(next.get(u.key) as Known);
    if (a.slots) {
      for (const k of next.values()) {
        const given = a.slots[k.key] ?? (a.slotsPartial ? undefined : []);
        if (given === undefined) continue;
        const urls = new Map(k.slots.map((s) => [s.id, s.url]));
        k.slots = given.map((s) => ({ id: s.id, url: s.url === '' ? (urls.get(s.id) ?? '') : s.url }));
        k.upstream = upstreamFor(k);
        touched.add(k);
      }
    }
    this.known = next;
    if (wholeUpstreams || wholeSlots) for (const k of next.values()) this.mirrorOne(k);
    else for (const k of touched) this.mirrorOne(k);
    if (a.shareToken !== undefined) this.takeShareToken(a.shareToken);
    // Cooldowns only lengthen (as in the leader's store): a full answer adds what the replica lacks.
    for (const [key, target, left] of a.cooldowns) {
      const k = next.get(key);
      if (!k || left <= 0) continue;
      this.mirror.reportProxy({
        namespace: k.namespace,
        name: key.slice(key.indexOf('/') + 1),
        target,
        result: 'blocked',
        cooldownSeconds: Math.min(MAX_COOLDOWN_SECONDS, Math.ceil(left / 1000)),
      });
    }
    if (a.epoch !== this.askEpoch) {
      this.askEpoch = a.epoch;
      this.askCursor = 0;
    }
    for (const ask of a.sessionAsks ?? []) {
      this.askCursor = Math.max(this.askCursor, ask.n);
      if (this.askedSessions.has(ask.ask)) continue;
      this.askedSessions.add(ask.ask);
      if (this.askedSessions.size > 1000)
        this.askedSessions.delete(this.askedSessions.values().next().value as string);
      // Only the replica that knows the session answers; the others stay silent.
      const r = this.reportSession(ask.session, ask.result, ask.target);
      if (r.ok) {
        this.sessionAnswers.push({ ask: ask.ask, upstream: r.upstream, target: r.target });
        queueMicrotask(() => this.onNeed());
      }
    }
    // A usable upstream this replica has not asked a share of yet: ask now, not at the next round.
    let unasked = false;
    for (const k of next.values()) {
      if (k.reason === null && k.slots.length === 0 && !this.asked.has(k.key)) {
        unasked = true;
        queueMicrotask(() => this.onNeed());
        break;
      }
    }
    // Ready once a share answer came back for every upstream it knew when asking.
    if (a.slots && !unasked) this.heard = true;
    if (a.slots) {
      this.scanned.clear();
      const ws = this.shareWaiters;
      this.shareWaiters = [];
      for (const w of ws) w();
    }
    return a;
  }

  /**
   * After a share answer: the token the hub answered with. The one this request was made under (or
   * the first one) acknowledges the share wanted; another means the hub had no record of it, so
   * the next request, sent at once, is a whole one.
   */
  private takeShareToken(token: string): void {
    const sent = this.shareToken;
    if (sent !== undefined && sent !== token) {
      this.forgetShareToken();
      queueMicrotask(() => this.onNeed());
      return;
    }
    this.shareToken = token;
    if (this.pendingWant) {
      this.sentWant.clear();
      for (const [key, w] of this.pendingWant) this.sentWant.set(key, w);
    }
    this.pendingWant = undefined;
  }

  private forgetShareToken(): void {
    this.shareToken = undefined;
    this.sentWant.clear();
    this.pendingWant = undefined;
  }

  /**
   * The upstreams after answer `a`: its whole list, or its changes and removals merged into what
   * this replica knows. An answer older than the last one applied (the sync and watch loops'
   * answers may cross) leaves them as they are, returning the same map.
   */
  private takeUpstreams(a: SyncAnswer): Map<string, Known> {
    const whole = a.upstreamsFull !== false;
    if (a.upstreamCursor !== undefined && a.epoch === this.upstreamEpoch) {
      if (a.upstreamCursor < this.upstreamCursor || (!whole && a.upstreamCursor === this.upstreamCursor))
        return this.known;
    } else if (!whole) return this.known;
    const next = whole ? new Map<string, Known>() : new Map(this.known);
    for (const u of a.upstreams) {
      const old = this.known.get(u.key);
      next.set(u.key, {
        ...u,
        selectable: selectableLabels(u.labels, u.location),
        slots: old?.slots ?? [],
        inUse: old?.inUse ?? 0,
        upstream: old?.upstream,
        mirrored: old?.mirrored ?? '',
      });
    }
    const gone = whole ? [...this.known.keys()].filter((key) => !next.has(key)) : (a.removed ?? []);
    for (const key of gone) {
      const old = this.known.get(key);
      if (!old) continue;
      // Connections still open on an upstream that disappeared keep counting until they close.
      if (old.inUse > 0) next.set(key, { ...old, reason: 'Deleting', slots: [] });
      else {
        next.delete(key);
        this.mirror.removeProxy(key);
      }
    }
    this.upstreamEpoch = a.epoch;
    this.upstreamCursor = a.upstreamCursor ?? 0;
    return next;
  }

  /**
   * What to ask the hub for now: per upstream usable by this replica, the connections open plus
   * headroom (one slot for an unlimited upstream, whose slot only carries the URL); slots beyond
   * it are given back and stop counting here at once.
   */
  shareRequest(): ShareRequest {
    const wanted = new Map<string, number>();
    const release: string[] = this.releaseBacklog;
    this.releaseBacklog = [];
    const held: Record<string, string[]> = {};
    for (const k of this.known.values()) {
      let w = 0;
      if (k.reason === null) {
        if (k.maxLeases === 0) w = 1;
        else {
          // Headroom lets connections start without a round trip; when another replica is short
          // of this upstream, idle headroom goes back to the leader.
          const headroom =
            (k.contended ? 0 : Math.max(1, Math.ceil(k.inUse / 4))) + (this.short.has(k.key) ? 1 : 0);
          w = Math.min(k.maxLeases, k.inUse + headroom);
        }
      }
      w = Math.max(w, k.maxLeases === 0 ? Math.min(1, k.slots.length) : Math.min(k.inUse, k.slots.length));
      if (k.slots.length > w) {
        while (k.slots.length > w) release.push((k.slots.pop() as Slot).id);
        // Fewer slots: less capacity in the mirror, and perhaps another slot's URL to dial.
        k.upstream = upstreamFor(k);
        this.mirrorOne(k);
      }
      if (w > 0) wanted.set(k.key, w);
      if (k.slots.length > 0 && this.shareToken === undefined) held[k.key] = k.slots.map((s) => s.id);
    }
    this.short.clear();
    this.scanned.clear();
    this.asked = new Set(wanted.keys());
    this.pendingWant = wanted;
    const reports = this.reports;
    this.reports = [];
    const sessionAnswers = this.sessionAnswers;
    this.sessionAnswers = [];
    if (this.shareToken === undefined)
      return { want: Object.fromEntries(wanted), release, held, reports, sessionAnswers };
    // A delta: only what the hub does not know yet.
    const want: Record<string, number> = {};
    for (const [key, w] of wanted) if (this.sentWant.get(key) !== w) want[key] = w;
    for (const key of this.sentWant.keys()) if (!wanted.has(key)) want[key] = 0;
    return { shareToken: this.shareToken, want, release, reports, sessionAnswers };
  }

  /** Reports the link could not deliver go back to the queue. */
  requeue(reports: SyncReport[], sessionAnswers: SessionAnswer[] = [], release: string[] = []): void {
    // Whether the hub applied the lost request is unknown: the next one tells it the whole share.
    this.forgetShareToken();
    this.reports.unshift(...reports);
    this.sessionAnswers.unshift(...sessionAnswers);
    this.releaseBacklog.unshift(...release);
  }

  /**
   * An upstream now, or — when the only ones that fit are at this replica's share while the
   * leader may grant more — after the share grew (at most SHARE_WAIT_MS): a short wait instead
   * of a 503 while shares move between replicas.
   */
  acquire(target: string, routing: RoutingOptions): AcquireOutcome | Promise<AcquireOutcome> {
    const first = this.tryAcquire(target, routing);
    if (first.ok || !first.couldGrow) return first;
    return this.acquireWaiting(target, routing, this.clock.now() + SHARE_WAIT_MS, first);
  }

  private async acquireWaiting(
    target: string,
    routing: RoutingOptions,
    deadline: number,
    last: AcquireOutcome & { couldGrow?: boolean },
  ): Promise<AcquireOutcome> {
    let outcome = last;
    while (!outcome.ok && outcome.couldGrow) {
      const left = deadline - this.clock.now();
      if (left <= 0) break;
      await new Promise<void>((resolve) => {
        const t = this.clock.setTimeout(done, left);
        function done() {
          resolve();
        }
        this.shareWaiters.push(() => {
          this.clock.clearTimeout(t);
          done();
        });
      });
      outcome = this.tryAcquire(target, routing);
    }
    return outcome;
  }

  private tryAcquire(target: string, routing: RoutingOptions): AcquireOutcome & { couldGrow?: boolean } {
    try {
      normalizeTarget(target);
    } catch (err) {
      if (err instanceof LeaseInputError) return { ok: false, status: 400, message: err.message };
      throw err;
    }
    if (!this.heard) {
      return { ok: false, status: 503, message: 'this gateway replica has not heard from the leader yet' };
    }
    const got = this.chooser.acquire(target, routing);
    if (got.ok) {
      const key = got.acquired.upstream.key;
      const k = this.known.get(key) as Known;
      k.inUse++;
      this.open.set(got.acquired.leaseId, key);
      // The mirror's grant names the upstream; the dial takes the slot's address and credentials.
      got.acquired.upstream = k.upstream as Upstream;
      // Its last free slot taken: ask for headroom now rather than at the next round.
      if (k.maxLeases > 0 && k.inUse >= k.slots.length && k.slots.length < k.maxLeases) {
        this.short.add(key);
        this.onNeed();
      }
      // Matching upstreams at their share (a share given back under contention included) are
      // asked for again, once per routing and share round: otherwise traffic that fits
      // elsewhere would never win them back.
      const routingKey = `${routing.namespace ?? ''}|${routing.selector ?? ''}`;
      if (!this.scanned.has(routingKey)) {
        this.scanned.add(routingKey);
        this.shortOf(routing);
      }
      return got;
    }
    if (got.status !== 503 || !got.counts) return got;
    const short = this.shortOf(routing);
    const c = got.counts;
    return {
      ok: false,
      status: 503,
      // The mirror counts an upstream this replica holds no slot of as not ready; say why instead.
      message: `no upstream proxy may carry this now on this gateway replica: ${c.matching} matching, ${c.coolingDownForTarget} cooling down for this site, ${short.atShare} at this replica's share of their capacity`,
      counts: c,
      couldGrow: short.couldGrow,
    };
  }

  /**
   * Marks the matching usable upstreams at this replica's share as short (the next share
   * request asks for more), counts them, and says whether a refused connection should wait for
   * that — only below
   * a fair share, since above it the capacity is most likely in use elsewhere and the client
   * gets its 503 at once.
   */
  private shortOf(routing: RoutingOptions): { atShare: number; couldGrow: boolean } {
    const selector = toSelector(routing.selector);
    let couldGrow = false;
    let atShare = 0;
    for (const k of this.known.values()) {
      if (k.reason !== null) continue;
      if (routing.namespace && k.namespace !== routing.namespace) continue;
      if (selector && !matchesSelector(selector, k.selectable)) continue;
      const full = !k.upstream || (k.maxLeases > 0 && k.inUse >= k.slots.length);
      if (!full) continue;
      atShare++;
      if (k.maxLeases > 0 && k.slots.length >= k.maxLeases) continue;
      this.short.add(k.key);
      if (k.slots.length < Math.ceil(k.maxLeases / this.replicas)) couldGrow = true;
    }
    if (this.short.size > 0) this.onNeed();
    return { atShare, couldGrow };
  }

  renew(leaseId: string): boolean {
    // An upstream gone from the fleet, or whose share the leader would not renew (a drain
    // deadline), ends its connections, like a lease the store will not renew.
    const key = this.open.get(leaseId);
    const k = key === undefined ? undefined : this.known.get(key);
    if (k === undefined || (k.reason !== null && k.slots.length === 0)) return false;
    this.chooser.renew(leaseId);
    return true;
  }

  release(a: Acquired): void {
    this.chooser.release(a);
    const key = this.open.get(a.leaseId);
    if (key === undefined) return;
    this.open.delete(a.leaseId);
    const k = this.known.get(key);
    if (k) k.inUse = Math.max(0, k.inUse - 1);
  }

  report(a: Acquired, result: Exclude<ReportResult, 'success'>, cooldownSeconds?: number): void {
    if (result === 'blocked' && a.target === undefined) return;
    this.chooser.report(a, result, cooldownSeconds);
    this.queue(a.upstream.key, result, a.target, cooldownSeconds);
  }

  reportSession(
    id: string,
    result: ReportResult,
    target: string | undefined,
  ): { ok: true; upstream: string; target: string } | { ok: false; message: string } {
    const r = this.chooser.reportSession(id, result, target);
    if (r.ok && result !== 'success') this.queue(r.upstream, result, r.target);
    return r;
  }

  purge(): void {
    this.chooser.purge();
  }

  /** Queues a report for the leader (a `failed` is proxy-wide: no target). */
  private queue(
    upstream: string,
    result: Exclude<ReportResult, 'success'>,
    target: string | undefined,
    cooldownSeconds?: number,
  ): void {
    const cooldown = cooldownSeconds === undefined ? {} : { cooldownSeconds };
    this.reports.push(
      result === 'blocked' ? { upstream, target, result, ...cooldown } : { upstream, result, ...cooldown },
    );
    this.onNeed();
  }

  /** Tells the mirror what changed about `k`: the leader's state, and this replica's share as capacity. */
  private mirrorOne(k: Known): void {
    const info = mirrorInfo(k);
    const sig = `${k.reason}|${info.maxLeases}|${info.host}:${info.port}|${info.latencyMillis}|${k.namespace}|${JSON.stringify(k.selectable)}`;
    if (sig === k.mirrored) return;
    k.mirrored = sig;
    this.mirror.upsertProxy(info);
  }
}

/**
 * An upstream as the mirror store holds it: the leader's reason mapped onto the fields the
 * store's leasing rule reads, capacity = the slots held (an upstream without a slot's URL
 * cannot be dialled, so it is not ready here).
 */
function mirrorInfo(k: Known): ProxyInfo {
  return {
    key: k.key,
    namespace: k.namespace,
    name: k.key.slice(k.key.indexOf('/') + 1),
    uid: 'mirror',
    labels: k.labels,
    ...(k.location ? { location: k.location } : {}),
    phase: k.reason === 'NotReady' ? 'Pending' : 'Ready',
    healthy: k.reason !== 'Unhealthy' && k.reason !== 'CoolingDown',
    draining: k.reason === 'Draining',
    deleting: k.reason === 'Deleting',
    maxLeases: k.maxLeases === 0 ? 0 : k.slots.length,
    host: k.upstream?.host ?? '',
    port: k.upstream?.port ?? 0,
    ...(k.latencyMillis === null ? {} : { latencyMillis: k.latencyMillis }),
  };
}

/** The upstream as the data path dials it, from the URL of any slot it holds. */
function upstreamFor(k: Known): Upstream | undefined {
  const slot = k.slots.find((s) => s.url !== '');
  if (!slot) return undefined;
  const url = new URL(slot.url);
  const user = decodeURIComponent(url.username);
  const pass = decodeURIComponent(url.password);
  return {
    key: k.key,
    host: url.hostname.replace(/^\[|\]$/g, ''),
    port: Number(url.port || 80),
    authorization:
      user === '' && pass === '' ? undefined : `Basic ${Buffer.from(`${user}:${pass}`).toString('base64')}`,
  };
}
