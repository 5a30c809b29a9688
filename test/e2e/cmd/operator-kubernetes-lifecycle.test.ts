/**
 * Cluster mode with the kubernetes provider and real Squid, through the real CLI: rotating a
 * Proxy's credentials replaces its Pod, and the new Pod is slow to start serving (Running with
 * a Pod IP, Squid not started yet). A client leasing in a loop through the discovery API the
 * whole time — tunnelling through every grant — only ever gets a working proxy: never the new
 * Pod before it passed its health checks, never a 407. The old Pod drains the lease still held
 * on it, is shown draining by GET /v1/proxies, and is deleted once that lease is released.
 */
import { describe, expect, it } from 'vitest';
import {
  createProxy,
  freePort,
  getProxy,
  kube,
  OPERATOR_NS,
  type Operator,
  PROXY_NS,
  startOperator,
  statusOf,
  throughProxy,
  until,
  untilReadyAndHealthy,
  useOperatorEnv,
} from '../../support/operator-env.ts';
import { playSlowKubelet } from '../../support/slow-kubelet.ts';

useOperatorEnv();

interface Grant {
  id: string;
  proxy: { url: string; host: string; port: number };
}

async function tryLease(op: Operator): Promise<Grant | undefined> {
  const res = await fetch(`${op.discovery}/v1/leases`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ namespace: PROXY_NS, selector: 'pool=e2e', ttlSeconds: 120 }),
  });
  return res.status === 200 || res.status === 201 ? ((await res.json()) as Grant) : undefined;
}

const release = (op: Operator, id: string) => fetch(`${op.discovery}/v1/leases/${id}`, { method: 'DELETE' });

function leaseLoop(op: Operator) {
  let running = true;
  const failures: string[] = [];
  const hosts: string[] = [];
  let grants = 0;
  const run = (async () => {
    while (running) {
      const g = await tryLease(op);
      if (!g) continue;
      grants++;
      if (hosts.at(-1) !== g.proxy.host) hosts.push(g.proxy.host);
      try {
        const status = await throughProxy(g.proxy.url, `${op.discovery}/generate_204`);
        if (status !== 204) failures.push(`${g.proxy.host}: ${status}`);
      } catch (err) {
        failures.push(`${g.proxy.host}: ${(err as Error).message}`);
      }
      await release(op, g.id);
    }
  })();
  return {
    async stop() {
      running = false;
      await run;
      return { grants, failures, hosts };
    },
  };
}

describe('operator with the kubernetes provider: a replacement slow to serve', () => {
  it('credentials rotation: only working grants, no 407, the old Pod drains then goes', async () => {
    const kubelet = playSlowKubelet(kube());
    try {
      const discoveryPort = await freePort();
      const op = await startOperator({
        name: 'a',
        discoveryPort,
        extraArgs: ['--drain-timeout', '2m'],
        extraProviders: `  - name: in-cluster\n    type: kubernetes\n    kubernetes:\n      egressPolicy: {allowCIDRs: ["127.0.0.1/32"], connectPorts: [${discoveryPort}]}\n`,
      });
      const port = await freePort();
      await createProxy('kube-1', op, PROXY_NS, { provider: 'in-cluster', port });
      const ready = await untilReadyAndHealthy('kube-1', 30_000);
      const old = statusOf(ready);
      const oldPod = (old.providerID ?? '').split('/').pop() as string;

      const loop = leaseLoop(op);
      const held = await until('a lease to hold', () => tryLease(op));
      expect(held.proxy.host).toBe(old.address);

      // Rotate the generated credentials; the new Pod comes up Running but does not serve.
      kubelet.slow = true;
      const secrets = kube().resource('secrets');
      const auth = secrets.get(PROXY_NS, 'kube-1-auth');
      if (!auth) throw new Error('no kube-1-auth');
      secrets.update({
        ...auth,
        data: {
          ...(auth.data as Record<string, string>),
          password: Buffer.from('rotated-password-1').toString('base64'),
        },
      });
      const pending = await until(
        'the replacement Pod Running, not serving',
        () => {
          const p = statusOf(getProxy('kube-1')) as { pending?: { instanceName: string; address?: string } };
          return p.pending?.address && kubelet.waiting().length === 1 ? p.pending : undefined;
        },
        30_000,
      );
      await until(
        'its probes failing',
        () =>
          (getProxy('kube-1')?.status as { replacementHealth?: { healthy: boolean } })?.replacementHealth
            ?.healthy === false,
        30_000,
      );
      expect(statusOf(getProxy('kube-1'))).toMatchObject({ phase: 'Replacing', address: old.address });

      await kubelet.serve(pending.instanceName);
      await until('the switch', () => statusOf(getProxy('kube-1')).address === pending.address, 30_000);
      // The old Pod drains the held lease: shown by the lease API, still serving it.
      const list = (await (await fetch(`${op.discovery}/v1/proxies?namespace=${PROXY_NS}`)).json()) as {
        proxies: { host: string; drainingInstances?: { host: string; activeLeases: number }[] }[];
      };
      expect(list.proxies[0]).toMatchObject({
        host: pending.address,
        drainingInstances: [{ host: old.address }],
      });
      expect(await throughProxy(held.proxy.url, `${op.discovery}/generate_204`)).toBe(204);
      expect(kube().resource('pods').get(OPERATOR_NS, oldPod)).toBeDefined();

      await release(op, held.id);
      await until(
        'the old Pod deleted',
        () => kube().resource('pods').get(OPERATOR_NS, oldPod) === undefined,
        30_000,
      );
      const { grants, failures, hosts } = await loop.stop();
      expect(failures).toEqual([]);
      expect(grants).toBeGreaterThan(5);
      expect(hosts).toEqual([old.address, pending.address]);
    } finally {
      await kubelet.stop();
    }
  }, 120_000);
});
