/**
 * gateway/hub — the leader's side of gateway scale-out (docs/architecture.md, "Gateway
 * scale-out"): every replica's gateway, the leader's own included, holds a share of each
 * upstream's capacity as real leases in the one lease store ("slot leases", target-less, renewed
 * on every sync), so API clients and all gateways together never exceed `maxLeases`; the hub
 * grows and shrinks a replica's share on request, applies the blocks and failures replicas
 * report, and pushes per-target cooldowns to every replica through long-polled syncs
 * (gateway/share). A replica that stops syncing loses its share after REPLICA_TIMEOUT_MS.
 */
import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
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

interface Replica {
  slots: Map<string, Slot[]>;
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
  private signature = '';
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
      r = { slots: new Map(), lastSeen: now, synced: false };
      this.replicas.set(req.replica, r);
    }
    r.lastSeen = now;
    if (mutating) {
      if (!r.synced && req.held) this.adopt(r, req.held);
      r.synced = true;
      this.apply(r, req);
    }
    if (
      !mutating &&
      req.waitMs > 0 &&
      req.epoch === this.epoch &&
      req.cursor >= this.seq &&
      (this.asks.size === 0 || (req.askCursor ?? 0) >= this.askSeq)
    ) {
      // Woken by news, by the timeout, or by stepping down (then the answer is the last state).
      await this.wait(req.waitMs);
    }
    return this.answer(req, mutating ? r : undefined);
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
        this.replicas.delete(id);
        this.log.info({ replica: id }, 'gateway replica went silent; its capacity share is released');
      }
      if (this.waiters.size > 0) {
        for (const [key, until] of this.contended) if (until <= now) this.contended.delete(key);
        const sig = `${this.gatewayLeases
          .upstreams()
          .map((u) => `${u.key}:${u.reason ?? ''}`)
          .join(',')}|${[...this.contended.keys()].join(',')}`;
        if (sig !== this.signature) {
          this.signature = sig;
          this.wake();
        }
      }
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

  private apply(r: Replica, req: SyncRequest): void {
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
    // Renew what is held: a slot lease the store will not renew (drain deadline, gone) leaves the share.
    for (const [key, slots] of r.slots) {
      const kept = slots.filter((s) => this.leases.renew(s.id, SLOT_TTL_SECONDS) !== undefined);
      if (kept.length > 0) r.slots.set(key, kept);
      else r.slots.delete(key);
    }
    if (req.want) {
      for (const [key, slots] of r.slots) {
        const want = req.want[key] ?? 0;
        while (slots.length > want) this.leases.release((slots.pop() as Slot).id);
        if (slots.length === 0) r.slots.delete(key);
      }
      for (const [key, want] of Object.entries(req.want)) {
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

  private answer(req: SyncRequest, r: Replica | undefined): SyncAnswer {
    const now = this.clock.now();
    const full = req.epoch !== this.epoch || req.cursor < this.firstSeq - 1 || req.cursor > this.seq;
    const upstreams = this.gatewayLeases.upstreams(full);
    const cooldowns: [string, string, number][] = [];
    if (full) {
      for (const u of upstreams) {
        for (const [t, until] of u.cooldowns ?? []) cooldowns.push([u.key, t, until - now]);
        delete u.cooldowns;
      }
    } else {
      for (let n = req.cursor + 1; n <= this.seq; n++) {
        const c = this.changes[(n - 1) % MAX_LOG] as Change;
        if (c.until > now) cooldowns.push([c.key, c.target, c.until - now]);
      }
    }
    for (const u of upstreams)
      if ((this.contended.get(u.key) ?? 0) > now) (u as UpstreamState).contended = true;
    const out: SyncAnswer = {
      epoch: this.epoch,
      cursor: this.seq,
      full,
      cooldowns,
      upstreams,
      replicas: this.replicas.size,
    };
    if (r) out.slots = Object.fromEntries(r.slots);
    if (this.asks.size > 0) out.sessionAsks = [...this.asks.values()].map((p) => p.ask);
    return out;
  }
}
