/**
 * gateway/hub — the leader's side of gateway scale-out (docs/architecture.md, "Gateway
 * scale-out"): every replica's gateway, the leader's own included, holds a share of each
 * upstream's capacity as real leases in the one lease store ("slot leases", target-less, renewed
 * on every sync), so API clients and all gateways together never exceed `maxLeases`; the hub
 * grows and shrinks a replica's share on request, applies the blocks and failures replicas
 * report, and pushes per-target cooldowns to every replica through long-polled syncs
 * (gateway/share). A replica that stops syncing loses its share after REPLICA_TIMEOUT_MS.
 * Answers are deltas: the upstreams whose published state changed since the replica's cursor,
 * and the upstreams whose slots differ from what the replica says it holds, so an idle sync
 * costs the same bytes at any fleet size.
 */
import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import { latencyMovedALot } from '../health/policy.ts';
import { LeaseInputError, TooManyLeasesError } from '../lease/errors.ts';
import type { LeaseStore } from '../lease/store.ts';
import type { Clock, TimerHandle } from '../runtime/clock.ts';
import { GatewayLeaseAdapter, type UpstreamLeaseOutcome } from './lease-adapter.ts';
import {
  isMutating,
  type SessionAsk,
  type Slot,
  type SyncAnswer,
  type SyncRequest,
  type UpstreamState,
} from './share.ts';

/** Slot leases last this long and are renewed by every mutating sync (replicas sync every few seconds). */
export const SLOT_TTL_SECONDS = 60;
/** A replica silent this long gives its share back. */
export const REPLICA_TIMEOUT_MS = 30_000;
/** Cooldown changes kept for incremental answers; a replica further behind gets a full answer. */
export const MAX_LOG = 50_000;
const HOUSEKEEPING_MS = 1000;
/** An upstream whose share a replica could not grow counts as contended this long. */
const CONTENDED_MS = 10_000;
/** How long a session report waits for the replica that knows the session. */
const SESSION_ASK_MS = 3000;
/**
 * How long a slot lease on an instance its proxy replaced is kept after a new slot took its place
 * in the share: connections the replica opened through the old instance finish meanwhile, and
 * the old instance's drain waits no longer for the gateway (the gateway's idle timeout).
 */
export const REPLACED_SLOT_GRACE_MS = 120_000;

export type SessionAskOutcome = { upstream: string; target: string } | undefined;

interface PendingAsk {
  ask: SessionAsk;
  resolve: (o: SessionAskOutcome) => void;
}

interface Change {
  key: string;
  target: string;
  until: number;
}

/** An upstream's state as last published to replicas, and the change that published it. */
interface Published {
  u: UpstreamState;
  seq: number;
  /** The refresh that last saw it in the fleet. */
  round: number;
}

interface Replica {
  slots: Map<string, Slot[]>;
  /** Slot leases on replaced instances, out of the share: lease id → when they are released. */
  retiring: Map<string, number>;
  /** Slot leases wanted per upstream, as the replica last said (a delta request changes some). */
  want: Map<string, number>;
  /** Per upstream, the slot ids the replica was last told it holds (answers send what differs). */
  told: Map<string, string>;
  /** Names this record: a replica's delta request carries it, and one for another record is not applied. */
  token: string;
  lastSeen: number;
  /** Has had a mutating sync here (before it, the slot leases it says it holds may be adopted). */
  synced: boolean;
}

export class GatewayHub {
  private readonly leases: LeaseStore;
  private readonly gatewayLeases: GatewayLeaseAdapter;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly isServing: () => boolean;
  private active = false;
  private epoch = '';
  /**
   * Sequence number of the last change. The last MAX_LOG changes sit in a ring: change `n` at
   * `(n - 1) % MAX_LOG`, so recording one never moves the others.
   */
  private seq = 0;
  private changes: Change[] = [];
  private readonly replicas = new Map<string, Replica>();
  private readonly waiters = new Set<() => void>();
  private unwatch: (() => void) | undefined;
  private timer: TimerHandle | undefined;
  /** Sequence number of the last upstream change (published state or removal) in this epoch. */
  private useq = 0;
  private readonly published = new Map<string, Published>();
  /** Upstreams gone from the fleet → the change that removed them (the oldest MAX_LOG kept). */
  private readonly removedAt = new Map<string, number>();
  /** A replica whose upstream cursor is below this missed a removal no longer kept: full answer. */
  private removedFloor = 0;
  private round = 0;
  /** Upstream → until when it is contended. */
  private readonly contended = new Map<string, number>();
  private readonly asks = new Map<string, PendingAsk>();
  private askSeq = 0;

