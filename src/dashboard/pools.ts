/**
 * dashboard/pools — which pool a proxy is in, and the pools as the dashboard shows them: every
 * ProxyPool object the store holds (the embedded standalone store or the cluster's informer
 * cache), with its desired count from `spec.replicas`, the counts and conditions its controller
 * wrote to `status`, and the active leases of its Proxies. Proxies whose pool names no ProxyPool
 * in their namespace (the `pool` label users select on, a pool label set by hand, or one left
 * by a pool being deleted) are listed too, counted from the fleet and marked as such. Fields are
 * picked one by one: nothing of the template (which may name Secrets) reaches the page. Pool
 * events (added, scaled, availability, deleted) come from watch events.
 */
import { LABEL_POOL } from '../api/constants.ts';
import { desiredReplicas, type ProxyPool } from '../api/proxypool.ts';
import type { ObjectStore, WatchEvent } from '../runtime/store.ts';
import type { DerivedEvent } from './snapshot-events.ts';
import type { FleetRow, PoolCondition, PoolSummary } from './web/types.ts';

/**
 * The label users group proxies by and select on: the examples' `pool: eu`, a lease request's
 * `selector=pool=eu`, the gateway's `pool-eu` user-name option.
 */
export const USER_POOL_LABEL = 'pool';

/**
 * A proxy's pool: the ProxyPool that owns it (the label ProxyPools set on their Proxies), else
 * the `pool` label; undefined without either. One rule, so the Pool column, the Pools panel and
 * the selectors users write agree.
 */
export function poolOf(
  labels: Readonly<Record<string, string>> | undefined,
): { name: string; label: string } | undefined {
  for (const label of [LABEL_POOL, USER_POOL_LABEL]) {
    const name = labels?.[label];
    if (name) return { name, label };
  }
  return undefined;
}

/** Where the pools come from, given the fleet rows (for the leases and the label-only pools). */
export type PoolLister = (rows: readonly FleetRow[]) => PoolSummary[];

/** Condition messages are written by the operator; the bound keeps one cell readable. */
const MAX_MESSAGE = 240;

function clip(s: string | undefined): string | null {
  if (!s) return null;
  return s.length > MAX_MESSAGE ? `${s.slice(0, MAX_MESSAGE - 1)}…` : s;
}

function poolKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

function count(n: number | undefined): number | null {
  return typeof n === 'number' && Number.isFinite(n) ? n : null;
}

function conditionsOf(pool: ProxyPool): PoolCondition[] {
  return (pool.status?.conditions ?? []).map((c) => ({
    type: c.type,
    status: c.status,
    reason: c.reason || null,
    message: clip(c.message),
  }));
}

/** One row per ProxyPool, then one per pool label without a ProxyPool; sorted by namespace/name. */
export function poolSummaries(pools: readonly ProxyPool[], rows: readonly FleetRow[]): PoolSummary[] {
  // Leases and members per (namespace, pool label), from the fleet rows.
  const members = new Map<string, FleetRow[]>();
  for (const r of rows) {
    if (r.pool === null) continue;
    const key = poolKey(r.namespace, r.pool);
    const list = members.get(key);
    if (list) list.push(r);
    else members.set(key, [r]);
  }
  const out: PoolSummary[] = [];
  for (const p of pools) {
    const namespace = p.metadata.namespace ?? '';
    const key = poolKey(namespace, p.metadata.name);
    const own = members.get(key) ?? [];
    members.delete(key);
    const s = p.status;
    const generation = p.metadata.generation;
    out.push({
      key,
      namespace,
      name: p.metadata.name,
      object: true,
      selectors: [`${LABEL_POOL}=${p.metadata.name}`],
      desired: desiredReplicas(p.spec),
      replicas: count(s?.replicas),
      ready: count(s?.readyReplicas),
      healthy: count(s?.healthyReplicas),
      leasable: count(s?.leasableReplicas),
      updated: count(s?.updatedReplicas),
      draining: count(s?.drainingReplicas),
      activeLeases: own.reduce((n, r) => n + r.activeLeases, 0),
      conditions: conditionsOf(p),
      deleting: p.metadata.deletionTimestamp !== undefined,
      stale:
        s === undefined ||
        (generation !== undefined && s.observedGeneration !== undefined && s.observedGeneration < generation),
    });
  }
  for (const [key, own] of members) {
    const first = own[0] as FleetRow;
    out.push({
      key,
      namespace: first.namespace,
      name: first.pool as string,
      object: false,
      selectors: [...new Set(own.map((r) => `${r.poolLabel}=${r.pool}`))].sort(),
      desired: null,
      replicas: own.length,
      ready: own.filter((r) => r.phase === 'Ready' || r.phase === 'Replacing').length,
      healthy: own.filter((r) => r.healthy).length,
      leasable: own.filter((r) => r.leasable).length,
      updated: null,
      draining: own.filter((r) => r.draining).length,
      activeLeases: own.reduce((n, r) => n + r.activeLeases, 0),
      conditions: [],
      deleting: false,
      stale: false,
    });
  }
  return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

/** The dashboard's PoolLister: the ProxyPool objects of `store`'s cache, read at each sample. */
export function storePools(store: Pick<ObjectStore, 'proxyPools'>): PoolLister {
  return (rows) => poolSummaries(store.proxyPools.list(), rows);
}

function availability(p: ProxyPool | undefined): { status: string; reason: string | null } | undefined {
  const c = p?.status?.conditions?.find((x) => x.type === 'Available');
  return c ? { status: c.status, reason: c.reason || null } : undefined;
}

/** Events read off ProxyPool watch events: added, scaled, available or not, deleting, deleted. */
export function poolEvents(e: WatchEvent<ProxyPool>): DerivedEvent[] {
  const p = e.object;
  const subject = `pool ${poolKey(p.metadata.namespace ?? '', p.metadata.name)}`;
  const ev = (message: string): DerivedEvent => ({ kind: 'pool', proxy: null, message });
  if (e.type === 'ADDED') return [ev(`${subject} added (${desiredReplicas(p.spec)} replicas)`)];
  if (e.type === 'DELETED') return [ev(`${subject} deleted`)];
  const old = e.old;
  if (!old) return [];
  const out: DerivedEvent[] = [];
  const [was, is] = [desiredReplicas(old.spec), desiredReplicas(p.spec)];
  if (was !== is) out.push(ev(`${subject} scaled ${was} → ${is}`));
  if (!old.metadata.deletionTimestamp && p.metadata.deletionTimestamp) out.push(ev(`${subject} deleting`));
  const [before, after] = [availability(old), availability(p)];
  if (after && after.status !== before?.status) {
    const why = after.reason ? ` (${after.reason})` : '';
    out.push(ev(`${subject} ${after.status === 'True' ? 'available' : 'not available'}${why}`));
  }
  return out;
}
