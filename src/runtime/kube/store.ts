/**
 * runtime/kube/store — the ObjectStore backed by a Kubernetes API server (cluster mode): wires
 * one informer and one resource client per resource, and runs the reflectors that feed the
 * caches (Proxies and ProxyPools, optionally restricted to one namespace; only labelled Secrets;
 * ProviderHealths have none, their cache holds what this process read and wrote). Reads and
 * writes themselves live in resource-client.ts and rest.ts.
 */
import type { KubeConfig } from '@kubernetes/client-node';
import { PROVIDER_HEALTH_PLURAL, PROXY_PLURAL, PROXY_POOL_PLURAL } from '../../api/constants.ts';
import type { KubeObject, Secret } from '../../api/meta.ts';
import type { ProviderHealth } from '../../api/providerhealth.ts';
import type { ProxyObject } from '../../api/proxy.ts';
import type { ProxyPool } from '../../api/proxypool.ts';
import { type Logger, silentLogger } from '../../log/index.ts';
import type { ObjectStore } from '../store.ts';
import { createKubeClients, type KubeClientOptions, type KubeClients } from './client.ts';
import { Informer } from './informer.ts';
import { Reflector } from './reflector.ts';
import { KubeResourceClient, KubeSecretClient, SECRET_SOURCES } from './resource-client.ts';
import { customApi, secretApi } from './rest.ts';

export { SECRET_SOURCES } from './resource-client.ts';

export interface KubeStoreOptions extends KubeClientOptions {
  /** Either a KubeConfig (the store builds and owns the clients) or clients shared with others. */
  kubeConfig?: KubeConfig;
  clients?: KubeClients;
  /** `--proxy-namespace`: watch Proxies and Secrets only there; empty = all namespaces. */
  namespace?: string;
  log?: Logger;
  /** Reflector tuning (tests use short backoffs). */
  reflector?: {
    pageSize?: number;
    watchTimeoutSeconds?: number;
    initialBackoffMs?: number;
    maxBackoffMs?: number;
    /** Uniform [0, 1) source for the backoff jitter (default Math.random). */
    random?: () => number;
  };
}

export class KubeStore implements ObjectStore {
  readonly proxies: KubeResourceClient<ProxyObject>;
  readonly proxyPools: KubeResourceClient<ProxyPool>;
  readonly providerHealths: KubeResourceClient<ProviderHealth>;
  readonly secrets: KubeSecretClient;
  readonly reflectors: Reflector<KubeObject>[] = [];
  private readonly clients: KubeClients;
  private readonly ownsClients: boolean;
  private readonly log: Logger;
  private readonly namespace: string | undefined;
  private readonly opts: KubeStoreOptions;
  private running: { ac: AbortController; done: Promise<unknown> } | undefined;

  constructor(clients: KubeClients, opts: KubeStoreOptions & { ownsClients?: boolean } = {}) {
    this.clients = clients;
    this.ownsClients = opts.ownsClients ?? false;
    this.opts = opts;
    this.log = opts.log ?? silentLogger();
    this.namespace = opts.namespace || undefined;
    const ns = this.namespace;
    const inNamespace = (o: KubeObject) => ns === undefined || o.metadata.namespace === ns;
    this.proxies = new KubeResourceClient(
      customApi<ProxyObject>(clients, PROXY_PLURAL, true),
      new Informer<ProxyObject>('proxies', this.log),
      inNamespace,
    );
    this.proxyPools = new KubeResourceClient(
      customApi<ProxyPool>(clients, PROXY_POOL_PLURAL, true),
      new Informer<ProxyPool>('proxypools', this.log),
      inNamespace,
    );
    // Not watched: the monitor (leader only) reads and writes its objects by name and lists
    // them once at start, so the operator needs no watch on them. The cache holds what this
    // process read and wrote — on the leader, every provider's latest status.
    this.providerHealths = new KubeResourceClient(
      customApi<ProviderHealth>(clients, PROVIDER_HEALTH_PLURAL, false),
      new Informer<ProviderHealth>('providerhealths', this.log),
      () => true,
      { unwatched: true },
    );
    this.secrets = new KubeSecretClient(
      secretApi(clients),
      new Informer<Secret>('secrets', this.log),
      inNamespace,
    );
  }

