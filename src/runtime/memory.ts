/**
 * runtime/memory — an in-process ObjectStore with full Kubernetes object semantics, for tests of
 * the reconciler, health engine, lease store and anything else that talks to an ObjectStore.
 * Cache == truth; `synced()` resolves at once; watch handlers get ADDED for existing objects.
 */
import type { KubeObject, Secret } from '../api/meta.ts';
import type { ProviderHealth } from '../api/providerhealth.ts';
import type { ProxyObject } from '../api/proxy.ts';
import type { Logger } from '../log/index.ts';
import type { Clock } from './clock.ts';
import { type Collection, ObjectEngine } from './objects/engine.ts';
import { collectOwnedObjects } from './objects/owners.ts';
import { storeOnEngine } from './objects/store-adapter.ts';
import {
  PROVIDER_HEALTH_RESOURCE,
  PROXY_POOL_RESOURCE,
  PROXY_RESOURCE,
  SECRET_RESOURCE,
  type StoredObject,
} from './objects/types.ts';
import type { ObjectStore } from './store.ts';

export interface MemoryStoreOptions {
  clock?: Clock;
  log?: Logger;
  /** Share an engine (e.g. with a test server); a fresh one otherwise. */
  engine?: ObjectEngine;
  /** Delete objects whose owners are gone, like the Kubernetes garbage collector (default off). */
  collectGarbage?: boolean;
}

/** Deep partial, for seeding objects without spelling out every field. */
export type Seed<T extends KubeObject> = Omit<T, 'metadata' | 'apiVersion' | 'kind'> & {
  apiVersion?: string;
  kind?: string;
  metadata: T['metadata'];
};

export interface MemoryStore extends ObjectStore {
  readonly engine: ObjectEngine;
  /**
   * Creates a Proxy as a user would (status given here is written through the status
   * subresource afterwards, so tests can seed a "Ready" proxy in one call).
   */
  seedProxy(p: Seed<ProxyObject>): ProxyObject;
  seedProviderHealth(p: Seed<ProviderHealth>): ProviderHealth;
  /** Creates a Secret; `stringData` is accepted and turned into base64 `data`. */
  seedSecret(s: Secret & { stringData?: Record<string, string> }): Secret;
  /** Synchronous raw access to the three collections (for assertions and fault setups). */
  readonly collections: {
    proxies: Collection;
    proxyPools: Collection;
    providerHealths: Collection;
    secrets: Collection;
  };
}

function seedWithStatus(c: Collection, obj: StoredObject): StoredObject {
  const created = c.create(obj);
  if (obj.status === undefined || !c.type.statusSubresource) return created;
  return c.patch(
    'merge',
    { status: obj.status },
    {
      namespace: created.metadata.namespace,
      name: created.metadata.name,
      subresource: 'status',
    },
  );
}

export function createMemoryStore(opts: MemoryStoreOptions = {}): MemoryStore {
  const engine = opts.engine ?? new ObjectEngine(opts.clock ? { clock: opts.clock } : {});
  const store = storeOnEngine(engine, opts.log ? { log: opts.log } : {});
  const collections = {
    proxies: engine.register(PROXY_RESOURCE),
    proxyPools: engine.register(PROXY_POOL_RESOURCE),
    providerHealths: engine.register(PROVIDER_HEALTH_RESOURCE),
    secrets: engine.register(SECRET_RESOURCE),
  };
  if (opts.collectGarbage) collectOwnedObjects(engine);
  return {
    ...store,
    engine,
    collections,
    seedProxy: (p) => seedWithStatus(collections.proxies, p as StoredObject) as unknown as ProxyObject,
    seedProviderHealth: (p) =>
      seedWithStatus(collections.providerHealths, p as unknown as StoredObject) as unknown as ProviderHealth,
    seedSecret: (s) => collections.secrets.create(s as StoredObject) as Secret,
  };
}
