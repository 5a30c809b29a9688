/**
 * gateway/lease-adapter: a grant on one named proxy (the gateway's sticky sessions and slot
 * leases) follows the same leasing rules as any grant — target cooldowns, capacity, health — and
 * counts like one; the upstreams the hub hands out carry the first rule each proxy fails.
 */
import { describe, expect, it } from 'vitest';
import { GatewayLeaseAdapter } from '../../../src/gateway/lease-adapter.ts';
import { TooManyLeasesError } from '../../../src/lease/errors.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

describe('GatewayLeaseAdapter.leaseProxy', () => {
  it('grants on the named proxy only while the leasing rules allow it', () => {
    const store = new LeaseStore({ clock: new FakeClock() });
    const gateway = new GatewayLeaseAdapter(store);
    store.upsertProxy(proxyInfo('a', { maxLeases: 1 }));
    store.upsertProxy(proxyInfo('b'));
    const first = gateway.leaseProxy('crawl/a', 'shop.example', undefined, 'gateway', 'session');
    expect(first.granted && first.grant.proxy.name).toBe('a');
    expect(gateway.leaseProxy('crawl/a', 'other.example', undefined, 'gateway', 'session')).toEqual({
      granted: false,
      reason: 'AtCapacity',
    });
    if (!first.granted) throw new Error('unreachable');
    store.report(first.grant.id, { result: 'blocked' });
    expect(gateway.leaseProxy('crawl/a', 'shop.example', undefined, 'gateway', 'session')).toEqual({
      granted: false,
      reason: 'CoolingDownForTarget',
    });
    expect(gateway.leaseProxy('crawl/a', 'other.example', undefined, 'gateway', 'session').granted).toBe(
      true,
    );
    store.setHealth('crawl/b', 'uid-b', { healthy: false });
    expect(gateway.leaseProxy('crawl/b', 'shop.example', undefined, 'gateway', 'session')).toEqual({
      granted: false,
      reason: 'Unhealthy',
    });
    expect(gateway.leaseProxy('crawl/zz', 'shop.example', undefined, 'gateway', 'session')).toEqual({
      granted: false,
      reason: 'Gone',
    });
    store.close();
  });

  it('counts against the store-wide cap like any grant', () => {
    const store = new LeaseStore({ clock: new FakeClock(), maxActiveLeases: 1 });
    const gateway = new GatewayLeaseAdapter(store);
    store.upsertProxy(proxyInfo('a'));
    expect(gateway.leaseProxy('crawl/a', undefined, undefined, 'gateway', 'session').granted).toBe(true);
    expect(() => gateway.leaseProxy('crawl/a', undefined, undefined, 'gateway', 'session')).toThrow(
      TooManyLeasesError,
    );
    expect(store.activeLeases()).toBe(1);
    store.close();
  });
});

describe('GatewayLeaseAdapter.upstreams', () => {
  it('names the first rule each proxy fails, capacity aside, and its live target cooldowns', () => {
    const clock = new FakeClock();
    const store = new LeaseStore({ clock });
    const gateway = new GatewayLeaseAdapter(store);
    const heard: [string, string, number][] = [];
    const unwatch = gateway.watchTargetCooldowns((e, target, until) => heard.push([e.key, target, until]));
    store.upsertProxy(proxyInfo('a', { maxLeases: 1, labels: { pool: 'x' } }));
    store.upsertProxy(proxyInfo('b', { healthy: false }));
    const held = store.lease({ target: 'shop.example' });
    if (!held.granted) throw new Error('expected a grant');
    store.report(held.grant.id, { result: 'blocked', cooldownSeconds: 60, release: false });
    const until = clock.now() + 60_000;
    expect(heard).toEqual([['crawl/a', 'shop.example', until]]);
    expect(gateway.upstreams(true)).toEqual([
      {
        key: 'crawl/a',
        namespace: 'crawl',
        labels: { pool: 'x' },
        maxLeases: 1,
        reason: null,
        latencyMillis: null,
        cooldowns: [['shop.example', until]],
      },
      {
        key: 'crawl/b',
        namespace: 'crawl',
        labels: {},
        maxLeases: 0,
        reason: 'Unhealthy',
        latencyMillis: null,
        cooldowns: [],
      },
    ]);
    unwatch();
    clock.advance(61_000);
    expect(gateway.upstreams(true)[0]?.cooldowns).toEqual([]);
    store.close();
  });
});
