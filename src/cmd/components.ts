/**
 * cmd/components — builds the components of one process (stores' clients, lease store and feed,
 * health engine, reconciler, pool controller, orphan sweep, provider health, discovery) from what the mode prepared, in
 * dependency order, each registered for teardown as soon as it exists.
 */
import type { Tracer } from '@opentelemetry/api';
import type { Registry } from 'prom-client';
import { createProxyReconciler } from '../controller/reconciler.ts';
import { type DashboardAssets, loadDashboardAssets } from '../dashboard/assets.ts';
import { Dashboard } from '../dashboard/dashboard.ts';
import { LeaseAuthority } from '../discovery/authority.ts';
import { EgressIpChecker } from '../health/egress.ts';
import { HealthEngine } from '../health/engine.ts';
import { LeaseCheckpointer } from '../lease/checkpoint.ts';
import { endedLeaseEvictionCounter, leaseEvictionCounter, registerLeaseMetrics } from '../lease/metrics.ts';
import { LeaseStore } from '../lease/store.ts';
import { errorMessage } from '../log/errors.ts';
import type { Logger } from '../log/index.ts';
import { registerHealthyProxiesGauge, registerProxyPhaseGauge } from '../metrics/fleet.ts';
import { OrphanSweeper } from '../orphans/sweeper.ts';
import { createPoolReconciler, type PoolReconciler } from '../pool/reconciler.ts';
import { LOCAL_ID_PREFIX } from '../provider/local/index.ts';
import type { ProviderRegistry } from '../provider/registry.ts';
import { ProviderHealthMonitor } from '../providerhealth/monitor.ts';
import type { Clock } from '../runtime/clock.ts';
import type { CredentialsResolver } from '../runtime/credentials.ts';
import { WorkQueue } from '../runtime/workqueue.ts';
import type { CommonFlags } from './flags.ts';
import { operatorProbeAddress } from './listeners.ts';
import type { ModeParts } from './modes.ts';
import { StartupError } from './startup.ts';

export interface Shared {
  flags: CommonFlags;
  log: Logger;
  registry: Registry;
  tracer: Tracer;
  clock: Clock;
  credentials: CredentialsResolver;
  mode: ModeParts;
  providers: ProviderRegistry;
  /**
   * Providers that assign each proxy its source address (local `egressAddresses`): the
   * reconciler writes their status.egressIP, so the egress-IP check leaves those proxies alone.
   */
  assignsEgressIP?: ReadonlySet<string>;
}

export interface Components extends Shared {
  health: HealthEngine;
  leases: LeaseStore;
  egress: EgressIpChecker | undefined;
  authority: LeaseAuthority;
  checkpointer: LeaseCheckpointer;
  reconciler: ReturnType<typeof createProxyReconciler>;
  queue: WorkQueue;
  pools: PoolReconciler;
  poolQueue: WorkQueue;
  orphans: OrphanSweeper;
  monitor: ProviderHealthMonitor;
  dashboard: Dashboard;
  dashboardAssets: DashboardAssets;
}

/** The control loops and services over the store and providers; nothing runs yet. */
export function buildComponents(shared: Shared): Components {
  const { health, leases, egress } = buildHealthAndLeases(shared);
  return {
    ...shared,
    health,
    leases,
    egress,
    ...buildControllers(shared, leases),
    ...buildHousekeeping(shared),
    ...buildLeaseAuthority(shared, leases),
    ...buildDashboard(shared, leases),
  };
}

/** The health engine, the optional egress-IP check and the lease store, which call each other. */
function buildHealthAndLeases(shared: Shared): Pick<Components, 'health' | 'leases' | 'egress'> {
  const { flags, log, registry, tracer, clock, credentials, mode } = shared;
  const { store } = mode;
  const probeAt = operatorProbeAddress(flags.discoveryBindAddress, process.env);
  // The health engine and the lease store call each other, each only once running.
  const health = new HealthEngine({
    store,
    clock,
    credentials,
    logger: log.child({ component: 'health' }),
    registry,
    traceProbes: flags.traceHealthProbes,
    tracer,
    // Where the placeholder host of health-check URLs (`operator.invalid`) points.
    ...(probeAt === undefined ? {} : { operatorAddress: probeAt }),
    listener: (v) => leases.setHealth(v.key, v.uid, { healthy: v.healthy, latencyMillis: v.latencyMillis }),
  });
  const evicted = leaseEvictionCounter(registry);
  const endedEvicted = endedLeaseEvictionCounter(registry);
  const leases: LeaseStore = new LeaseStore({
    clock,
    log: log.child({ component: 'leases' }),
    requestProbe: (key) => health.requestProbe(key),
    maxActiveLeases: flags.leases.maxActiveLeases,
    drainTimeoutMs: flags.leases.drainTimeoutMs,
    onCooldownEvicted: () => evicted.inc(),
    endedLeaseBytes: flags.leases.endedLeaseBytes,
    onEndedLeaseEvicted: (holder) => endedEvicted.inc({ holder }),
    perLeaseCredentials: (id) => id.startsWith(LOCAL_ID_PREFIX),
  });
  registerLeaseMetrics(registry, leases);
  registerProxyPhaseGauge(registry, store.proxies);
  registerHealthyProxiesGauge(registry, store.proxies);
  return { health, leases, egress: buildEgressCheck(shared) };
}

