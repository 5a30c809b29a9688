/**
 * Kubernetes backend over real client-node and real HTTP against the stateful REST test server:
 * the shared ObjectStore contract, watch survival across server-side cuts and 410 Gone, retried
 * list/watch faults, connection reuse, patch content types, namespace restriction.
 */
import { connect, createServer, type Server, type Socket } from 'node:net';
import type { KubeConfig } from '@kubernetes/client-node';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { FINALIZER } from '../../../src/api/constants.ts';
import { keyOf, parseKey } from '../../../src/api/meta.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { createKubeClients } from '../../../src/runtime/kube/client.ts';
import { createKubeStore, type KubeStore } from '../../../src/runtime/kube/store.ts';
import { Manager } from '../../../src/runtime/manager.ts';
import type { WatchEvent } from '../../../src/runtime/store.ts';
import { WorkQueue } from '../../../src/runtime/workqueue.ts';
import { type KubeServer, startKubeServer } from '../../support/kube-server/index.ts';
import { proxyFixture, runStoreContract } from '../../support/store-contract.ts';

/** How long a cache or watch may take to catch up on loopback. */
const WAIT = { timeout: 5000, interval: 10 };

const fastReflector = { initialBackoffMs: 20, maxBackoffMs: 200, watchTimeoutSeconds: 20, pageSize: 3 };

runStoreContract('kubernetes (client-node → REST test server)', async () => {
  const server = await startKubeServer({ bookmarkIntervalMs: 200 });
  const store = await createKubeStore({ kubeConfig: server.kubeConfig(), reflector: fastReflector });
  const ac = new AbortController();
  await store.start(ac.signal);
  await store.proxies.synced();
  return {
    store,
    cleanup: async () => {
      ac.abort();
      await store.stop();
      await server.stop();
    },
  };
});

interface Env {
  server: KubeServer;
  store: KubeStore;
  ac: AbortController;
  events: WatchEvent<ProxyObject>[];
}

let env: Env | undefined;
afterEach(async () => {
  if (!env) return;
  env.ac.abort();
  await env.store.stop();
  await env.server.stop();
  env = undefined;
});

async function setup(opts: { namespace?: string; kubeConfig?: KubeConfig; server?: KubeServer } = {}) {
  const server = opts.server ?? (await startKubeServer({ bookmarkIntervalMs: 100 }));
  const store = await createKubeStore({
    kubeConfig: opts.kubeConfig ?? server.kubeConfig(),
    reflector: fastReflector,
    ...(opts.namespace ? { namespace: opts.namespace } : {}),
  });
  const ac = new AbortController();
  const events: WatchEvent<ProxyObject>[] = [];
  store.proxies.watch((e) => events.push(e));
  await store.start(ac.signal);
  await store.proxies.synced();
  env = { server, store, ac, events };
  return env;
}

/** Creates objects directly in the server (another client), bypassing our write-through cache. */
function seed(server: KubeServer, ns: string, name: string, labels: Record<string, string> = {}) {
  return server.resource('proxies').create(proxyFixture(ns, name, labels) as never);
}

const names = (store: KubeStore) =>
  store.proxies
    .list()
    .map((p) => `${p.metadata.namespace}/${p.metadata.name}`)
    .sort();

