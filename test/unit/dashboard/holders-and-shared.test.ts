/**
 * The dashboard's state, shaped on the server: the pool of every proxy by one rule (the owning
 * ProxyPool, else the `pool` label users select on) in the rows and the Pools panel; the lease
 * holders (id prefix only, target, grant time, API or gateway), bounded with a count of the
 * rest; and cooldowns a proxy took on through its egress address marked with the proxy that was
 * reported, whose event names the others.
 */
import { describe, expect, it } from 'vitest';
import { LABEL_POOL } from '../../../src/api/constants.ts';
import { Dashboard } from '../../../src/dashboard/dashboard.ts';
import { LEASE_ID_SHOWN, leaseHolders } from '../../../src/dashboard/lease-holders.ts';
import { poolOf } from '../../../src/dashboard/pools.ts';
import type { DashboardState } from '../../../src/dashboard/web/types.ts';
import { LeaseStoreChooser } from '../../../src/gateway/upstreams.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

function world() {
  const clock = new FakeClock();
  const store = createMemoryStore({ clock });
  const leases = new LeaseStore({ clock });
  const dashboard = new Dashboard({ leases, store, clock, freshMs: 0 });
  const state = (after = 0) => JSON.parse(dashboard.stateJson(after)) as DashboardState;
  const seed = (name: string, labels: Record<string, string>, egressIP?: string) => {
    store.seedProxy({
      metadata: { namespace: 'crawl', name, labels },
      spec: { provider: 'local' },
      status: { phase: 'Ready', address: '127.0.0.1', port: 3128, ...(egressIP ? { egressIP } : {}) },
    });
    leases.upsertProxy(proxyInfo(name, { labels, ...(egressIP ? { egressIP } : {}) }));
  };
  return { clock, store, leases, dashboard, state, seed };
}

function granted(outcome: ReturnType<LeaseStore['lease']>) {
  if (!outcome.granted) throw new Error('no grant');
  return outcome.grant;
}

describe('the pool of a proxy', () => {
  it('is the owning ProxyPool, else the pool label users select on, else none', () => {
    expect(poolOf({ [LABEL_POOL]: 'demo', pool: 'eu' })).toEqual({ name: 'demo', label: LABEL_POOL });
    expect(poolOf({ pool: 'eu', tier: 'x' })).toEqual({ name: 'eu', label: 'pool' });
    expect(poolOf({ tier: 'x' })).toBeUndefined();
    expect(poolOf(undefined)).toBeUndefined();
  });

  it("shows the README's label pools and a ProxyPool's members, and lists each pool with its selector", () => {
    const { seed, state } = world();
    seed('local-1', { pool: 'eu' });
    seed('local-2', { pool: 'eu' });
    seed('local-3', { pool: 'us' });
    seed('demo-abcde', { pool: 'demo', [LABEL_POOL]: 'demo' });
    const s = state();
    expect(s.proxies.map((p) => [p.name, p.pool, p.poolLabel])).toEqual([
      ['demo-abcde', 'demo', LABEL_POOL],
      ['local-1', 'eu', 'pool'],
      ['local-2', 'eu', 'pool'],
      ['local-3', 'us', 'pool'],
    ]);
    expect(s.pools.map((p) => [p.key, p.object, p.selectors, p.replicas, p.leasable])).toEqual([
      ['crawl/demo', false, [`${LABEL_POOL}=demo`], 1, 1],
      ['crawl/eu', false, ['pool=eu'], 2, 2],
      ['crawl/us', false, ['pool=us'], 1, 1],
    ]);
  });
});

describe('lease holders', () => {
  it('lists API and gateway leases newest first with an id prefix, target, age and origin; never a full id', () => {
    const { clock, seed, leases, state } = world();
    seed('a', { pool: 'eu' });
    const api = granted(leases.lease({ target: 'https://shop.example/', selector: 'pool=eu' }));
    clock.advance(5000);
    const chooser = new LeaseStoreChooser(leases, clock);
    const conn = chooser.acquire('news.example', {
      selector: 'pool=eu',
      session: 's1',
      sessionTtlSeconds: 60,
    });
    if (!conn.ok) throw new Error(conn.message);
    clock.advance(2000);
    const s = state();
    expect(s.leases).toEqual({
      total: 2,
      api: 1,
      gateway: 1,
      gatewayShare: 0,
      restored: 0,
      more: 0,
      newest: [
        {
          id: conn.acquired.leaseId.slice(0, LEASE_ID_SHOWN),
          proxy: 'crawl/a',
          target: 'news.example',
          grantedAt: new Date(clock.now() - 2000).toISOString(),
          expiresAt: new Date(clock.now() - 2000 + 300_000).toISOString(),
          via: 'gateway',
        },
        {
          id: api.id.slice(0, LEASE_ID_SHOWN),
          proxy: 'crawl/a',
          target: 'shop.example',
          grantedAt: new Date(clock.now() - 7000).toISOString(),
          expiresAt: api.expiresAt,
          via: 'api',
        },
      ],
    });
    const text = JSON.stringify(s);
    expect(text).not.toContain(api.id);
    expect(text).not.toContain(conn.acquired.leaseId);
    // Released leases leave the list.
    chooser.release(conn.acquired);
    leases.release(api.id);
    expect(state().leases).toMatchObject({ total: 0, newest: [], more: 0 });
  });

  it('keeps the list bounded, the newest first, and counts the rest', () => {
    const { seed, leases, state } = world();
    seed('a', {});
    const ids = Array.from({ length: 60 }, () => granted(leases.lease({})).id);
    const s = state();
    expect(s.leases.total).toBe(60);
    expect(s.leases.newest).toHaveLength(50);
    expect(s.leases.more).toBe(10);
    expect(s.leases.newest.map((l) => l.id)).toEqual(
      ids
        .slice(-50)
        .reverse()
        .map((id) => id.slice(0, LEASE_ID_SHOWN)),
    );
    expect(leaseHolders(leases.liveLeases(3), 2).newest).toHaveLength(2);
    expect(leases.liveLeases(0)).toMatchObject({ counts: { api: 60 }, newest: [] });
  });

  it('shows a lease restored after a restart without an origin or age', () => {
    const { seed, leases } = world();
    seed('a', {});
    granted(leases.lease({}));
    const next = new LeaseStore({ clock: new FakeClock() });
    next.upsertProxy(proxyInfo('a'));
    next.restoreState(leases.exportState());
    const live = leaseHolders(next.liveLeases(10));
    expect(live).toMatchObject({ total: 1, restored: 1, api: 0 });
    expect(live.newest[0]).toMatchObject({ via: null, grantedAt: null });
  });
});

