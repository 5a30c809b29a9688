/**
 * runtime/objects/store-adapter — the ObjectStore interface on top of an ObjectEngine. The
 * engine is both cache and truth, so `get`/`list` are exact; watch handlers get informer
 * semantics (ADDED for every existing object on subscribe, then changes, delivered
 * asynchronously in commit order), and secondary indexes (`addIndex`) follow every commit
 * synchronously, like the engine itself. A `schedule` hook lets the embedded store hold events back
 * until the write that caused them is durable.
 */
import { LABEL_CLOUD_INIT_SECRET, LABEL_CREDENTIALS_FOR } from '../../api/constants.ts';
import { type KubeObject, keyOf, type ObjectKey, parseKey, type Secret } from '../../api/meta.ts';
import type { ProviderHealth } from '../../api/providerhealth.ts';
import type { ProxyObject } from '../../api/proxy.ts';
import type { ProxyPool } from '../../api/proxypool.ts';
import type { Logger } from '../../log/index.ts';
import { silentLogger } from '../../log/index.ts';
import { CacheIndexes } from '../indexer.ts';
import type {
  IndexFunc,
  ListOptions,
  ObjectStore,
  ResourceClient,
  SecretClient,
  Unsubscribe,
  WatchEvent,
  WriteOptions,
} from '../store.ts';
import type { Collection, ObjectEngine } from './engine.ts';
import type { EngineEvent } from './types.ts';
import {
  PROVIDER_HEALTH_RESOURCE,
  PROXY_POOL_RESOURCE,
  PROXY_RESOURCE,
  SECRET_RESOURCE,
  type StoredObject,
} from './types.ts';

export interface EngineStoreOptions {
  log?: Logger;
  /**
   * Runs a write's follow-up (event delivery) once the write may be observed; default: next
   * microtask. Must preserve order.
   */
  schedule?: (fn: () => void) => void;
  /** Awaited by every write before it resolves (e.g. the state file is fsynced). */
  durable?: () => Promise<void>;
}

/** Secrets the operator caches: cloud-init Secrets and its own credential Secrets. */
export function isCachedSecret(s: KubeObject): boolean {
  const l = s.metadata.labels ?? {};
  return l[LABEL_CLOUD_INIT_SECRET] === 'true' || Object.hasOwn(l, LABEL_CREDENTIALS_FOR);
}

function checkSignal(opts?: WriteOptions): void {
  opts?.signal?.throwIfAborted();
}

class Dispatcher {
  private readonly log: Logger;
  private readonly schedule: (fn: () => void) => void;
  constructor(log: Logger, schedule: (fn: () => void) => void) {
    this.log = log;
    this.schedule = schedule;
  }

  /** Subscribes with informer semantics; `filter` decides cache membership (Secrets). */
  subscribe<T extends KubeObject>(
    c: Collection,
    handler: (e: WatchEvent<T>) => void,
    filter: (o: StoredObject) => boolean = () => true,
  ): Unsubscribe {
    let active = true;
    const call = (e: WatchEvent<T>) => {
      this.schedule(() => {
        if (!active) return;
        try {
          handler(e);
        } catch (err) {
          this.log.error({ err, resource: c.type.plural }, 'watch handler failed; event dropped');
        }
      });
    };
    const w = c.watch({}, (ev: EngineEvent) => {
      const now = filter(ev.object);
      const before = ev.old ? filter(ev.old) : false;
      let type = ev.type;
      if (ev.type === 'MODIFIED') {
        if (now && !before) type = 'ADDED';
        else if (!now && before) type = 'DELETED';
        else if (!now) return;
      } else if (ev.type === 'DELETED') {
        if (!before) return; // never in the cache, so nothing to remove
      } else if (!now) {
        return;
      }
      const out: WatchEvent<T> = { type, object: ev.object as unknown as T };
      if (type !== 'ADDED' && ev.old) out.old = ev.old as unknown as T;
      call(out);
    });
    return () => {
      active = false;
      w.stop();
    };
  }
}

