/**
 * runtime/kube/store — the ObjectStore backed by a Kubernetes API server (cluster mode). Reads
 * come from reflector-fed caches (Proxies, optionally restricted to one namespace; all
 * ProviderHealths; only labelled Secrets), writes go to the API through the shared client with
 * explicit patch content types, and every successful write is applied to the cache at once so
 * callers read their own writes before the watch event arrives.
 */
import type { KubeConfig } from '@kubernetes/client-node';
import {
  GROUP,
  LABEL_CLOUD_INIT_SECRET,
  LABEL_CREDENTIALS_FOR,
  PROVIDER_HEALTH_PLURAL,
  PROXY_PLURAL,
  VERSION,
} from '../../api/constants.ts';
import { type KubeObject, keyOf, type ObjectKey, type Secret } from '../../api/meta.ts';
import type { ProviderHealth } from '../../api/providerhealth.ts';
import type { ProxyObject } from '../../api/proxy.ts';
import { type Logger, silentLogger } from '../../log/index.ts';
import {
  type IndexFunc,
  type ListOptions,
  type ObjectStore,
  type ResourceClient,
  type SecretClient,
  StoreError,
  type Unsubscribe,
  type WatchEvent,
  type WriteOptions,
} from '../store.ts';
import { callOptions, createKubeClients, type KubeClientOptions, type KubeClients } from './client.ts';
import { kubeCall } from './errors.ts';
import { Informer, MultiSourceSink } from './informer.ts';
import { type ListPage, Reflector } from './reflector.ts';

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
  };
}

/** Plain JSON, as the watch delivers it: typed client models carry Dates and class prototypes. */
function toPlain<T>(v: unknown): T {
  return JSON.parse(JSON.stringify(v)) as T;
}

/** REST operations on one resource type; namespaced or cluster-scoped. */
interface RawApi<T extends KubeObject> {
  readonly what: string;
  collectionPath(namespace?: string): string;
  list(
    namespace: string | undefined,
    q: { labelSelector?: string; limit: number; continue?: string },
    signal: AbortSignal,
  ): Promise<ListPage<T>>;
  read(key: ObjectKey, signal?: AbortSignal): Promise<T>;
  create(obj: T, signal?: AbortSignal): Promise<T>;
  replace(obj: T, signal?: AbortSignal): Promise<T>;
  patch(
    key: ObjectKey,
    body: unknown,
    type: 'merge' | 'json',
    status: boolean,
    signal?: AbortSignal,
  ): Promise<T>;
  delete(key: ObjectKey, uid: string | undefined, signal?: AbortSignal): Promise<unknown>;
}

function requireNamespace(what: string, key: ObjectKey): string {
  if (!key.namespace)
    throw new StoreError('Invalid', 422, `${what} ${key.name}: metadata.namespace is required`);
  return key.namespace;
}

