/**
 * cmd/compose — the one composition root: builds store, providers, reconciler, health engine,
 * lease store, discovery API, metrics, orphan sweep and provider health for either mode, checks
 * everything that can be checked before anything starts, then hands them to the manager.
 * Standalone and cluster mode differ only in the store, the elector and the kubernetes
 * provider. One clock and one credentials resolver serve every component.
 */

import type { Registry } from 'prom-client';
import { loadProvidersConfig } from '../config/load.ts';
import type { ProvidersConfig } from '../config/schema.ts';
import { discoveryTokenFromEnv } from '../discovery/auth.ts';
import { gatewayTokenFromEnv } from '../gateway/auth.ts';
import { clusterGateway } from '../gateway/cluster.ts';
import { GatewaySessions, type GatewaySetup, gatewaySetupProblem } from '../gateway/service.ts';
import type { HealthEngine } from '../health/engine.ts';
import type { LeaseStore } from '../lease/store.ts';
import { errorMessage } from '../log/errors.ts';
import { createLogger, type Logger } from '../log/index.ts';
import { createMetricsRegistry } from '../metrics/index.ts';
import { readTlsFiles } from '../metrics/listener.ts';
import { collectedGauge } from '../metrics/register.ts';
import { buildProviders, type ProviderRegistry } from '../provider/registry.ts';
import { validateSchedule } from '../providerhealth/monitor.ts';
import { strandedReadiness } from '../providerhealth/stranded.ts';
import { type Clock, systemClock } from '../runtime/clock.ts';
import { createCredentialsResolver } from '../runtime/credentials.ts';
import type { StateWrites } from '../runtime/embedded/state-writes.ts';
import { type FdLimit, readFdLimit } from '../runtime/fd-budget.ts';
import { Manager } from '../runtime/manager.ts';
import type { ObjectStore } from '../runtime/store.ts';
import { setupTracing, type Tracing, type TracingOptions } from '../tracing/index.ts';
import { fitConnectionCaps } from './caps.ts';
import { buildComponents, type Components } from './components.ts';
import type { CommonFlags, ParsedCommand } from './flags.ts';
import { listenFailureOf } from './listeners.ts';
import {
  egressReservationsIn,
  type KubeClientsFactory,
  type ModeParts,
  operatorParts,
  operatorPorts,
  providerFactories,
  resolveStandalonePaths,
  standaloneParts,
} from './modes.ts';
import { addRunnables, type ListenerInputs } from './runnables.ts';
import { StartupError, Teardown } from './startup.ts';

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
  /** Runs until SIGTERM/SIGINT or stop(), then closes everything; rejects on a fatal runnable error. */
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
/** Seams for tests: how tracing and the cluster-mode API clients are made, and the clock. */
export interface ComposeDeps {
  setupTracing: (opts: TracingOptions) => Tracing;
  kubeClients?: KubeClientsFactory;
  clock?: Clock;
  /** The open-files limit the connection caps are fitted under; default: read from the system. */
  fdLimit?: FdLimit;
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
export async function buildApp(given: ServerCommand, opts: BuildOptions = {}): Promise<App> {
  const flags = given.flags;
  const log = opts.log ?? loggerFor(flags);
  const scheduleProblem = validateSchedule(flags.providerCheckIntervalMs, flags.providerCheckTimeoutMs);
  if (scheduleProblem) throw new StartupError(scheduleProblem);
  const listeners = listenerInputs(flags, opts.env ?? process.env);

  // Validate the providers config before touching any backend or state file.
  const providersFile =
    given.command === 'standalone'
      ? resolveStandalonePaths(given.flags).providersFile
      : given.flags.providersConfig;
  const config = await loadConfig(providersFile, log);
  const parsed = withFittedCaps(given, config, opts.deps?.fdLimit ?? readFdLimit(), log);

  const teardown = new Teardown();
  try {
    return await assemble(parsed, config, log, teardown, opts, listeners);
  } catch (err) {
    return teardown.abandon(err, log);
  }
}

/** `parsed` with every listener's connection cap fitted under the open-files limit (cmd/caps). */
function withFittedCaps(
  parsed: ServerCommand,
  config: ProvidersConfig,
  fd: FdLimit,
  log: Logger,
): ServerCommand {
  const local = config.providers.some((e) => e.type === 'local');
  return parsed.command === 'standalone'
    ? { command: 'standalone', flags: fitConnectionCaps(parsed.flags, local, fd, log) }
    : { command: 'operator', flags: fitConnectionCaps(parsed.flags, local, fd, log) };
}

/** What the discovery listener needs from outside the flags, checked before anything starts. */
function listenerInputs(flags: CommonFlags, env: NodeJS.ProcessEnv): ListenerInputs {
  try {
    const tls = flags.discoveryTls;
    const token = discoveryTokenFromEnv(env);
    const gatewayToken = gatewayTokenFromEnv(env);
    const problem = gatewaySetupProblem({
      bindAddress: flags.gateway.bindAddress,
      token: gatewayToken,
      egressPolicy: undefined,
      operatorPorts: { ports: [] },
    });
    if (problem) throw new Error(problem);
    return {
      token,
      gatewayToken,
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

  // Late-bound: the manager is built after the mode, but the state lock must wait for it.
  let manager: Manager | undefined;
  const mode: ModeParts =
    parsed.command === 'standalone'
      ? await standaloneParts(parsed.flags, log, teardown, { beforeUnlock: async () => manager?.settled() })
      : await operatorParts(parsed.flags, log, teardown, opts.deps?.kubeClients);
  const { store } = mode;
  log.info(
    { installation: mode.installationId },
    'installation id: the orphan sweep and adoption touch only instances labelled with it',
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
      providerFactories(mode.kubernetesProvider, flags, leaseCredentials, egressReservationsIn(store)),
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

  const assignsEgressIP = new Set(
    config.providers.filter((e) => e.type === 'local' && e.local?.egressAddresses).map((e) => e.name),
  );
  const parts = buildComponents({
    flags,
    log,
    registry,
    tracer,
    clock,
    credentials,
    mode,
    providers,
    assignsEgressIP,
  });
  leaseStore = parts.leases;
  manager = managerFor(flags, mode, clock, log);
  // Proxies naming a provider the config lacks (renamed, removed): noted, or failing once the
  // whole fleet is stranded (providerhealth/stranded).
  const configured = new Set(config.providers.map((e) => e.name));
  manager.addReadyzCheck('providers', () => strandedReadiness(store.proxies.list(), configured));
  if (mode.stateWrites) watchStateWrites(mode.stateWrites, manager, registry);
  const discoveryUrl = addRunnables(
    manager,
    parts,
    listeners,
    gatewayFor(parsed, config, parts, listeners, registry),
  );
  return {
    manager,
    store,
    providers,
    leases: parts.leases,
    health: parts.health,
    registry,
    log,
    discoveryUrl,
    // The teardown under the signal handlers too: a Ctrl-C during the final snapshot is counted.
    run: () => manager.run(() => teardown.close()),
    stop: async () => {
      await manager.stop();
      await teardown.close();
    },
  };
}

/**
 * Standalone: a state directory that stops taking writes (full, read-only) fails readiness with
 * the file and the error, and shows in a gauge to alert on.
 */
function watchStateWrites(writes: StateWrites, manager: Manager, registry: Registry): void {
  manager.addReadyzCheck('state', () => writes.readiness());
  collectedGauge(registry, {
    name: 'proxy_operator_state_writes_failing',
    help: 'Standalone state files (state journal, lease checkpoint) that cannot be written now.',
    collect() {
      this.set(writes.failingCount);
    },
  });
}

/** The manager of one process: leader election, the probe port, the shutdown grace. */
function managerFor(flags: CommonFlags, mode: ModeParts, clock: Clock, log: Logger): Manager {
  return new Manager({
    store: mode.store,
    clock,
    elector: mode.elector,
    healthProbeBindAddress: flags.healthProbeBindAddress,
    // The --http-*-timeout flags hold for the probe port too; its cap is small, with no flag.
    healthProbeLimits: {
      headersTimeoutMs: flags.metricsLimits.headersTimeoutMs,
      requestTimeoutMs: flags.metricsLimits.requestTimeoutMs,
      idleTimeoutMs: flags.metricsLimits.idleTimeoutMs,
      maxConnections: flags.healthProbeMaxConnections,
    },
    gracePeriodMs: flags.shutdownGraceMs,
    log: log.child({ component: 'manager' }),
  });
}

/**
 * The gateway's set-up and sessions. Cluster mode: every replica serves the gateway with a
 * share from the leader's hub, which also finds the replica that knows a reported session
 * (docs/architecture.md, "Gateway scale-out").
 */
function gatewayFor(
  parsed: ServerCommand,
  config: ProvidersConfig,
  parts: Components,
  listeners: ListenerInputs,
  registry: Registry,
): Parameters<typeof addRunnables>[3] {
  const flags = parsed.flags;
  const g = flags.gateway;
  const setup: GatewaySetup = {
    bindAddress: g.bindAddress,
    ...(g.blockedStatuses ? { blockedStatuses: g.blockedStatuses } : {}),
    ...(config.gateway?.rules ? { rules: config.gateway.rules } : {}),
    ...(g.inspect
      ? {
          inspect: {
            exclude: g.inspectExclude,
            caStore: parts.mode.gatewayCa,
            ...(g.originCaFile === undefined ? {} : { originCaFile: g.originCaFile }),
          },
        }
      : {}),
    maxConnections: g.maxConnections,
    token: listeners.gatewayToken,
    egressPolicy: config.gateway?.egressPolicy,
    operatorPorts: operatorPorts(flags),
  };
  const cluster =
    parsed.command === 'operator'
      ? clusterGateway({
          leases: parts.leases,
          authority: parts.authority,
          clock: parts.clock,
          log: parts.log.child({ component: 'gateway' }),
          token: listeners.token,
          tls: listeners.discoveryTls,
          registry,
        })
      : undefined;
  return {
    setup,
    sessions: new GatewaySessions(cluster ? (id, r, t) => cluster.hub.askSession(id, r, t) : undefined),
    ...(cluster ? { cluster } : {}),
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
    // A port in use is the usual first-hour failure: say which flag moves that listener.
    const listen = listenFailureOf(err, parsed.flags);
    if (listen) {
      app.log.error({ err }, listen.message);
      process.stderr.write(`egress-proxies-operator: ${listen.message}\n`);
      return 1;
    }
    app.log.error({ err }, 'stopped with an error');
    return 1;
  } finally {
    await app.stop();
  }
}
