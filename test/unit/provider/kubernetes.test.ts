import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { classify } from '../../../src/provider/errors.ts';
import { createKubernetesProvider, type KubernetesProvider } from '../../../src/provider/kubernetes/index.ts';
import { createKubeClients, type KubeClients } from '../../../src/runtime/kube/client.ts';
import { type KubeServer, startKubeServer } from '../../support/kube-server/index.ts';
import { captureLog } from '../../support/log.ts';
import { callContext, createRequest, TEST_CREDENTIALS } from '../../support/provider-calls.ts';

const creds = TEST_CREDENTIALS;
const ctx = callContext;
const req = createRequest;

const errorOf = async (p: Promise<unknown>): Promise<Error> => {
  try {
    await p;
  } catch (e) {
    return e as Error;
  }
  throw new Error('expected a rejection');
};

describe('kubernetes provider against a Kubernetes REST server', () => {
  let server: KubeServer;
  let clients: KubeClients;
  let provider: KubernetesProvider;
  const captured = captureLog('debug');

  beforeAll(async () => {
    server = await startKubeServer();
    clients = await createKubeClients(server.kubeConfig());
    provider = createKubernetesProvider({
      name: 'k8s',
      config: { namespace: 'proxies', resourceProfiles: { small: { cpu: '100m', memory: '128Mi' } } },
      core: clients.core,
      apiHost: server.url,
      listPageSize: 2,
      log: captured.log,
    });
  });
  afterEach(() => server.clearFaults());
  afterAll(async () => {
    await clients?.close();
    await server?.stop();
    expect(captured.raw.join('')).not.toContain(creds.password);
  });

  const pods = () => server.resource('pods');
  const secrets = () => server.resource('secrets');
  /** What the kubelet would do: the Pod runs, becomes Ready and gets an IP. */
  const markReady = (name: string, ip: string) =>
    pods().patch(
      'merge',
      {
        status: {
          phase: 'Running',
          podIP: ip,
          conditions: [{ type: 'Ready', status: 'True' }],
        },
      },
      { namespace: 'proxies', name, subresource: 'status' },
    );

  it('creates a labelled Squid Pod plus its Secret, and reports it Pending until Ready', async () => {
    const inst = await provider.create(ctx(), req('px-create', { machineType: 'small' }));
    expect(inst).toMatchObject({
      id: 'namespaces/proxies/pods/px-create',
      name: 'px-create',
      state: 'Pending',
      port: 3128,
      uid: 'uid-px-create',
      namespace: 'crawl',
    });
    expect(inst.createdAt).toBeInstanceOf(Date);
    const pod = pods().read('proxies', 'px-create') as unknown as {
      metadata: { uid: string; labels: Record<string, string> };
      spec: { containers: { resources: unknown; readinessProbe: unknown }[] };
    };
    expect(pod.metadata.labels['proxy-operator-managed']).toBe('true');
    expect(pod.spec.containers[0]?.resources).toEqual({
      requests: { cpu: '100m', memory: '128Mi' },
      limits: { memory: '128Mi' },
    });
    const secret = secrets().read('proxies', 'px-create') as unknown as {
      metadata: { ownerReferences: { uid: string; kind: string }[] };
      data: Record<string, string>;
    };
    expect(secret.metadata.ownerReferences[0]).toMatchObject({ kind: 'Pod', uid: pod.metadata.uid });
    expect(Object.keys(secret.data).sort()).toEqual(['htpasswd', 'squid.conf']);
    // Only the hash is stored, and nothing the client sent over the wire held the password.
    expect(JSON.stringify(secret)).not.toContain(creds.password);
    expect(JSON.stringify(server.requests)).not.toContain(creds.password);

    expect((await provider.get(ctx(), inst.id)).state).toBe('Pending');
    markReady('px-create', '10.0.0.7');
    expect(await provider.get(ctx(), inst.id)).toMatchObject({
      state: 'Running',
      address: '10.0.0.7',
      port: 3128,
    });
  });

  it('create is idempotent and repairs a missing Secret after an interrupted create', async () => {
    const first = await provider.create(ctx(), req('px-idem'));
    const again = await provider.create(ctx(), req('px-idem'));
    expect(again.id).toBe(first.id);
    expect(
      pods()
        .list()
        .items.filter((p) => p.metadata.name === 'px-idem'),
    ).toHaveLength(1);
    // A crash between the Pod and the Secret: the retry finds the Pod and adds the Secret.
    await provider.delete(ctx(), first.id);
    pods().create({
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: {
        name: 'px-idem',
        namespace: 'proxies',
        labels: { 'proxy-operator-managed': 'true', 'proxy-operator-uid': 'uid-px-idem' },
      },
      spec: { containers: [{ name: 'squid', image: 'x' }] },
    } as never);
    expect(secrets().get('proxies', 'px-idem')).toBeUndefined();
    const resumed = await provider.create(ctx(), req('px-idem'));
    expect(resumed.id).toBe(first.id);
    expect(secrets().get('proxies', 'px-idem')).toBeDefined();
  });

  it('refuses to adopt a Pod of the same name that belongs to another Proxy', async () => {
    pods().create({
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: {
        name: 'px-foreign',
        namespace: 'proxies',
        labels: { 'proxy-operator-uid': 'someone-else' },
      },
      spec: { containers: [{ name: 'c', image: 'x' }] },
    } as never);
    const err = await errorOf(provider.create(ctx(), req('px-foreign')));
    expect(classify(err)).toBe('Permanent');
  });

  it('delete removes the Pod and the Secret, is idempotent, and get then answers NotFound', async () => {
    const inst = await provider.create(ctx(), req('px-del'));
    await provider.delete(ctx(), inst.id);
    expect(pods().get('proxies', 'px-del')).toBeUndefined();
    expect(secrets().get('proxies', 'px-del')).toBeUndefined();
    await provider.delete(ctx(), inst.id);
    expect(classify(await errorOf(provider.get(ctx(), inst.id)))).toBe('NotFound');
    expect(classify(await errorOf(provider.get(ctx(), 'namespaces/proxies/px-del')))).toBe('Permanent');
  });

  it('listByTag pages through managed Pods in every namespace and reads identity back', async () => {
    const other = createKubernetesProvider({
      name: 'k8s-other',
      config: { namespace: 'elsewhere' },
      core: clients.core,
    });
    await other.create(ctx(), req('px-list-b', { namespace: 'team-b', uid: 'uid-b' }));
    await provider.create(ctx(), req('px-list-a'));
    pods().create({
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { name: 'unrelated', namespace: 'proxies', labels: { app: 'web' } },
      spec: { containers: [{ name: 'c', image: 'x' }] },
    } as never);
    const all = await provider.listByTag(ctx());
    const byName = new Map(all.map((i) => [i.name, i]));
    expect(byName.has('unrelated')).toBe(false);
    expect(byName.get('px-list-b')).toMatchObject({
      id: 'namespaces/elsewhere/pods/px-list-b',
      uid: 'uid-b',
      namespace: 'team-b',
    });
    expect(byName.get('px-list-a')?.createdAt).toBeInstanceOf(Date);
    // Page size 2 with more managed Pods than that: the continue token was followed.
    expect(all.length).toBeGreaterThan(2);
    const lists = server.requests.filter((r) => r.method === 'GET' && r.path === '/api/v1/pods');
    expect(lists.some((r) => r.query.continue)).toBe(true);
    expect(lists.every((r) => r.query.labelSelector === 'proxy-operator-managed=true')).toBe(true);
  });

  it('labels a Pod with its installation, and adopts an unlabelled one with a merge patch', async () => {
    await provider.create(ctx(), req('px-inst-new', { installation: 'installation-a' }));
    const legacy = await provider.create(ctx(), req('px-inst-old'));
    expect(pods().get('proxies', 'px-inst-new')?.metadata.labels?.['proxy-operator-installation']).toBe(
      'installation-a',
    );
    let listed = await provider.listByTag(ctx());
    expect(listed.find((i) => i.name === 'px-inst-new')?.installation).toBe('installation-a');
    expect(listed.find((i) => i.name === 'px-inst-old')?.installation).toBeUndefined();

    await provider.adopt(ctx(), legacy.id, 'installation-a');
    listed = await provider.listByTag(ctx());
    expect(listed.find((i) => i.name === 'px-inst-old')).toMatchObject({
      installation: 'installation-a',
      uid: 'uid-px-inst-old',
    });
    expect(classify(await errorOf(provider.adopt(ctx(), 'namespaces/proxies/pods/px-gone', 'x')))).toBe(
      'NotFound',
    );
    for (const name of ['px-inst-new', 'px-inst-old']) {
      await provider.delete(ctx(), `namespaces/proxies/pods/${name}`);
    }
  });

  it('maps API errors to classes', async () => {
    server.injectFault({
      method: 'POST',
      path: /\/pods$/,
      status: 403,
      message:
        'pods "px-q" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=10, limited: pods=10',
    });
    const quota = await errorOf(provider.create(ctx(), req('px-q')));
    expect(classify(quota)).toBe('QuotaExceeded');
    expect(quota.message).toContain('exceeded quota');

    server.injectFault({
      method: 'POST',
      path: /\/pods$/,
      status: 403,
      message: 'pods is forbidden: User cannot create',
    });
    expect(classify(await errorOf(provider.create(ctx(), req('px-q'))))).toBe('Permanent');
    server.injectFault({ method: 'POST', path: /\/pods$/, status: 422, message: 'Pod "px-q" is invalid' });
    expect(classify(await errorOf(provider.create(ctx(), req('px-q'))))).toBe('Permanent');
    for (const status of [429, 500, 503] as const) {
      server.injectFault({ method: 'GET', path: /\/pods\/px-create$/, status });
      expect(classify(await errorOf(provider.get(ctx(), 'namespaces/proxies/pods/px-create')))).toBe(
        'Transient',
      );
    }
    server.injectFault({ method: 'GET', path: /\/pods\/px-create$/, status: 'reset' });
    expect(classify(await errorOf(provider.get(ctx(), 'namespaces/proxies/pods/px-create')))).toBe(
      'Transient',
    );
    server.injectFault({
      method: 'DELETE',
      path: /\/secrets\/px-create$/,
      status: 500,
      message: 'etcd down',
    });
    const secretErr = await errorOf(provider.delete(ctx(), 'namespaces/proxies/pods/px-create'));
    expect(classify(secretErr)).toBe('Transient');
    // The Pod is gone already; a retry finishes the job.
    await provider.delete(ctx(), 'namespaces/proxies/pods/px-create');
    expect(secrets().get('proxies', 'px-create')).toBeUndefined();
  });

  it('stops promptly when the call is aborted', async () => {
    server.injectFault({ method: 'POST', path: /\/pods$/, delayMs: 5000 });
    const ac = new AbortController();
    const started = Date.now();
    setTimeout(() => ac.abort(), 50);
    const err = await errorOf(provider.create(ctx(ac.signal), req('px-slow')));
    expect(Date.now() - started).toBeLessThan(2000);
    expect(classify(err)).toBe('Transient');
  });

  describe('check', () => {
    it('lists at most one managed Pod cluster-wide and reports Reachable', async () => {
      const before = server.requests.length;
      const [t] = await provider.check(ctx());
      expect(t).toMatchObject({ name: 'apiserver', address: server.url, ready: true, reason: 'Reachable' });
      expect(t?.latencyMillis).toBeGreaterThanOrEqual(0);
      const calls = server.requests.slice(before);
      expect(calls).toHaveLength(1);
      expect(calls[0]).toMatchObject({
        method: 'GET',
        path: '/api/v1/pods',
        query: { labelSelector: 'proxy-operator-managed=true', limit: '1' },
      });
    });

    it('names the failure: Unauthorized, Forbidden, APIError, Unreachable, Timeout (also a 500 ServerTimeout)', async () => {
      const badClients = await createKubeClients(server.kubeConfig({ token: 'wrong' }));
      try {
        const unauth = createKubernetesProvider({ name: 'k', core: badClients.core });
        expect((await unauth.check(ctx()))[0]).toMatchObject({ ready: false, reason: 'Unauthorized' });
      } finally {
        await badClients.close();
      }
      server.injectFault({ path: /^\/api\/v1\/pods$/, status: 403, message: 'pods is forbidden' });
      expect((await provider.check(ctx()))[0]).toMatchObject({ ready: false, reason: 'Forbidden' });
      server.injectFault({ path: /^\/api\/v1\/pods$/, status: 500, message: 'etcd down' });
      const [apiErr] = await provider.check(ctx());
      expect(apiErr).toMatchObject({ ready: false, reason: 'APIError' });
      expect(apiErr?.message).toContain('etcd down');
      server.injectFault({
        path: /^\/api\/v1\/pods$/,
        status: 500,
        reason: 'ServerTimeout',
        message: 'the server cannot complete the requested operation at this time, try again later',
      });
      const [serverTimeout] = await provider.check(ctx());
      expect(serverTimeout).toMatchObject({ ready: false, reason: 'Timeout' });
      expect(serverTimeout?.message).toContain('HTTP 500 ServerTimeout');

      server.injectFault({ path: /^\/api\/v1\/pods$/, delayMs: 5000 });
      const started = Date.now();
      const [slow] = await provider.check(ctx(AbortSignal.timeout(100)));
      expect(slow).toMatchObject({ ready: false, reason: 'Timeout' });
      expect(Date.now() - started).toBeLessThan(2000);

      const deadServer = await startKubeServer();
      const kc = deadServer.kubeConfig();
      await deadServer.stop();
      const dead = await createKubeClients(kc);
      try {
        const p = createKubernetesProvider({ name: 'k', core: dead.core });
        expect((await p.check(ctx()))[0]).toMatchObject({ ready: false, reason: 'Unreachable' });
      } finally {
        await dead.close();
      }
    });
  });
});
