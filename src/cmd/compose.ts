/**
 * cmd/compose — the one composition root: builds store, providers, reconciler, health engine,
 * lease store, discovery API, metrics, orphan GC and provider health for either mode, checks
 * everything that can be checked before anything starts, then hands them to the manager.
 * Standalone and cluster mode differ only in the store, the elector and the kubernetes
 * provider. One clock and one credentials resolver serve every component.
 */

import type { Tracer } from '@opentelemetry/api';
import type { Registry } from 'prom-client';
import { type CredentialsResolver, createCredentialsResolver } from '../api/credentials.ts';
import { loadProvidersConfig } from '../config/load.ts';
import type { ProvidersConfig } from '../config/schema.ts';
import { createProxyReconciler } from '../controller/reconciler.ts';
import { discoveryTokenFromEnv } from '../discovery/auth.ts';
import { LeaseAuthority } from '../discovery/authority.ts';
import { type DiscoveryServer, startDiscoveryServer } from '../discovery/server.ts';
import { OrphanGC } from '../gc/gc.ts';
import { EgressIpChecker } from '../health/egress.ts';
import { HealthEngine } from '../health/engine.ts';
import { LeaseCheckpointer } from '../lease/checkpoint.ts';
import { startLeaseFeed } from '../lease/feed.ts';
import { leaseEvictionCounter, registerLeaseMetrics } from '../lease/metrics.ts';
import { LeaseStore } from '../lease/store.ts';
import { errorMessage } from '../log/errors.ts';
import { createLogger, type Logger } from '../log/index.ts';
import { registerProxyPhaseGauge } from '../metrics/fleet.ts';
import { createMetricsRegistry } from '../metrics/index.ts';
import { readTlsFiles, type TlsFiles } from '../metrics/listener.ts';
import { startMetricsServer } from '../metrics/server.ts';
import { LOCAL_ID_PREFIX } from '../provider/local/index.ts';
import { buildProviders, type ProviderRegistry } from '../provider/registry.ts';
import { ProviderHealthMonitor, validateSchedule } from '../providerhealth/monitor.ts';
import { type Clock, systemClock } from '../runtime/clock.ts';
import { Manager, type Runnable } from '../runtime/manager.ts';
import type { ObjectStore } from '../runtime/store.ts';
import { WorkQueue } from '../runtime/workqueue.ts';
import { setupTracing, type Tracing, type TracingOptions } from '../tracing/index.ts';
import type { CommonFlags, ParsedCommand } from './flags.ts';
import {
  type KubeClientsFactory,
  type ModeParts,
  operatorParts,
  providerFactories,
  resolveStandalonePaths,
  standaloneParts,
} from './modes.ts';
import { StartupError, Teardown } from './startup.ts';

const RECONCILE_WORKERS = 8;

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

