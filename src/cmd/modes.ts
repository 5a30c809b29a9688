/**
 * cmd/modes — what differs between the two modes: where objects live (embedded store or the
 * Kubernetes API), who leads (always this process, or a Lease), and whether the kubernetes
 * provider and authenticated metrics exist. Everything built here is registered on the
 * Teardown at once, so a later start-up failure closes it.
 */
import { existsSync, statSync } from 'node:fs';
import { hostname, networkInterfaces } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import type { KubeConfig } from '@kubernetes/client-node';
import { canonicalAddressText, type OperatorEndpoints } from '../config/egress.ts';
import { type CaStore, FileCaStore, SecretCaStore } from '../gateway/ca.ts';
import type { CheckpointStorage } from '../lease/checkpoint.ts';
import { errorMessage } from '../log/errors.ts';
import type { Logger } from '../log/index.ts';
import type { Authorize } from '../metrics/authorize.ts';
import { parseBindAddress } from '../metrics/bind.ts';
import { readTlsDir, type TlsFiles } from '../metrics/listener.ts';
import { selfSignedCertificate } from '../metrics/selfsigned.ts';
import { createAwsProvider } from '../provider/aws/index.ts';
import { createGcpProvider } from '../provider/gcp/index.ts';
import { createKvmProvider } from '../provider/kvm/index.ts';
import type { EgressReservation } from '../provider/local/address-pool.ts';
import { SharedConnectionCap } from '../provider/local/forward-proxy.ts';
import { createLocalProvider } from '../provider/local/index.ts';
import type { ProviderFactory } from '../provider/registry.ts';
import { FileCheckpoint, leaseCheckpointPath } from '../runtime/embedded/lease-checkpoint.ts';
import { acquireLock } from '../runtime/embedded/lock.ts';
import type { StateWrites } from '../runtime/embedded/state-writes.ts';
import { createEmbeddedStore, prepareStateDir } from '../runtime/embedded/store.ts';
import type { KubeClients } from '../runtime/kube/client.ts';
import { type LeaderElector, StandaloneElector } from '../runtime/leader/elector.ts';
import type { ObjectStore } from '../runtime/store.ts';
import type { CommonFlags, OperatorFlags, StandaloneFlags } from './flags.ts';
import { describeListener, type ListenerKey } from './listeners.ts';
import { StartupError, type Teardown } from './startup.ts';

const LEADER_LEASE_NAME = 'egress-proxies-operator-leader';

export interface ModeParts {
  store: ObjectStore;
  elector: LeaderElector;
  kubernetesProvider?: ProviderFactory;
  metricsAuthorizer?: Authorize;
  /** HTTPS for the metrics endpoint (`--metrics-secure`). */
  metricsTls?: TlsFiles;
  proxyNamespace?: string;
  /** Labels every instance; the orphan sweep and adoption touch only instances carrying it. */
  installationId: string;
  /** Where the leader keeps its lease checkpoint. */
  leaseCheckpoint: CheckpointStorage;
  /**
   * Standalone: whether the state directory takes writes (a full or read-only disk fails
   * readiness; the process serves on from memory meanwhile).
   */
  stateWrites?: StateWrites;
  /**
   * What a damaged lease checkpoint does without `--discard-lease-state`: `stop` the process
   * (standalone: the operator cannot serve leases without it, and a supervisor's restarts stay
   * loud), or `wait` not deciding leases, reading it again now and then (a leader: the
   * other replicas' listeners keep answering, and an operator may repair or remove it).
   */
  damagedCheckpoint: 'stop' | 'wait';
  /** Tells the elector where this replica's discovery API answers, once listening. */
  advertiseDiscovery?: (url: string) => void;
  /**
   * Host names the discovery API serves without a token besides `--discovery-allowed-hosts`: in
   * a cluster the Pod's own IPs, by which the other replicas reach the leader (gateway sync).
   */
  discoveryHosts?: string[];
  /** Where the gateway's inspection CA is kept: the state dir, or one Secret every replica reads. */
  gatewayCa: CaStore;
}

/** The Secret holding the gateway's inspection CA in the operator namespace (docs/gateway.md). */
export const GATEWAY_CA_SECRET = 'egress-proxies-gateway-ca';

