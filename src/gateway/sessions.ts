/**
 * gateway/sessions — sticky sessions (docs/gateway.md, "Sticky sessions"): a session id from the
 * user name remembers the upstream it is bound to and, per target host, the last lease its
 * connections held there, so a later report can name the right lease. A session no connection
 * has used for its TTL is forgotten; the table is bounded, the least recently used going first.
 */
import type { Clock } from '../runtime/clock.ts';

export const DEFAULT_MAX_SESSIONS = 100_000;
/** Hosts per session whose last lease is remembered for reports. */
const MAX_HOSTS_PER_SESSION = 64;

export interface Session {
  id: string;
  /** The routing the session was created with; a connection asking for other routing rebinds it. */
  routing: string;
  /** `namespace/name` of the upstream it is bound to, or undefined until the first grant. */
  upstream: string | undefined;
  ttlMs: number;
  lastUsedAt: number;
  /** Connections using it now: a session in use never idles out. */
  open: number;
  /** Target host → the last lease a connection of this session held for it, and its upstream. */
  leases: Map<string, { leaseId: string; upstream: string }>;
  /** The last target host used (the default target of a report). */
  lastTarget: string | undefined;
}

export class SessionTable {
  private readonly sessions = new Map<string, Session>();
  private readonly clock: Clock;
  private readonly max: number;

  constructor(clock: Clock, max = DEFAULT_MAX_SESSIONS) {
    this.clock = clock;
    this.max = max;
  }

  get size(): number {
    return this.sessions.size;
  }

  /** The live session `id`, or undefined when unknown or idle past its TTL. */
  find(id: string): Session | undefined {
    const s = this.sessions.get(id);
    if (!s) return undefined;
    if (s.open === 0 && this.clock.now() - s.lastUsedAt > s.ttlMs) {
      this.sessions.delete(id);
      return undefined;
    }
    return s;
  }

  /**
   * What a report on session `id` concerns: the session, the host (`target`, else the last one
   * it used) and the lease it holds for that host; or the message saying why there is none.
   */
  reportable(
    id: string,
    target: string | undefined,
  ):
    | { ok: true; session: Session; host: string; leaseId: string; upstream: string }
    | { ok: false; message: string } {
    const session = this.find(id);
    if (!session) return { ok: false, message: `no live session ${JSON.stringify(id)}` };
    const host = target ?? session.lastTarget;
    const used = host === undefined ? undefined : session.leases.get(host);
    if (host === undefined || used === undefined) {
      return {
        ok: false,
        message: `session ${JSON.stringify(id)} has not connected to ${target ?? 'any target'}`,
      };
    }
    return { ok: true, session, host, ...used };
  }

  /** The session to use for a new connection: the live one (rebound if its routing changed) or a new one. */
  use(id: string, routing: string, ttlMs: number): Session {
    let s = this.find(id);
    if (s && s.routing !== routing) {
      s.routing = routing;
      s.upstream = undefined;
    }
    if (!s) {
      if (this.sessions.size >= this.max) this.evictOne();
      s = {
        id,
        routing,
        upstream: undefined,
        ttlMs,
        lastUsedAt: 0,
        open: 0,
        leases: new Map(),
        lastTarget: undefined,
      };
    }
    // Re-inserting keeps the Map in least-recently-used order.
    this.sessions.delete(id);
    this.sessions.set(id, s);
    s.ttlMs = ttlMs;
    s.lastUsedAt = this.clock.now();
    return s;
  }

  /** Records the lease a session's connection holds for `target`, on `upstream`. */
  remember(s: Session, target: string, leaseId: string, upstream: string): void {
    s.leases.delete(target);
    s.leases.set(target, { leaseId, upstream });
    if (s.leases.size > MAX_HOSTS_PER_SESSION) s.leases.delete(s.leases.keys().next().value as string);
    s.lastTarget = target;
  }

  /** A connection of `s` closed: the idle time counts from now. */
  done(s: Session): void {
    s.open = Math.max(0, s.open - 1);
    s.lastUsedAt = this.clock.now();
  }

  /** Drops sessions idle past their TTL (called periodically, so memory follows use). */
  purge(): void {
    const now = this.clock.now();
    for (const [id, s] of this.sessions) {
      if (s.open === 0 && now - s.lastUsedAt > s.ttlMs) this.sessions.delete(id);
    }
  }

  private evictOne(): void {
    for (const [id, s] of this.sessions) {
      if (s.open === 0) {
        this.sessions.delete(id);
        return;
      }
    }
  }
}