/** What every engine-backed client holds: its collection, the event dispatcher, durability. */
abstract class EngineClient {
  protected readonly c: Collection;
  protected readonly d: Dispatcher;
  protected readonly durable: () => Promise<void>;
  constructor(c: Collection, d: Dispatcher, durable: () => Promise<void>) {
    this.c = c;
    this.d = d;
    this.durable = durable;
  }

  /** Resolves with `v` once the write behind it is durable (on disk in standalone mode). */
  protected async done<R>(v: R): Promise<R> {
    await this.durable();
    return v;
  }
}

class EngineResourceClient<T extends KubeObject> extends EngineClient implements ResourceClient<T> {
  /**
   * Index state lives in one object, never in fields assigned later: tests wrap a client with
   * `Object.create(client)`, and an assignment through the wrapper would fork the state.
   */
  private readonly idx: { indexes: CacheIndexes<T>; following: boolean } = {
    indexes: new CacheIndexes<T>(),
    following: false,
  };

  get(key: ObjectKey): T | undefined {
    return this.c.get(key.namespace, key.name) as unknown as T | undefined;
  }

  list(opts: ListOptions = {}): T[] {
    return this.c.list(opts).items as unknown as T[];
  }

  async read(key: ObjectKey, opts?: WriteOptions): Promise<T> {
    checkSignal(opts);
    return this.c.read(key.namespace, key.name) as unknown as T;
  }

  async readList(opts: ListOptions & WriteOptions = {}): Promise<T[]> {
    checkSignal(opts);
    const { signal: _signal, ...list } = opts;
    return this.list(list);
  }

  addIndex(name: string, fn: IndexFunc<T>): void {
    const state = this.idx;
    if (state.following) {
      state.indexes.add(name, fn, this.c.all() as unknown as T[]);
      return;
    }
    if (!state.indexes.add(name, fn, [])) return;
    state.following = true;
    // A synchronous engine watch: it replays every object now, then sees each commit as it
    // happens, so the index is exactly as fresh as `get`. It lives as long as the store.
    this.c.watch({}, (ev) => {
      if (ev.type === 'DELETED') state.indexes.remove(keyOf(ev.object));
      else state.indexes.upsert(ev.object as unknown as T);
    });
  }

  byIndex(name: string, value: string): T[] {
    const out: T[] = [];
    for (const key of this.idx.indexes.keys(name, value)) {
      const k = parseKey(key);
      const obj = this.c.get(k.namespace, k.name);
      if (obj) out.push(obj as unknown as T);
    }
    return out;
  }

  async create(obj: T, opts?: WriteOptions): Promise<T> {
    checkSignal(opts);
    return this.done(this.c.create(obj as unknown as StoredObject) as unknown as T);
  }

  async update(obj: T, opts?: WriteOptions): Promise<T> {
    checkSignal(opts);
    return this.done(this.c.update(obj as unknown as StoredObject) as unknown as T);
  }

  async patchStatus(
    key: ObjectKey,
    status: Record<string, unknown>,
    opts?: WriteOptions & { resourceVersion?: string },
  ): Promise<T> {
    checkSignal(opts);
    const body: Record<string, unknown> = { status };
    if (opts?.resourceVersion !== undefined) body.metadata = { resourceVersion: opts.resourceVersion };
    const out = this.c.patch('merge', body, {
      namespace: key.namespace,
      name: key.name,
      subresource: 'status',
    });
    return this.done(out as unknown as T);
  }

  async delete(key: ObjectKey, opts?: WriteOptions & { uid?: string }): Promise<void> {
    checkSignal(opts);
    const pre = opts?.uid !== undefined ? { uid: opts.uid } : {};
    this.c.delete(key.namespace, key.name, pre);
    await this.durable();
  }

