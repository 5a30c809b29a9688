/**
 * gateway/replica — upstream choice on a gateway replica in cluster mode (docs/architecture.md,
 * "Gateway scale-out"), with no call to the leader per connection: it chooses among the upstreams
 * the leader's hub last described (usable, matching the routing, not cooling down for the
 * target) and counts connections against the capacity share it holds (slot leases). It asks its
 * link for more share when an upstream runs short, gives back what it no longer needs, and
 * reports blocks and failures, which it also applies at once itself. A sticky session's first
 * upstream is the highest-ranked by rendezvous hashing of the session id, so every replica binds
 * a session to the same upstream.
 */
import { LeaseInputError } from '../lease/errors.ts';
import { normalizeTarget } from '../lease/target.ts';
import type { ReportResult } from '../lease/types.ts';
import type { Clock } from '../runtime/clock.ts';
import { matchesSelector, parseSelector, type Selector, SelectorError } from '../runtime/selector.ts';
import { SessionTable } from './sessions.ts';
import type { SessionAnswer, Slot, SyncAnswer, SyncReport, UpstreamState } from './share.ts';
import type { Acquired, AcquireOutcome, Upstream, UpstreamChooser } from './upstreams.ts';
import type { RoutingOptions } from './username.ts';

/** How long a failed upstream is kept out locally until the leader's answer says more. */
const LOCAL_FAILED_MS = 60_000;
/** How long a connection waits for this replica's share to grow before it gets 503. */
export const SHARE_WAIT_MS = 3000;
/** Sessions' selectors parsed once. */
const MAX_SELECTORS = 256;

interface Known extends UpstreamState {
  slots: Slot[];
  inUse: number;
  /** Local grant sequence of its last connection: least recently used first. */
  lastUsed: number;
  /** Until when it is kept out after a local `failed`, before the leader's answer confirms it. */
  downUntil: number;
  upstream: Upstream | undefined;
}

/** What the link sends next: wanted shares, give-backs and reports. */
export interface ShareRequest {
  want: Record<string, number>;
  release: string[];
  held: Record<string, string[]>;
  reports: SyncReport[];
  sessionAnswers: SessionAnswer[];
}

