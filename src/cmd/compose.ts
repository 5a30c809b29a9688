/**
 * cmd/compose — the one composition root: builds store, providers, reconciler, health engine,
 * lease store, discovery API, metrics, orphan GC and provider health for either mode, checks
 * everything that can be checked before anything starts, then hands them to the manager.
 * Standalone and cluster mode differ only in the store, the elector and the kubernetes
 * provider.
 */
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import type { Registry } from 'prom-client';
import { loadProvidersConfig } from '../config/load.ts';
import type { ProvidersConfig } from '../config/schema.ts';
import { createProxyReconciler } from '../controller/reconciler.ts';
import { type DiscoveryServer, startDiscoveryServer } from '../discovery/server.ts';
import { OrphanGC } from '../gc/gc.ts';
import { EgressIpChecker } from '../health/egress.ts';
import { HealthEngine } from '../health/engine.ts';
import { startLeaseFeed } from '../lease/feed.ts';
import { registerLeaseMetrics } from '../lease/metrics.ts';
import { LeaseStore } from '../lease/store.ts';
import { errorMessage } from '../log/errors.ts';
import { createLogger, type Logger } from '../log/index.ts';
import type { Authorize } from '../metrics/authorize.ts';
import { registerProxyPhaseGauge } from '../metrics/fleet.ts';
import { createMetricsRegistry } from '../metrics/index.ts';
import { startMetricsServer } from '../metrics/server.ts';
import { createGcpProvider } from '../provider/gcp/index.ts';
import { createKvmProvider } from '../provider/kvm/index.ts';
import { createLocalProvider } from '../provider/local/index.ts';
import { buildProviders, type ProviderFactory, type ProviderRegistry } from '../provider/registry.ts';
import { ProviderHealthMonitor, validateSchedule } from '../providerhealth/monitor.ts';
import { createEmbeddedStore } from '../runtime/embedded/store.ts';
import type { KubeClients } from '../runtime/kube/client.ts';
import { type LeaderElector, StandaloneElector } from '../runtime/leader/elector.ts';
import { Manager, type Runnable } from '../runtime/manager.ts';
import type { ObjectStore } from '../runtime/store.ts';
import { WorkQueue } from '../runtime/workqueue.ts';
import { setupTracing, type Tracing } from '../tracing/index.ts';
import type { CommonFlags, OperatorFlags, ParsedCommand, StandaloneFlags } from './flags.ts';

export const LEADER_LEASE_NAME = 'egress-proxies-operator-leader';
const RECONCILE_WORKERS = 8;

/** A start-up problem the user must fix; printed as one line. */
export class StartupError extends Error {
  constructor(message: string, opts?: { cause?: unknown }) {
    super(message, opts);
    this.name = 'StartupError';
  }
}

export interface App {
  manager: Manager;
  store: ObjectStore;
  providers: ProviderRegistry;
  leases: LeaseStore;
  health: HealthEngine;
  registry: Registry;
  log: Logger;
  /** Base URL of the discovery API once started. */
  discoveryUrl(): string | undefined;
  /** Runs until SIGTERM/SIGINT or stop(); rejects on a fatal runnable error. */
  run(): Promise<void>;
  stop(): Promise<void>;
}

export interface StandalonePaths {
  providersFile: string;
  manifests: string;
  statePath: string;
}

/** `--config` may name the providers file or a directory holding `providers.yaml`. */
export function resolveStandalonePaths(flags: StandaloneFlags, cwd = process.cwd()): StandalonePaths {
  const config = resolve(cwd, flags.config);
  if (!existsSync(config)) throw new StartupError(`--config: ${flags.config} does not exist`);
  const isDir = statSync(config).isDirectory();
  const providersFile = isDir ? join(config, 'providers.yaml') : config;
  if (!existsSync(providersFile)) {
    throw new StartupError(`--config: ${flags.config} is a directory without a providers.yaml`);
  }
  const manifests = flags.manifests
    ? resolve(cwd, flags.manifests)
    : join(isDir ? config : dirname(config), 'proxies');
  if (!existsSync(manifests)) {
    throw new StartupError(
      `--manifests: ${flags.manifests ?? manifests} does not exist (Proxy manifests are read from there)`,
    );
  }
  const statePath = resolve(cwd, flags.state ?? join('.state', 'standalone-state.json'));
  return { providersFile, manifests, statePath };
}