  /** Starts the reflectors (idempotent); resolves at once — use `synced()` to wait for lists. */
  async start(signal: AbortSignal): Promise<void> {
    if (this.running) return;
    const ac = new AbortController();
    signal.addEventListener('abort', () => ac.abort(), { once: true });
    if (signal.aborted) ac.abort();
    const r = this.opts.reflector ?? {};
    const tuning = {
      ...(r.pageSize !== undefined && { pageSize: r.pageSize }),
      ...(r.watchTimeoutSeconds !== undefined && { watchTimeoutSeconds: r.watchTimeoutSeconds }),
      ...(r.initialBackoffMs !== undefined && { initialBackoffMs: r.initialBackoffMs }),
      ...(r.maxBackoffMs !== undefined && { maxBackoffMs: r.maxBackoffMs }),
      ...(r.random !== undefined && { random: r.random }),
      log: this.log,
      watchClient: this.clients.watch,
    };
    const ns = this.namespace;
    const proxiesApi = customApi<ProxyObject>(this.clients, PROXY_PLURAL, true);
    const secretsApi = secretApi(this.clients);
    const reflectors: Reflector<KubeObject>[] = [];
    const proxies = new Reflector<ProxyObject>({
      ...tuning,
      name: 'proxies',
      list: (q) => proxiesApi.list(ns, q, q.signal),
      watchPath: proxiesApi.collectionPath(ns),
      sink: this.proxies.informer,
      onSynced: () => this.proxies.informer.markSynced(),
    });
    reflectors.push(proxies as unknown as Reflector<KubeObject>);
    const poolsApi = customApi<ProxyPool>(this.clients, PROXY_POOL_PLURAL, true);
    const pools = new Reflector<ProxyPool>({
      ...tuning,
      name: 'proxypools',
      list: (q) => poolsApi.list(ns, q, q.signal),
      watchPath: poolsApi.collectionPath(ns),
      sink: this.proxyPools.informer,
      onSynced: () => this.proxyPools.informer.markSynced(),
    });
    reflectors.push(pools as unknown as Reflector<KubeObject>);
    this.providerHealths.informer.markSynced();
    const secretReflectors = SECRET_SOURCES.map(
      (s) =>
        new Reflector<Secret>({
          ...tuning,
          name: `secrets(${s.name})`,
          list: (q) => secretsApi.list(ns, { ...q, labelSelector: s.labelSelector }, q.signal),
          watchPath: secretsApi.collectionPath(ns),
          labelSelector: s.labelSelector,
          sink: this.secrets.sink.source(s.name, s.accept),
          onSynced: () => {
            if (secretReflectors.every((x) => x.hasSynced())) this.secrets.informer.markSynced();
          },
        }),
    );
    for (const x of secretReflectors) reflectors.push(x as unknown as Reflector<KubeObject>);
    this.reflectors.push(...reflectors);
    const done = Promise.all(reflectors.map((x) => x.run(ac.signal)));
    this.running = { ac, done };
    this.log.info({ namespace: ns ?? '(all)' }, 'kubernetes store started');
  }

  async stop(): Promise<void> {
    const r = this.running;
    if (r) {
      r.ac.abort();
      await r.done;
    }
    if (this.ownsClients) await this.clients.close();
  }
}

/** The cluster-mode ObjectStore; call `start()` (the manager does) and wait for `synced()`. */
export async function createKubeStore(opts: KubeStoreOptions): Promise<KubeStore> {
  if (opts.clients) return new KubeStore(opts.clients, opts);
  if (!opts.kubeConfig) throw new Error('createKubeStore: kubeConfig or clients is required');
  const clients = await createKubeClients(opts.kubeConfig, opts);
  return new KubeStore(clients, { ...opts, ownsClients: true });
}
