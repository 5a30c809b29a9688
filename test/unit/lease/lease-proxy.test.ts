/**
 * `leaseProxy`: a grant on one named proxy (the gateway's sticky sessions) follows the same
 * leasing rules as any grant — target cooldowns, capacity, health — and counts like one.
 */
import { describe, expect, it } from 'vitest';
import { LeaseStore } from '../../../src/lease/store.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

describe('LeaseStore.leaseProxy', () => {
  it('grants on the named proxy only while the leasing rules allow it', () => {
    const store = new LeaseStore({ clock: new FakeClock() });
    store.upsertProxy(proxyInfo('a', { maxLeases: 1 }));
    store.upsertProxy(proxyInfo('b'));
    const first = store.leaseProxy('crawl/a', 'shop.example');
    expect(first.granted && first.grant.proxy.name).toBe('a');
    expect(store.leaseProxy('crawl/a', 'other.example')).toEqual({ granted: false, reason: 'AtCapacity' });
    if (!first.granted) throw new Error('unreachable');
    store.report(first.grant.id, { result: 'blocked' });
    expect(store.leaseProxy('crawl/a', 'shop.example')).toEqual({
      granted: false,
      reason: 'CoolingDownForTarget',
    });
    expect(store.leaseProxy('crawl/a', 'other.example').granted).toBe(true);
    store.setHealth('crawl/b', 'uid-b', { healthy: false });
    expect(store.leaseProxy('crawl/b', 'shop.example')).toEqual({ granted: false, reason: 'Unhealthy' });
    expect(store.leaseProxy('crawl/zz', 'shop.example')).toEqual({ granted: false, reason: 'Gone' });
    store.close();
  });
});