function loggerFor(flags: CommonFlags): Logger {
  const pretty = flags.logFormat === 'pretty' ? true : flags.logFormat === 'json' ? false : undefined;
  return createLogger({ level: flags.logLevel, ...(pretty === undefined ? {} : { pretty }) });
}

async function loadConfig(path: string, log: Logger): Promise<ProvidersConfig> {
  try {
    return await loadProvidersConfig(path, { logger: log.child({ component: 'config' }) });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'EACCES' || code === 'EISDIR') {
      throw new StartupError(`providers config ${path}: cannot read it (${code})`, { cause: err });
    }
    throw new StartupError(errorMessage(err), { cause: err });
  }
}

function providerFactories(
  kubernetes: ProviderFactory | undefined,
  flags: Pick<CommonFlags, 'gcpWireFullPayloads'>,
): Record<string, ProviderFactory> {
  return {
    local: (entry, deps) =>
      createLocalProvider({ name: entry.name, config: entry.local ?? {}, log: deps.log }),
    kubernetes:
      kubernetes ??
      (() => {
        throw new Error(
          'the kubernetes provider runs only in cluster mode (egress-proxies-operator operator)',
        );
      }),
    gcp: (entry, deps) => {
      if (!entry.gcp) throw new Error('the gcp block is required for a provider of type gcp');
      return createGcpProvider({
        name: entry.name,
        config: entry.gcp,
        log: deps.log,
        wireLog: flags.gcpWireFullPayloads,
      });
    },
    kvm: (entry, deps) => {
      if (!entry.kvm) throw new Error('the kvm block is required for a provider of type kvm');
      return createKvmProvider({ name: entry.name, config: entry.kvm, log: deps.log });
    },
  };
}

/** Wraps a start/stop pair as a runnable that lives until the manager stops it. */
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

interface ModeParts {
  store: ObjectStore;
  elector: LeaderElector;
  kube?: KubeClients;
  kubernetesProvider?: ProviderFactory;
  metricsAuthorizer?: Authorize;
  providersFile: string;
  proxyNamespace?: string;
}

async function standaloneParts(flags: StandaloneFlags, log: Logger): Promise<ModeParts> {
  const paths = resolveStandalonePaths(flags);
  let store: ObjectStore;
  try {
    mkdirSync(dirname(paths.statePath), { recursive: true });
    store = await createEmbeddedStore({
      manifests: paths.manifests,
      statePath: paths.statePath,
      log: log.child({ component: 'store' }),
    });
  } catch (err) {
    throw new StartupError(errorMessage(err), { cause: err });
  }
  log.info({ manifests: paths.manifests, state: paths.statePath }, 'standalone store ready');
  return { store, elector: new StandaloneElector(), providersFile: paths.providersFile };
}

/**
 * Cluster mode. Its modules (client-node, undici 8) are loaded only here: they need
 * Node ≥ 22.19, while standalone mode runs on any Node ≥ 22.12.
 */