  constructor(o: { leases: LeaseStore; clock: Clock; log: Logger; isServing: () => boolean }) {
    this.leases = o.leases;
    this.gatewayLeases = new GatewayLeaseAdapter(o.leases);
    this.clock = o.clock;
    this.log = o.log;
    this.isServing = o.isServing;
  }

  /** Replicas holding a share now (a metric and a test hook). */
  get replicaCount(): number {
    return this.replicas.size;
  }

  /** Answers one sync (gateway/share); waits for news when it is a watch with nothing new. */
  async sync(req: SyncRequest): Promise<SyncAnswer> {
    this.activate();
    const now = this.clock.now();
    let r = this.replicas.get(req.replica);
    const mutating = isMutating(req);
    if (!r) {
      r = {
        slots: new Map(),
        retiring: new Map(),
        want: new Map(),
        told: new Map(),
        token: randomBytes(8).toString('hex'),
        lastSeen: now,
        synced: false,
      };
      this.replicas.set(req.replica, r);
    }
    r.lastSeen = now;
    // A delta request made for another record of this replica (a new leader, or a share this hub
    // gave up): only what needs no share state is applied, and the answer asks for a full one.
    const stale = req.shareToken !== undefined && req.shareToken !== r.token;
    if (mutating) {
      if (!stale) {
        if (!r.synced && req.held) this.adopt(r, req.held);
        r.synced = true;
      }
      this.apply(r, req, stale);
    }
    // A watch with nothing new waits; the refresh that found nothing new also serves an answer now.
    let fresh = false;
    if (!mutating && req.waitMs > 0) {
      this.refresh();
      fresh = true;
    }
    if (
      !mutating &&
      req.waitMs > 0 &&
      req.epoch === this.epoch &&
      req.cursor >= this.seq &&
      (req.upstreamCursor === undefined || req.upstreamCursor >= this.useq) &&
      (this.asks.size === 0 || (req.askCursor ?? 0) >= this.askSeq)
    ) {
      // Woken by news, by the timeout, or by stepping down (then the answer is the last state).
      await this.wait(req.waitMs);
      fresh = false;
    }
    return this.answer(req, mutating ? r : undefined, fresh);
  }

  /**
   * A session report for a session the leader's own gateway does not know: handed to every
   * replica with the next answers; resolves with what the replica that knows it applied, or
   * undefined when none answers within SESSION_ASK_MS.
   */
  askSession(
    session: string,
    result: SessionAsk['result'],
    target: string | undefined,
  ): Promise<SessionAskOutcome> {
    this.activate();
    const n = ++this.askSeq;
    const ask: SessionAsk = {
      ask: `${this.epoch}-${n}`,
      n,
      session,
      result,
      ...(target === undefined ? {} : { target }),
    };
    return new Promise((resolve) => {
      const t = this.clock.setTimeout(() => done(undefined), SESSION_ASK_MS);
      const done = (o: SessionAskOutcome) => {
        this.clock.clearTimeout(t);
        this.asks.delete(ask.ask);
        resolve(o);
      };
      this.asks.set(ask.ask, { ask, resolve: done });
      this.wake();
    });
  }

  /** Stops: forgets every share (the slot leases stay in the store and expire, or a new hub adopts them). */
  close(): void {
    this.deactivate();
  }

