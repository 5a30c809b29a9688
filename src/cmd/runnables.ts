/**
 * cmd/runnables — hands the components of one process to the manager as runnables: listeners on
 * every replica, the loops that decide or write on the leader only (docs/deployment.md).
 */
import { dashboardHandlers } from '../dashboard/routes.ts';
import { type DiscoveryServer, startDiscoveryServer } from '../discovery/server.ts';
import { type ClusterGateway, gatewaySyncHandler } from '../gateway/cluster.ts';
import { type GatewaySessions, type GatewaySetup, runGateway } from '../gateway/service.ts';
import { LeaseCheckpointDamagedError } from '../lease/errors.ts';
import { startLeaseFeed } from '../lease/feed.ts';
import type { TlsFiles } from '../metrics/listener.ts';
import { startMetricsServer } from '../metrics/server.ts';
import type { Manager, Runnable } from '../runtime/manager.ts';
import type { ProcessResult, WorkQueue } from '../runtime/workqueue.ts';
import type { Components } from './components.ts';

/** What the listeners take from the environment and flags, read once before anything starts. */
export interface ListenerInputs {
  token: string | undefined;
  discoveryTls: TlsFiles | undefined;
  /** GATEWAY_TOKEN, else DISCOVERY_TOKEN (docs/gateway.md). */
  gatewayToken: string | undefined;
}

/** Reconcile workers: enough to overlap slow provider calls, few enough to stay under quotas. */
const RECONCILE_WORKERS = 8;
/** Pool workers: a pass is mostly cache reads, and one pool is never handled by two at once. */
const POOL_WORKERS = 2;

function service(
  name: string,
  needLeaderElection: boolean,
  run: (signal: AbortSignal) => Promise<void>,
): Runnable {
  return { name, needLeaderElection, start: run };
}

function untilAborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((r) => signal.addEventListener('abort', () => r(), { once: true }));
}

/** Hands every component to the manager; returns where the discovery API listens once started. */
export function addRunnables(
  manager: Manager,
  c: Components,
  listeners: ListenerInputs,
  gateway: { setup: GatewaySetup; sessions: GatewaySessions; cluster?: ClusterGateway },
): () => string | undefined {
  const discoveryUrl = addListeners(manager, c, listeners, gateway);
  addLeaderLoops(manager, c);
  addGateway(manager, c, gateway);
  return discoveryUrl;
}

/** The discovery API and the metrics endpoint, on every replica, and the lease feed behind them. */
function addListeners(
  manager: Manager,
  c: Components,
  listeners: ListenerInputs,
  gateway: { sessions: GatewaySessions; cluster?: ClusterGateway },
): () => string | undefined {
  const { flags, log, registry, tracer, clock, credentials, mode, leases, authority, dashboard } = c;
  let discovery: DiscoveryServer | undefined;
  manager.add(
    service('discovery', false, async (signal) => {
      discovery = await startDiscoveryServer({
        bindAddress: flags.discoveryBindAddress,
        leases,
        token: listeners.token,
        tls: listeners.discoveryTls,
        limits: flags.discoveryLimits,
        allowedHosts: [...flags.discoveryAllowedHosts, ...(mode.discoveryHosts ?? [])],
        log: log.child({ component: 'discovery' }),
        registry,
        tracer,
        authority,
        handlers: {
          ...dashboardHandlers(dashboard, c.dashboardAssets),
          ...(gateway.cluster ? { gatewaySync: gatewaySyncHandler(gateway.cluster.hub) } : {}),
        },
        sessions: gateway.sessions,
      });
      mode.advertiseDiscovery?.(discovery.url);
      log.info({ url: discovery.url }, 'discovery API listening');
      await untilAborted(signal);
      await discovery.close();
      leases.close();
    }),
  );
  manager.add(
    service('metrics', false, async (signal) => {
      const server = await startMetricsServer({
        bindAddress: flags.metricsBindAddress,
        registry,
        log: log.child({ component: 'metrics' }),
        authorize: mode.metricsAuthorizer,
        tls: mode.metricsTls,
        limits: flags.metricsLimits,
      });
      if (server) log.info({ address: server.address }, 'metrics endpoint listening');
      await untilAborted(signal);
      await server?.close();
    }),
  );
  manager.add(
    service('lease-feed', false, async (signal) => {
      const feed = startLeaseFeed({
        store: mode.store,
        leases,
        clock,
        credentials,
        log: log.child({ component: 'lease-feed' }),
        signal,
      });
      await untilAborted(signal);
      feed.stop();
    }),
  );
  return () => discovery?.url;
}

/** A controller on the leader: its sources fill the queue, `workers` reconcile keys from it. */
function controller(
  name: string,
  loop: {
    watchSources(add: (key: string) => void): () => void;
    reconcile(key: string, signal: AbortSignal): Promise<ProcessResult | undefined>;
  },
  queue: WorkQueue,
  workers: number,
): Runnable {
  return service(name, true, async (signal) => {
    const unsubscribe = loop.watchSources((key) => queue.add(key));
    try {
      await queue.runWorkers({ concurrency: workers, signal, process: (key) => loop.reconcile(key, signal) });
    } finally {
      unsubscribe();
    }
  });
}

