/**
 * test/unit/pool/pool — the ProxyPool controller on both real backends (the embedded standalone store
 * and client-node against the Kubernetes REST test server): replicas kept with named, labelled,
 * owned Proxies; scale-down victims in order, drained before deletion; template roll-outs and
 * age rotation one surge at a time without leasable Proxies dropping below the minimum; the
 * pool's status; cascading deletion through ownerReferences; rotation strategy Restart (aged
 * Proxies restarted in place one at a time, back in rotation only once healthy) and its refusal.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  ANNOTATION_POOL_DRAIN_SINCE,
  ANNOTATION_RESTART_REQUESTED,
  LABEL_POOL,
} from '../../../src/api/constants.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import type { ProxyPoolSpec } from '../../../src/api/proxypool.ts';
import { BACKENDS, NAMESPACE, openWorld, type PoolWorld, poolSpec } from '../../support/pool/world.ts';

const NAME = /^eu-[bcdfghjklmnpqrstvwxz2456789]{5}$/;
const WAIT = { timeout: 5000, interval: 10 };

let world: PoolWorld | undefined;
afterEach(async () => {
  await world?.close();
  world = undefined;
});

const leasable = (ps: ProxyObject[]) =>
  ps.filter(
    (p) =>
      p.status?.address &&
      p.spec.drain !== true &&
      p.status.conditions?.some((c) => c.type === 'Healthy' && c.status === 'True'),
  ).length;

/** Reconciles and serves until the pool is steady, checking `invariant` after every pass. */
async function settle(
  w: PoolWorld,
  pool: string,
  invariant: () => void = () => {},
  passes = 60,
): Promise<number> {
  let changes = 0;
  for (let i = 0; i < passes; i++) {
    const before = JSON.stringify(w.members(pool).map((p) => [p.metadata.name, p.spec.drain]));
    await w.reconcile(pool);
    invariant();
    await w.serve();
    invariant();
    const after = JSON.stringify(w.members(pool).map((p) => [p.metadata.name, p.spec.drain]));
    if (before === after) return changes;
    changes += 1;
  }
  throw new Error(`pool ${pool} did not settle in ${passes} passes`);
}

/**
 * One step of each requested in-place restart, the way the Proxy controller (controller/restart)
 * and the health engine write status: Restarting without an address and Healthy=Unknown, then
 * Ready at a new address (restart Done), then Healthy=True once "probed".
 */
async function playRestarts(w: PoolWorld, pool: string, nextIP: () => string): Promise<void> {
  const now = new Date(w.clock.now()).toISOString();
  const healthy = (status: 'True' | 'Unknown') => [
    {
      type: 'Healthy',
      status,
      reason: status === 'True' ? 'ProbeSucceeded' : 'NotServing',
      lastTransitionTime: now,
    },
  ];
  for (const p of w.members(pool)) {
    const key = { namespace: NAMESPACE, name: p.metadata.name };
    const requested = p.metadata.annotations?.[ANNOTATION_RESTART_REQUESTED];
    const r = p.status?.restart;
    if (requested && r?.requestedAt !== requested) {
      await w.store.proxies.patchStatus(key, {
        phase: 'Restarting',
        address: null,
        restart: {
          requestedAt: requested,
          phase: 'Restarting',
          since: now,
          previousAddress: p.status?.address,
        },
        conditions: healthy('Unknown'),
      });
    } else if (r?.phase === 'Restarting') {
      await w.store.proxies.patchStatus(key, {
        phase: 'Ready',
        address: nextIP(),
        restart: { ...r, phase: 'Done', finishedAt: now },
      });
    } else if (requested && r?.phase === 'Done') {
      await w.store.proxies.patchStatus(key, { conditions: healthy('True') });
    }
  }
}

async function updateSpec(w: PoolWorld, pool: string, edit: (s: ProxyPoolSpec) => void): Promise<void> {
  const cur = await w.store.proxyPools.read({ namespace: NAMESPACE, name: pool });
  edit(cur.spec);
  await w.store.proxyPools.update(cur);
}

