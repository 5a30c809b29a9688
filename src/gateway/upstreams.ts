/**
 * gateway/upstreams — which upstream proxy carries a gateway connection, decided by the lease
 * store's rules for the connection's target host (docs/gateway.md, "Choosing an upstream"):
 * every connection holds a lease (target = host) while it is open, so cooldowns, capacity,
 * draining and health apply exactly as for API clients; a sticky session asks for its bound
 * upstream first, binds by rendezvous hashing of its id when it has none, and is rebound only
 * when its upstream may not take the lease. Standalone runs it over the lease store; a cluster
 * replica runs the very same chooser over a mirror store of its share (gateway/replica).
 */
import { LeaseInputError, TooManyLeasesError } from '../lease/errors.ts';
import type { LeaseStore } from '../lease/store.ts';
import type { LeaseGrant, NoneLeasableCounts, ReportResult } from '../lease/types.ts';
import type { Clock } from '../runtime/clock.ts';
import { GatewayLeaseAdapter } from './lease-adapter.ts';
import { type Session, SessionTable } from './sessions.ts';
import type { RoutingOptions } from './username.ts';

/** Connection leases last this long and are renewed while the connection stays open. */
export const CONNECTION_LEASE_TTL_SECONDS = 300;

export interface Upstream {
  /** `namespace/name`: the X-Egress-Proxy header and the metric label. */
  key: string;
  host: string;
  port: number;
  /** `Proxy-Authorization` value for the upstream, or undefined when it needs none. */
  authorization: string | undefined;
}

export interface Acquired {
  leaseId: string;
  upstream: Upstream;
  session: Session | undefined;
  /** The target host (normalised) the lease was granted for. */
  target?: string;
}

export type AcquireOutcome =
  | { ok: true; acquired: Acquired }
  /** `status` is what the client gets: 503 when nothing may carry it, 400 for a bad target. */
  | { ok: false; status: number; message: string; counts?: NoneLeasableCounts };

/** What the gateway's data path asks of whoever decides leases. */
export interface UpstreamChooser {
  /** At once, or after a short wait for capacity (a gateway replica whose share is being grown). */
  acquire(target: string, routing: RoutingOptions): AcquireOutcome | Promise<AcquireOutcome>;
  /** Keeps the connection's lease alive; false when the lease may not be renewed (it ended, or a drain deadline passed). */
  renew(leaseId: string): boolean;
  release(a: Acquired): void;
  /** `cooldownSeconds`: this cooldown instead of the store's default (a rate limit's Retry-After). */
  report(a: Acquired, result: Exclude<ReportResult, 'success'>, cooldownSeconds?: number): void;
  /** A report on a sticky session's upstream for `target` (default: the host it used last). */
  reportSession(
    id: string,
    result: ReportResult,
    target: string | undefined,
  ): { ok: true; upstream: string; target: string } | { ok: false; message: string };
  purge(): void;
}

/** The upstream of a grant: its address and the credentials the grant's URL carries. */
export function upstreamOf(grant: LeaseGrant): Upstream {
  const url = new URL(grant.proxy.url);
  const user = decodeURIComponent(url.username);
  const pass = decodeURIComponent(url.password);
  return {
    key: `${grant.proxy.namespace}/${grant.proxy.name}`,
    host: grant.proxy.host,
    port: grant.proxy.port,
    authorization:
      user === '' && pass === '' ? undefined : `Basic ${Buffer.from(`${user}:${pass}`).toString('base64')}`,
  };
}

/** The routing part that must match for a session to keep its upstream. */
function routingKey(r: RoutingOptions): string {
  return `${r.namespace ?? ''}|${r.selector ?? ''}`;
}

/** Upstream choice straight from a lease store in this process (standalone, or the leader). */
export class LeaseStoreChooser implements UpstreamChooser {
  private readonly leases: LeaseStore;
  private readonly gatewayLeases: GatewayLeaseAdapter;
  readonly sessions: SessionTable;

