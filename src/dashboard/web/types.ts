/**
 * dashboard/web/types — the JSON the dashboard's data routes answer (see docs/dashboard.md),
 * shared by the server that builds it and the page that draws it. Types only: nothing here
 * reaches the browser after type stripping.
 */

/** One proxy as the dashboard shows it; never a credential. */
export interface FleetRow {
  /** "namespace/name". */
  key: string;
  namespace: string;
  name: string;
  /** The `crawl.example.com/pool` label, or null when the proxy has none. */
  pool: string | null;
  /** spec.provider; "external" for an External proxy. */
  provider: string | null;
  phase: string;
  healthy: boolean;
  draining: boolean;
  deleting: boolean;
  leasable: boolean;
  /** Why not leasable now (the lease store's reason), null when leasable. */
  reason: string | null;
  latencyMillis: number | null;
  activeLeases: number;
  /** 0 = unlimited. */
  maxLeases: number;
  /** End of a global cooldown (a `failed` report), RFC 3339. */
  cooldownUntil: string | null;
  /** Per-target cooldowns (`blocked` reports), soonest end first. */
  targetCooldowns: { target: string; until: string }[];
  /** status.egressIP, when the egress-IP check published one. */
  egressIP: string | null;
  /** host:port clients connect to, null while unaddressed. */
  address: string | null;
  /** A problem only a person can fix (reason: message), or null. */
  problem: string | null;
}

/** One condition of a ProxyPool's status (Available, Progressing, SpecValid, …). */
export interface PoolCondition {
  type: string;
  /** "True", "False" or "Unknown". */
  status: string;
  reason: string | null;
  message: string | null;
}

/**
 * One pool: a ProxyPool object (counts from its status, desired from its spec), or a pool label
 * some proxies carry with no ProxyPool of that name in their namespace (`object: false`, counts
 * from the proxies themselves, no desired count).
 */
export interface PoolSummary {
  /** "namespace/name". */
  key: string;
  namespace: string;
  name: string;
  /** Whether a ProxyPool object exists; false for a label on proxies only. */
  object: boolean;
  /** spec.replicas (with its default); null without a ProxyPool. */
  desired: number | null;
  /** status.replicas: the pool's proxies not draining away; null until the controller wrote it. */
  replicas: number | null;
  ready: number | null;
  healthy: number | null;
  leasable: number | null;
  /** Proxies from the current template and within maxAge; null without a ProxyPool. */
  updated: number | null;
  draining: number | null;
  /** Active leases on the pool's proxies (from the lease store). */
  activeLeases: number;
  conditions: PoolCondition[];
  /** deletionTimestamp set: the pool and its proxies are going. */
  deleting: boolean;
  /** The status is older than the spec (or missing): the controller has not caught up yet. */
  stale: boolean;
}

export interface ProviderTargetSummary {
  name: string;
  ready: boolean;
  reason: string;
  message: string | null;
  latencyMillis: number | null;
}

export interface ProviderSummary {
  name: string;
  type: string | null;
  ready: boolean | null;
  reason: string | null;
  targetsReady: string | null;
  lastCheckTime: string | null;
  targets: ProviderTargetSummary[];
}

export type EventKind =
  | 'added'
  | 'deleted'
  | 'phase'
  | 'healthy'
  | 'unhealthy'
  | 'blocked'
  | 'failed'
  | 'replacing'
  | 'replaced'
  | 'egress-ip'
  | 'pool';

export interface FleetEvent {
  /** Increasing number; the page asks for events after the last one it has. */
  seq: number;
  /** RFC 3339. */
  at: string;
  kind: EventKind;
  /** "namespace/name", or null for an event about no one proxy (a pool's events name it in the message). */
  proxy: string | null;
  message: string;
}

export interface FleetTotals {
  proxies: number;
  ready: number;
  healthy: number;
  leasable: number;
  activeLeases: number;
  coolingDown: number;
}

/** `GET /v1/dashboard/state`: the fleet now, plus the events after `?after=`. */
export interface DashboardState {
  /** The server's clock, RFC 3339: time left is counted against it. */
  now: string;
  totals: FleetTotals;
  proxies: FleetRow[];
  pools: PoolSummary[];
  providers: ProviderSummary[];
  events: FleetEvent[];
  /** seq of the newest event (0 when none yet). */
  lastEvent: number;
}

/** `GET /v1/dashboard/history`: mean probe latency per proxy per step, oldest first. */
export interface LatencyHistoryBody {
  stepSeconds: number;
  /** Start of the newest step, RFC 3339; the last value of every series belongs to it. */
  end: string;
  /** Same length for every proxy; null where it was unhealthy or unknown. */
  series: Record<string, (number | null)[]>;
}