async function operatorParts(flags: OperatorFlags, log: Logger): Promise<ModeParts> {
  const [{ KubeConfig }, { createKubeClients }, { createKubeStore }, { LeaseElector }, k8sProvider, authz] =
    await Promise.all([
      import('@kubernetes/client-node'),
      import('../runtime/kube/client.ts'),
      import('../runtime/kube/store.ts'),
      import('../runtime/leader/lease.ts'),
      import('../provider/kubernetes/index.ts'),
      import('../metrics/authorize.ts'),
    ]);
  const kc = new KubeConfig();
  try {
    if (flags.kubeconfig) kc.loadFromFile(flags.kubeconfig);
    else kc.loadFromDefault();
  } catch (err) {
    throw new StartupError(`kubeconfig: ${errorMessage(err)}`, { cause: err });
  }
  const kube = await createKubeClients(kc);
  const store = await createKubeStore({
    clients: kube,
    log: log.child({ component: 'store' }),
    ...(flags.proxyNamespace ? { namespace: flags.proxyNamespace } : {}),
  });
  const elector: LeaderElector = flags.leaderElect
    ? new LeaseElector({
        api: kube.coordination,
        namespace: flags.leaderElectionNamespace ?? k8sProvider.operatorNamespace(),
        name: LEADER_LEASE_NAME,
        log: log.child({ component: 'leader-election' }),
      })
    : new StandaloneElector();
  const kubernetesProvider: ProviderFactory = (entry, deps) =>
    k8sProvider.createKubernetesProvider({
      name: entry.name,
      config: entry.kubernetes ?? {},
      core: kube.core,
      apiHost: kc.getCurrentCluster()?.server ?? '',
      log: deps.log,
    });
  return {
    store,
    elector,
    kube,
    kubernetesProvider,
    ...(flags.metricsSecure ? { metricsAuthorizer: authz.tokenReviewAuthorizer(kc) } : {}),
    providersFile: flags.providersConfig,
    ...(flags.proxyNamespace ? { proxyNamespace: flags.proxyNamespace } : {}),
  };
}

