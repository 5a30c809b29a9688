import { afterEach, describe, expect, it } from 'vitest';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { ProxyInfo } from '../../../src/lease/types.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

const DRAIN_MS = 60_000;

const info = (over: Partial<ProxyInfo> = {}): ProxyInfo => proxyInfo('px-1', { instance: 'vm-old', ...over });

const stores: LeaseStore[] = [];
afterEach(() => {
  for (const s of stores.splice(0)) s.close();
});

describe('the drain deadline of a replaced instance', () => {
  it('caps renewals of leases granted on the old instance, then refuses them; new-instance leases renew freely', () => {
    const clock = new FakeClock();
    const store = new LeaseStore({ clock, drainTimeoutMs: DRAIN_MS });
    stores.push(store);
    store.upsertProxy(info());
    const old = store.lease({ ttlSeconds: 300 });
    if (!old.granted) throw new Error('no grant');

    // The switch: the proxy now serves from vm-new, vm-old drains from now on.
    const since = clock.now();
    store.upsertProxy(
      info({
        host: '10.0.0.2',
        instance: 'vm-new',
        drainingInstances: [
          { providerID: 'vm-old', host: '10.0.0.1', port: 3128, since: new Date(since).toISOString() },
        ],
      }),
    );
    const fresh = store.lease({ ttlSeconds: 300 });
    if (!fresh.granted) throw new Error('no grant');
    expect(store.leasesOn('crawl/px-1', 'vm-old')).toBe(1);

    clock.advance(40_000);
    expect(store.renew(old.grant.id, 300)?.expiresAt).toBe(new Date(since + DRAIN_MS).toISOString());
    expect(store.renew(fresh.grant.id, 300)?.expiresAt).toBe(new Date(clock.now() + 300_000).toISOString());

    clock.advance(25_000);
    expect(store.renew(old.grant.id, 30)).toBeUndefined();
    expect(store.leasesOn('crawl/px-1', 'vm-old')).toBe(0);
    expect(store.renew(fresh.grant.id, 30)).toBeDefined();
  });
});