  private activate(): void {
    if (this.active) return;
    this.active = true;
    this.epoch = randomBytes(8).toString('hex');
    this.seq = 0;
    this.changes = [];
    this.useq = 0;
    this.published.clear();
    this.removedAt.clear();
    this.removedFloor = 0;
    this.unwatch = this.gatewayLeases.watchTargetCooldowns((e, target, until) => {
      this.changes[this.seq % MAX_LOG] = { key: e.key, target, until };
      this.seq++;
      this.wake();
    });
    this.housekeeping();
  }

  private deactivate(): void {
    if (!this.active) return;
    this.active = false;
    this.unwatch?.();
    this.unwatch = undefined;
    if (this.timer) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.replicas.clear();
    this.wake();
  }

  /** Expires silent replicas, notices upstream state changes for the watchers, steps down with the leader. */
  private housekeeping(): void {
    this.timer = this.clock.setTimeout(() => {
      if (!this.isServing()) return this.deactivate();
      const now = this.clock.now();
      for (const [id, r] of this.replicas) {
        if (now - r.lastSeen <= REPLICA_TIMEOUT_MS) continue;
        for (const slots of r.slots.values()) for (const s of slots) this.leases.release(s.id);
        for (const lease of r.retiring.keys()) this.leases.release(lease);
        this.replicas.delete(id);
        this.log.info({ replica: id }, 'gateway replica went silent; its capacity share is released');
      }
      if (this.waiters.size > 0 && this.refresh()) this.wake();
      this.housekeeping();
    }, HOUSEKEEPING_MS);
  }

  private wake(): void {
    const ws = [...this.waiters];
    this.waiters.clear();
    for (const w of ws) w();
  }