export async function buildApp(
  parsed: Extract<ParsedCommand, { command: 'standalone' | 'operator' }>,
  opts: { log?: Logger; version?: string; env?: NodeJS.ProcessEnv } = {},
): Promise<App> {
  const flags = parsed.flags;
  const env = opts.env ?? process.env;
  const log = opts.log ?? loggerFor(flags);
  const scheduleProblem = validateSchedule(flags.providerCheckIntervalMs, flags.providerCheckTimeoutMs);
  if (scheduleProblem) throw new StartupError(scheduleProblem);

  // Validate the providers config before touching any backend or state file.
  const providersFile =
    parsed.command === 'standalone'
      ? resolveStandalonePaths(parsed.flags).providersFile
      : parsed.flags.providersConfig;
  const config = await loadConfig(providersFile, log);

  const tracing: Tracing = setupTracing({
    serviceName: 'egress-proxies-operator',
    ...(opts.version ? { serviceVersion: opts.version } : {}),
    log,
  });
  const tracer = tracing.tracer;
  const registry = createMetricsRegistry();

  const mode =
    parsed.command === 'standalone'
      ? await standaloneParts(parsed.flags, log)
      : await operatorParts(parsed.flags, log);
  const { store } = mode;

  let providers: ProviderRegistry;
  try {
    providers = await buildProviders(config, providerFactories(mode.kubernetesProvider, parsed.flags), {
      log: log.child({ component: 'provider' }),
      registry,
      tracer,
    });
  } catch (err) {
    await store.stop();
    throw new StartupError(errorMessage(err), { cause: err });
  }

  const health = new HealthEngine({
    store,
    logger: log.child({ component: 'health' }),
    registry,
    traceProbes: flags.traceHealthProbes,
    tracer,
    listener: (v) =>
      leases.setHealth(v.key, v.uid, {
        healthy: v.healthy,
        ...(v.latencyMillis === undefined ? {} : { latencyMillis: v.latencyMillis }),
      }),
  });
  // Optional (SPEC §5): publishes each proxy's egress IP in status.egressIP (leader only).
  let egress: EgressIpChecker | undefined;
  if (flags.egressIpUrl) {
    try {
      egress = new EgressIpChecker({
        store,
        url: flags.egressIpUrl,
        log: log.child({ component: 'egress-ip' }),
        registry,
      });
    } catch (err) {
      await providers.close();
      await store.stop();
      throw new StartupError(errorMessage(err), { cause: err });
    }
  }
  const leases: LeaseStore = new LeaseStore({
    log: log.child({ component: 'leases' }),
    requestProbe: (key) => health.requestProbe(key),
  });
  registerLeaseMetrics(registry, leases);
  registerProxyPhaseGauge(registry, store.proxies);

  const reconciler = createProxyReconciler({
    store,
    providers,
    log: log.child({ component: 'controller' }),
    registry,
    tracer,
  });
  const queue = new WorkQueue({ name: 'proxy', registry, log: log.child({ component: 'workqueue' }) });
  const gc = new OrphanGC({
    store,
    providers: () => providers.entries(),
    intervalMs: flags.gcIntervalMs,
    minAgeMs: flags.gcMinAgeMs,
    ...(mode.proxyNamespace ? { proxyNamespace: mode.proxyNamespace } : {}),
    log: log.child({ component: 'gc' }),
    registry,
    tracer,
  });
  const checkers = providers.checkers();
  const monitor = new ProviderHealthMonitor({
    store,
    providers: providers.names().map((name) => {
      const checker = checkers.get(name);
      return { name, type: providers.type(name) ?? 'unknown', ...(checker ? { checker } : {}) };
    }),
    intervalMs: flags.providerCheckIntervalMs,
    timeoutMs: flags.providerCheckTimeoutMs,
    log: log.child({ component: 'providerhealth' }),
    registry,
    tracer,
  });

  const manager = new Manager({
    store,
    elector: mode.elector,
    healthProbeBindAddress: flags.healthProbeBindAddress,
    gracePeriodMs: flags.shutdownGraceMs,
    log: log.child({ component: 'manager' }),
  });

  let discovery: DiscoveryServer | undefined;
  const token = env.DISCOVERY_TOKEN?.trim() || undefined;
  manager.add(
    service('discovery', false, async (signal) => {
      discovery = await startDiscoveryServer({
        bindAddress: flags.discoveryBindAddress,
        leases,
        ...(token ? { token } : {}),
        log: log.child({ component: 'discovery' }),
        registry,
        tracer,
      });
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
        ...(mode.metricsAuthorizer ? { authorize: mode.metricsAuthorizer } : {}),
      });
      if (server) log.info({ address: server.address }, 'metrics endpoint listening');
      await untilAborted(signal);
      await server?.close();
    }),
  );
  manager.add(
    service('lease-feed', false, async (signal) => {
      const feed = startLeaseFeed({ store, leases, log: log.child({ component: 'lease-feed' }), signal });
      await untilAborted(signal);
      feed.stop();
    }),
  );
  manager.add(service('health', false, (signal) => health.run(signal)));
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
  manager.add(service('orphan-gc', true, (signal) => gc.start(signal)));
  manager.add(service('provider-health', true, (signal) => monitor.start(signal)));
  if (egress) {
    const checker = egress;
    manager.add(service('egress-ip', true, (signal) => checker.run(signal)));
  }

  return {
    manager,
    store,
    providers,
    leases,
    health,
    registry,
    log,
    discoveryUrl: () => discovery?.url,
    run: () => manager.run(),
    stop: async () => {
      await manager.stop();
      await providers.close();
      await store.stop();
      await mode.kube?.close();
      await tracing.shutdown();
    },
  };
}

/** Entry for `standalone` and `operator`: runs until SIGTERM/SIGINT; returns the exit code. */
export async function runServer(
  parsed: Extract<ParsedCommand, { command: 'standalone' | 'operator' }>,
  version: string,
): Promise<number> {
  let app: App;
  try {
    app = await buildApp(parsed, { version });
  } catch (err) {
    if (err instanceof StartupError) {
      process.stderr.write(`egress-proxies-operator: ${err.message}\n`);
      return 2;
    }
    throw err;
  }
  app.log.info({ version, mode: parsed.command }, 'egress-proxies-operator starting');
  try {
    await app.run();
    return 0;
  } catch (err) {
    app.log.error({ err: errorMessage(err) }, 'stopped with an error');
    return 1;
  } finally {
    await app.stop();
  }
}