  constructor(leases: LeaseStore, clock: Clock, maxSessions?: number) {
    this.leases = leases;
    this.gatewayLeases = new GatewayLeaseAdapter(leases);
    this.sessions = new SessionTable(clock, maxSessions);
  }

  acquire(target: string, routing: RoutingOptions): AcquireOutcome {
    const session = routing.session
      ? this.sessions.use(routing.session, routingKey(routing), routing.sessionTtlSeconds * 1000)
      : undefined;
    try {
      let grant: LeaseGrant | undefined;
      if (session?.upstream) {
        const r = this.gatewayLeases.leaseProxy(
          session.upstream,
          target,
          CONNECTION_LEASE_TTL_SECONDS,
          'gateway',
          'session',
        );
        if (r.granted) grant = r.grant;
        else session.upstream = undefined;
      }
      if (!grant) {
        // A new binding ranks the session's id the same way in every process (lease/view). Once
        // ended, only a session can still name the lease in a report (gateway/sessions).
        const r = this.leases.lease(
          {
            target,
            ttlSeconds: CONNECTION_LEASE_TTL_SECONDS,
            ...(routing.selector ? { selector: routing.selector } : {}),
            ...(routing.namespace ? { namespace: routing.namespace } : {}),
          },
          session?.id,
          'gateway',
          session ? 'session' : 'none',
        );
        if (!r.granted) return { ok: false, status: 503, message: noneMessage(r.counts), counts: r.counts };
        grant = r.grant;
      }
      const upstream = upstreamOf(grant);
      if (session) {
        session.upstream = upstream.key;
        session.open++;
        if (grant.target) this.sessions.remember(session, grant.target, grant.id, upstream.key);
      }
      return {
        ok: true,
        acquired: { leaseId: grant.id, upstream, session, ...(grant.target ? { target: grant.target } : {}) },
      };
    } catch (err) {
      if (err instanceof TooManyLeasesError) return { ok: false, status: 503, message: err.message };
      if (err instanceof LeaseInputError) return { ok: false, status: 400, message: err.message };
      throw err;
    }
  }

  renew(leaseId: string): boolean {
    return this.leases.renew(leaseId, CONNECTION_LEASE_TTL_SECONDS) !== undefined;
  }

  release(a: Acquired): void {
    this.leases.release(a.leaseId);
    if (a.session) this.sessions.done(a.session);
  }

  report(a: Acquired, result: Exclude<ReportResult, 'success'>, cooldownSeconds?: number): void {
    this.leases.report(a.leaseId, {
      result,
      release: false,
      ...(cooldownSeconds === undefined ? {} : { cooldownSeconds }),
    });
    // A blocked or failed upstream is not kept for the session: the next connection rebinds.
    if (a.session?.upstream === a.upstream.key) a.session.upstream = undefined;
  }

  reportSession(
    id: string,
    result: ReportResult,
    target: string | undefined,
  ): { ok: true; upstream: string; target: string } | { ok: false; message: string } {
    const found = this.sessions.reportable(id, target);
    if (!found.ok) return found;
    const { session, host, leaseId, upstream } = found;
    if (!this.leases.report(leaseId, { result, release: false })) {
      return { ok: false, message: `session ${JSON.stringify(id)} used ${host} too long ago to report it` };
    }
    if (result !== 'success' && session.upstream === upstream) session.upstream = undefined;
    return { ok: true, upstream, target: host };
  }

  purge(): void {
    this.sessions.purge();
  }
}

function noneMessage(c: {
  matching: number;
  healthy: number;
  coolingDown: number;
  coolingDownForTarget: number;
  atCapacity: number;
  draining: number;
}): string {
  return `no upstream proxy may carry this now: ${c.matching} matching, ${c.healthy} healthy, ${c.draining} draining, ${c.coolingDown} cooling down, ${c.coolingDownForTarget} cooling down for this site, ${c.atCapacity} at capacity`;
}