  private wait(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        this.clock.clearTimeout(t);
        this.waiters.delete(done);
        resolve();
      };
      const t = this.clock.setTimeout(done, ms);
      this.waiters.add(done);
    });
  }

  /** A replica this hub does not know (a new leader): keep the slot leases it still holds. */
  private adopt(r: Replica, held: Record<string, string[]>): void {
    for (const [key, ids] of Object.entries(held)) {
      const kept: Slot[] = [];
      for (const id of ids) {
        // The replica keeps the URL it had for an adopted slot ('' here).
        if (this.leases.renew(id, SLOT_TTL_SECONDS)) kept.push({ id, url: '' });
      }
      if (kept.length > 0) r.slots.set(key, kept);
    }
    this.log.info(
      { held: Object.values(held).flat().length, kept: [...r.slots.values()].flat().length },
      'gateway replica share adopted',
    );
  }

  private apply(r: Replica, req: SyncRequest, stale: boolean): void {
    if (req.release?.length) {
      const gone = new Set(req.release);
      for (const [key, slots] of r.slots) {
        const kept = slots.filter((s) => !gone.has(s.id));
        if (kept.length > 0) r.slots.set(key, kept);
        else r.slots.delete(key);
      }
      // Released whether or not this hub knew them as the replica's: a slot handed back on the
      // first sync with a new leader was never adopted, and would otherwise hold capacity until
      // its lease expired.
      for (const id of gone) this.leases.release(id);
    }
    for (const a of req.sessionAnswers ?? []) {
      this.asks.get(a.ask)?.resolve({ upstream: a.upstream, target: a.target });
    }
    for (const rep of req.reports ?? []) {
      const slash = rep.upstream.indexOf('/');
      try {
        this.leases.reportProxy({
          namespace: rep.upstream.slice(0, slash),
          name: rep.upstream.slice(slash + 1),
          result: rep.result,
          ...(rep.target === undefined ? {} : { target: rep.target }),
          ...(rep.cooldownSeconds === undefined ? {} : { cooldownSeconds: rep.cooldownSeconds }),
        });
      } catch (err) {
        if (!(err instanceof LeaseInputError)) throw err;
        this.log.info({ upstream: rep.upstream, err: err.message }, 'gateway replica report refused');
      }
    }
    if (stale) return;
    // Renew what is held: a slot lease the store will not renew (drain deadline, gone) leaves the share.
    // So does one on an instance an unlimited proxy has replaced (its slot only carries the
    // address): a new slot, granted below as the share is refilled, gives the replica the new
    // instance's address, where it would otherwise dial the old one and keep it draining until
    // the drain deadline. (A limited proxy's slots are capacity the old instance still holds:
    // they move when the drain deadline ends them.)
    const now = this.clock.now();
    for (const [key, slots] of r.slots) {
      const kept = slots.filter((s) => {
        if (this.leases.renew(s.id, SLOT_TTL_SECONDS) === undefined) return false;
        if (!this.gatewayLeases.onReplacedUnlimited(s.id)) return true;
        r.retiring.set(s.id, now + REPLACED_SLOT_GRACE_MS);
        return false;
      });
      if (kept.length > 0) r.slots.set(key, kept);
      else r.slots.delete(key);
    }
    for (const [lease, until] of r.retiring) {
      if (until > now && this.leases.renew(lease, SLOT_TTL_SECONDS) !== undefined) continue;
      this.leases.release(lease);
      r.retiring.delete(lease);
    }
    if (req.want) {
      // A full request's `want` replaces what was wanted, a delta request's changes it (0 = none).
      if (req.shareToken === undefined) r.want.clear();
      for (const [key, w] of Object.entries(req.want)) {
        if (w > 0) r.want.set(key, w);
        else r.want.delete(key);
      }
    }
    if (req.want || req.shareToken !== undefined) {
      for (const [key, slots] of r.slots) {
        const want = r.want.get(key) ?? 0;
        while (slots.length > want) this.leases.release((slots.pop() as Slot).id);
        if (slots.length === 0) r.slots.delete(key);
      }
      for (const [key, want] of r.want) {
        const slots = r.slots.get(key) ?? [];
        while (slots.length < want) {
          let got: UpstreamLeaseOutcome;
          try {
            got = this.gatewayLeases.leaseProxy(key, undefined, SLOT_TTL_SECONDS, 'gateway-share', 'none');
          } catch (err) {
            if (err instanceof TooManyLeasesError) break;
            throw err;
          }
          if (!got.granted) {
            if (got.reason === 'AtCapacity') {
              if (!this.contended.has(key)) queueMicrotask(() => this.wake());
              this.contended.set(key, this.clock.now() + CONTENDED_MS);
            }
            break;
          }
          slots.push({ id: got.grant.id, url: got.grant.proxy.url });
        }
        if (slots.length > 0) r.slots.set(key, slots);
      }
    }
  }

  /** Sequence number of the oldest change still in the ring. */
  private get firstSeq(): number {
    return Math.max(1, this.seq - MAX_LOG + 1);
  }

  /**
   * Brings the published upstream states up to date with the store: an upstream whose state
   * changed (its latency only when it moved a lot, as in Proxy status) gets the next upstream
   * sequence number, one gone from the fleet a removal. Returns whether anything changed.
   */
  private refresh(): boolean {
    const now = this.clock.now();
    for (const [key, until] of this.contended) if (until <= now) this.contended.delete(key);
    const round = ++this.round;
    const before = this.useq;
    for (const u of this.gatewayLeases.upstreams()) {
      const state: UpstreamState = u;
      if ((this.contended.get(u.key) ?? 0) > now) state.contended = true;
      const p = this.published.get(u.key);
      if (p && sameState(p.u, state)) {
        p.round = round;
        continue;
      }
      if (p && !latencyMoved(p.u.latencyMillis, state.latencyMillis)) state.latencyMillis = p.u.latencyMillis;
      this.published.set(u.key, { u: state, seq: ++this.useq, round });
      this.removedAt.delete(u.key);
    }
    for (const [key, p] of this.published) {
      if (p.round === round) continue;
      this.published.delete(key);
      this.removedAt.set(key, ++this.useq);
      if (this.removedAt.size > MAX_LOG) {
        const [oldest, seq] = this.removedAt.entries().next().value as [string, number];
        this.removedAt.delete(oldest);
        this.removedFloor = seq;
      }
    }
    return this.useq !== before;
  }

  private answer(req: SyncRequest, r: Replica | undefined, fresh = false): SyncAnswer {
    const now = this.clock.now();
    const full = req.epoch !== this.epoch || req.cursor < this.firstSeq - 1 || req.cursor > this.seq;
    const cooldowns: [string, string, number][] = [];
    if (full) {
      for (const u of this.gatewayLeases.upstreams(true)) {
        for (const [t, until] of u.cooldowns ?? []) cooldowns.push([u.key, t, until - now]);
      }
    } else {
      for (let n = req.cursor + 1; n <= this.seq; n++) {
        const c = this.changes[(n - 1) % MAX_LOG] as Change;
        if (c.until > now) cooldowns.push([c.key, c.target, c.until - now]);
      }
    }
    if (!fresh) this.refresh();
    // A replica that sends an upstream cursor takes deltas (gateway/share); an older one, or one
    // whose cursor this epoch cannot serve, gets every upstream.
    const since = req.upstreamCursor;
    const whole =
      since === undefined || since === 0 || full || since < this.removedFloor || since > this.useq;
    const upstreams: UpstreamState[] = [];
    for (const p of this.published.values()) if (whole || p.seq > since) upstreams.push(p.u);
    const out: SyncAnswer = {
      epoch: this.epoch,
      cursor: this.seq,
      full,
      cooldowns,
      upstreams,
      replicas: this.replicas.size,
    };
    if (since !== undefined) {
      out.upstreamCursor = this.useq;
      out.upstreamsFull = whole;
      if (!whole) {
        const removed: string[] = [];
        for (const [key, seq] of this.removedAt) if (seq > since) removed.push(key);
        if (removed.length > 0) out.removed = removed;
      }
    }
    if (r) this.answerShare(req, r, out);
    if (this.asks.size > 0) out.sessionAsks = [...this.asks.values()].map((p) => p.ask);
    return out;
  }

  /**
   * The share part of an answer to a mutating sync: the whole share for a replica that takes no
   * deltas; otherwise this record's token and the upstreams whose slots differ from what the
   * replica holds (its `held` in a full request, what it was last told in a delta request).
   */
  private answerShare(req: SyncRequest, r: Replica, out: SyncAnswer): void {
    if (req.upstreamCursor === undefined) {
      out.slots = Object.fromEntries(r.slots);
      return;
    }
    out.shareToken = r.token;
    if (req.shareToken !== undefined && req.shareToken !== r.token) return;
    if (req.shareToken === undefined) {
      r.told.clear();
      for (const [key, ids] of Object.entries(req.held ?? {})) r.told.set(key, ids.join(','));
    }
    const slots: Record<string, Slot[]> = {};
    for (const [key, s] of r.slots) {
      const ids = s.map((x) => x.id).join(',');
      if (r.told.get(key) === ids) continue;
      slots[key] = s;
      r.told.set(key, ids);
    }
    for (const key of r.told.keys()) {
      if (r.slots.has(key)) continue;
      slots[key] = [];
      r.told.delete(key);
    }
    out.slots = slots;
    out.slotsPartial = true;
  }
}

/** Whether a replica would learn nothing from `b` over `a` (latency aside: see latencyMoved). */
function sameState(a: UpstreamState, b: UpstreamState): boolean {
  return (
    a.reason === b.reason &&
    a.maxLeases === b.maxLeases &&
    a.namespace === b.namespace &&
    a.contended === b.contended &&
    !latencyMoved(a.latencyMillis, b.latencyMillis) &&
    sameRecord(a.labels, b.labels) &&
    a.location?.region === b.location?.region &&
    a.location?.zone === b.location?.zone
  );
}

/** Latency is republished when it appears, goes, or moves a lot (as Proxy status publishes it). */
function latencyMoved(before: number | null, now: number | null): boolean {
  if (before === null || now === null) return before !== now;
  return latencyMovedALot(before, now);
}

function sameRecord(a: Record<string, string>, b: Record<string, string>): boolean {
  let n = 0;
  for (const k in a) {
    if (a[k] !== b[k]) return false;
    n++;
  }
  return Object.keys(b).length === n;
}
