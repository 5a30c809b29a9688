/**
 * Cluster mode with two real operator processes and --leader-elect against the Kubernetes REST
 * test server: only the leader reconciles and probes while both answer lease requests (the
 * standby by forwarding to the leader), and SIGTERM of the leader hands the Lease over at once;
 * the new leader re-provisions what died with the old one.
 */
import { describe, expect, it } from 'vitest';
import { CONDITION_HEALTHY } from '../../../src/api/constants.ts';
import {
  condition,
  createProxy,
  freePort,
  getProxy,
  lease,
  leaseSpec,
  type Operator,
  PROXY_NS,
  startOperator,
  statusOf,
  throughProxy,
  until,
  untilReadyAndHealthy,
  useOperatorEnv,
} from '../../support/operator-env.ts';

useOperatorEnv();

describe('operator replicas with --leader-elect', () => {
  it('with two replicas only the leader reconciles, and SIGTERM hands over quickly', async () => {
    // a's local proxies are probed through b's discovery API, which is not a's own port: on
    // loopback, a's egress policy must allow it.
    const bPort = await freePort();
    const a = await startOperator({ name: 'a', leaderElect: true, openPorts: [bPort] });
    await until('a to lead', () => leaseSpec().holderIdentity === a.identity());
    const b = await startOperator({ name: 'b', leaderElect: true, discoveryPort: bPort });

    // Probe through b's discovery endpoint: it outlives a.
    await createProxy('ha-1', b);
    const first = statusOf(await untilReadyAndHealthy('ha-1'));
    const became = (op: Operator) => op.logs.some((l) => l.msg.startsWith('became leader'));
    const reconciled = (op: Operator) =>
      op.logs.some((l) => l.component === 'controller' && l.proxy === `${PROXY_NS}/ha-1`);
    expect(became(a)).toBe(true);
    expect(became(b)).toBe(false);
    expect(reconciled(b)).toBe(false);
    // Probes and Healthy writes are the leader's: the standby has not judged ha-1.
    const judged = (op: Operator) =>
      op.logs.some((l) => l.component === 'health' && l.msg === 'proxy healthy');
    expect(judged(a)).toBe(true);
    expect(judged(b)).toBe(false);
    // b still answers the discovery API (every replica does): it forwards to the leader, so the
    // lease it hands out is a's and releases through a.
    const viaB = await lease(b);
    expect(viaB.proxy.name).toBe('ha-1');
    const released = await fetch(`${a.discovery}/v1/leases/${viaB.id}`, { method: 'DELETE' });
    expect(released.status).toBe(204);

    const stoppedAt = Date.now();
    expect(await a.stop()).toBe(0);
    await until('b to take the lease', () => leaseSpec().holderIdentity === b.identity(), 10_000);
    expect(Date.now() - stoppedAt).toBeLessThan(10_000);
    await until('b to start leading', () => became(b));

    // a's local instance died with it: b re-provisions the Proxy and serves it.
    const again = await until('ha-1 re-provisioned by b', () => {
      const p = getProxy('ha-1');
      return statusOf(p).phase === 'Ready' &&
        condition(p, CONDITION_HEALTHY)?.status === 'True' &&
        reconciled(b)
        ? p
        : undefined;
    });
    expect(statusOf(again).address).toBe(first.address);
    // Status can read Ready before b has noticed the instance died with a (the local provider's
    // listeners live in the operator process): b must bring it back and serve it, within time.
    const served = await until('b to serve ha-1 again', async () => {
      const grant = await lease(b);
      const status = await throughProxy(grant.proxy.url, `${b.discovery}/generate_204`);
      return status === 204 ? status : undefined;
    });
    expect(served).toBe(204);
  }, 90_000);
});