describe('kube store: reflector resilience', () => {
  it('lists in pages and keeps following after the server cuts every watch', async () => {
    const server = await startKubeServer({ bookmarkIntervalMs: 100 });
    for (let i = 0; i < 7; i++) seed(server, 'ns', `pre-${i}`);
    const { store } = await setup({ server });
    expect(names(store)).toHaveLength(7); // 3 pages of 3
    expect(
      server.requests.filter((r) => r.path.endsWith('/proxies') && !r.watch && r.query.limit === '3').length,
    ).toBeGreaterThanOrEqual(3);
    for (let round = 0; round < 3; round++) {
      server.closeWatches({ abrupt: round === 1 });
      seed(server, 'ns', `after-cut-${round}`);
      await vi.waitFor(
        () => expect(store.proxies.get({ namespace: 'ns', name: `after-cut-${round}` })).toBeDefined(),
        WAIT,
      );
    }
    expect(names(store)).toHaveLength(10);
  });

  it('relists after 410 Gone without losing a create, an update or a delete made meanwhile', async () => {
    const { server, store, events } = await setup();
    seed(server, 'ns', 'keep');
    seed(server, 'ns', 'gone');
    seed(server, 'ns', 'phoenix');
    await vi.waitFor(() => expect(names(store)).toEqual(['ns/gone', 'ns/keep', 'ns/phoenix']), WAIT);
    const watchesBefore = env!.store.reflectors[0]!.stats.relistsOnGone;
    // Changes happen while our watch is down, then history is compacted past our resourceVersion.
    server.injectFault({ path: /\/proxies$/, watch: true, status: 500, times: 3 });
    server.closeWatches();
    const col = server.resource('proxies');
    const keep = col.read('ns', 'keep');
    col.update({ ...keep, metadata: { ...keep.metadata, labels: { changed: 'yes' } } });
    col.delete('ns', 'gone');
    col.create(proxyFixture('ns', 'new') as never);
    const phoenixOld = col.read('ns', 'phoenix');
    col.delete('ns', 'phoenix');
    const phoenixNew = col.create(proxyFixture('ns', 'phoenix') as never);
    server.compact();
    await vi.waitFor(() => expect(names(store)).toEqual(['ns/keep', 'ns/new', 'ns/phoenix']), WAIT);
    expect(store.proxies.get({ namespace: 'ns', name: 'phoenix' })?.metadata.uid).toBe(
      phoenixNew.metadata.uid,
    );
    expect(store.proxies.get({ namespace: 'ns', name: 'keep' })?.metadata.labels).toEqual({ changed: 'yes' });
    expect(env!.store.reflectors[0]!.stats.relistsOnGone).toBeGreaterThan(watchesBefore);
    const types = events
      .filter((e) => e.object.metadata.namespace === 'ns')
      .map((e) => `${e.type}:${e.object.metadata.name}`);
    expect(types).toEqual(expect.arrayContaining(['MODIFIED:keep', 'DELETED:gone', 'ADDED:new']));
    const deleted = events.find((e) => e.type === 'DELETED');
    expect(deleted?.old?.metadata.name).toBe('gone');
    // The relist finds only the new phoenix: consumers still see the old one deleted, then the new one.
    const phoenix = events.filter((e) => e.object.metadata.name === 'phoenix').slice(1);
    expect(phoenix.map((e) => `${e.type}:${e.object.metadata.uid}`)).toEqual([
      `DELETED:${phoenixOld.metadata.uid}`,
      `ADDED:${phoenixNew.metadata.uid}`,
    ]);
  });

  it('retries 500, 429 and connection resets on list and watch until it syncs', async () => {
    const server = await startKubeServer({ bookmarkIntervalMs: 100 });
    seed(server, 'ns', 'a');
    server.injectFault({ path: /\/proxies$/, watch: false, method: 'GET', status: 500, times: 2 });
    server.injectFault({
      path: /\/proxies$/,
      watch: false,
      method: 'GET',
      status: 429,
      times: 1,
      retryAfterSeconds: 0,
    });
    server.injectFault({ path: /\/proxies$/, watch: false, method: 'GET', status: 'reset', times: 1 });
    server.injectFault({ path: /\/proxies$/, watch: true, status: 500, times: 2 });
    server.injectFault({ path: /\/proxies$/, watch: true, status: 'reset', times: 1 });
    const { store } = await setup({ server });
    expect(names(store)).toEqual(['ns/a']);
    seed(server, 'ns', 'b');
    await vi.waitFor(() => expect(names(store)).toEqual(['ns/a', 'ns/b']), WAIT);
    expect(store.reflectors[0]!.stats.errors).toBeGreaterThanOrEqual(4);
  });

  it('a handler that throws on every event does not stop the cache or crash the process', async () => {
    const { server, store } = await setup();
    store.proxies.watch(() => {
      throw new Error('handler bug');
    });
    seed(server, 'ns', 'x');
    await vi.waitFor(() => expect(store.proxies.get({ namespace: 'ns', name: 'x' })).toBeDefined(), WAIT);
  });
});