function customApi<T extends KubeObject>(c: KubeClients, plural: string, namespaced: boolean): RawApi<T> {
  const co = c.customObjects;
  const base = { group: GROUP, version: VERSION, plural };
  const label = (key: ObjectKey) => `${plural} ${key.namespace ? `${key.namespace}/` : ''}${key.name}`;
  const call = <R>(what: string, fn: () => Promise<unknown>) => kubeCall(what, fn) as Promise<R>;
  return {
    what: plural,
    collectionPath: (ns) =>
      namespaced && ns
        ? `/apis/${GROUP}/${VERSION}/namespaces/${ns}/${plural}`
        : `/apis/${GROUP}/${VERSION}/${plural}`,
    list: (ns, q, signal) => {
      const p = { ...base, labelSelector: q.labelSelector, limit: q.limit, _continue: q.continue };
      return call(`list ${plural}`, () =>
        namespaced && ns
          ? co.listNamespacedCustomObject({ ...p, namespace: ns }, callOptions({ signal }))
          : co.listClusterCustomObject(p, callOptions({ signal })),
      );
    },
    read: (key, signal) =>
      call(`get ${label(key)}`, () =>
        namespaced
          ? co.getNamespacedCustomObject(
              { ...base, namespace: requireNamespace(plural, key), name: key.name },
              callOptions({ signal }),
            )
          : co.getClusterCustomObject({ ...base, name: key.name }, callOptions({ signal })),
      ),
    create: (obj, signal) =>
      call(`create ${label(obj.metadata)}`, () =>
        namespaced
          ? co.createNamespacedCustomObject(
              { ...base, namespace: requireNamespace(plural, obj.metadata), body: obj },
              callOptions({ signal }),
            )
          : co.createClusterCustomObject({ ...base, body: obj }, callOptions({ signal })),
      ),
    replace: (obj, signal) =>
      call(`update ${label(obj.metadata)}`, () =>
        namespaced
          ? co.replaceNamespacedCustomObject(
              {
                ...base,
                namespace: requireNamespace(plural, obj.metadata),
                name: obj.metadata.name,
                body: obj,
              },
              callOptions({ signal }),
            )
          : co.replaceClusterCustomObject(
              { ...base, name: obj.metadata.name, body: obj },
              callOptions({ signal }),
            ),
      ),
    patch: (key, body, type, status, signal) => {
      const o = callOptions({ signal, patch: type });
      const what = `patch ${label(key)}${status ? '/status' : ''}`;
      if (namespaced) {
        const p = { ...base, namespace: requireNamespace(plural, key), name: key.name, body };
        return call(what, () =>
          status ? co.patchNamespacedCustomObjectStatus(p, o) : co.patchNamespacedCustomObject(p, o),
        );
      }
      const p = { ...base, name: key.name, body };
      return call(what, () =>
        status ? co.patchClusterCustomObjectStatus(p, o) : co.patchClusterCustomObject(p, o),
      );
    },
    delete: (key, uid, signal) => {
      const body = uid !== undefined ? { preconditions: { uid } } : undefined;
      return call(`delete ${label(key)}`, () =>
        namespaced
          ? co.deleteNamespacedCustomObject(
              { ...base, namespace: requireNamespace(plural, key), name: key.name, ...(body && { body }) },
              callOptions({ signal }),
            )
          : co.deleteClusterCustomObject(
              { ...base, name: key.name, ...(body && { body }) },
              callOptions({ signal }),
            ),
      );
    },
  };
}

function secretApi(c: KubeClients): RawApi<Secret> {
  const core = c.core;
  const label = (key: ObjectKey) => `secrets ${key.namespace ?? ''}/${key.name}`;
  return {
    what: 'secrets',
    collectionPath: (ns) => (ns ? `/api/v1/namespaces/${ns}/secrets` : '/api/v1/secrets'),
    list: async (ns, q, signal) => {
      const p = { labelSelector: q.labelSelector, limit: q.limit, _continue: q.continue };
      const out = await kubeCall('list secrets', () =>
        ns
          ? core.listNamespacedSecret({ ...p, namespace: ns }, callOptions({ signal }))
          : core.listSecretForAllNamespaces(p, callOptions({ signal })),
      );
      return toPlain<ListPage<Secret>>(out);
    },
    read: async (key, signal) =>
      toPlain<Secret>(
        await kubeCall(`get ${label(key)}`, () =>
          core.readNamespacedSecret(
            { namespace: requireNamespace('secrets', key), name: key.name },
            callOptions({ signal }),
          ),
        ),
      ),
    create: async (obj, signal) =>
      toPlain<Secret>(
        await kubeCall(`create ${label(obj.metadata)}`, () =>
          core.createNamespacedSecret(
            { namespace: requireNamespace('secrets', obj.metadata), body: obj as never },
            callOptions({ signal }),
          ),
        ),
      ),
    replace: async () => {
      throw new StoreError('BadRequest', 400, 'secrets: update is not supported by this store');
    },
    patch: async () => {
      throw new StoreError('BadRequest', 400, 'secrets: patch is not supported by this store');
    },
    delete: (key, _uid, signal) =>
      kubeCall(`delete ${label(key)}`, () =>
        core.deleteNamespacedSecret(
          { namespace: requireNamespace('secrets', key), name: key.name },
          callOptions({ signal }),
        ),
      ),
  };
}

