/**
 * A Secret shared by 50 Proxies is edited: every spec-hash changes at once. With the default
 * surge limit (10 % of the provider's proxies: 5) never more than 5 replace at once, leasable
 * capacity never drops below 90 %, and clients leasing throughout only get working proxies.
 * Real local proxies, health engine, lease store and feed (test/support/controller/lifecycle-world).
 */
import { describe, expect, it } from 'vitest';
import { leaseLoop, NS, startLifecycleWorld } from '../../support/controller/lifecycle-world.ts';
import { until } from '../../support/wait.ts';

const b64 = (s: string) => Buffer.from(s).toString('base64');
const N = 50;

describe('surge limit', () => {
  it('a shared-Secret edit over 50 proxies: at most 5 replacing, capacity ≥ 90 %, no failed grant', async () => {
    const w = await startLifecycleWorld({ instances: N + 12, intervalMs: 500 });
    await w.store.secrets.create({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'fleet-creds', namespace: NS },
      data: { username: b64('crawler'), password: b64('first-password') },
    });
    const names = Array.from({ length: N }, (_, i) => `p-${String(i).padStart(2, '0')}`);
    for (const n of names) await w.seed(n, { credentialsSecretRef: { name: 'fleet-creds' } });
    await until('all leasable', () => w.leases.snapshot().filter((s) => s.leasable).length === N, 30_000);
    const firstIDs = new Map(names.map((n) => [n, w.proxy(n)!.status!.providerID!]));

    let maxReplacing = 0;
    let minLeasable = N;
    const sample = () => {
      const replacing = w.store.proxies.list().filter((p) => p.status?.pending).length;
      maxReplacing = Math.max(maxReplacing, replacing);
      minLeasable = Math.min(minLeasable, w.leases.snapshot().filter((s) => s.leasable).length);
    };
    const off = w.store.proxies.watch(sample);
    const timer = setInterval(sample, 20);
    const loops = [leaseLoop(w), leaseLoop(w)];
    try {
      const secret = await w.store.secrets.read({ namespace: NS, name: 'fleet-creds' });
      await w.store.secrets.delete({ namespace: NS, name: 'fleet-creds' });
      await w.store.secrets.create({
        ...secret,
        metadata: { name: 'fleet-creds', namespace: NS, labels: secret.metadata.labels ?? {} },
        data: { username: b64('crawler'), password: b64('second-password') },
      });
      // Some wait their turn, and say so.
      await until(
        'a proxy waiting for a replacement slot',
        () =>
          w.store.proxies.list().some((p) => p.status?.message?.startsWith('waiting for a replacement slot')),
        10_000,
      );
      await until(
        'every proxy replaced and drained',
        () =>
          names.every((n) => {
            const s = w.proxy(n)!.status;
            return s?.credentialsGeneration === 2 && !s.pending && !s.draining && !s.retiring;
          }),
        { timeoutMs: 90_000, intervalMs: 50 },
      );
    } finally {
      clearInterval(timer);
      off();
    }
    const results = await Promise.all(loops.map((l) => l.stop()));
    expect(results.flatMap((r) => r.failures)).toEqual([]);
    expect(maxReplacing).toBeGreaterThan(1);
    expect(maxReplacing).toBeLessThanOrEqual(5);
    expect(minLeasable / N).toBeGreaterThanOrEqual(0.9);
    for (const n of names) expect(w.proxy(n)!.status!.providerID, n).not.toBe(firstIDs.get(n));
    const grant = w.leases.lease({});
    expect(grant.granted && grant.grant.proxy.url).toContain('second-password');
  }, 120_000);
});