  async addFinalizer(obj: T, finalizer: string, opts?: WriteOptions): Promise<T> {
    checkSignal(opts);
    const cur = this.c.read(obj.metadata.namespace, obj.metadata.name);
    const next = { ...cur, metadata: { ...cur.metadata } };
    if (obj.metadata.resourceVersion !== undefined)
      next.metadata.resourceVersion = obj.metadata.resourceVersion;
    const fins = next.metadata.finalizers ?? [];
    if (fins.includes(finalizer) && next.metadata.resourceVersion === cur.metadata.resourceVersion) {
      return cur as unknown as T;
    }
    next.metadata.finalizers = fins.includes(finalizer) ? fins : [...fins, finalizer];
    return this.done(this.c.update(next) as unknown as T);
  }

  async removeFinalizer(obj: T, finalizer: string, opts?: WriteOptions): Promise<T | undefined> {
    checkSignal(opts);
    const cur = this.c.read(obj.metadata.namespace, obj.metadata.name);
    const next = { ...cur, metadata: { ...cur.metadata } };
    if (obj.metadata.resourceVersion !== undefined)
      next.metadata.resourceVersion = obj.metadata.resourceVersion;
    next.metadata.finalizers = (next.metadata.finalizers ?? []).filter((f) => f !== finalizer);
    const out = this.c.update(next);
    const still = this.c.get(out.metadata.namespace, out.metadata.name);
    await this.durable();
    return still && still.metadata.uid === out.metadata.uid ? (out as unknown as T) : undefined;
  }

  watch(handler: (event: WatchEvent<T>) => void): Unsubscribe {
    return this.d.subscribe(this.c, handler);
  }

  async synced(signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
  }
}

class EngineSecretClient extends EngineClient implements SecretClient {
  get(key: ObjectKey): Secret | undefined {
    const s = this.c.get(key.namespace, key.name);
    return s && isCachedSecret(s) ? (s as Secret) : undefined;
  }

  async read(key: ObjectKey, opts?: WriteOptions): Promise<Secret> {
    checkSignal(opts);
    return this.c.read(key.namespace, key.name) as Secret;
  }

  async create(secret: Secret, opts?: WriteOptions): Promise<Secret> {
    checkSignal(opts);
    const out = this.c.create(secret as StoredObject) as Secret;
    await this.durable();
    return out;
  }

  async addLabels(
    key: ObjectKey,
    labels: Record<string, string>,
    opts?: WriteOptions & { resourceVersion?: string },
  ): Promise<Secret> {
    checkSignal(opts);
    const metadata: Record<string, unknown> = { labels };
    if (opts?.resourceVersion !== undefined) metadata.resourceVersion = opts.resourceVersion;
    const out = this.c.patch('merge', { metadata }, { namespace: key.namespace, name: key.name });
    return this.done(out as unknown as Secret);
  }

  async delete(key: ObjectKey, opts?: WriteOptions): Promise<void> {
    checkSignal(opts);
    this.c.delete(key.namespace, key.name);
    await this.durable();
  }

  watch(handler: (event: WatchEvent<Secret>) => void): Unsubscribe {
    return this.d.subscribe(this.c, handler, isCachedSecret);
  }

  async synced(signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
  }
}

/** An ObjectStore whose cache and truth are the given engine (Proxy, ProxyPool, ProviderHealth, Secret registered). */
export function storeOnEngine(engine: ObjectEngine, opts: EngineStoreOptions = {}): ObjectStore {
  const d = new Dispatcher(opts.log ?? silentLogger(), opts.schedule ?? queueMicrotask);
  const durable = opts.durable ?? (async () => {});
  const proxies = new EngineResourceClient<ProxyObject>(engine.register(PROXY_RESOURCE), d, durable);
  const proxyPools = new EngineResourceClient<ProxyPool>(engine.register(PROXY_POOL_RESOURCE), d, durable);
  const providerHealths = new EngineResourceClient<ProviderHealth>(
    engine.register(PROVIDER_HEALTH_RESOURCE),
    d,
    durable,
  );
  const secrets = new EngineSecretClient(engine.register(SECRET_RESOURCE), d, durable);
  return {
    proxies,
    proxyPools,
    providerHealths,
    secrets,
    async start() {},
    async stop() {},
  };
}