describe('kube store: wire behaviour', () => {
  it('sends merge patches with the merge-patch content type and the resourceVersion precondition', async () => {
    const { server, store } = await setup();
    const a = await store.proxies.create(proxyFixture('ns', 'a'));
    await store.proxies.patchStatus(
      { namespace: 'ns', name: 'a' },
      { phase: 'Ready' },
      {
        resourceVersion: a.metadata.resourceVersion as string,
      },
    );
    await store.proxies.addFinalizer(await store.proxies.read({ namespace: 'ns', name: 'a' }), FINALIZER);
    const patches = server.requests.filter((r) => r.method === 'PATCH');
    expect(patches).toHaveLength(2);
    expect(patches[0]).toMatchObject({
      path: '/apis/crawl.example.com/v1alpha1/namespaces/ns/proxies/a/status',
      contentType: 'application/merge-patch+json',
      body: { status: { phase: 'Ready' }, metadata: { resourceVersion: a.metadata.resourceVersion } },
    });
    expect(patches[1]?.contentType).toBe('application/merge-patch+json');
    expect(patches[1]?.body).toMatchObject({ metadata: { finalizers: [FINALIZER] } });
  });

  it('reuses connections: many requests, few TCP connections', async () => {
    const server = await startKubeServer();
    // Count TCP connections with a loopback relay in front of the server.
    let connections = 0;
    const sockets = new Set<Socket>();
    const relay: Server = createServer((client) => {
      connections++;
      const upstream = connect(server.port, '127.0.0.1');
      sockets.add(client).add(upstream);
      client.pipe(upstream).pipe(client);
      const close = () => {
        client.destroy();
        upstream.destroy();
      };
      client.on('error', close).on('close', close);
      upstream.on('error', close).on('close', close);
    });
    await new Promise<void>((r) => relay.listen(0, '127.0.0.1', () => r()));
    const port = (relay.address() as { port: number }).port;
    const kc = server.kubeConfig();
    const cluster = kc.getCurrentCluster()!;
    kc.loadFromOptions({
      clusters: [{ ...cluster, server: `http://127.0.0.1:${port}` }],
      users: kc.users,
      contexts: kc.contexts,
      currentContext: kc.currentContext,
    });
    const clients = await createKubeClients(kc);
    try {
      for (let i = 0; i < 20; i++) {
        await clients.customObjects.createNamespacedCustomObject({
          group: 'crawl.example.com',
          version: 'v1alpha1',
          plural: 'proxies',
          namespace: 'ns',
          body: proxyFixture('ns', `p${i}`),
        });
      }
      await Promise.all(
        Array.from({ length: 10 }, (_, i) =>
          clients.customObjects.getNamespacedCustomObject({
            group: 'crawl.example.com',
            version: 'v1alpha1',
            plural: 'proxies',
            namespace: 'ns',
            name: `p${i}`,
          }),
        ),
      );
      expect(connections).toBeLessThanOrEqual(11); // 30 requests; without the shared agent: 30
    } finally {
      await clients.close();
      for (const s of sockets) s.destroy();
      relay.close();
      await server.stop();
    }
  });

  it('restricts the Proxy and Secret caches to --proxy-namespace', async () => {
    const server = await startKubeServer({ bookmarkIntervalMs: 100 });
    seed(server, 'mine', 'a');
    seed(server, 'theirs', 'b');
    const { store } = await setup({ server, namespace: 'mine' });
    seed(server, 'theirs', 'c');
    seed(server, 'mine', 'd');
    await vi.waitFor(() => expect(names(store)).toEqual(['mine/a', 'mine/d']), WAIT);
    expect(server.requests.some((r) => r.path === '/apis/crawl.example.com/v1alpha1/proxies')).toBe(false);
    expect(
      server.requests.some((r) => r.path === '/api/v1/namespaces/mine/secrets' && r.query.labelSelector),
    ).toBe(true);
  });

  it('never lists or watches ProviderHealths on its own; keeps what this process read and wrote', async () => {
    const server = await startKubeServer({ bookmarkIntervalMs: 100 });
    server.resource('providerhealths').create({
      apiVersion: 'crawl.example.com/v1alpha1',
      kind: 'ProviderHealth',
      metadata: { name: 'elsewhere' },
    } as never);
    const { store } = await setup({ server });
    await store.providerHealths.synced();
    await store.secrets.synced();
    expect(store.providerHealths.list()).toEqual([]);
    const ph = await store.providerHealths.create({
      apiVersion: 'crawl.example.com/v1alpha1',
      kind: 'ProviderHealth',
      metadata: { name: 'kvm-a' },
    });
    await store.providerHealths.patchStatus({ name: ph.metadata.name }, { targetsReady: '1/1' });
    await store.providerHealths.read({ name: 'elsewhere' });
    expect(store.providerHealths.list().map((o) => [o.metadata.name, o.status?.targetsReady])).toEqual([
      ['elsewhere', undefined],
      ['kvm-a', '1/1'],
    ]);
    const collection = server.requests.filter((r) => r.path.endsWith('/providerhealths'));
    expect(collection.filter((r) => r.method === 'GET')).toEqual([]);
  });

  it('turns API errors into StoreErrors naming the object', async () => {
    const { store } = await setup();
    const err = await store.proxies.read({ namespace: 'ns', name: 'nope' }).catch((e) => e);
    expect(err.name).toBe('StoreError');
    expect(err.reason).toBe('NotFound');
    expect(err.message).toContain('ns/nope');
  });
});