function loggerFor(flags: CommonFlags): Logger {
  const pretty = flags.logFormat === 'pretty' ? true : flags.logFormat === 'json' ? false : undefined;
  return createLogger({ level: flags.logLevel, pretty });
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

/** Seams for tests: how tracing and the cluster-mode API clients are made, and the clock. */
export interface ComposeDeps {
  setupTracing: (opts: TracingOptions) => Tracing;
  kubeClients?: KubeClientsFactory;
  clock?: Clock;
}

export interface BuildOptions {
  log?: Logger;
  version?: string;
  env?: NodeJS.ProcessEnv;
  deps?: Partial<ComposeDeps>;
}

type ServerCommand = Extract<ParsedCommand, { command: 'standalone' | 'operator' }>;

/**
 * Builds the whole app in dependency order (config → tracing and metrics → store, elector and
 * clients of the mode → providers → components → manager). Nothing runs until `run()`; a
 * failure at any step closes what the earlier steps built.
 */
export async function buildApp(parsed: ServerCommand, opts: BuildOptions = {}): Promise<App> {
  const flags = parsed.flags;
  const log = opts.log ?? loggerFor(flags);
  const scheduleProblem = validateSchedule(flags.providerCheckIntervalMs, flags.providerCheckTimeoutMs);
  if (scheduleProblem) throw new StartupError(scheduleProblem);
  const listeners = listenerInputs(flags, opts.env ?? process.env);

  // Validate the providers config before touching any backend or state file.
  const providersFile =
    parsed.command === 'standalone'
      ? resolveStandalonePaths(parsed.flags).providersFile
      : parsed.flags.providersConfig;
  const config = await loadConfig(providersFile, log);

  const teardown = new Teardown();
  try {
    return await assemble(parsed, config, log, teardown, opts, listeners);
  } catch (err) {
    return teardown.abandon(err, log);
  }
}

/** What the discovery listener needs from outside the flags, checked before anything starts. */
interface ListenerInputs {
  token: string | undefined;
  discoveryTls: TlsFiles | undefined;
}

function listenerInputs(flags: CommonFlags, env: NodeJS.ProcessEnv): ListenerInputs {
  try {
    const tls = flags.discoveryTls;
    return {
      token: discoveryTokenFromEnv(env),
      discoveryTls:
        tls && readTlsFiles(tls.certFile, tls.keyFile, '--discovery-tls-cert/--discovery-tls-key'),
    };
  } catch (err) {
    throw new StartupError(errorMessage(err), { cause: err });
  }
}

async function assemble(
  parsed: ServerCommand,
  config: ProvidersConfig,
  log: Logger,
  teardown: Teardown,
  opts: BuildOptions,
  listeners: ListenerInputs,
): Promise<App> {
  const flags = parsed.flags;
  const tracing = (opts.deps?.setupTracing ?? setupTracing)({
    serviceName: 'egress-proxies-operator',
    serviceVersion: opts.version,
    log,
  });
  teardown.add('tracing', () => tracing.shutdown());
  const tracer = tracing.tracer;
  const registry = createMetricsRegistry();

  const mode: ModeParts =
    parsed.command === 'standalone'
      ? await standaloneParts(parsed.flags, log, teardown)
      : await operatorParts(parsed.flags, log, teardown, opts.deps?.kubeClients);
  const { store } = mode;
  log.info(
    { installation: mode.installationId },
    'installation id: GC and adoption touch only instances labelled with it',
  );
  const clock = opts.deps?.clock ?? systemClock;
  // The one resolver: reconciler, lease feed, health engine and egress check share its index.
  const credentials = createCredentialsResolver(store, { clock });
  teardown.add('credentials resolver', () => credentials.close());

  let providers: ProviderRegistry;
  // Local proxies check per-lease credentials against the lease store built below.
  let leaseStore: LeaseStore | undefined;
  const leaseCredentials = (id: string, user: string, pass: string) =>
    leaseStore?.acceptsLeaseCredentials(id, user, pass) ?? false;
  try {
    providers = await buildProviders(
      config,
      providerFactories(mode.kubernetesProvider, flags, leaseCredentials),
      {
        log: log.child({ component: 'provider' }),
        registry,
        tracer,
      },
    );
  } catch (err) {
    throw new StartupError(errorMessage(err), { cause: err });
  }
  teardown.add('providers', () => providers.close());

  const parts = buildComponents({ flags, log, registry, tracer, clock, credentials, mode, providers });
  leaseStore = parts.leases;
  const manager = new Manager({
    store,
    clock,
    elector: mode.elector,
    healthProbeBindAddress: flags.healthProbeBindAddress,
    gracePeriodMs: flags.shutdownGraceMs,
    log: log.child({ component: 'manager' }),
  });

  const discoveryUrl = addRunnables(manager, parts, listeners);
  return {
    manager,
    store,
    providers,
    leases: parts.leases,
    health: parts.health,
    registry,
    log,
    discoveryUrl,
    run: () => manager.run(),
    stop: async () => {
      await manager.stop();
      await teardown.close();
    },
  };
}

interface Shared {
  flags: CommonFlags;
  log: Logger;
  registry: Registry;
  tracer: Tracer;
  clock: Clock;
  credentials: CredentialsResolver;
  mode: ModeParts;
  providers: ProviderRegistry;
}

interface Components extends Shared {
  health: HealthEngine;
  leases: LeaseStore;
  egress: EgressIpChecker | undefined;
  authority: LeaseAuthority;
  checkpointer: LeaseCheckpointer;
  reconciler: ReturnType<typeof createProxyReconciler>;
  queue: WorkQueue;
  gc: OrphanGC;
  monitor: ProviderHealthMonitor;
}

/** The control loops and services over the store and providers; nothing runs yet. */
function buildComponents(shared: Shared): Components {
  const { flags, log, registry, tracer, clock, credentials, mode, providers } = shared;
  const { store } = mode;
  // The health engine and the lease store call each other, each only once running.
  const health = new HealthEngine({
    store,
    clock,
    credentials,
    logger: log.child({ component: 'health' }),
    registry,
    traceProbes: flags.traceHealthProbes,
    tracer,
    listener: (v) => leases.setHealth(v.key, v.uid, { healthy: v.healthy, latencyMillis: v.latencyMillis }),
  });
  // Optional (docs/health.md): publishes each proxy's egress IP in status.egressIP (leader only).
  let egress: EgressIpChecker | undefined;
  try {
    egress = flags.egressIpUrl
      ? new EgressIpChecker({
          store,
          clock,
          credentials,
          url: flags.egressIpUrl,
          log: log.child({ component: 'egress-ip' }),
          registry,
        })
      : undefined;
  } catch (err) {
    throw new StartupError(errorMessage(err), { cause: err });
  }
  const evicted = leaseEvictionCounter(registry);
  const leases: LeaseStore = new LeaseStore({
    clock,
    log: log.child({ component: 'leases' }),
    requestProbe: (key) => health.requestProbe(key),
    maxActiveLeases: flags.leases.maxActiveLeases,
    drainTimeoutMs: flags.leases.drainTimeoutMs,
    onCooldownEvicted: () => evicted.inc(),
    perLeaseCredentials: (id) => id.startsWith(LOCAL_ID_PREFIX),
  });
  registerLeaseMetrics(registry, leases);
  registerProxyPhaseGauge(registry, store.proxies);

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
    leasesOn: (key, providerID) => leases.leasesOn(key, providerID),
  });
  const queue = new WorkQueue({ name: 'proxy', clock, registry, log: log.child({ component: 'workqueue' }) });
  const gc = new OrphanGC({
    store,
    clock,
    providers: () => providers.entries(),
    intervalMs: flags.gcIntervalMs,
    minAgeMs: flags.gcMinAgeMs,
    proxyNamespace: mode.proxyNamespace,
    installation: mode.installationId,
    log: log.child({ component: 'gc' }),
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

  // One authority (docs/deployment.md): the leader decides leases, standbys forward to it.
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

  return { ...shared, health, leases, egress, authority, checkpointer, reconciler, queue, gc, monitor };
}

/** Hands every component to the manager; returns where the discovery API listens once started. */
function addRunnables(manager: Manager, c: Components, listeners: ListenerInputs): () => string | undefined {
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
    app.log.error({ err }, 'stopped with an error');
    return 1;
  } finally {
    await app.stop();
  }
}
