/**
 * dashboard/fleet — the fleet as the dashboard shows it: each lease-store snapshot joined with
 * its Proxy (pool, provider, egress IP) and with where its shared cooldowns came from, Proxies
 * the lease store has not seen yet, and the totals (the pools are dashboard/pools). Fields are
 * picked one by one, so nothing secret can ride along.
 */
import { isConditionTrue } from '../api/conditions.ts';
import type { ProxyObject } from '../api/proxy.ts';
import type { CooldownOrigin, CooldownOrigins, ProxySnapshot } from '../lease/types.ts';
import { providerOf } from './object-events.ts';
import { poolOf } from './pools.ts';
import type { FleetRow, FleetTotals, TargetCooldownRow } from './web/types.ts';

const NO_ORIGINS: ReadonlyMap<string, CooldownOrigin> = new Map();

function targetCooldowns(
  snapshot: ProxySnapshot,
  origins: ReadonlyMap<string, CooldownOrigin>,
): TargetCooldownRow[] {
  return snapshot.targetCooldowns
    .map((c): TargetCooldownRow => {
      const from = origins.get(c.target);
      return {
        target: c.target,
        until: c.until,
        sharedFrom: from ? { proxy: from.proxy, address: from.address } : null,
      };
    })
    .sort((a, b) => (a.until < b.until ? -1 : 1));
}

function address(host: string | null | undefined, port: number | null | undefined): string | null {
  if (!host) return null;
  return port ? `${host.includes(':') ? `[${host}]` : host}:${port}` : host;
}

export function fleetRow(
  snapshot: ProxySnapshot | undefined,
  proxy: ProxyObject | undefined,
  origins: ReadonlyMap<string, CooldownOrigin> = NO_ORIGINS,
): FleetRow | undefined {
  const namespace = snapshot?.namespace ?? proxy?.metadata.namespace;
  const name = snapshot?.name ?? proxy?.metadata.name;
  if (namespace === undefined || name === undefined) return undefined;
  const pool = poolOf(proxy?.metadata.labels);
  return {
    key: `${namespace}/${name}`,
    namespace,
    name,
    pool: pool?.name ?? null,
    poolLabel: pool?.label ?? null,
    provider: proxy ? providerOf(proxy) : null,
    phase: snapshot?.phase ?? proxy?.status?.phase ?? 'Pending',
    healthy: snapshot ? snapshot.healthy : isConditionTrue(proxy?.status?.conditions, 'Healthy'),
    draining: snapshot?.draining ?? false,
    deleting: snapshot?.deleting ?? proxy?.metadata.deletionTimestamp !== undefined,
    leasable: snapshot?.leasable ?? false,
    reason: snapshot ? snapshot.reason : 'NotReady',
    latencyMillis: snapshot?.latencyMillis ?? null,
    activeLeases: snapshot?.activeLeases ?? 0,
    maxLeases: snapshot?.maxLeases ?? proxy?.spec.maxLeases ?? 0,
    cooldownUntil: snapshot?.cooldownUntil ?? null,
    targetCooldowns: snapshot ? targetCooldowns(snapshot, origins) : [],
    egressIP: proxy?.status?.egressIP ?? null,
    address: snapshot
      ? address(snapshot.host, snapshot.port)
      : address(proxy?.status?.address, proxy?.status?.port),
    problem: snapshot?.problem ? `${snapshot.problem.reason}: ${snapshot.problem.message}` : null,
  };
}

/** Rows for every proxy either side knows, sorted by namespace/name. */
export function fleetRows(
  snapshots: readonly ProxySnapshot[],
  proxies: readonly ProxyObject[],
  origins: CooldownOrigins = new Map(),
): FleetRow[] {
  const byKey = new Map<string, ProxyObject>();
  for (const p of proxies) byKey.set(`${p.metadata.namespace ?? ''}/${p.metadata.name}`, p);
  const rows: FleetRow[] = [];
  for (const s of snapshots) {
    const key = `${s.namespace}/${s.name}`;
    const row = fleetRow(s, byKey.get(key), origins.get(key));
    byKey.delete(key);
    if (row) rows.push(row);
  }
  for (const p of byKey.values()) {
    const row = fleetRow(undefined, p);
    if (row) rows.push(row);
  }
  return rows.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

export function fleetTotals(rows: readonly FleetRow[], now: number): FleetTotals {
  const t: FleetTotals = {
    proxies: rows.length,
    ready: 0,
    healthy: 0,
    leasable: 0,
    activeLeases: 0,
    coolingDown: 0,
  };
  for (const r of rows) {
    if (r.phase === 'Ready' || r.phase === 'Replacing') t.ready++;
    if (r.healthy) t.healthy++;
    if (r.leasable) t.leasable++;
    t.activeLeases += r.activeLeases;
    if ((r.cooldownUntil && Date.parse(r.cooldownUntil) > now) || r.targetCooldowns.length > 0)
      t.coolingDown++;
  }
  return t;
}