/** Whether an API response body is a (possibly deleting) object rather than a Status. */
function isObject<T extends KubeObject>(v: unknown): v is T {
  return typeof v === 'object' && v !== null && 'metadata' in v && (v as { kind?: string }).kind !== 'Status';
}

/** A removed-finalizer response for an object the server then deleted. */
function isGone(obj: KubeObject): boolean {
  return Boolean(obj.metadata.deletionTimestamp) && (obj.metadata.finalizers?.length ?? 0) === 0;
}

class KubeResourceClient<T extends KubeObject> implements ResourceClient<T> {
  readonly informer: Informer<T>;
  private readonly api: RawApi<T>;
  private readonly inScope: (obj: KubeObject) => boolean;

  constructor(api: RawApi<T>, informer: Informer<T>, inScope: (obj: KubeObject) => boolean) {
    this.api = api;
    this.informer = informer;
    this.inScope = inScope;
  }

  private cache(obj: T): T {
    if (!this.inScope(obj)) return obj;
    if (isGone(obj)) this.informer.remove(obj);
    else this.informer.upsert(obj);
    return obj;
  }

  get(key: ObjectKey): T | undefined {
    return this.informer.get(keyOf({ metadata: key }));
  }

  list(opts?: ListOptions): T[] {
    return this.informer.list(opts);
  }

  addIndex(name: string, fn: IndexFunc<T>): void {
    this.informer.addIndex(name, fn);
  }

  byIndex(name: string, value: string): T[] {
    return this.informer.byIndex(name, value);
  }

  read(key: ObjectKey, opts?: WriteOptions): Promise<T> {
    return this.api.read(key, opts?.signal);
  }

  async create(obj: T, opts?: WriteOptions): Promise<T> {
    return this.cache(await this.api.create(obj, opts?.signal));
  }

  async update(obj: T, opts?: WriteOptions): Promise<T> {
    return this.cache(await this.api.replace(obj, opts?.signal));
  }

  async patchStatus(
    key: ObjectKey,
    status: Record<string, unknown>,
    opts?: WriteOptions & { resourceVersion?: string },
  ): Promise<T> {
    // metadata.resourceVersion in a merge patch is a precondition: 409 if the object moved.
    const body: Record<string, unknown> = { status };
    if (opts?.resourceVersion !== undefined) body.metadata = { resourceVersion: opts.resourceVersion };
    return this.cache(await this.api.patch(key, body, 'merge', true, opts?.signal));
  }

  async delete(key: ObjectKey, opts?: WriteOptions & { uid?: string }): Promise<void> {
    const out = await this.api.delete(key, opts?.uid, opts?.signal);
    if (isObject<T>(out) && out.metadata.deletionTimestamp && (out.metadata.finalizers?.length ?? 0) > 0) {
      this.cache(out);
    } else {
      const cached = this.get(key);
      if (cached) this.informer.remove(cached);
    }
  }

  async addFinalizer(obj: T, finalizer: string, opts?: WriteOptions): Promise<T> {
    const base = obj.metadata.resourceVersion ? obj : await this.read(obj.metadata, opts);
    const current = base.metadata.finalizers ?? [];
    const finalizers = current.includes(finalizer) ? current : [...current, finalizer];
    const out = await this.writeFinalizers(base, finalizers, opts);
    if (!out)
      throw new StoreError('NotFound', 404, `${this.api.what} ${keyOf(base)}: gone while adding a finalizer`);
    return out;
  }

  async removeFinalizer(obj: T, finalizer: string, opts?: WriteOptions): Promise<T | undefined> {
    const base = obj.metadata.resourceVersion ? obj : await this.read(obj.metadata, opts);
    const finalizers = (base.metadata.finalizers ?? []).filter((f) => f !== finalizer);
    const out = await this.writeFinalizers(base, finalizers, opts);
    return out && !isGone(out) ? out : undefined;
  }