describe.each(BACKENDS)('ProxyPool controller on the %s backend', (backend) => {
  it('creates replicas named <pool>-<5 chars>, labelled and owned by the pool, and reports status', async () => {
    world = await openWorld(backend);
    const pool = await world.createPool('eu', poolSpec(3));
    await settle(world, 'eu');
    const members = world.members('eu');
    expect(members).toHaveLength(3);
    for (const p of members) {
      expect(p.metadata.name).toMatch(NAME);
      expect(p.metadata.labels).toMatchObject({ [LABEL_POOL]: 'eu', tier: 'a' });
      expect(p.metadata.ownerReferences).toEqual([
        expect.objectContaining({ kind: 'ProxyPool', name: 'eu', uid: pool.metadata.uid, controller: true }),
      ]);
      expect(p.spec.provider).toBe('local');
    }
    await world.reconcile('eu');
    const status = world.pool('eu')?.status;
    expect(status).toMatchObject({
      replicas: 3,
      readyReplicas: 3,
      healthyReplicas: 3,
      leasableReplicas: 3,
      updatedReplicas: 3,
      selector: `${LABEL_POOL}=eu`,
    });
    const conditions = Object.fromEntries((status?.conditions ?? []).map((c) => [c.type, c.status]));
    expect(conditions).toEqual({ Available: 'True', Progressing: 'False', SpecValid: 'True' });
  });

  it('scales down not-Ready, then fewest leases first, and deletes a victim only once drained', async () => {
    world = await openWorld(backend, { drainTimeoutMs: 60_000 });
    const w = world;
    await w.createPool('eu', poolSpec(5));
    await settle(w, 'eu');
    const [notReady, busy, lessBusy, ...idle] = w.members('eu').map((p) => p.metadata.name);
    await w.store.proxies.patchStatus(
      { namespace: NAMESPACE, name: notReady as string },
      { phase: 'Provisioning', address: null },
    );
    w.leases.set(busy as string, 3);
    w.leases.set(lessBusy as string, 1);

    await updateSpec(w, 'eu', (s) => {
      s.replicas = 1;
    });
    await w.reconcile('eu');
    const draining = w.members('eu').filter((p) => p.metadata.annotations?.[ANNOTATION_POOL_DRAIN_SINCE]);
    // Four victims: the not-Ready one, the idle ones, then the one with one lease; the busiest stays.
    expect(draining.map((p) => p.metadata.name).sort()).toEqual([notReady, lessBusy, ...idle].sort());
    for (const p of draining) expect(p.spec.drain).toBe(true);

    await w.reconcile('eu');
    // Drained victims are gone; the one still holding a lease waits for it.
    expect(
      w
        .members('eu')
        .map((p) => p.metadata.name)
        .sort(),
    ).toEqual([busy, lessBusy].sort());
    w.clock.advance(30_000);
    await w.reconcile('eu');
    expect(w.members('eu')).toHaveLength(2);
    // Its lease ends (or the drain timeout passes): then it goes.
    w.leases.set(lessBusy as string, 0);
    await w.reconcile('eu');
    expect(w.members('eu').map((p) => p.metadata.name)).toEqual([busy]);
    expect(w.pool('eu')?.status).toMatchObject({ replicas: 1, drainingReplicas: 0 });
  });

  it('rolls a template change out one surge at a time, never below replicas − maxUnavailable leasable', async () => {
    world = await openWorld(backend);
    const w = world;
    await w.createPool('eu', poolSpec(4));
    await settle(w, 'eu');
    const before = new Set(w.members('eu').map((p) => p.metadata.name));
    await updateSpec(w, 'eu', (s) => {
      s.template.spec.maxLeases = 5;
    });
    let most = 0;
    const steps = await settle(w, 'eu', () => {
      const live = w.members('eu');
      expect(leasable(live)).toBeGreaterThanOrEqual(4);
      most = Math.max(most, live.filter((p) => p.spec.drain !== true).length);
    });
    const after = w.members('eu');
    expect(after).toHaveLength(4);
    for (const p of after) {
      expect(before.has(p.metadata.name)).toBe(false);
      expect(p.spec.maxLeases).toBe(5);
    }
    expect(most).toBeLessThanOrEqual(5); // replicas + maxSurge
    expect(steps).toBeGreaterThanOrEqual(4); // one at a time
  });

  it('recycles Proxies past maxAge × (1 − jitter × r), staggered, under the same limits', async () => {
    world = await openWorld(backend);
    const w = world;
    await w.createPool('eu', poolSpec(3, { rotation: { maxAge: '20s', jitter: 0.5 } }));
    await settle(w, 'eu');
    const first = new Set(w.members('eu').map((p) => p.metadata.name));
    const res = await w.reconcile('eu');
    // The earliest rotation is due between 10 s and 20 s from now.
    expect(res.requeueAfter).toBeGreaterThanOrEqual(10_000);
    expect(res.requeueAfter).toBeLessThanOrEqual(20_000);
    w.clock.advance(20_000);
    await settle(w, 'eu', () => expect(leasable(w.members('eu'))).toBeGreaterThanOrEqual(3));
    const now = w.members('eu');
    expect(now).toHaveLength(3);
    for (const p of now) expect(first.has(p.metadata.name)).toBe(false);
  });

  it('deleting the pool deletes its Proxies (ownerReference garbage collection)', async () => {
    world = await openWorld(backend);
    const w = world;
    await w.createPool('eu', poolSpec(3));
    await settle(w, 'eu');
    expect(w.members('eu')).toHaveLength(3);
    await w.store.proxyPools.delete({ namespace: NAMESPACE, name: 'eu' });
    await vi.waitFor(() => expect(w.members('eu')).toHaveLength(0), WAIT);
  });

  it('strategy Restart: aged Proxies get a new IP in place one at a time, back only once healthy', async () => {
    world = await openWorld(backend, { providerType: () => 'gcp', canRestart: () => true });
    const w = world;
    await w.createPool(
      'eu',
      poolSpec(3, {
        rotation: { maxAge: '20s', jitter: 0.5, strategy: 'Restart' },
        rollingUpdate: { maxUnavailable: 1 },
      }),
    );
    await settle(w, 'eu');
    const names = w
      .members('eu')
      .map((p) => p.metadata.name)
      .sort();
    const before = new Map(w.members('eu').map((p) => [p.metadata.name, p.status?.address]));
    w.clock.advance(20_000);
    let ip = 10;
    const nextIP = () => `127.0.0.${ip++}`;
    let most = 0;
    for (let pass = 0; pass < 40; pass++) {
      await w.reconcile('eu');
      const live = w.members('eu');
      const restarting = live.filter((p) => p.metadata.annotations?.[ANNOTATION_RESTART_REQUESTED]);
      most = Math.max(most, restarting.length);
      // A Proxy asked to restart takes no new leases until the pool lifts its drain.
      for (const p of restarting) expect(p.spec.drain).toBe(true);
      expect(leasable(live)).toBeGreaterThanOrEqual(2);
      if (restarting.length === 0 && live.every((p) => p.status?.restart?.phase === 'Done')) break;
      await playRestarts(w, 'eu', nextIP);
    }
    const after = w.members('eu');
    // The same Proxies, no surge, each with a new address, one restart at a time.
    expect(after.map((p) => p.metadata.name).sort()).toEqual(names);
    for (const p of after) {
      expect(p.status?.restart?.phase).toBe('Done');
      expect(p.status?.address).not.toBe(before.get(p.metadata.name));
      expect(p.spec.drain).toBeUndefined();
    }
    expect(most).toBe(1);
    expect(leasable(after)).toBe(3);
    expect(w.pool('eu')?.status).toMatchObject({ replicas: 3, leasableReplicas: 3, restartingReplicas: 0 });
    // The next rotation counts from the restart: not due again right away.
    const res = await w.reconcile('eu');
    expect(res.requeueAfter).toBeGreaterThanOrEqual(10_000);
  });

  it('refuses strategy Restart without room for an unavailable Proxy, naming the field', async () => {
    world = await openWorld(backend, { providerType: () => 'gcp', canRestart: () => true });
    const w = world;
    await w.createPool('eu', poolSpec(2, { rotation: { maxAge: '1h', strategy: 'Restart' } }));
    await w.reconcile('eu');
    expect(w.members('eu')).toHaveLength(0);
    const valid = w.pool('eu')?.status?.conditions?.find((c) => c.type === 'SpecValid');
    expect(valid?.status).toBe('False');
    expect(valid?.message).toMatch(/^spec\.rollingUpdate\.maxUnavailable: must be at least 1/);
  });

  it('refuses strategy Restart where the provider cannot change IP in place, changing nothing', async () => {
    world = await openWorld(backend);
    const w = world;
    await w.createPool(
      'eu',
      poolSpec(2, { rotation: { maxAge: '1h', strategy: 'Restart' }, rollingUpdate: { maxUnavailable: 1 } }),
    );
    await w.reconcile('eu');
    expect(w.members('eu')).toHaveLength(0);
    const valid = w.pool('eu')?.status?.conditions?.find((c) => c.type === 'SpecValid');
    expect(valid?.status).toBe('False');
    expect(valid?.message).toMatch(
      /^spec\.rotation\.strategy: Restart is not supported: provider "local" \(type local\)/,
    );
  });
});
