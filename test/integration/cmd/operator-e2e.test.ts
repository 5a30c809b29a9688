/**
 * Cluster mode end to end: the real CLI (`main.ts operator`) as a child process against the
 * stateful Kubernetes REST test server, driven only through the API and the discovery API, as a
 * user would: the Proxy lifecycle (finalizer, Ready, Healthy, credentials Secret, ProviderHealth,
 * a lease that tunnels, deletion, the leader Lease), reconciliation across watch cuts and 410
 * Gone, and --proxy-namespace. Hand-over between replicas: operator-ha.test.ts; the kubernetes
 * provider: operator-kubernetes.test.ts. OPERATOR_E2E_MAIN=<dir>/dist/cmd/main.js runs them
 * against a compiled build.
 */
import { describe, expect, it } from 'vitest';
import { FINALIZER, LABEL_CREDENTIALS_FOR } from '../../../src/api/constants.ts';
import type { StoredObject } from '../../../src/runtime/objects/types.ts';
import {
  canBind,
  condition,
  createProxy,
  deleteProxy,
  freePort,
  getProxy,
  kube,
  leaderLease,
  lease,
  leaseSpec,
  PROXY_NS,
  proxies,
  startOperator,
  statusOf,
  throughProxy,
  until,
  untilReadyAndHealthy,
  useOperatorEnv,
} from '../../support/operator-env.ts';

useOperatorEnv();

describe('operator (cluster mode) end to end', () => {
  it('takes a Proxy from creation to Ready/Healthy, leases it out, and cleans up on delete', async () => {
    const metricsPort = await freePort();
    const op = await startOperator({
      name: 'a',
      leaderElect: true,
      extraArgs: ['--metrics-bind-address', `127.0.0.1:${metricsPort}`],
    });

    const created = await createProxy('e2e-1', op);
    const uid = created.metadata.uid as string;

    await until('the finalizer', () => getProxy('e2e-1')?.metadata.finalizers?.includes(FINALIZER));
    const ready = await untilReadyAndHealthy('e2e-1');
    const st = statusOf(ready);
    expect(st.address).toBe('127.0.0.1');
    expect(st.port).toBeGreaterThan(0);
    expect(st.providerID).toMatch(/^local\//);

    // Metrics come from the same cluster-backed cache and loops.
    await until('proxy_operator_proxies{phase="Ready"} 1', async () => {
      const metrics = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
      return /^proxy_operator_proxies\{phase="Ready"\} 1$/m.test(metrics);
    });

    // Generated credentials: a labelled Secret owned by the Proxy.
    const secret = kube().resource('secrets').get(PROXY_NS, 'e2e-1-auth');
    expect(secret).toBeDefined();
    expect(secret?.metadata.labels?.[LABEL_CREDENTIALS_FOR]).toBe('e2e-1');
    const owners = (secret?.metadata ?? {}) as { ownerReferences?: { uid: string; kind: string }[] };
    expect(owners.ownerReferences).toEqual(
      expect.arrayContaining([expect.objectContaining({ kind: 'Proxy', uid })]),
    );

    // The provider health monitor publishes one object named after the provider.
    const ph = await until('ProviderHealth local', () => {
      const o = kube().resource('providerhealths').get(undefined, 'local');
      return condition(o, 'Ready') ? o : undefined;
    });
    expect(condition(ph, 'Ready')?.status).toBe('True');

    // A lease through the discovery API, used as a crawler would.
    const grant = await lease(op);
    expect(grant.proxy).toMatchObject({
      namespace: PROXY_NS,
      name: 'e2e-1',
      host: '127.0.0.1',
      port: st.port,
    });
    expect(await throughProxy(grant.proxy.url, `${op.discovery}/generate_204`)).toBe(204);
    // The proxy is never open: without the grant's credentials it refuses.
    await expect(
      throughProxy(`http://127.0.0.1:${st.port}`, `${op.discovery}/generate_204`),
    ).rejects.toThrow();

    // --leader-elect: the Lease exists, names this process, and is renewed.
    await until('the leader Lease', () => leaderLease());
    const spec = leaseSpec();
    expect(spec.holderIdentity).toBe(op.identity());
    await until('a renewal of the leader Lease', () => leaseSpec().renewTime !== spec.renewTime, 10_000);

    // Delete: the finalizer is removed only after cleanup, then the object is gone.
    await deleteProxy('e2e-1');
    await until('the Proxy to disappear', () => getProxy('e2e-1') === undefined);
    // The generated credentials go with it (right after the finalizer; ownerReference GC in a
    // real cluster would too).
    await until(
      'the generated Secret to go',
      () => kube().resource('secrets').get(PROXY_NS, 'e2e-1-auth') === undefined,
    );
    // The instance is gone with it: nothing listens on its port any more.
    await until('the proxy port to close', () => canBind(st.port as number));

    const t0 = Date.now();
    expect(await op.stop()).toBe(0);
    expect(Date.now() - t0).toBeLessThan(10_000);
    // A graceful stop hands the Lease back at once.
    expect(leaseSpec().holderIdentity ?? '').toBe('');
  }, 60_000);

  it('keeps reconciling new Proxies across watch cuts and 410 Gone', async () => {
    const op = await startOperator({ name: 'a' });

    const proxyLists = (from: number) =>
      kube()
        .requests.slice(from)
        .filter((r) => !r.watch && r.method === 'GET' && r.path.endsWith('/proxies')).length;
    const atCut = kube().requests.length;
    kube().closeWatches();
    await createProxy('after-cut', op);
    await untilReadyAndHealthy('after-cut');
    // A plain cut resumes the watch from the last resourceVersion: no relist.
    expect(proxyLists(atCut)).toBe(0);

    // Move the global resourceVersion past everything the reflectors saw, drop the history,
    // then cut the watches: resuming is answered 410 and the reflectors must relist.
    kube()
      .resource('secrets')
      .create({
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: 'unrelated', namespace: 'elsewhere' },
      } as StoredObject);
    kube().compact();
    const before = kube().requests.length;
    kube().closeWatches();
    await createProxy('after-410', op);
    await untilReadyAndHealthy('after-410');
    // The resumed watch got an in-stream 410 (Expired), so the Proxy reflector relisted.
    expect(proxyLists(before)).toBeGreaterThan(0);
  }, 60_000);

  it('--proxy-namespace leaves Proxies of other namespaces alone', async () => {
    const op = await startOperator({ name: 'a', extraArgs: ['--proxy-namespace', PROXY_NS] });
    await createProxy('elsewhere', op, 'other');
    await createProxy('mine', op);
    await untilReadyAndHealthy('mine');
    // Proven by the request log rather than by waiting: the operator never listed or watched
    // Proxies outside its namespace, and the test's own create is the only request there.
    const outside = kube()
      .requests.filter(
        (r) =>
          r.path.includes('/namespaces/other/') ||
          (/\/proxies(\/|$)/.test(r.path) && !r.path.includes(`/namespaces/${PROXY_NS}/`)),
      )
      .map((r) => `${r.method} ${r.path}`);
    expect(outside).toEqual(['POST /apis/crawl.example.com/v1alpha1/namespaces/other/proxies']);
    const other = proxies().get('other', 'elsewhere');
    expect(other?.metadata.finalizers ?? []).toEqual([]);
    expect(other?.status).toBeUndefined();
    expect(kube().resource('secrets').get('other', 'elsewhere-auth')).toBeUndefined();
  }, 60_000);
});