  /**
   * Merge patch of the whole finalizer list guarded by the resourceVersion it was computed
   * from, so a concurrent change to the list is a 409 rather than a lost finalizer.
   */
  private async writeFinalizers(base: T, finalizers: string[], opts?: WriteOptions): Promise<T | undefined> {
    const body = { metadata: { resourceVersion: base.metadata.resourceVersion, finalizers } };
    const out: unknown = await this.api.patch(base.metadata, body, 'merge', false, opts?.signal);
    if (isObject<T>(out)) return this.cache(out);
    // Some servers answer the patch that deletes the object with a Status instead of it.
    const cached = this.get(base.metadata);
    if (cached) this.informer.remove(cached);
    return undefined;
  }

  watch(handler: (event: WatchEvent<T>) => void): Unsubscribe {
    return this.informer.subscribe(handler);
  }

  synced(signal?: AbortSignal): Promise<void> {
    return this.informer.synced(signal);
  }
}

interface SecretSource {
  name: string;
  labelSelector: string;
  accept: (s: Secret) => boolean;
}

/** The label selectors under which Secrets are cached (an unlabelled Secret reads as missing). */
export const SECRET_SOURCES: SecretSource[] = [
  {
    name: 'cloud-init',
    labelSelector: `${LABEL_CLOUD_INIT_SECRET}=true`,
    accept: (s) => s.metadata.labels?.[LABEL_CLOUD_INIT_SECRET] === 'true',
  },
  {
    name: 'credentials',
    labelSelector: LABEL_CREDENTIALS_FOR,
    accept: (s) => Object.hasOwn(s.metadata.labels ?? {}, LABEL_CREDENTIALS_FOR),
  },
];

class KubeSecretClient implements SecretClient {
  readonly informer: Informer<Secret>;
  readonly sink: MultiSourceSink<Secret>;
  private readonly api: RawApi<Secret>;
  private readonly inScope: (obj: KubeObject) => boolean;

  constructor(api: RawApi<Secret>, informer: Informer<Secret>, inScope: (obj: KubeObject) => boolean) {
    this.api = api;
    this.informer = informer;
    this.sink = new MultiSourceSink(informer);
    this.inScope = inScope;
  }

  get(key: ObjectKey): Secret | undefined {
    return this.informer.get(keyOf({ metadata: key }));
  }

  read(key: ObjectKey, opts?: WriteOptions): Promise<Secret> {
    return this.api.read(key, opts?.signal);
  }

  async create(secret: Secret, opts?: WriteOptions): Promise<Secret> {
    const out = await this.api.create(secret, opts?.signal);
    if (this.inScope(out)) this.sink.writeThrough(out, SECRET_SOURCES);
    return out;
  }

  async delete(key: ObjectKey, opts?: WriteOptions): Promise<void> {
    await this.api.delete(key, undefined, opts?.signal);
    const cached = this.get(key);
    if (cached) for (const s of SECRET_SOURCES) this.sink.source(s.name, s.accept).remove(cached);
  }

  watch(handler: (event: WatchEvent<Secret>) => void): Unsubscribe {
    return this.informer.subscribe(handler);
  }

  synced(signal?: AbortSignal): Promise<void> {
    return this.informer.synced(signal);
  }
}

export class KubeStore implements ObjectStore {
  readonly proxies: KubeResourceClient<ProxyObject>;
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
    this.providerHealths = new KubeResourceClient(
      customApi<ProviderHealth>(clients, PROVIDER_HEALTH_PLURAL, false),
      new Informer<ProviderHealth>('providerhealths', this.log),
      () => true,
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
      log: this.log,
      watchClient: this.clients.watch,
    };
    const ns = this.namespace;
    const proxiesApi = customApi<ProxyObject>(this.clients, PROXY_PLURAL, true);
    const phApi = customApi<ProviderHealth>(this.clients, PROVIDER_HEALTH_PLURAL, false);
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
    const phs = new Reflector<ProviderHealth>({
      ...tuning,
      name: 'providerhealths',
      list: (q) => phApi.list(undefined, q, q.signal),
      watchPath: phApi.collectionPath(),
      sink: this.providerHealths.informer,
      onSynced: () => this.providerHealths.informer.markSynced(),
    });
    reflectors.push(phs as unknown as Reflector<KubeObject>);
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
