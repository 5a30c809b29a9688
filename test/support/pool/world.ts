/**
 * test/support/pool/world — a ProxyPool controller under test on a real backend (the embedded store on a
 * state file, or client-node against the Kubernetes REST test server), with the Proxy
 * controller and the health engine played by the test: `serve()` makes pool Proxies Ready and
 * Healthy the way those two would write status, and `leases` stands in for the lease store.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { API_VERSION, LABEL_POOL, PROXY_POOL_KIND } from '../../../src/api/constants.ts';
import { keyOf } from '../../../src/api/meta.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import type { ProxyPool, ProxyPoolSpec } from '../../../src/api/proxypool.ts';
import { createPoolReconciler, type PoolReconciler } from '../../../src/pool/reconciler.ts';
import type { Clock } from '../../../src/runtime/clock.ts';
import { createEmbeddedStore } from '../../../src/runtime/embedded/store.ts';
import { createKubeStore } from '../../../src/runtime/kube/store.ts';
import type { ObjectStore } from '../../../src/runtime/store.ts';
import { FakeClock } from '../clock.ts';
import { type KubeServer, startKubeServer } from '../kube-server/index.ts';
import { seededRandom } from '../random.ts';

export type Backend = 'embedded' | 'rest';
export const BACKENDS: Backend[] = ['embedded', 'rest'];
export const NAMESPACE = 'crawl';

export interface PoolWorld {
  store: ObjectStore;
  clock: FakeClock;
  pools: PoolReconciler;
  /** Live leases per Proxy name (the lease store's answer, summed over instances). */
  leases: Map<string, number>;
  server?: KubeServer;
  /** The pool's Proxies, not counting those being deleted. */
  members(pool?: string): ProxyObject[];
  /** Marks every pool Proxy without an address Ready and Healthy (controller + health engine). */
  serve(): Promise<void>;
  createPool(name: string, spec: ProxyPoolSpec): Promise<ProxyPool>;
  pool(name: string): ProxyPool | undefined;
  reconcile(name: string): Promise<{ requeueAfter?: number }>;
  close(): Promise<void>;
}

const fastReflector = { initialBackoffMs: 20, maxBackoffMs: 200, watchTimeoutSeconds: 20 };

/** A real backend: the embedded store on a state file, or client-node against the REST test server. */
export async function openStore(
  backend: Backend,
  clock: Clock,
): Promise<{ store: ObjectStore; server?: KubeServer; close(): Promise<void> }> {
  if (backend === 'embedded') {
    const dir = mkdtempSync(join(tmpdir(), 'pool-'));
    const store = await createEmbeddedStore({
      statePath: join(dir, 'state.json'),
      clock,
      rescanIntervalMs: 0,
    });
    return {
      store,
      close: async () => {
        await store.stop();
        rmSync(dir, { recursive: true, force: true });
      },
    };
  }
  const server = await startKubeServer({ clock, bookmarkIntervalMs: 200 });
  const store = await createKubeStore({ kubeConfig: server.kubeConfig(), reflector: fastReflector });
  const ac = new AbortController();
  await store.start(ac.signal);
  await Promise.all([store.proxies.synced(), store.proxyPools.synced()]);
  return {
    store,
    server,
    close: async () => {
      ac.abort();
      await store.stop();
      await server.stop();
    },
  };
}

export async function openWorld(
  backend: Backend,
  opts: {
    providerType?: (name: string) => string | undefined;
    canRestart?: (name: string) => boolean | undefined;
    drainTimeoutMs?: number;
  } = {},
): Promise<PoolWorld> {
  const clock = new FakeClock();
  const { store, server, close } = await openStore(backend, clock);
  const leases = new Map<string, number>();
  const pools = createPoolReconciler({
    store,
    clock,
    random: seededRandom(),
    leasesOn: (key, providerID) =>
      providerID === `fake/${key}` ? (leases.get(key.split('/')[1] ?? '') ?? 0) : 0,
    providerType: opts.providerType ?? (() => 'local'),
    ...(opts.canRestart ? { canRestart: opts.canRestart } : {}),
    ...(opts.drainTimeoutMs !== undefined ? { drainTimeoutMs: opts.drainTimeoutMs } : {}),
  });
  const ac = new AbortController();
  const members = (pool?: string) =>
    store.proxies
      .list({ namespace: NAMESPACE, labelSelector: pool ? `${LABEL_POOL}=${pool}` : LABEL_POOL })
      .filter((p) => !p.metadata.deletionTimestamp);
  return {
    store,
    clock,
    pools,
    leases,
    ...(server ? { server } : {}),
    members,
    async serve() {
      for (const p of members()) {
        if (p.status?.address) continue;
        await store.proxies.patchStatus(
          { namespace: NAMESPACE, name: p.metadata.name },
          {
            phase: 'Ready',
            address: '127.0.0.1',
            port: 3128,
            providerID: `fake/${keyOf(p)}`,
            conditions: [
              {
                type: 'Healthy',
                status: 'True',
                reason: 'ProbeSucceeded',
                lastTransitionTime: new Date(clock.now()).toISOString(),
              },
            ],
          },
        );
      }
    },
    createPool: (name, spec) =>
      store.proxyPools.create({
        apiVersion: API_VERSION,
        kind: PROXY_POOL_KIND,
        metadata: { name, namespace: NAMESPACE },
        spec,
      }),
    pool: (name) => store.proxyPools.get({ namespace: NAMESPACE, name }),
    reconcile: (name) => pools.reconcile(`${NAMESPACE}/${name}`, ac.signal),
    close: async () => {
      ac.abort();
      await close();
    },
  };
}

/** A pool spec of local proxies. */
export function poolSpec(replicas: number, extra: Partial<ProxyPoolSpec> = {}): ProxyPoolSpec {
  return {
    replicas,
    template: { metadata: { labels: { tier: 'a' } }, spec: { provider: 'local' } },
    ...extra,
  };
}
