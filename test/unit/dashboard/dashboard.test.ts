/**
 * The dashboard's server side on a fake clock: rows joined from the lease store and the Proxy
 * objects (pool label, provider, egress IP, nothing secret), events for blocks, failures,
 * health flips and object changes, the bounded event ring and latency history, and one
 * snapshot per refresh however many viewers ask.
 */
import { describe, expect, it, vi } from 'vitest';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { Dashboard } from '../../../src/dashboard/dashboard.ts';
import { EventRing } from '../../../src/dashboard/events.ts';
import { LatencyHistory } from '../../../src/dashboard/history.ts';
import { objectEvents } from '../../../src/dashboard/object-events.ts';
import type { DashboardState } from '../../../src/dashboard/web/types.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

function world() {
  const clock = new FakeClock();
  const store = createMemoryStore({ clock });
  const leases = new LeaseStore({ clock });
  const dashboard = new Dashboard({ leases, store, clock });
  const state = (after = 0) => JSON.parse(dashboard.stateJson(after)) as DashboardState;
  return { clock, store, leases, dashboard, state };
}

function seed(
  store: ReturnType<typeof createMemoryStore>,
  name: string,
  over: Partial<ProxyObject['status']> = {},
  labels: Record<string, string> = {},
) {
  return store.seedProxy({
    metadata: { namespace: 'crawl', name, labels },
    spec: { provider: 'local' },
    status: { phase: 'Ready', address: '10.0.0.1', port: 3128, ...over },
  });
}

describe('fleet rows', () => {
  it('joins each proxy with its pool label, provider and egress IP, and never carries credentials', () => {
    const { store, leases, state } = world();
    seed(store, 'a', { egressIP: '203.0.113.7' }, { 'crawl.example.com/pool': 'eu', other: 'x' });
    seed(store, 'b');
    leases.upsertProxy(
      proxyInfo('a', { latencyMillis: 12, credentials: { username: 'u', password: 'hunter2-secret' } }),
    );
    leases.upsertProxy(proxyInfo('b', { healthy: false }));
    const s = state();
    expect(s.proxies.map((p) => [p.key, p.pool, p.provider, p.egressIP, p.healthy])).toEqual([
      ['crawl/a', 'eu', 'local', '203.0.113.7', true],
      ['crawl/b', null, 'local', null, false],
    ]);
    expect(s.proxies[0]).toMatchObject({ latencyMillis: 12, address: '10.0.0.1:3128', leasable: true });
    // No ProxyPool named eu: the label alone makes a pool, marked as such (test/unit/dashboard/pools.test.ts).
    expect(s.pools).toEqual([
      expect.objectContaining({ key: 'crawl/eu', object: false, desired: null, replicas: 1, leasable: 1 }),
    ]);
    expect(s.totals).toMatchObject({ proxies: 2, ready: 2, healthy: 1, leasable: 1 });
    expect(JSON.stringify(s)).not.toContain('hunter2-secret');
  });

  it('lists a Proxy the lease store has not seen yet, with the phase from its status', () => {
    const { store, state } = world();
    seed(store, 'new', { phase: 'Provisioning', address: undefined });
    expect(state().proxies).toEqual([
      expect.objectContaining({
        key: 'crawl/new',
        phase: 'Provisioning',
        healthy: false,
        leasable: false,
        address: null,
      }),
    ]);
  });
});

