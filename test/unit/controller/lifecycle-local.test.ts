/**
 * Replacements end to end on the `local` provider with the real health engine, lease store and
 * lease feed (test/support/controller/lifecycle-world): the new instance is slow to start serving, yet
 * a client leasing in a loop through the whole replacement only ever gets proxies that work
 * (each grant is tunnelled through); the old instance drains its leases before it is deleted
 * and the lease API shows it draining; a credentials rotation under load causes no 407.
 */
import { describe, expect, it } from 'vitest';
import { keyOfName, leaseLoop, NS, startLifecycleWorld } from '../../support/controller/lifecycle-world.ts';
import { until } from '../../support/wait.ts';

const b64 = (s: string) => Buffer.from(s).toString('base64');

describe('replacement on the local provider', () => {
  it('never leases a replacement before it serves; the old instance drains, then goes', async () => {
    const w = await startLifecycleWorld();
    await w.seed('eu-1', { placement: { zone: 'a' } });
    await until('eu-1 leasable', () => w.leases.snapshot()[0]?.leasable, 10_000);
    const old = w.proxy('eu-1')!.status!;
    const loop = leaseLoop(w);
    // A lease held across the switch: the old instance must keep serving it.
    const held = w.leases.lease({ ttlSeconds: 300 });
    if (!held.granted) throw new Error('no lease');
    expect(held.grant.proxy.port).toBe(old.port);

    w.gates.slow = true;
    const p = w.proxy('eu-1')!;
    await w.store.proxies.update({ ...p, spec: { ...p.spec, placement: { zone: 'b' } } });
    const pending = await until(
      'pending replacement with an address',
      () => (w.proxy('eu-1')!.status?.pending?.address ? w.proxy('eu-1')!.status!.pending : undefined),
      10_000,
    );
    expect(w.gates.closed()).toEqual([pending.instanceName]);
    // Probed and failing for a while: no switch, the old instance serves on.
    await until(
      'the replacement reported failing',
      () => w.proxy('eu-1')!.status?.replacementHealth?.healthy === false,
      10_000,
    );
    expect(w.proxy('eu-1')!.status).toMatchObject({
      phase: 'Replacing',
      providerID: old.providerID,
      port: old.port,
    });
    expect(w.proxy('eu-1')!.status!.message).toMatch(
      /waiting for .* to pass its health checks \(last probe: /,
    );

    w.gates.open(pending.instanceName);
    await until(
      'switched, as the lease store sees it',
      () => w.leases.snapshot()[0]?.port === pending.port,
      10_000,
    );
    expect(w.proxy('eu-1')!.status!.providerID).toBe(pending.providerID);
    // Draining: shown by the lease API with its live lease; still serving that lease.
    const snap = w.leases.snapshot()[0]!;
    expect(snap.port).toBe(pending.port);
    // The held lease, and maybe one of the loop's still in flight.
    expect(snap.drainingInstances).toEqual([
      { host: old.address, port: old.port, since: expect.any(String), activeLeases: expect.any(Number) },
    ]);
    expect(snap.drainingInstances![0]!.activeLeases).toBeGreaterThanOrEqual(1);
    expect(w.proxy('eu-1')!.status!.draining?.[0]?.providerID).toBe(old.providerID);
    expect((await w.tunnel(held.grant)).ok).toBe(true);

    w.leases.release(held.grant.id);
    await until(
      'old instance deleted',
      () => !w.proxy('eu-1')!.status?.draining && !w.proxy('eu-1')!.status?.retiring,
      10_000,
    );
    expect(w.leases.snapshot()[0]!.drainingInstances).toBeUndefined();
    expect(w.leases.leasesOn(keyOfName('eu-1'), old.providerID!)).toBe(0);

    const atDelete = loop.grants();
    await until('load on the new instance', () => loop.grants() > Math.max(atDelete + 10, 20), 10_000);
    const { grants, failures, endpoints } = await loop.stop();
    expect(failures).toEqual([]);
    expect(grants).toBeGreaterThan(20);
    // Old address first, then only the new one.
    expect(endpoints).toEqual([`${old.address}:${old.port}`, `127.0.0.1:${pending.port}`]);
  });

  it('a credentials rotation under load: zero 407s, old leases keep working until they end', async () => {
    const w = await startLifecycleWorld({ surge: { count: 2 } });
    await w.store.secrets.create({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'creds', namespace: NS },
      data: { username: b64('crawler'), password: b64('first-password') },
    });
    for (const name of ['eu-1', 'eu-2']) await w.seed(name, { credentialsSecretRef: { name: 'creds' } });
    await until('both leasable', () => w.leases.snapshot().filter((s) => s.leasable).length === 2, 10_000);
    const loops = [leaseLoop(w), leaseLoop(w), leaseLoop(w)];
    const held = w.leases.lease({ ttlSeconds: 300 });
    if (!held.granted) throw new Error('no lease');
    expect(held.grant.proxy.url).toContain('first-password');

    w.gates.slow = true;
    const secret = await w.store.secrets.read({ namespace: NS, name: 'creds' });
    await w.store.secrets.delete({ namespace: NS, name: 'creds' });
    await w.store.secrets.create({
      ...secret,
      metadata: { name: 'creds', namespace: NS, labels: secret.metadata.labels ?? {} },
      data: { username: b64('crawler'), password: b64('second-password') },
    });
    const pendings = await until(
      'both replacements pending',
      () => {
        const ps = ['eu-1', 'eu-2'].map((n) => w.proxy(n)!.status?.pending);
        return ps.every((x) => x?.address) && ps;
      },
      10_000,
    );
    // Until they serve, grants carry the credentials the old instances really have.
    const before = w.leases.lease({});
    if (!before.granted) throw new Error('no lease');
    expect(before.grant.proxy.url).toContain('first-password');
    expect((await w.tunnel(before.grant)).ok).toBe(true);
    w.leases.release(before.grant.id);
    for (const p of pendings) w.gates.open(p!.instanceName);
    await until(
      'both switched, as the lease store sees it',
      () =>
        ['eu-1', 'eu-2'].every((n) => w.proxy(n)!.status?.credentialsGeneration === 2) &&
        w.leases.snapshot().every((s, i) => s.port === pendings[i]!.port),
      10_000,
    );
    const after = w.leases.lease({});
    if (!after.granted) throw new Error('no lease');
    expect(after.grant.proxy.url).toContain('second-password');
    w.leases.release(after.grant.id);
    // The lease granted before the rotation still works on its draining instance.
    const r = await w.tunnel(held.grant);
    expect(r).toMatchObject({ ok: true });
    w.leases.release(held.grant.id);
    await until('drained', () => ['eu-1', 'eu-2'].every((n) => !w.proxy(n)!.status?.draining), 10_000);
    // Enough traffic through the new instances too, however fast this machine ran the switch.
    const sum = () => loops.reduce((n, l) => n + l.grants(), 0);
    const atSwitch = sum();
    await until('load on the new instances', () => sum() > Math.max(atSwitch + 10, 30), 10_000);

    const results = await Promise.all(loops.map((l) => l.stop()));
    expect(results.flatMap((x) => x.failures)).toEqual([]);
    expect(results.reduce((n, x) => n + x.grants, 0)).toBeGreaterThan(30);
  });
});
