/**
 * The Kubernetes test server, exercised through the real @kubernetes/client-node 2.0.1 over
 * HTTP: if these pass, code written against client-node sees apiserver-like behaviour.
 */
import {
  ApiException,
  CoordinationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  makeInformer,
  PatchStrategy,
  setHeaderOptions,
  V1MicroTime,
  Watch,
} from '@kubernetes/client-node';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { type KubeServer, startKubeServer } from '../../support/kube-server/index.ts';
import { proxyFixture } from '../../support/store-contract.ts';

/** How long a cache or watch may take to catch up on loopback. */
const WAIT = { timeout: 5000, interval: 10 };

const G = { group: 'crawl.example.com', version: 'v1alpha1', plural: 'proxies' };

interface Obj {
  metadata: {
    name: string;
    resourceVersion: string;
    uid: string;
    generation?: number;
    deletionTimestamp?: string;
    finalizers?: string[];
  };
  spec?: Record<string, unknown>;
  status?: Record<string, unknown>;
}

async function apiError(
  p: Promise<unknown>,
): Promise<{ code: number; reason: string; body: Record<string, unknown> }> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(ApiException);
    const ex = e as ApiException<string>;
    const body = ex.body ? (JSON.parse(ex.body) as Record<string, unknown>) : {};
    return { code: ex.code, reason: String(body.reason ?? ''), body };
  }
  throw new Error('expected an ApiException');
}

