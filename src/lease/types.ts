/**
 * lease/types — the lease store's data contract (see docs/lease-api.md): what the proxy feed and the
 * health engine pass in, what clients ask for, and what they get back — grants, refusal
 * counts, snapshots — with the limits the API enforces.
 */
import type { Location } from '../api/location.ts';
import type { Selector } from '../runtime/selector.ts';

export const DEFAULT_TTL_SECONDS = 300;
export const MAX_TTL_SECONDS = 3600;
export const DEFAULT_BLOCKED_COOLDOWN_SECONDS = 600;
export const DEFAULT_FAILED_COOLDOWN_SECONDS = 60;
export const MAX_COOLDOWN_SECONDS = 86_400;

export interface ProxyInfo {
  /** "namespace/name". */
  key: string;
  namespace: string;
  name: string;
  uid: string;
  labels: Record<string, string>;
  /**
   * Where it runs (status.location): selectors match it as the topology label keys
   * (api/location `selectableLabels`) beside `labels`.
   */
  location?: Location;
  phase: string;
  /** Initial health, from the status Healthy condition; health-engine verdicts override it. */
  healthy: boolean;
  draining: boolean;
  deleting: boolean;
  /** 0 = unlimited. */
  maxLeases: number;
  /** Empty when the proxy has no address yet (then it is not ready). */
  host: string;
  port: number;
  credentials?: { username: string; password: string };
  latencyMillis?: number;
  /** A problem only a person can fix (e.g. a missing credentials Secret), from the Provisioned condition. */
  problem?: ProxyProblem;
  /** providerID of the instance at host:port; leases remember it so a drain can count them. */
  instance?: string;
  /** Replaced instances still serving the leases granted on them, but no new ones. */
  drainingInstances?: DrainingInstanceInfo[];
  /**
   * The source address its traffic leaves from (status.egressIP): proxies sharing one share
   * `blocked` cooldowns, since a site that blocks the address blocks them all.
   */
  egressIP?: string;
}

export interface DrainingInstanceSnapshot {
  host: string;
  port: number;
  since: string;
  /** Live leases granted on it. */
  activeLeases: number;
}

/** A replaced instance that drains (see docs/lease-api.md). */
export interface DrainingInstanceInfo {
  providerID: string;
  host: string;
  port: number;
  /** When it stopped getting new leases (RFC 3339). */
  since: string;
}

/** Why the operator cannot make a proxy serve until someone acts (see docs/lease-api.md). */
export interface ProxyProblem {
  /** The Provisioned condition's reason: CredentialsError or CloudInitError. */
  reason: string;
  message: string;
}

export interface LeaseRequest {
  target?: string;
  /** Label selector text (Kubernetes syntax) or an already parsed selector. */
  selector?: string | Selector;
  namespace?: string;
  ttlSeconds?: number;
}

export interface LeaseGrant {
  id: string;
  proxy: { namespace: string; name: string; url: string; host: string; port: number };
  target: string | null;
  expiresAt: string;
}

/**
 * Why nothing was leasable, as a funnel over the proxies matching namespace + selector:
 * matching ⊇ ready ⊇ healthy, then the healthy ones split into draining, coolingDown,
 * coolingDownForTarget, atCapacity (each counted in the first of those it falls in), so that
 * healthy − draining − coolingDown − coolingDownForTarget − atCapacity = leasable (0 on refusal).
 */
export interface NoneLeasableCounts {
  matching: number;
  ready: number;
  healthy: number;
  draining: number;
  coolingDown: number;
  coolingDownForTarget: number;
  atCapacity: number;
}

export type LeaseOutcome =
  | { granted: true; grant: LeaseGrant }
  | {
      granted: false;
      counts: NoneLeasableCounts;
      /** Earliest time (ms) a matching proxy may be leasable for the target; undefined: none by itself. */
      retryAt: number | undefined;
    };

export type ReportResult = 'success' | 'blocked' | 'failed';

export interface ReportRequest {
  result: ReportResult;
  cooldownSeconds?: number;
  /** Default true. */
  release?: boolean;
}

/** A report naming the proxy (and the target) instead of a lease. */
export interface ProxyReportRequest {
  namespace: string;
  name: string;
  target?: string;
  result: ReportResult;
  cooldownSeconds?: number;
}

export type NotLeasableReason =
  | 'NotReady'
  | 'Deleting'
  | 'Unhealthy'
  | 'Draining'
  | 'CoolingDown'
  | 'CoolingDownForTarget'
  | 'AtCapacity';

export interface ProxySnapshot {
  namespace: string;
  name: string;
  phase: string;
  healthy: boolean;
  draining: boolean;
  deleting: boolean;
  host: string | null;
  port: number | null;
  /** The source address its traffic leaves from, when known (status.egressIP). */
  egressIP: string | null;
  /** Where it runs (status.location); present only when its provider reports it. */
  location?: Location;
  latencyMillis: number | null;
  activeLeases: number;
  maxLeases: number;
  lastLeasedAt: string | null;
  cooldownUntil: string | null;
  targetCooldowns: { target: string; until: string }[];
  leasable: boolean;
  /** Why not leasable now (the first rule that fails); null when leasable. */
  reason: NotLeasableReason | null;
  /** A problem only a person can fix, or null. */
  problem: ProxyProblem | null;
  /**
   * Replaced instances draining: no new leases, deleted once their leases end (or at the drain
   * timeout). Present only while some instance drains.
   */
  drainingInstances?: DrainingInstanceSnapshot[];
}

export interface SnapshotFilter {
  namespace?: string;
  selector?: string | Selector;
  target?: string;
}

/**
 * Where a lease came from: the lease API, a gateway connection (the connection's target host),
 * or a gateway replica's share of a proxy's capacity (a slot lease, target-less).
 */
export type LeaseVia = 'api' | 'gateway' | 'gateway-share';

/**
 * Why a proxy cools down for a target it was not reported for: another proxy leaving from the
 * same egress address was blocked there (lease/egress-groups).
 */
export interface CooldownOrigin {
  /** "namespace/name" of the proxy whose report (or whose cooldown) it took on. */
  proxy: string;
  /** The egress address they share. */
  address: string;
}

/** Per proxy key, per target: where a cooldown the proxy took on from its egress address came from. */
export type CooldownOrigins = ReadonlyMap<string, ReadonlyMap<string, CooldownOrigin>>;

/** One live lease as the dashboard's lease holders see it. */
export interface LiveLease {
  id: string;
  /** "namespace/name" of its proxy. */
  proxy: string;
  target: string | null;
  /** ms; null for a lease restored from a checkpoint (the grant time is not kept). */
  grantedAt: number | null;
  expiresAt: number;
  /** null for a lease restored from a checkpoint (its origin is not kept). */
  via: LeaseVia | null;
}

export interface LiveLeases {
  /** Every live lease, by origin (`unknown`: restored from a checkpoint). */
  counts: Record<LeaseVia | 'unknown', number>;
  /** The newest ones, newest first. */
  newest: LiveLease[];
}
