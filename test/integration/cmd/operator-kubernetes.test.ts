/**
 * Cluster mode with the kubernetes provider, through the real CLI: the provider creates the
 * Pod and its Squid-config Secret in the operator's namespace, a kubelet stand-in runs that
 * Pod's Squid for real on loopback with the generated config and htpasswd, and the Proxy goes
 * Ready, Healthy, leased (tunnelling through Squid with the grant's credentials) and deleted.
 */
import { describe, expect, it } from 'vitest';
import {
  condition,
  createProxy,
  deleteProxy,
  freePort,
  getProxy,
  kube,
  lease,
  OPERATOR_NS,
  PROXY_NS,
  playKubelet,
  startOperator,
  statusOf,
  throughProxy,
  until,
  untilReadyAndHealthy,
  useOperatorEnv,
} from '../../support/operator-env.ts';

useOperatorEnv();

describe('operator with the kubernetes provider', () => {
  it('runs a Proxy on the kubernetes provider: Pod + Secret, real Squid, lease, cleanup', async () => {
    const kubelet = playKubelet();
    try {
      // The Pods' Squid probes the operator's discovery API on loopback, which the default egress
      // policy refuses: the provider's egressPolicy opens exactly that address and port.
      const discoveryPort = await freePort();
      const op = await startOperator({
        name: 'a',
        discoveryPort,
        extraProviders: `  - name: in-cluster\n    type: kubernetes\n    kubernetes:\n      egressPolicy: {allowCIDRs: ["127.0.0.1/32"], connectPorts: [${discoveryPort}]}\n`,
      });
      const port = await freePort();
      const created = await createProxy('kube-1', op, PROXY_NS, { provider: 'in-cluster', port });
      const ready = await untilReadyAndHealthy('kube-1', 30_000);
      expect(statusOf(ready)).toMatchObject({ address: '127.0.0.1', port });
      // The Pod and its Squid-config Secret live in the operator's namespace (POD_NAMESPACE).
      const podName = (statusOf(ready).providerID ?? '').split('/').pop() as string;
      const pod = kube().resource('pods').get(OPERATOR_NS, podName);
      expect(pod?.metadata.labels).toMatchObject({
        'proxy-operator-managed': 'true',
        'proxy-operator-uid': created.metadata.uid,
        'proxy-operator-namespace': PROXY_NS,
      });
      expect(kube().resource('secrets').get(OPERATOR_NS, podName)).toBeDefined();
      const ph = await until('ProviderHealth in-cluster', () => {
        const o = kube().resource('providerhealths').get(undefined, 'in-cluster');
        return condition(o, 'Ready') ? o : undefined;
      });
      expect(condition(ph, 'Ready')?.status).toBe('True');

      // Real Squid with the generated htpasswd: the grant's credentials get through.
      const grant = await lease(op);
      expect(grant.proxy.port).toBe(port);
      expect(await throughProxy(grant.proxy.url, `${op.discovery}/generate_204`)).toBe(204);

      await deleteProxy('kube-1');
      await until('the Proxy to disappear', () => getProxy('kube-1') === undefined, 30_000);
      expect(kube().resource('pods').get(OPERATOR_NS, podName)).toBeUndefined();
      expect(kube().resource('secrets').get(OPERATOR_NS, podName)).toBeUndefined();
    } finally {
      await kubelet.stop();
    }
  }, 90_000);
});