describe('kube test server with client-node', () => {
  let server: KubeServer;
  let co: CustomObjectsApi;
  beforeEach(async () => {
    server = await startKubeServer({ bookmarkIntervalMs: 100 });
    co = server.kubeConfig().makeApiClient(CustomObjectsApi);
  });
  afterEach(async () => {
    await server.stop();
  });

  it('CRUD on proxies with status merge patch, 409 on stale RV, generation rules', async () => {
    const created = (await co.createNamespacedCustomObject({
      ...G,
      namespace: 'ns1',
      body: { ...proxyFixture('ns1', 'p1'), status: { phase: 'Ready' } },
    })) as Obj;
    expect(created.metadata.uid).toBeTruthy();
    expect(created.metadata.generation).toBe(1);
    expect(created.status).toBeUndefined();
    const dup = await apiError(
      co.createNamespacedCustomObject({ ...G, namespace: 'ns1', body: proxyFixture('ns1', 'p1') }),
    );
    expect([dup.code, dup.reason]).toEqual([409, 'AlreadyExists']);

    const st = (await co.patchNamespacedCustomObjectStatus(
      { ...G, namespace: 'ns1', name: 'p1', body: { status: { phase: 'Provisioning' } } },
      setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
    )) as Obj;
    expect(st.status).toEqual({ phase: 'Provisioning' });
    expect(st.metadata.generation).toBe(1);
    const last = server.requests.at(-1);
    expect(last?.contentType).toBe('application/merge-patch+json');
    expect(last?.authorization).toBe('Bearer test-token');

    const stalePatch = await apiError(
      co.patchNamespacedCustomObjectStatus(
        {
          ...G,
          namespace: 'ns1',
          name: 'p1',
          body: { metadata: { resourceVersion: created.metadata.resourceVersion }, status: { phase: 'X' } },
        },
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      ),
    );
    expect([stalePatch.code, stalePatch.reason]).toEqual([409, 'Conflict']);

    const replaced = (await co.replaceNamespacedCustomObject({
      ...G,
      namespace: 'ns1',
      name: 'p1',
      body: {
        ...st,
        spec: { type: 'External', endpoint: { host: 'h', port: 2 } },
        status: { phase: 'Ignored' },
      },
    })) as Obj;
    expect(replaced.metadata.generation).toBe(2);
    expect(replaced.status).toEqual({ phase: 'Provisioning' });
    const stale = await apiError(
      co.replaceNamespacedCustomObject({ ...G, namespace: 'ns1', name: 'p1', body: st }),
    );
    expect([stale.code, stale.reason]).toEqual([409, 'Conflict']);
    expect(stale.body.details).toMatchObject({ name: 'p1', group: 'crawl.example.com', kind: 'proxies' });

    const got = (await co.getNamespacedCustomObject({ ...G, namespace: 'ns1', name: 'p1' })) as Obj;
    expect(got.metadata.resourceVersion).toBe(replaced.metadata.resourceVersion);
    const missing = await apiError(co.getNamespacedCustomObject({ ...G, namespace: 'ns1', name: 'nope' }));
    expect([missing.code, missing.reason]).toEqual([404, 'NotFound']);

    await co.deleteNamespacedCustomObject({ ...G, namespace: 'ns1', name: 'p1' });
    expect((await apiError(co.getNamespacedCustomObject({ ...G, namespace: 'ns1', name: 'p1' }))).code).toBe(
      404,
    );
  });

  it('JSON patch with test op, strategic merge 415, default json-patch content type with an object 400', async () => {
    const p = (await co.createNamespacedCustomObject({
      ...G,
      namespace: 'ns1',
      body: proxyFixture('ns1', 'p1'),
    })) as Obj;
    const withF = (await co.patchNamespacedCustomObject(
      {
        ...G,
        namespace: 'ns1',
        name: 'p1',
        body: [
          { op: 'test', path: '/metadata/resourceVersion', value: p.metadata.resourceVersion },
          { op: 'add', path: '/metadata/finalizers', value: ['crawl.example.com/instance-cleanup'] },
        ],
      },
      setHeaderOptions('Content-Type', PatchStrategy.JsonPatch),
    )) as Obj;
    expect(withF.metadata.finalizers).toEqual(['crawl.example.com/instance-cleanup']);
    const failed = await apiError(
      co.patchNamespacedCustomObject(
        {
          ...G,
          namespace: 'ns1',
          name: 'p1',
          body: [{ op: 'test', path: '/metadata/resourceVersion', value: p.metadata.resourceVersion }],
        },
        setHeaderOptions('Content-Type', PatchStrategy.JsonPatch),
      ),
    );
    expect([failed.code, failed.reason]).toEqual([422, 'Invalid']);
    const smp = await apiError(
      co.patchNamespacedCustomObject(
        { ...G, namespace: 'ns1', name: 'p1', body: { metadata: { labels: { a: 'b' } } } },
        setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch),
      ),
    );
    expect(smp.code).toBe(415);
    const noHeader = await apiError(
      co.patchNamespacedCustomObject({
        ...G,
        namespace: 'ns1',
        name: 'p1',
        body: { metadata: { labels: { a: 'b' } } },
      }),
    );
    expect(noHeader.code).toBe(400);
    const noManager = await apiError(
      co.patchNamespacedCustomObject(
        { ...G, namespace: 'ns1', name: 'p1', body: { metadata: { labels: { a: 'b' } } } },
        setHeaderOptions('Content-Type', PatchStrategy.ServerSideApply),
      ),
    );
    expect(noManager.code).toBe(422);
    const applied = (await co.patchNamespacedCustomObject(
      {
        ...G,
        namespace: 'ns1',
        name: 'p1',
        fieldManager: 'test',
        body: { metadata: { labels: { a: 'b' } } },
      },
      setHeaderOptions('Content-Type', PatchStrategy.ServerSideApply),
    )) as Obj & { metadata: { labels?: Record<string, string> } };
    expect(applied.metadata.labels).toEqual({ a: 'b' });

    // Deleting with a finalizer marks; removing it completes the delete.
    const marked = (await co.deleteNamespacedCustomObject({ ...G, namespace: 'ns1', name: 'p1' })) as Obj;
    expect(marked.metadata.deletionTimestamp).toBeTruthy();
    await co.patchNamespacedCustomObject(
      { ...G, namespace: 'ns1', name: 'p1', body: { metadata: { finalizers: null } } },
      setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
    );
    expect((await apiError(co.getNamespacedCustomObject({ ...G, namespace: 'ns1', name: 'p1' }))).code).toBe(
      404,
    );
  });

  it('lists with selectors and pages with limit/continue', async () => {
    for (const [ns, name, pool] of [
      ['a', 'p1', 'eu'],
      ['a', 'p2', 'us'],
      ['b', 'p3', 'eu'],
      ['b', 'p4', 'eu'],
    ]) {
      await co.createNamespacedCustomObject({
        ...G,
        namespace: ns as string,
        body: proxyFixture(ns as string, name as string, { pool: pool as string }),
      });
    }
    const names = (l: unknown) => (l as { items: Obj[] }).items.map((o) => o.metadata.name);
    expect(names(await co.listNamespacedCustomObject({ ...G, namespace: 'a' }))).toEqual(['p1', 'p2']);
    expect(names(await co.listClusterCustomObject({ ...G, labelSelector: 'pool=eu' }))).toEqual([
      'p1',
      'p3',
      'p4',
    ]);
    expect(
      names(
        await co.listClusterCustomObject({ ...G, fieldSelector: 'metadata.namespace=b,metadata.name!=p3' }),
      ),
    ).toEqual(['p4']);
    const page1 = (await co.listClusterCustomObject({ ...G, limit: 3 })) as {
      items: Obj[];
      metadata: { continue?: string; remainingItemCount?: number; resourceVersion: string };
    };
    expect(names(page1)).toEqual(['p1', 'p2', 'p3']);
    expect(page1.metadata.remainingItemCount).toBe(1);
    const page2 = (await co.listClusterCustomObject({
      ...G,
      limit: 3,
      _continue: page1.metadata.continue,
    })) as { items: Obj[]; metadata: { continue?: string } };
    expect(names(page2)).toEqual(['p4']);
    expect(page2.metadata.continue).toBeUndefined();
    const bad = await apiError(co.listClusterCustomObject({ ...G, labelSelector: 'pool in (' }));
    expect(bad.code).toBe(400);
  });

  it('watch streams from a resourceVersion, sends bookmarks, and answers 410 after compaction', async () => {
    const a = (await co.createNamespacedCustomObject({
      ...G,
      namespace: 'ns1',
      body: proxyFixture('ns1', 'a'),
    })) as Obj;
    await co.createNamespacedCustomObject({ ...G, namespace: 'ns1', body: proxyFixture('ns1', 'b') });
    const events: string[] = [];
    let ended = false;
    const w = new Watch(server.kubeConfig());
    const ctl = await w.watch(
      '/apis/crawl.example.com/v1alpha1/namespaces/ns1/proxies',
      { resourceVersion: a.metadata.resourceVersion, allowWatchBookmarks: true },
      (type, obj: Obj) => events.push(type === 'BOOKMARK' ? type : `${type}:${obj.metadata.name}`),
      () => {
        ended = true;
      },
    );
    await vi.waitFor(() => expect(events.filter((e) => e !== 'BOOKMARK')).toEqual(['ADDED:b']), WAIT);
    await co.deleteNamespacedCustomObject({ ...G, namespace: 'ns1', name: 'a' });
    await vi.waitFor(
      () => expect(events.filter((e) => e !== 'BOOKMARK')).toEqual(['ADDED:b', 'DELETED:a']),
      WAIT,
    );
    await vi.waitFor(() => expect(events).toContain('BOOKMARK'), WAIT);
    server.closeWatches();
    await vi.waitFor(() => expect(ended).toBe(true), WAIT);
    ctl.abort();

    server.compact();
    const errors: Array<{ type: string; obj: { code?: number; reason?: string } }> = [];
    let done = false;
    await w.watch(
      '/apis/crawl.example.com/v1alpha1/namespaces/ns1/proxies',
      { resourceVersion: a.metadata.resourceVersion },
      (type, obj) => errors.push({ type, obj }),
      () => {
        done = true;
      },
    );
    await vi.waitFor(() => expect(done).toBe(true), WAIT);
    expect(errors).toEqual([
      { type: 'ERROR', obj: expect.objectContaining({ code: 410, reason: 'Expired' }) },
    ]);
  });

  it('leases require MicroTime and use optimistic concurrency', async () => {
    const co1 = server.kubeConfig().makeApiClient(CoordinationV1Api);
    const bad = await apiError(
      co1.createNamespacedLease({
        namespace: 'kube-system',
        body: {
          metadata: { name: 'leader' },
          spec: { holderIdentity: 'a', renewTime: new Date() as V1MicroTime },
        },
      }),
    );
    expect(bad.code).toBe(400);
    const lease = await co1.createNamespacedLease({
      namespace: 'kube-system',
      body: {
        metadata: { name: 'leader' },
        spec: { holderIdentity: 'a', leaseDurationSeconds: 15, renewTime: new V1MicroTime() },
      },
    });
    expect(lease.spec?.holderIdentity).toBe('a');
    const renewed = await co1.replaceNamespacedLease({
      namespace: 'kube-system',
      name: 'leader',
      body: { ...lease, spec: { ...lease.spec, renewTime: new V1MicroTime() } },
    });
    expect(Number(renewed.metadata?.resourceVersion)).toBeGreaterThan(
      Number(lease.metadata?.resourceVersion),
    );
    const lost = await apiError(
      co1.replaceNamespacedLease({
        namespace: 'kube-system',
        name: 'leader',
        body: { ...lease, spec: { ...lease.spec, holderIdentity: 'b' } },
      }),
    );
    expect(lost.code).toBe(409);
    expect(
      (await co1.readNamespacedLease({ namespace: 'kube-system', name: 'leader' })).spec?.holderIdentity,
    ).toBe('a');
  });

  it('secrets CRUD, cluster-wide list, auth, faults and discovery', async () => {
    const core = server.kubeConfig().makeApiClient(CoreV1Api);
    await core.createNamespacedSecret({
      namespace: 'ns1',
      body: {
        metadata: { name: 's1', labels: { 'crawl.example.com/cloud-init': 'true' } },
        stringData: { 'user-data': '#cloud-config' },
      },
    });
    const s = await core.readNamespacedSecret({ namespace: 'ns1', name: 's1' });
    expect(Buffer.from(s.data?.['user-data'] ?? '', 'base64').toString()).toBe('#cloud-config');
    await core.createNamespacedSecret({
      namespace: 'ns2',
      body: { metadata: { name: 's2' }, data: { k: 'dg==' } },
    });
    const all = await core.listSecretForAllNamespaces({ labelSelector: 'crawl.example.com/cloud-init=true' });
    expect(all.items.map((x) => x.metadata?.name)).toEqual(['s1']);
    await core.deleteNamespacedSecret({ namespace: 'ns2', name: 's2' });
    expect((await apiError(core.readNamespacedSecret({ namespace: 'ns2', name: 's2' }))).code).toBe(404);

    const wrong = server.kubeConfig({ token: 'wrong' }).makeApiClient(CoreV1Api);
    expect((await apiError(wrong.readNamespacedSecret({ namespace: 'ns1', name: 's1' }))).code).toBe(401);

    const f = server.injectFault({ method: 'GET', path: /\/secrets\/s1$/, status: 503, times: 2 });
    expect((await apiError(core.readNamespacedSecret({ namespace: 'ns1', name: 's1' }))).code).toBe(503);
    expect((await apiError(core.readNamespacedSecret({ namespace: 'ns1', name: 's1' }))).code).toBe(503);
    expect((await core.readNamespacedSecret({ namespace: 'ns1', name: 's1' })).metadata?.name).toBe('s1');
    expect(f.hits).toBe(2);
    server.injectFault({ path: /\/secrets\/s1$/, status: 'reset' });
    await expect(core.readNamespacedSecret({ namespace: 'ns1', name: 's1' })).rejects.toThrow();

    const res = await fetch(`${server.url}/apis/crawl.example.com/v1alpha1`, {
      headers: { authorization: 'Bearer test-token' },
    });
    expect(res.headers.get('content-type')).toBe('application/json');
    const doc = (await res.json()) as { resources: Array<{ name: string; namespaced: boolean }> };
    expect(doc.resources.map((r) => `${r.name}:${r.namespaced}`)).toEqual([
      'proxies:true',
      'proxies/status:true',
      'proxypools:true',
      'proxypools/status:true',
      'proxypools/scale:true',
      'providerhealths:false',
      'providerhealths/status:false',
    ]);
  });

  it('cluster-scoped providerhealths with status subresource', async () => {
    const ph = { group: 'crawl.example.com', version: 'v1alpha1', plural: 'providerhealths' };
    await co.createClusterCustomObject({
      ...ph,
      body: { apiVersion: 'crawl.example.com/v1alpha1', kind: 'ProviderHealth', metadata: { name: 'gcp' } },
    });
    const st = (await co.patchClusterCustomObjectStatus(
      { ...ph, name: 'gcp', body: { status: { targetsReady: '1/1' } } },
      setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
    )) as Obj & { metadata: { namespace?: string } };
    expect(st.status).toEqual({ targetsReady: '1/1' });
    expect(st.metadata.namespace).toBeUndefined();
    expect(server.resource('providerhealths').read(undefined, 'gcp').status).toEqual({ targetsReady: '1/1' });
  });

  it("client-node's informer lists, watches, survives watch closes and relists after 410", async () => {
    const path = '/apis/crawl.example.com/v1alpha1/namespaces/ns1/proxies';
    const informer = makeInformer(server.kubeConfig(), path, () =>
      co.listNamespacedCustomObject({ ...G, namespace: 'ns1' }),
    );
    const seen: string[] = [];
    informer.on('add', (o) => seen.push(`add:${o.metadata?.name}`));
    informer.on('update', (o) => seen.push(`update:${o.metadata?.name}`));
    informer.on('delete', (o) => seen.push(`delete:${o.metadata?.name}`));
    await co.createNamespacedCustomObject({ ...G, namespace: 'ns1', body: proxyFixture('ns1', 'a') });
    await informer.start();
    try {
      await vi.waitFor(() => expect(seen).toEqual(['add:a']), WAIT);
      await co.createNamespacedCustomObject({ ...G, namespace: 'ns1', body: proxyFixture('ns1', 'b') });
      await vi.waitFor(() => expect(seen).toEqual(['add:a', 'add:b']), WAIT);
      await vi.waitFor(() => expect(server.openWatches()).toBe(1), WAIT);

      // An apiserver restart: the stream ends, the informer re-watches from its resourceVersion.
      server.closeWatches();
      await vi.waitFor(() => expect(server.openWatches()).toBe(1), WAIT);
      await co.patchNamespacedCustomObjectStatus(
        { ...G, namespace: 'ns1', name: 'a', body: { status: { phase: 'Ready' } } },
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      );
      await vi.waitFor(() => expect(seen).toEqual(['add:a', 'add:b', 'update:a']), WAIT);

      // Missed events plus compaction: the re-watch gets 410 and the informer relists.
      // (The re-watch is held back so the delete and compaction happen in between.)
      const held = server.injectFault({ watch: true, delayMs: 500 });
      server.closeWatches();
      await co.deleteNamespacedCustomObject({ ...G, namespace: 'ns1', name: 'b' });
      server.compact();
      await vi.waitFor(() => expect(held.hits).toBe(1), WAIT);
      await vi.waitFor(() => expect(seen).toContain('delete:b'), { timeout: 10_000, interval: 10 });
      expect(informer.list('ns1').map((o) => o.metadata?.name)).toEqual(['a']);
      const lists = server.requests.filter((r) => r.method === 'GET' && r.path === path && !r.watch);
      expect(lists.length).toBeGreaterThanOrEqual(2); // the relist after 410
    } finally {
      await informer.stop();
    }
  });
});
