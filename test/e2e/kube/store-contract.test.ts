/**
 * The ObjectStore contract with the real API server as its backend: the Kubernetes store
 * (client-node over one undici Agent, reflectors, informer caches) against kube-apiserver and
 * etcd gives the same answers as the memory, embedded and REST-test-server backends — the same
 * errors for the same mistakes, generation and finalizer semantics, and caches and watch events
 * that follow every write.
 */
import { resolve } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import { beforeAll, inject } from 'vitest';
import { createKubeStore } from '../../../src/runtime/kube/store.ts';
import { runStoreContract } from '../../support/store-contract.ts';
import { kubectl } from './support/control-plane.ts';
import { rest } from './support/rest.ts';

const ROOT = resolve(import.meta.dirname, '../../..');
const cp = inject('controlPlane');

beforeAll(() => {
  kubectl(cp, ['apply', '--server-side', '--field-manager=e2e', '-k', resolve(ROOT, 'config/crd')]);
  for (const crd of ['proxies', 'proxypools', 'providerhealths'])
    kubectl(cp, ['wait', '--for=condition=Established', '--timeout=60s', `crd/${crd}.crawl.example.com`]);
});

runStoreContract(
  'kubernetes (client-node → real kube-apiserver)',
  async ({ namespaces }) => {
    const api = rest(cp.server, cp.adminToken, cp.caFile);
    for (const name of namespaces) {
      const r = await api.call('POST', '/api/v1/namespaces', {
        apiVersion: 'v1',
        kind: 'Namespace',
        metadata: { name },
      });
      if (r.status !== 201)
        throw new Error(`create namespace ${name}: ${r.status} ${JSON.stringify(r.body)}`);
    }
    const providerHealths = async (): Promise<string[]> =>
      ((await api.call('GET', '/apis/crawl.example.com/v1alpha1/providerhealths')).body?.items ?? []).map(
        (p: { metadata: { name: string } }) => p.metadata.name,
      );
    const existing = new Set(await providerHealths());
    const kc = new KubeConfig();
    kc.loadFromFile(cp.kubeconfig);
    const store = await createKubeStore({
      kubeConfig: kc,
      reflector: { initialBackoffMs: 50, maxBackoffMs: 1000 },
    });
    const ac = new AbortController();
    await store.start(ac.signal);
    await store.proxies.synced();
    return {
      store,
      cleanup: async () => {
        ac.abort();
        await store.stop();
        // Finalizers left by a test would hold its namespace in Terminating for good: no
        // operator runs here to remove them.
        for (const ns of namespaces) {
          const list = await api.call('GET', `/apis/crawl.example.com/v1alpha1/namespaces/${ns}/proxies`);
          for (const p of list.body?.items ?? []) {
            if (!p.metadata.finalizers?.length) continue;
            await api.call(
              'PATCH',
              `/apis/crawl.example.com/v1alpha1/namespaces/${ns}/proxies/${p.metadata.name}`,
              { metadata: { finalizers: null } },
              { contentType: 'application/merge-patch+json' },
            );
          }
          await api.call('DELETE', `/api/v1/namespaces/${ns}`);
        }
        // ProviderHealths are cluster-scoped: the test's own go with it, for the files after this one.
        for (const name of await providerHealths())
          if (!existing.has(name))
            await api.call('DELETE', `/apis/crawl.example.com/v1alpha1/providerhealths/${name}`);
        await api.close();
      },
    };
  },
  // The real server's watch is quick on loopback, but this machine is shared: a generous bound.
  { cacheTimeoutMs: 15_000 },
);