export class ReplicaChooser implements UpstreamChooser {
  private readonly clock: Clock;
  readonly sessions: SessionTable;
  private known = new Map<string, Known>();
  /** `upstream\ntarget` → end of its cooldown on this process's clock. */
  private cooldowns = new Map<string, number>();
  private reports: SyncReport[] = [];
  private sessionAnswers: SessionAnswer[] = [];
  /** Slot leases given back whose sync failed: sent again with the next one. */
  private releaseBacklog: string[] = [];
  /** Session asks already handled (bounded, oldest first). */
  private readonly askedSessions = new Set<string>();
  /** The newest session ask seen, per hub epoch. */
  askCursor = 0;
  private askEpoch = '';
  private readonly short = new Set<string>();
  private readonly selectors = new Map<string, Selector>();
  private seq = 0;
  private connSeq = 0;
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
    this.sessions = new SessionTable(clock, maxSessions);
  }

  /** Per upstream: slot leases held and connections open on this replica (the share metrics). */
  shares(): { upstream: string; slots: number; inUse: number }[] {
    return [...this.known.values()].map((k) => ({ upstream: k.key, slots: k.slots.length, inUse: k.inUse }));
  }

  /** Whether it has had its share from the leader at least once. */
  get ready(): boolean {
    return this.heard;
  }

  /** Takes in a hub answer (gateway/share). */
  applyAnswer(a: SyncAnswer): void {
    const now = this.clock.now();
    if (a.replicas !== undefined) this.replicas = Math.max(1, a.replicas);
    const next = new Map<string, Known>();
    for (const u of a.upstreams) {
      const old = this.known.get(u.key);
      const k: Known = {
        ...u,
        slots: old?.slots ?? [],
        inUse: old?.inUse ?? 0,
        lastUsed: old?.lastUsed ?? 0,
        downUntil: u.reason === null ? (old?.downUntil ?? 0) : 0,
        upstream: old?.upstream,
      };
      next.set(u.key, k);
    }
    if (a.slots) {
      for (const k of next.values()) {
        const given = a.slots[k.key] ?? [];
        const urls = new Map(k.slots.map((s) => [s.id, s.url]));
        k.slots = given.map((s) => ({ id: s.id, url: s.url === '' ? (urls.get(s.id) ?? '') : s.url }));
        k.upstream = upstreamFor(k);
      }
    }
    // Connections still open on an upstream that disappeared keep counting until they close.
    for (const [key, old] of this.known) {
      if (!next.has(key) && old.inUse > 0) next.set(key, { ...old, reason: 'Deleting', slots: [] });
    }
    this.known = next;
    if (a.full) this.cooldowns.clear();
    for (const [key, target, left] of a.cooldowns) {
      const id = `${key}\n${target}`;
      const until = now + left;
      if ((this.cooldowns.get(id) ?? 0) < until) this.cooldowns.set(id, until);
    }
    for (const [id, until] of this.cooldowns) if (until <= now) this.cooldowns.delete(id);
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
      const ws = this.shareWaiters;
      this.shareWaiters = [];
      for (const w of ws) w();
    }
  }

  /**
   * What to ask the hub for now: per upstream usable by this replica, the connections open plus
   * headroom (one slot for an unlimited upstream, whose slot only carries the URL); slots beyond
   * it are given back and stop counting here at once.
   */
  shareRequest(): ShareRequest {
    const want: Record<string, number> = {};
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
      while (k.slots.length > w) release.push((k.slots.pop() as Slot).id);
      if (w > 0) want[k.key] = w;
      if (k.slots.length > 0) held[k.key] = k.slots.map((s) => s.id);
      k.upstream = upstreamFor(k);
    }
    this.short.clear();
    this.asked = new Set(Object.keys(want));
    const reports = this.reports;
    this.reports = [];
    const sessionAnswers = this.sessionAnswers;
    this.sessionAnswers = [];
    return { want, release, held, reports, sessionAnswers };
  }

  /** Reports the link could not deliver go back to the queue. */
  requeue(reports: SyncReport[], sessionAnswers: SessionAnswer[] = [], release: string[] = []): void {
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
    let host: string | undefined;
    try {
      host = normalizeTarget(target);
    } catch (err) {
      if (err instanceof LeaseInputError) return { ok: false, status: 400, message: err.message };
      throw err;
    }
    if (!this.heard) {
      return { ok: false, status: 503, message: 'this gateway replica has not heard from the leader yet' };
    }
    const now = this.clock.now();
    let selector: Selector | undefined;
    try {
      selector = this.selector(routing.selector);
    } catch (err) {
      if (err instanceof SelectorError)
        return { ok: false, status: 400, message: `selector: ${err.message}` };
      throw err;
    }
    const session = routing.session
      ? this.sessions.use(
          routing.session,
          `${routing.namespace ?? ''}|${routing.selector ?? ''}`,
          routing.sessionTtlSeconds * 1000,
        )
      : undefined;
    let chosen: Known | undefined;
    let matching = 0;
    let cooling = 0;
    let full = 0;
    let couldGrow = false;
    const fits: Known[] = [];
    for (const k of this.known.values()) {
      if (routing.namespace && k.namespace !== routing.namespace) continue;
      if (selector && !matchesSelector(selector, k.labels)) continue;
      matching++;
      if (k.reason !== null || k.downUntil > now) continue;
      if (host !== undefined && (this.cooldowns.get(`${k.key}\n${host}`) ?? 0) > now) {
        cooling++;
        continue;
      }
      if (!k.upstream || (k.maxLeases > 0 && k.inUse >= k.slots.length)) {
        full++;
        if (k.maxLeases === 0 || k.slots.length < k.maxLeases) {
          this.short.add(k.key);
          // Worth waiting for only below a fair share: above it the capacity is most likely in
          // use elsewhere, and the client gets its 503 at once.
          if (k.slots.length < Math.ceil(k.maxLeases / this.replicas)) couldGrow = true;
        }
        continue;
      }
      fits.push(k);
    }
    if (session?.upstream) chosen = fits.find((k) => k.key === session.upstream);
    if (!chosen && session) chosen = rendezvous(session.id, fits);
    if (!chosen) {
      for (const k of fits) if (!chosen || better(k, chosen)) chosen = k;
    }
    if (this.short.size > 0) this.onNeed();
    if (!chosen) {
      if (session) session.upstream = undefined;
      return {
        ok: false,
        status: 503,
        message: `no upstream proxy may carry this now on this gateway replica: ${matching} matching, ${cooling} cooling down for this site, ${full} at this replica's share of their capacity`,
        couldGrow,
      };
    }
    chosen.inUse++;
    chosen.lastUsed = ++this.seq;
    const leaseId = `${chosen.key}#${++this.connSeq}`;
    if (session) {
      session.upstream = chosen.key;
      session.open++;
      if (host !== undefined) this.sessions.remember(session, host, leaseId);
    }
    return {
      ok: true,
      acquired: {
        leaseId,
        upstream: chosen.upstream as Upstream,
        session,
        ...(host === undefined ? {} : { target: host }),
      },
    };
  }

  renew(leaseId: string): boolean {
    // An upstream gone from the fleet, or whose share the leader would not renew (a drain
    // deadline), ends its connections, like a lease the store will not renew.
    const k = this.known.get(keyOf(leaseId));
    return k !== undefined && (k.reason === null || k.slots.length > 0);
  }

  release(a: Acquired): void {
    const k = this.known.get(a.upstream.key);
    if (k) k.inUse = Math.max(0, k.inUse - 1);
    if (a.session) this.sessions.done(a.session);
  }

  report(a: Acquired, result: Exclude<ReportResult, 'success'>): void {
    this.note(a.upstream.key, result, a.target);
    if (a.session?.upstream === a.upstream.key) a.session.upstream = undefined;
  }

  /** Applies a report here at once and queues it for the leader. */
  private note(key: string, result: Exclude<ReportResult, 'success'>, target: string | undefined): void {
    const now = this.clock.now();
    if (result === 'blocked' && target !== undefined) {
      // The leader's answer brings the real cooldown; until then this site avoids it for a while.
      const id = `${key}\n${target}`;
      this.cooldowns.set(id, Math.max(this.cooldowns.get(id) ?? 0, now + LOCAL_FAILED_MS));
      this.reports.push({ upstream: key, target, result });
    } else if (result === 'failed') {
      const k = this.known.get(key);
      if (k) k.downUntil = now + LOCAL_FAILED_MS;
      this.reports.push({ upstream: key, result });
    } else return;
    this.onNeed();
  }

  reportSession(
    id: string,
    result: ReportResult,
    target: string | undefined,
  ): { ok: true; upstream: string; target: string } | { ok: false; message: string } {
    const found = this.sessions.reportable(id, target);
    if (!found.ok) return found;
    const { session, host, leaseId } = found;
    const key = keyOf(leaseId);
    if (result !== 'success') {
      this.note(key, result, host);
      if (session.upstream === key) session.upstream = undefined;
    }
    return { ok: true, upstream: key, target: host };
  }

  purge(): void {
    this.sessions.purge();
  }

  private selector(text: string | undefined): Selector | undefined {
    if (!text) return undefined;
    let s = this.selectors.get(text);
    if (!s) {
      s = parseSelector(text);
      if (this.selectors.size >= MAX_SELECTORS) this.selectors.clear();
      this.selectors.set(text, s);
    }
    return s;
  }
}

function keyOf(leaseId: string): string {
  return leaseId.slice(0, leaseId.lastIndexOf('#'));
}

/** Least loaded here, then least recently used, then fastest, then by name. */
function better(a: Known, b: Known): boolean {
  if (a.inUse !== b.inUse) return a.inUse < b.inUse;
  if (a.lastUsed !== b.lastUsed) return a.lastUsed < b.lastUsed;
  const la = a.latencyMillis ?? Number.POSITIVE_INFINITY;
  const lb = b.latencyMillis ?? Number.POSITIVE_INFINITY;
  if (la !== lb) return la < lb;
  return a.key < b.key;
}

/** The upstream ranked first for `session` (highest-random-weight hashing): the same on every replica. */
function rendezvous(session: string, fits: Known[]): Known | undefined {
  let best: Known | undefined;
  let bestScore = -1;
  for (const k of fits) {
    const score = fnv1a(`${session}\n${k.key}`);
    if (score > bestScore || (score === bestScore && best !== undefined && k.key < best.key)) {
      best = k;
      bestScore = score;
    }
  }
  return best;
}

function fnv1a(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h;
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