/** `--metrics-secure` serves HTTPS: the certificate of `--metrics-cert-dir`, else a self-signed one. */
export function metricsTls(
  flags: Pick<OperatorFlags, 'metricsSecure' | 'metricsCertDir'>,
  log: Logger,
): TlsFiles | undefined {
  if (!flags.metricsSecure) {
    if (flags.metricsCertDir) throw new StartupError('--metrics-cert-dir: needs --metrics-secure');
    return undefined;
  }
  if (flags.metricsCertDir) {
    try {
      return readTlsDir(flags.metricsCertDir, '--metrics-cert-dir');
    } catch (err) {
      throw new StartupError(errorMessage(err), { cause: err });
    }
  }
  log.info(
    'metrics: serving HTTPS with a self-signed certificate generated at start (--metrics-cert-dir not set)',
  );
  const host = hostname().toLowerCase();
  const names = ['localhost', '127.0.0.1', '::1', ...(/^[a-z0-9.-]{1,253}$/.test(host) ? [host] : [])];
  return selfSignedCertificate({ altNames: names });
}

/** How cluster mode makes its API clients (a seam for tests). */
export type KubeClientsFactory = (kc: KubeConfig) => Promise<KubeClients>;

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

/** The operator's own ports with, for refusals, which listener each is (cmd/listeners). */
export interface OperatorPorts {
  ports: number[];
  probePort?: number;
  /** Port → `discovery API (--discovery-bind-address)`. */
  names?: Readonly<Record<number, string>>;
}

/**
 * The operator's own listening ports, which the local proxies keep closed to lease holders; the
 * discovery API's is also the probe port (`GET /generate_204` stays reachable for health checks).
 */
export function operatorPorts(
  flags: Pick<CommonFlags, 'discoveryBindAddress' | 'metricsBindAddress' | 'healthProbeBindAddress'> &
    Partial<Pick<CommonFlags, 'gateway'>>,
): OperatorPorts {
  const port = (v: string) => {
    const p = parseBindAddress(v, 'bind address')?.port;
    return p === undefined || p === 0 ? undefined : p;
  };
  const listening: [ListenerKey, number | undefined][] = [
    ['discovery', port(flags.discoveryBindAddress)],
    ['metrics', port(flags.metricsBindAddress)],
    ['healthProbe', port(flags.healthProbeBindAddress)],
    ['gateway', flags.gateway && port(flags.gateway.bindAddress)],
  ];
  const names: Record<number, string> = {};
  // Two listeners on one port (on different addresses) are both named.
  for (const [key, p] of listening) {
    if (p !== undefined)
      names[p] = names[p] ? `${names[p]} or ${describeListener(key)}` : describeListener(key);
  }
  const discovery = listening[0]?.[1];
  return {
    ports: listening.map(([, p]) => p).filter((p) => p !== undefined),
    ...(discovery === undefined ? {} : { probePort: discovery }),
    names,
  };
}

/** The Pod's IPs from the downward API (`POD_IP`, `POD_IPS`), none outside a cluster. */
export function podIps(env: NodeJS.ProcessEnv): string[] {
  return [env.POD_IP, ...(env.POD_IPS ?? '').split(',')].map((a) => a?.trim() ?? '').filter((a) => a !== '');
}

/**
 * The operator's own listeners as Squid proxies elsewhere must keep them closed (provider/squid
 * config): its ports (operatorPorts) on every address this process has, read when the providers
 * are built. That is this machine's interface addresses in standalone mode, and the Pod's in a
 * cluster, where `POD_IP`/`POD_IPS` (downward API) add the Pod IPs should the interfaces not
 * show them (a sidecar network namespace). Loopback is left out: from a Pod or a VM it is that
 * proxy itself, and the default policy denies it. Service cluster IPs are not known here (the
 * operator reads no Services); they are private and stay denied unless allowCIDRs opens them.
 */
export function operatorEndpoints(
  flags: Parameters<typeof operatorPorts>[0],
  env: NodeJS.ProcessEnv = process.env,
  interfaces: ReturnType<typeof networkInterfaces> = networkInterfaces(),
): OperatorEndpoints {
  const seen = new Set<string>();
  const raw = [
    ...Object.values(interfaces).flatMap((list) =>
      (list ?? []).filter((i) => !i.internal).map((i) => i.address),
    ),
    ...podIps(env),
  ];
  for (const a of raw) {
    // A link-local address carries its interface (fe80::1%eth0); the address alone is what a peer dials.
    const c = canonicalAddressText(a.split('%')[0] as string);
    if (c !== undefined && !c.startsWith('127.') && c !== '::1') seen.add(c);
  }
  const { ports, probePort } = operatorPorts(flags);
  return {
    addresses: [...seen].sort(),
    ports: [...new Set(ports)].sort((a, b) => a - b),
    ...(probePort === undefined ? {} : { probePort }),
  };
}