describe('kube store under the manager', () => {
  it('readyz turns ready only once the Kubernetes caches have synced', async () => {
    const server = await startKubeServer({ bookmarkIntervalMs: 100 });
    seed(server, 'ns', 'a');
    // Hold the first proxies list back so the not-yet-synced state is observable.
    server.injectFault({ path: /\/proxies$/, watch: false, method: 'GET', delayMs: 400 });
    const store = await createKubeStore({ kubeConfig: server.kubeConfig(), reflector: fastReflector });
    const m = new Manager({ store, healthProbeBindAddress: '127.0.0.1:0', gracePeriodMs: 500 });
    const run = m.start();
    try {
      await vi.waitFor(() => expect(m.healthAddress()).toBeDefined(), WAIT);
      const url = `http://127.0.0.1:${m.healthAddress()!.port}/readyz`;
      expect((await fetch(url)).status).toBe(500);
      await m.whenStarted();
      expect((await fetch(url)).status).toBe(200);
      expect(store.proxies.get({ namespace: 'ns', name: 'a' })).toBeDefined();
    } finally {
      await m.stop();
      await run;
      await server.stop();
    }
  });
});

describe('cache → handler → queue → workers', () => {
  it('a change on the server reaches a worker, which sees at least that version in the cache', async () => {
    const { server, store } = await setup();
    const q = new WorkQueue({ name: 'proxies' });
    store.proxies.watch((e) => q.add(keyOf(e.object)));
    const seen: string[] = [];
    const ac = new AbortController();
    const workers = q.runWorkers({
      concurrency: 2,
      signal: ac.signal,
      process: async (key) => {
        const p = store.proxies.get(parseKey(key));
        seen.push(`${key}:${p?.metadata.labels?.v ?? 'gone'}`);
      },
    });
    seed(server, 'ns', 'a', { v: '1' });
    await vi.waitFor(() => expect(seen).toContain('ns/a:1'), WAIT);
    const col = server.resource('proxies');
    const cur = col.read('ns', 'a');
    col.update({ ...cur, metadata: { ...cur.metadata, labels: { v: '2' } } });
    await vi.waitFor(() => expect(seen.at(-1)).toBe('ns/a:2'), WAIT);
    col.delete('ns', 'a');
    await vi.waitFor(() => expect(seen.at(-1)).toBe('ns/a:gone'), WAIT);
    ac.abort();
    await workers;
  });
});
