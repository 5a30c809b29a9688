/**
 * The dashboard's pools come from the ProxyPool objects themselves: desired from the spec, the
 * counts and conditions from the status the pool controller wrote, the leases from the lease
 * store, on both the embedded standalone store and client-node against the Kubernetes REST test
 * server. Pool labels without a ProxyPool are listed and marked; a proxy keeps its pool column;
 * nothing of the template reaches the page; pool events (added, scaled, availability, deleted)
 * show in the event list.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { API_VERSION, LABEL_POOL, PROXY_POOL_KIND } from '../../../src/api/constants.ts';
import type { ProxyPoolSpec } from '../../../src/api/proxypool.ts';
import { Dashboard } from '../../../src/dashboard/dashboard.ts';
import { poolEvents, poolSummaries } from '../../../src/dashboard/pools.ts';
import type { DashboardState, FleetRow } from '../../../src/dashboard/web/types.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';
import { BACKENDS, NAMESPACE, openWorld, type PoolWorld, poolSpec } from '../../support/pool/world.ts';

const WAIT = { timeout: 10_000, interval: 20 };

let world: PoolWorld | undefined;
afterEach(async () => {
  await world?.close();
  world = undefined;
});

function poolObject(name: string, spec: ProxyPoolSpec, namespace = 'crawl') {
  return { apiVersion: API_VERSION, kind: PROXY_POOL_KIND, metadata: { name, namespace }, spec };
}

function row(name: string, pool: string | null, over: Partial<FleetRow> = {}): FleetRow {
  return {
    key: `crawl/${name}`,
    namespace: 'crawl',
    name,
    pool,
    poolLabel: pool === null ? null : LABEL_POOL,
    provider: 'local',
    phase: 'Ready',
    healthy: true,
    draining: false,
    deleting: false,
    leasable: true,
    reason: null,
    latencyMillis: 5,
    activeLeases: 0,
    maxLeases: 0,
    cooldownUntil: null,
    targetCooldowns: [],
    egressIP: null,
    address: '127.0.0.1:3128',
    problem: null,
    ...over,
  };
}

describe('pool summaries', () => {
  it('reads desired from the spec and the counts and conditions from the status, leases from the rows', () => {
    const pool = {
      ...poolObject('eu', poolSpec(4)),
      metadata: { name: 'eu', namespace: 'crawl', generation: 2 },
      status: {
        replicas: 3,
        readyReplicas: 3,
        healthyReplicas: 2,
        leasableReplicas: 2,
        updatedReplicas: 3,
        drainingReplicas: 1,
        observedGeneration: 2,
        conditions: [
          {
            type: 'Available',
            status: 'False' as const,
            reason: 'TooFewLeasable',
            message: '2 leasable of 4',
            lastTransitionTime: '2026-01-01T00:00:00Z',
          },
        ],
      },
    };
    // Rows disagree with the status on purpose: the status is what the page shows.
    const rows = [
      row('eu-aaaaa', 'eu', { activeLeases: 2 }),
      row('eu-bbbbb', 'eu', { activeLeases: 1 }),
      row('other', null, { activeLeases: 7 }),
    ];
    expect(poolSummaries([pool], rows)).toEqual([
      {
        key: 'crawl/eu',
        namespace: 'crawl',
        name: 'eu',
        object: true,
        selectors: ['crawl.example.com/pool=eu'],
        desired: 4,
        replicas: 3,
        ready: 3,
        healthy: 2,
        leasable: 2,
        updated: 3,
        draining: 1,
        activeLeases: 3,
        conditions: [
          { type: 'Available', status: 'False', reason: 'TooFewLeasable', message: '2 leasable of 4' },
        ],
        deleting: false,
        stale: false,
      },
    ]);
  });

  it('lists a pool with no status yet as stale with unknown counts, and spec.replicas defaulting to 1', () => {
    const spec = poolSpec(1);
    delete spec.replicas;
    expect(poolSummaries([poolObject('new', spec)], [])).toEqual([
      expect.objectContaining({ key: 'crawl/new', desired: 1, replicas: null, ready: null, stale: true }),
    ]);
  });

  it('marks a status older than the spec as stale', () => {
    const pool = {
      ...poolObject('eu', poolSpec(3)),
      metadata: { name: 'eu', namespace: 'crawl', generation: 5 },
      status: { replicas: 2, observedGeneration: 4 },
    };
    expect(poolSummaries([pool], [])[0]).toMatchObject({ desired: 3, replicas: 2, stale: true });
  });

  it('lists pool labels without a ProxyPool (in that namespace) from the proxies, marked as such', () => {
    const rows = [
      row('a', 'research', { activeLeases: 1 }),
      row('b', 'research', { healthy: false, leasable: false }),
      row('c', 'eu'),
    ];
    const pools = poolSummaries([poolObject('eu', poolSpec(1), 'elsewhere')], rows);
    expect(pools.map((p) => [p.key, p.object])).toEqual([
      ['crawl/eu', false],
      ['crawl/research', false],
      ['elsewhere/eu', true],
    ]);
    expect(pools[1]).toMatchObject({
      desired: null,
      replicas: 2,
      ready: 2,
      healthy: 1,
      leasable: 1,
      activeLeases: 1,
      conditions: [],
    });
  });

  it('turns pool watch events into events: added, scaled, availability, deleting, deleted', () => {
    const base = poolObject('eu', poolSpec(2));
    const available = (status: 'True' | 'False', reason: string) => ({
      ...base,
      spec: poolSpec(3),
      status: {
        conditions: [{ type: 'Available', status, reason, lastTransitionTime: '2026-01-01T00:00:00Z' }],
      },
    });
    const messages = [
      ...poolEvents({ type: 'ADDED', object: base }),
      ...poolEvents({ type: 'MODIFIED', object: available('False', 'TooFewLeasable'), old: base }),
      ...poolEvents({
        type: 'MODIFIED',
        object: available('True', 'Leasable'),
        old: available('False', 'TooFewLeasable'),
      }),
      ...poolEvents({
        type: 'MODIFIED',
        object: { ...base, metadata: { ...base.metadata, deletionTimestamp: '2026-01-01T00:00:00Z' } },
        old: base,
      }),
      ...poolEvents({ type: 'DELETED', object: base }),
    ].map((e) => [e.kind, e.proxy, e.message]);
    expect(messages).toEqual([
      ['pool', null, 'pool crawl/eu added (2 replicas)'],
      ['pool', null, 'pool crawl/eu scaled 2 → 3'],
      ['pool', null, 'pool crawl/eu not available (TooFewLeasable)'],
      ['pool', null, 'pool crawl/eu available (Leasable)'],
      ['pool', null, 'pool crawl/eu deleting'],
      ['pool', null, 'pool crawl/eu deleted'],
    ]);
  });
});

describe('the dashboard on the memory store', () => {
  it('shows ProxyPools with no proxy yet, keeps the pool column of proxies, and never the template', async () => {
    const clock = new FakeClock();
    const store = createMemoryStore({ clock });
    const leases = new LeaseStore({ clock });
    const dashboard = new Dashboard({ leases, store, clock, freshMs: 0 });
    const spec = poolSpec(2);
    spec.template.spec.credentialsSecretRef = { name: 'template-secret-name' };
    spec.template.metadata = { labels: { tier: 'template-label-value' } };
    await store.proxyPools.create(poolObject('empty', spec));
    store.seedProxy({
      metadata: { namespace: 'crawl', name: 'hand', labels: { [LABEL_POOL]: 'research' } },
      spec: { provider: 'local' },
      status: { phase: 'Ready', address: '10.0.0.1', port: 3128 },
    });
    leases.upsertProxy(proxyInfo('hand'));
    const state = JSON.parse(dashboard.stateJson(0)) as DashboardState;
    expect(state.pools.map((p) => [p.key, p.object, p.desired, p.replicas])).toEqual([
      ['crawl/empty', true, 2, null],
      ['crawl/research', false, null, 1],
    ]);
    expect(state.proxies.map((p) => [p.key, p.pool])).toEqual([['crawl/hand', 'research']]);
    const text = JSON.stringify(state);
    expect(text).not.toContain('template-secret-name');
    expect(text).not.toContain('template-label-value');
  });
});

describe.each(BACKENDS)('the dashboard on the %s backend', (backend) => {
  it('shows a ProxyPool with the counts and conditions its controller wrote, and follows a scale', async () => {
    world = await openWorld(backend);
    const w = world;
    const leases = new LeaseStore({ clock: w.clock });
    const dashboard = new Dashboard({ leases, store: w.store, clock: w.clock, freshMs: 0 });
    const ac = new AbortController();
    const running = dashboard.run(ac.signal);
    const state = () => JSON.parse(dashboard.stateJson(0)) as DashboardState;
    const pool = () => state().pools.find((p) => p.key === `${NAMESPACE}/eu`);
    /** The pool controller and the Proxy side at work until the page shows `n` of everything. */
    const settle = (n: number) =>
      vi.waitFor(async () => {
        await w.reconcile('eu');
        await w.serve();
        expect(pool()).toMatchObject({ replicas: n, ready: n, healthy: n, leasable: n, stale: false });
      }, WAIT);
    try {
      await w.createPool('eu', poolSpec(2));
      await vi.waitFor(() => expect(pool()).toMatchObject({ desired: 2, stale: true }), WAIT);
      await settle(2);
      // The members' leases come from the lease store, keyed by their names.
      const [first] = w.members('eu');
      leases.upsertProxy(proxyInfo(first?.metadata.name ?? ''));
      const grant = leases.lease({});
      expect(grant.granted).toBe(true);
      await vi.waitFor(
        () =>
          expect(pool()).toMatchObject({
            object: true,
            desired: 2,
            replicas: 2,
            ready: 2,
            healthy: 2,
            leasable: 2,
            updated: 2,
            activeLeases: 1,
            stale: false,
          }),
        WAIT,
      );
      expect(Object.fromEntries((pool()?.conditions ?? []).map((c) => [c.type, c.status]))).toMatchObject({
        Available: 'True',
        Progressing: 'False',
      });
      const proxies = state().proxies.filter((p) => p.pool === 'eu');
      expect(proxies).toHaveLength(2);

      // A scale shows as the new desired count at once, the status catching up after reconciles.
      const cur = await w.store.proxyPools.read({ namespace: NAMESPACE, name: 'eu' });
      cur.spec.replicas = 3;
      await w.store.proxyPools.update(cur);
      await vi.waitFor(() => expect(pool()).toMatchObject({ desired: 3, replicas: 2, stale: true }), WAIT);
      await settle(3);
      expect(pool()).toMatchObject({ desired: 3, updated: 3 });
      const events = state()
        .events.filter((e) => e.kind === 'pool')
        .map((e) => e.message);
      expect(events).toEqual(
        expect.arrayContaining(['pool crawl/eu added (2 replicas)', 'pool crawl/eu scaled 2 → 3']),
      );
    } finally {
      ac.abort();
      await running;
    }
  });
});