/**
 * The source addresses the Proxies of a provider hold in status, read from the object store's
 * cache when a local proxy is created (creates are rare; a list is cheap enough).
 */
export function egressReservationsIn(store: ObjectStore): (provider: string) => EgressReservation[] {
  return (provider) =>
    store.proxies
      .list()
      .filter((p) => p.spec.provider === provider && p.status?.egressIP && p.metadata.uid)
      .map((p) => ({ address: p.status?.egressIP as string, uid: p.metadata.uid as string }));
}

/**
 * `leaseCredentials` is the lease store's per-lease check for local proxies; the store is built
 * after the providers, so it is passed as a late-bound callback.
 */
export function providerFactories(
  kubernetes: ProviderFactory | undefined,
  flags: Pick<
    CommonFlags,
    'gcpWireFullPayloads' | 'discoveryBindAddress' | 'metricsBindAddress' | 'healthProbeBindAddress'
  > &
    Partial<Pick<CommonFlags, 'gateway' | 'localProxiesMaxConnections'>>,
  leaseCredentials?: (providerID: string, username: string, password: string) => boolean,
  egressReservations?: (provider: string) => EgressReservation[],
): Record<string, ProviderFactory> {
  // One cap for every local proxy of every local provider: together they hold the descriptors.
  const localCap =
    flags.localProxiesMaxConnections === undefined
      ? undefined
      : new SharedConnectionCap(flags.localProxiesMaxConnections);
  return {
    local: (entry, deps) =>
      createLocalProvider({
        name: entry.name,
        config: entry.local ?? {},
        log: deps.log,
        registry: deps.registry,
        operator: operatorPorts(flags),
        ...(localCap ? { sharedCap: localCap } : {}),
        ...(leaseCredentials ? { leaseCredentials } : {}),
        ...(egressReservations ? { egressReservations: () => egressReservations(entry.name) } : {}),
      }),
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
        operator: operatorEndpoints(flags),
      });
    },
    aws: (entry, deps) => {
      if (!entry.aws) throw new Error('the aws block is required for a provider of type aws');
      return createAwsProvider({
        name: entry.name,
        config: entry.aws,
        log: deps.log,
        operator: operatorEndpoints(flags),
      });
    },
    kvm: (entry, deps) => {
      if (!entry.kvm) throw new Error('the kvm block is required for a provider of type kvm');
      return createKvmProvider({
        name: entry.name,
        config: entry.kvm,
        log: deps.log,
        operator: operatorEndpoints(flags),
      });
    },
  };
}

/**
 * Standalone mode. The state lock is taken here, before the store, and registered on the
 * Teardown first so it is released last: after the manager drained (final lease checkpoint,
 * every listener closed), the store's final snapshot and the local proxies' ports. A second
 * process can therefore never take the state while this one still writes or serves.
 */
export async function standaloneParts(
  flags: StandaloneFlags,
  log: Logger,
  teardown: Teardown,
  opts: { beforeUnlock?: () => Promise<void> } = {},
): Promise<ModeParts> {
  const paths = resolveStandalonePaths(flags);
  let store: Awaited<ReturnType<typeof createEmbeddedStore>>;
  try {
    prepareStateDir(dirname(paths.statePath), log);
    const lock = acquireLock(`${paths.statePath}.lock`);
    // Should the process exit while a runnable is still stuck here, the lock stays behind with
    // a dead pid, which the next start takes over (runtime/embedded/lock).
    teardown.add('state lock', async () => {
      await opts.beforeUnlock?.();
      lock.release();
    });
    store = await createEmbeddedStore({
      manifests: paths.manifests,
      statePath: paths.statePath,
      allowEmptyManifests: flags.allowEmptyManifests,
      log: log.child({ component: 'store' }),
      lock,
      ...(flags.installationId !== undefined ? { installationId: flags.installationId } : {}),
    });
  } catch (err) {
    throw new StartupError(errorMessage(err), { cause: err });
  }
  teardown.add('store', () => store.stop());
  log.info({ manifests: paths.manifests, state: paths.statePath }, 'standalone store ready');
  return {
    store,
    elector: new StandaloneElector(),
    installationId: store.installation.id,
    leaseCheckpoint: new FileCheckpoint(
      leaseCheckpointPath(paths.statePath),
      store.writes.writer('lease checkpoint', leaseCheckpointPath(paths.statePath)),
    ),
    stateWrites: store.writes,
    damagedCheckpoint: 'stop',
    gatewayCa: new FileCaStore(join(dirname(paths.statePath), 'gateway-ca')),
  };
}