describe('cooldowns shared through an egress address', () => {
  it('marks the cooldowns other proxies took on, and names them in the reported proxy’s event', () => {
    const { clock, seed, leases, state } = world();
    seed('local-2', { pool: 'eu' }, '127.0.0.2');
    seed('demo-aaaaa', { [LABEL_POOL]: 'demo' }, '127.0.0.2');
    seed('demo-bbbbb', { [LABEL_POOL]: 'demo' }, '127.0.0.2');
    seed('local-1', { pool: 'eu' }, '127.0.0.3');
    state();
    expect(
      leases.reportProxy({ namespace: 'crawl', name: 'local-2', target: 'shop.example', result: 'blocked' }),
    ).toBe(true);
    clock.advance(1000);
    const s = state();
    const cooldowns = Object.fromEntries(s.proxies.map((p) => [p.name, p.targetCooldowns]));
    expect(cooldowns['local-2']).toEqual([
      expect.objectContaining({ target: 'shop.example', sharedFrom: null }),
    ]);
    for (const peer of ['demo-aaaaa', 'demo-bbbbb'])
      expect(cooldowns[peer]).toEqual([
        expect.objectContaining({
          target: 'shop.example',
          sharedFrom: { proxy: 'crawl/local-2', address: '127.0.0.2' },
        }),
      ]);
    expect(cooldowns['local-1']).toEqual([]);
    // One event, on the proxy that was reported, naming those that share its address.
    expect(s.events.map((e) => [e.kind, e.proxy, e.message])).toEqual([
      [
        'blocked',
        'crawl/local-2',
        'blocked by shop.example: cooling down for it, 10 min left, with crawl/demo-aaaaa, crawl/demo-bbbbb on the same egress IP 127.0.0.2',
      ],
    ]);
    expect(s.totals.coolingDown).toBe(3);

    // A proxy reported itself later is blocked on its own account: no longer marked as shared.
    clock.advance(60_000);
    leases.reportProxy({ namespace: 'crawl', name: 'demo-aaaaa', target: 'shop.example', result: 'blocked' });
    clock.advance(1000);
    const after = state(s.lastEvent);
    const own = after.proxies.find((p) => p.name === 'demo-aaaaa')?.targetCooldowns[0];
    expect(own?.sharedFrom).toBeNull();
    const reported = after.proxies.find((p) => p.name === 'local-2')?.targetCooldowns[0];
    expect(reported?.sharedFrom).toEqual({ proxy: 'crawl/demo-aaaaa', address: '127.0.0.2' });
    expect(after.events.map((e) => [e.kind, e.proxy])).toEqual([['blocked', 'crawl/demo-aaaaa']]);
    expect(after.events[0]?.message).toContain(
      'with crawl/demo-bbbbb, crawl/local-2 on the same egress IP 127.0.0.2',
    );
  });

  it('gives a proxy that takes a blocked address later an event of its own saying where it came from', () => {
    const { clock, seed, leases, state } = world();
    seed('local-2', {}, '127.0.0.2');
    seed('late', {}, '127.0.0.9');
    state();
    leases.reportProxy({ namespace: 'crawl', name: 'local-2', target: 'shop.example', result: 'blocked' });
    clock.advance(1000);
    const first = state();
    leases.upsertProxy(proxyInfo('late', { egressIP: '127.0.0.2' }));
    clock.advance(1000);
    const s = state(first.lastEvent);
    expect(s.proxies.find((p) => p.name === 'late')?.targetCooldowns).toEqual([
      expect.objectContaining({
        target: 'shop.example',
        sharedFrom: { proxy: 'crawl/local-2', address: '127.0.0.2' },
      }),
    ]);
    expect(s.events.map((e) => [e.kind, e.proxy, e.message])).toEqual([
      [
        'shared-block',
        'crawl/late',
        'via 127.0.0.2, blocked on crawl/local-2: cooling down for shop.example, 10 min left',
      ],
    ]);
  });
});