/** Optional (docs/health.md): publishes each proxy's egress IP in status.egressIP (leader only). */
function buildEgressCheck(shared: Shared): EgressIpChecker | undefined {
  const { flags, log, registry, clock, credentials, mode } = shared;
  if (!flags.egressIpUrl) return undefined;
  try {
    return new EgressIpChecker({
      store: mode.store,
      clock,
      credentials,
      url: flags.egressIpUrl,
      skip: (p) => shared.assignsEgressIP?.has(p.spec.provider ?? '') ?? false,
      log: log.child({ component: 'egress-ip' }),
      registry,
    });
  } catch (err) {
    throw new StartupError(errorMessage(err), { cause: err });
  }
}

/** The Proxy reconciler and the pool controller, each with its work queue. */
function buildControllers(
  shared: Shared,
  leases: LeaseStore,
): Pick<Components, 'reconciler' | 'queue' | 'pools' | 'poolQueue'> {
  const { flags, log, registry, tracer, clock, credentials, mode, providers } = shared;
  const { store } = mode;
  const leasesOn = (key: string, providerID: string): number => leases.leasesOn(key, providerID);
  const reconciler = createProxyReconciler({
    store,
    providers,
    clock,
    credentials,
    log: log.child({ component: 'controller' }),
    registry,
    tracer,
    installation: mode.installationId,
    options: { drainTimeoutMs: flags.leases.drainTimeoutMs },
    maxConcurrentReplacements: flags.maxConcurrentReplacements,
    leasesOn,
  });
  const pools = createPoolReconciler({
    store,
    clock,
    log: log.child({ component: 'pool' }),
    leasesOn,
    providerType: (name) => providers.type(name),
    canRestart: (name) => providers.canRestart(name),
    drainTimeoutMs: flags.leases.drainTimeoutMs,
  });
  const queue = (name: string): WorkQueue =>
    new WorkQueue({ name, clock, registry, log: log.child({ component: 'workqueue' }) });
  return { reconciler, queue: queue('proxy'), pools, poolQueue: queue('pool') };
}

/** The orphan sweep and the provider health monitor: periodic checks beside the controllers. */
function buildHousekeeping(shared: Shared): Pick<Components, 'orphans' | 'monitor'> {
  const { flags, log, registry, tracer, clock, mode, providers } = shared;
  const { store } = mode;
  const orphans = new OrphanSweeper({
    store,
    clock,
    providers: () => providers.entries(),
    intervalMs: flags.gcIntervalMs,
    minAgeMs: flags.gcMinAgeMs,
    proxyNamespace: mode.proxyNamespace,
    installation: mode.installationId,
    log: log.child({ component: 'orphans' }),
    registry,
    tracer,
  });
  const checkers = providers.checkers();
  const monitor = new ProviderHealthMonitor({
    store,
    clock,
    providers: providers.names().map((name) => ({
      name,
      type: providers.type(name) ?? 'unknown',
      checker: checkers.get(name),
    })),
    intervalMs: flags.providerCheckIntervalMs,
    timeoutMs: flags.providerCheckTimeoutMs,
    log: log.child({ component: 'providerhealth' }),
    registry,
    tracer,
  });
  return { orphans, monitor };
}

/** One authority (docs/deployment.md): the leader decides leases, standbys forward to it. */
function buildLeaseAuthority(
  shared: Shared,
  leases: LeaseStore,
): Pick<Components, 'authority' | 'checkpointer'> {
  const { flags, log, registry, clock, mode } = shared;
  const authority = new LeaseAuthority({
    leaderUrl: () => mode.elector.leaderAddress?.(),
    isLeader: () => mode.elector.isLeader(),
  });
  const checkpointer = new LeaseCheckpointer({
    leases,
    storage: mode.leaseCheckpoint,
    intervalMs: flags.leases.checkpointIntervalMs,
    clock,
    log: log.child({ component: 'lease-checkpoint' }),
    registry,
  });
  return { authority, checkpointer };
}

/** The web page (docs/dashboard.md): samples the stores on the leader, served by discovery. */
function buildDashboard(
  shared: Shared,
  leases: LeaseStore,
): Pick<Components, 'dashboard' | 'dashboardAssets'> {
  const dashboard = new Dashboard({ leases, store: shared.mode.store, clock: shared.clock });
  try {
    return { dashboard, dashboardAssets: loadDashboardAssets() };
  } catch (err) {
    throw new StartupError(`dashboard: ${errorMessage(err)}`, { cause: err });
  }
}