/**
 * Cluster mode. Its modules (client-node, undici 8) are loaded only here: they need
 * Node ≥ 22.19, while standalone mode runs on any Node ≥ 22.12.
 */
export async function operatorParts(
  flags: OperatorFlags,
  log: Logger,
  teardown: Teardown,
  kubeClients?: KubeClientsFactory,
): Promise<ModeParts> {
  const [
    { KubeConfig },
    { createKubeClients },
    { createKubeStore },
    { LeaseElector },
    k8sProvider,
    authz,
    { clusterInstallationId },
    { ConfigMapCheckpoint },
  ] = await Promise.all([
    import('@kubernetes/client-node'),
    import('../runtime/kube/client.ts'),
    import('../runtime/kube/store.ts'),
    import('../runtime/leader/lease.ts'),
    import('../provider/kubernetes/index.ts'),
    import('../metrics/authorize.ts'),
    import('../runtime/kube/installation.ts'),
    import('../runtime/leader/checkpoint-configmaps.ts'),
  ]);
  const tls = metricsTls(flags, log);
  const kc = new KubeConfig();
  try {
    if (flags.kubeconfig) kc.loadFromFile(flags.kubeconfig);
    else kc.loadFromDefault();
  } catch (err) {
    throw new StartupError(`kubeconfig: ${errorMessage(err)}`, { cause: err });
  }
  const kube = await (kubeClients ?? createKubeClients)(kc);
  teardown.add('kube clients', () => kube.close());
  let installationId = flags.installationId;
  if (installationId === undefined) {
    try {
      installationId = await clusterInstallationId(kube.core);
    } catch (err) {
      throw new StartupError(errorMessage(err), { cause: err });
    }
  }
  const store = await createKubeStore({
    clients: kube,
    log: log.child({ component: 'store' }),
    namespace: flags.proxyNamespace,
  });
  teardown.add('store', () => store.stop());
  const operatorNamespace = flags.leaderElectionNamespace ?? k8sProvider.operatorNamespace();
  let advertised: string | undefined;
  const elector: LeaderElector = flags.leaderElect
    ? new LeaseElector({
        api: kube.coordination,
        namespace: operatorNamespace,
        name: LEADER_LEASE_NAME,
        log: log.child({ component: 'leader-election' }),
        advertise: () => advertised,
      })
    : new StandaloneElector();
  const kubernetesProvider: ProviderFactory = (entry, deps) =>
    k8sProvider.createKubernetesProvider({
      name: entry.name,
      config: entry.kubernetes ?? {},
      core: kube.core,
      apiHost: kc.getCurrentCluster()?.server ?? '',
      log: deps.log,
      operator: operatorEndpoints(flags),
    });
  return {
    store,
    elector,
    kubernetesProvider,
    metricsAuthorizer: flags.metricsSecure ? authz.tokenReviewAuthorizer(kc) : undefined,
    metricsTls: tls,
    proxyNamespace: flags.proxyNamespace,
    installationId,
    leaseCheckpoint: new ConfigMapCheckpoint({ core: kube.core, namespace: operatorNamespace }),
    damagedCheckpoint: 'wait',
    advertiseDiscovery: (url) => {
      advertised = advertisedUrl(url, process.env.POD_IP);
    },
    // The address advertised to the other replicas is an IP literal, never a name a rebinding
    // page could put in Host: admitted without a token like the bind address.
    discoveryHosts: podIps(process.env),
    gatewayCa: new SecretCaStore(store.secrets, operatorNamespace, GATEWAY_CA_SECRET),
  };
}

/**
 * The discovery URL other replicas reach this one at: the Pod IP (downward API, `POD_IP`) with
 * the listening port and scheme, else the listening URL itself (loopback tests, one host).
 */
export function advertisedUrl(listening: string, podIp: string | undefined): string {
  const ip = podIp?.trim();
  if (!ip) return listening;
  const u = new URL(listening);
  u.hostname = ip.includes(':') ? `[${ip}]` : ip;
  return u.origin;
}
