import { registerDashboardRoutes } from '../dashboard/routes.ts';
import { type DiscoveryServer, startDiscoveryServer } from '../discovery/server.ts';
import { type ClusterGateway, registerGatewaySync } from '../gateway/cluster.ts';
import { type GatewaySessions, type GatewaySetup, runGateway } from '../gateway/service.ts';
import { startLeaseFeed } from '../lease/feed.ts';
import { startMetricsServer } from '../metrics/server.ts';
import type { Manager, Runnable } from '../runtime/manager.ts';
import type { Components } from './components.ts';
import type { ListenerInputs } from './compose.ts';

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

export function addRunnables(
  manager: Manager,
  c: Components,
  listeners: ListenerInputs,
  gateway: { setup: GatewaySetup; sessions: GatewaySessions; cluster?: ClusterGateway },
): () => string | undefined {
  const {
    flags,
    log,
    registry,
    tracer,
    clock,
    credentials,
    mode,
    leases,
    health,
    reconciler,
    queue,
    gc,
    monitor,
    egress,
    authority,
    dashboard,
  } = c;
  const { store } = mode;
  let discovery: DiscoveryServer | undefined;
  manager.add(
    service('discovery', false, async (signal) => {
      discovery = await startDiscoveryServer({
        bindAddress: flags.discoveryBindAddress,
        leases,
        token: listeners.token,
        tls: listeners.discoveryTls,
        limits: flags.discoveryLimits,
        allowedHosts: flags.discoveryAllowedHosts,
        log: log.child({ component: 'discovery' }),
        registry,
        tracer,
        authority,
        extraRoutes: (app) => {
          registerDashboardRoutes(app, dashboard, c.dashboardAssets);
          if (gateway.cluster) registerGatewaySync(app, gateway.cluster.hub);
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
        store,
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
  // Probes and Healthy writes on the leader only; a new leader starts from the verdicts in status.
  manager.add(service('health', true, (signal) => health.run(signal)));
  manager.add(service('lease-authority', true, (signal) => leadLeases(c, signal)));
  manager.add(
    service('proxy-controller', true, async (signal) => {
      const unsubscribe = reconciler.watchSources((key) => queue.add(key));
      try {
        await queue.runWorkers({
          concurrency: RECONCILE_WORKERS,
          signal,
          process: (key) => reconciler.reconcile(key, signal),
        });
      } finally {
        unsubscribe();
      }
    }),
  );
  // Samples on the leader, where leases and cooldowns live; standbys forward /v1/dashboard/*.
  manager.add(service('dashboard', true, (signal) => dashboard.run(signal)));
  const cluster = gateway.cluster;
  if (cluster) {
    // Cluster mode: every replica serves the gateway, choosing upstreams from the share and the
    // cooldowns the leader's hub hands it (docs/architecture.md, "Gateway scale-out").
    manager.add(
      service('gateway', false, async (signal) => {
        await runGateway(
          gateway.setup,
          {
            leases,
            clock,
            log: log.child({ component: 'gateway' }),
            registry,
            tracer,
            sessions: gateway.sessions,
            chooser: cluster.replica,
            alongside: (s) => cluster.link.run(s),
          },
          signal,
        );
        await cluster.close();
      }),
    );
  } else {
    // Standalone: the gateway serves where leases are decided, once the restored state is in
    // (docs/gateway.md).
    manager.add(
      service('gateway', true, async (signal) => {
        while (!authority.isServing && !signal.aborted)
          await new Promise<void>((r) => clock.setTimeout(r, 50));
        await runGateway(
          gateway.setup,
          {
            leases,
            clock,
            log: log.child({ component: 'gateway' }),
            registry,
            tracer,
            sessions: gateway.sessions,
          },
          signal,
        );
      }),
    );
  }
  // Pools (docs/configuration.md): leader only, like every controller that writes.
  manager.add(
    service('pool-controller', true, async (signal) => {
      const unsubscribe = c.pools.watchSources((key) => c.poolQueue.add(key));
      try {
        await c.poolQueue.runWorkers({
          concurrency: POOL_WORKERS,
          signal,
          process: (key) => c.pools.reconcile(key, signal),
        });
      } finally {
        unsubscribe();
      }
    }),
  );
  manager.add(service('orphan-gc', true, (signal) => gc.start(signal)));
  manager.add(service('provider-health', true, (signal) => monitor.start(signal)));
  if (egress) {
    const checker = egress;
    manager.add(service('egress-ip', true, (signal) => checker.run(signal)));
  }

  return () => discovery?.url;
}

/**
 * The leader's side of the lease authority: restore the checkpoint, then decide leases and
 * checkpoint them every interval; at step-down stop deciding first, then save a last time.
 */
async function leadLeases(c: Components, signal: AbortSignal): Promise<void> {
  const { checkpointer, authority, clock, log, mode } = c;
  for (;;) {
    try {
      await checkpointer.restore(signal);
      break;
    } catch (err) {
      if (signal.aborted) return;
      log.warn({ err }, 'reading the lease checkpoint failed; retrying (lease requests get 503 no_leader)');
      await new Promise<void>((r) => clock.setTimeout(r, 1000));
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

/** Entry for `standalone` and `operator`: runs until SIGTERM/SIGINT; returns the exit code. */