/** Everything that probes, decides or writes: on the leader only. */
function addLeaderLoops(manager: Manager, c: Components): void {
  // Probes and Healthy writes on the leader only; a new leader starts from the verdicts in status.
  manager.add(service('health', true, (signal) => c.health.run(signal)));
  manager.add(service('lease-authority', true, (signal) => leadLeases(c, signal)));
  manager.add(controller('proxy-controller', c.reconciler, c.queue, RECONCILE_WORKERS));
  // Samples on the leader, where leases and cooldowns live; standbys forward /v1/dashboard/*.
  manager.add(service('dashboard', true, (signal) => c.dashboard.run(signal)));
  // Pools (docs/configuration.md): leader only, like every controller that writes.
  manager.add(controller('pool-controller', c.pools, c.poolQueue, POOL_WORKERS));
  manager.add(service('orphan-sweep', true, (signal) => c.orphans.start(signal)));
  manager.add(service('provider-health', true, (signal) => c.monitor.start(signal)));
  const egress = c.egress;
  if (egress) manager.add(service('egress-ip', true, (signal) => egress.run(signal)));
}

/**
 * The gateway (docs/gateway.md). Standalone: it serves where leases are decided, once the
 * restored state is in. Cluster mode: every replica serves it, choosing upstreams from the share
 * and the cooldowns the leader's hub hands it (docs/architecture.md, "Gateway scale-out").
 */
function addGateway(
  manager: Manager,
  c: Components,
  gateway: { setup: GatewaySetup; sessions: GatewaySessions; cluster?: ClusterGateway },
): void {
  const { log, registry, tracer, clock, authority, leases } = c;
  const deps = {
    leases,
    clock,
    log: log.child({ component: 'gateway' }),
    registry,
    tracer,
    sessions: gateway.sessions,
  };
  const cluster = gateway.cluster;
  if (cluster) {
    manager.add(
      service('gateway', false, async (signal) => {
        await runGateway(
          gateway.setup,
          { ...deps, chooser: cluster.replica, alongside: (s) => cluster.link.run(s) },
          signal,
        );
        await cluster.close();
      }),
    );
    return;
  }
  manager.add(
    service('gateway', true, async (signal) => {
      while (!authority.isServing && !signal.aborted) await new Promise<void>((r) => clock.setTimeout(r, 50));
      await runGateway(gateway.setup, deps, signal);
    }),
  );
}

/** How often a leader that found the lease checkpoint damaged reads it again. */
const DAMAGED_CHECKPOINT_RETRY_MS = 30_000;

/**
 * The leader's side of the lease authority: restore the checkpoint, then decide leases and
 * checkpoint them every interval; at step-down stop deciding first, then save a last time. A
 * store that cannot be read is retried every second; a damaged checkpoint stops the process or
 * keeps the leader from deciding (ModeParts.damagedCheckpoint) unless `--discard-lease-state`.
 */
async function leadLeases(c: Components, signal: AbortSignal): Promise<void> {
  const { checkpointer, authority, clock, log, mode, flags } = c;
  for (;;) {
    let retryMs = 1000;
    try {
      await checkpointer.restore(signal, { discard: flags.leases.discardLeaseState });
      break;
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof LeaseCheckpointDamagedError) {
        if (mode.damagedCheckpoint === 'stop') throw err;
        log.error(
          { err, where: err.where },
          'lease checkpoint damaged; not deciding leases (503 no_leader) until it is repaired or removed, or the leader runs with --discard-lease-state',
        );
        retryMs = DAMAGED_CHECKPOINT_RETRY_MS;
      } else {
        log.warn({ err }, 'reading the lease checkpoint failed; retrying (lease requests get 503 no_leader)');
      }
      // Abortable: a shutdown does not wait out the pause.
      await new Promise<void>((r) => {
        const done = () => {
          clock.clearTimeout(t);
          signal.removeEventListener('abort', done);
          r();
        };
        const t = clock.setTimeout(done, retryMs);
        signal.addEventListener('abort', done, { once: true });
      });
    }
  }
  if (signal.aborted) return;
  authority.startServing();
  log.info('deciding leases');
  await checkpointer.run(signal);
  authority.stopServing();
  // After a lost election another replica may already decide: only a leader that still holds
  // the lock (a graceful stop) writes the final checkpoint.
  if (!mode.elector.isLeader()) return;
  const timeout = new AbortController();
  const t = clock.setTimeout(() => timeout.abort(), 10_000);
  try {
    if (await checkpointer.save(timeout.signal)) log.info('lease state saved for the next leader');
  } finally {
    clock.clearTimeout(t);
  }
}