describe('events', () => {
  it('turns a blocked report into a cooldown and a blocked event, a failed one into a global cooldown', () => {
    const { clock, leases, state } = world();
    leases.upsertProxy(proxyInfo('a'));
    state();
    const g = leases.lease({ target: 'https://shop.example/x' });
    if (!g.granted) throw new Error('no grant');
    leases.report(g.grant.id, { result: 'blocked', cooldownSeconds: 600 });
    clock.advance(1000);
    let s = state();
    expect(s.proxies[0]?.targetCooldowns).toEqual([
      {
        target: 'shop.example',
        until: new Date(clock.now() - 1000 + 600_000).toISOString(),
        sharedFrom: null,
      },
    ]);
    expect(s.events.map((e) => [e.kind, e.proxy])).toEqual([['blocked', 'crawl/a']]);
    expect(s.events[0]?.message).toContain('shop.example');
    const g2 = leases.lease({});
    if (!g2.granted) throw new Error('no grant');
    leases.report(g2.grant.id, { result: 'failed' });
    clock.advance(1000);
    s = state(s.lastEvent);
    expect(s.events.map((e) => e.kind)).toEqual(['failed']);
    expect(s.proxies[0]?.cooldownUntil).not.toBeNull();
  });

  it('reports health flips both ways', () => {
    const { clock, leases, state } = world();
    leases.upsertProxy(proxyInfo('a', { latencyMillis: 10 }));
    state();
    leases.setHealth('crawl/a', 'uid-a', { healthy: false });
    clock.advance(1000);
    const down = state();
    expect(down.events.map((e) => e.kind)).toEqual(['unhealthy']);
    leases.setHealth('crawl/a', 'uid-a', { healthy: true, latencyMillis: 40 });
    clock.advance(1000);
    const up = state(down.lastEvent);
    expect(up.events.map((e) => [e.kind, e.message])).toEqual([['healthy', 'healthy (40 ms)']]);
  });

  it('records object changes while running: added, phase, replacement, switch, egress IP, deleted', async () => {
    const { clock, store, state, dashboard } = world();
    const ctrl = new AbortController();
    const running = dashboard.run(ctrl.signal);
    const p = seed(store, 'a', { phase: 'Provisioning', address: undefined, instanceName: 'px-1' });
    const key = { namespace: 'crawl', name: 'a' };
    await store.proxies.patchStatus(key, { phase: 'Ready', address: '10.0.0.2' });
    await store.proxies.patchStatus(key, {
      phase: 'Replacing',
      pending: { providerID: 'local/2', instanceName: 'px-2' },
    });
    await store.proxies.patchStatus(key, {
      phase: 'Ready',
      pending: null,
      instanceName: 'px-2',
      egressIP: '198.51.100.1',
    });
    await store.proxies.delete(key, { uid: p.metadata.uid });
    clock.advance(1000);
    const kinds = state().events.map((e) => [e.kind, e.message]);
    ctrl.abort();
    await running;
    expect(kinds).toEqual([
      ['added', 'added (provider local)'],
      // The seed writes its status after the create, as the reconciler would.
      ['phase', 'Pending → Provisioning'],
      ['phase', 'Provisioning → Ready'],
      ['phase', 'Ready → Replacing'],
      ['replacing', 'replacement instance px-2 started'],
      ['phase', 'Replacing → Ready'],
      ['replaced', 'now served by px-2 (was px-1)'],
      ['egress-ip', 'egress IP 198.51.100.1'],
      ['deleted', 'deleted'],
    ]);
  });

  it('quotes only phases and names: a watch event carries no spec or Secret field', () => {
    const p = {
      apiVersion: 'v',
      kind: 'Proxy',
      metadata: { name: 'x', namespace: 'n' },
      spec: { provider: 'gcp', credentialsSecretRef: { name: 'top-secret-ref' } },
    } as unknown as ProxyObject;
    const events = objectEvents({ type: 'ADDED', object: p });
    expect(JSON.stringify(events)).not.toContain('top-secret-ref');
  });
});

describe('bounds', () => {
  it('keeps the newest events up to its capacity and answers what came after a sequence number', () => {
    const ring = new EventRing(3);
    for (let i = 1; i <= 10; i++) ring.add(i * 1000, 'phase', 'n/p', `e${i}`);
    expect(ring.since(0).map((e) => e.message)).toEqual(['e8', 'e9', 'e10']);
    expect(ring.since(9).map((e) => e.message)).toEqual(['e10']);
    expect(ring.since(10)).toEqual([]);
    // A reader that saw another process's ring gets everything held.
    expect(ring.since(99).map((e) => e.seq)).toEqual([8, 9, 10]);
  });

  it('keeps the latency history to its window, one mean per step, gaps where unhealthy', () => {
    const h = new LatencyHistory(10_000, 4);
    const t0 = 1_000_000_000_000;
    h.record('n/a', 10, t0);
    h.record('n/a', 20, t0 + 5_000);
    h.record('n/a', null, t0 + 10_000);
    h.record('n/a', 30, t0 + 20_000);
    expect(h.body(t0 + 20_000).series['n/a']).toEqual([null, 15, null, 30]);
    h.record('n/a', 40, t0 + 60_000);
    expect(h.body(t0 + 60_000).series['n/a']).toEqual([null, null, null, 40]);
    h.record('n/b', 5, t0 + 60_000);
    h.retain(new Set(['n/b']));
    expect(Object.keys(h.body(t0 + 60_000).series)).toEqual(['n/b']);
  });

  it('while watching, reads the Proxy cache again only after a Proxy changed', async () => {
    const { clock, store, leases, dashboard, state } = world();
    seed(store, 'a');
    leases.upsertProxy(proxyInfo('a'));
    const ctrl = new AbortController();
    const running = dashboard.run(ctrl.signal);
    const list = vi.spyOn(store.proxies, 'list');
    for (let i = 0; i < 3; i++) {
      clock.advance(1000);
      state();
    }
    expect(list).toHaveBeenCalledTimes(0);
    await store.proxies.patchStatus({ namespace: 'crawl', name: 'a' }, { egressIP: '198.51.100.9' });
    clock.advance(1000);
    expect(state().proxies[0]?.egressIP).toBe('198.51.100.9');
    expect(list).toHaveBeenCalledTimes(1);
    ctrl.abort();
    await running;
  });

  it('costs one lease-store snapshot per refresh, however many viewers ask', () => {
    const { clock, leases, dashboard } = world();
    leases.upsertProxy(proxyInfo('a'));
    const snapshot = vi.spyOn(leases, 'snapshot');
    for (let i = 0; i < 20; i++) dashboard.stateJson(0);
    dashboard.historyJsonText();
    expect(snapshot).toHaveBeenCalledTimes(1);
    clock.advance(500);
    dashboard.stateJson(0);
    expect(snapshot).toHaveBeenCalledTimes(2);
  });
});
