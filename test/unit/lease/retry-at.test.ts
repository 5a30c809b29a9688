/**
 * The 409's retryAt: the earliest time some matching proxy is leasable again for the target —
 * the end of a target cooldown, of a global cooldown, or of a lease on a full proxy — and none
 * when only things time does not end hold the proxies back.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { LeaseStore } from '../../../src/lease/store.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

const stores: LeaseStore[] = [];
function setup() {
  const clock = new FakeClock();
  const store = new LeaseStore({ clock });
  stores.push(store);
  return { clock, store };
}
afterEach(() => {
  for (const s of stores.splice(0)) s.close();
});

function retryAt(store: LeaseStore, req: Parameters<LeaseStore['lease']>[0]): number | undefined {
  const out = store.lease(req);
  if (out.granted) throw new Error(`expected a refusal, got ${out.grant.proxy.name}`);
  return out.retryAt;
}

function grantId(store: LeaseStore, req: Parameters<LeaseStore['lease']>[0]): string {
  const out = store.lease(req);
  if (!out.granted) throw new Error('expected a grant');
  return out.grant.id;
}

describe('retryAt of a refused grant', () => {
  it('is the soonest end among target cooldowns, global cooldowns and leases on full proxies', () => {
    const { clock, store } = setup();
    const t0 = clock.now();
    for (const name of ['a', 'b', 'c']) store.upsertProxy(proxyInfo(name, { maxLeases: 1 }));
    store.report(grantId(store, { target: 'shop.example' }), { result: 'blocked', cooldownSeconds: 300 });
    store.report(grantId(store, { target: 'shop.example' }), { result: 'failed', cooldownSeconds: 200 });
    grantId(store, { target: 'shop.example', ttlSeconds: 120 });
    expect(retryAt(store, { target: 'shop.example' })).toBe(t0 + 120_000);

    // At that time the full proxy's lease has expired: it is leased again at once.
    clock.advance(120_000);
    expect(store.lease({ target: 'shop.example' }).granted).toBe(true);
    // Next comes the end of the global cooldown (t0 + 200 s), then the target's (t0 + 300 s).
    expect(retryAt(store, { target: 'shop.example' })).toBe(t0 + 200_000);
    clock.advance(80_000);
    expect(store.lease({ target: 'shop.example' }).granted).toBe(true);
    // Both others are full until their leases expire (t0 + 420 s, t0 + 500 s): the target cooldown ends first.
    expect(retryAt(store, { target: 'shop.example' })).toBe(t0 + 300_000);
  });

  it('is none when nothing matches or only unready, unhealthy or draining proxies do', () => {
    const { store } = setup();
    expect(retryAt(store, {})).toBeUndefined();
    store.upsertProxy(proxyInfo('sick', { healthy: false }));
    store.upsertProxy(proxyInfo('new', { phase: 'Provisioning' }));
    store.upsertProxy(proxyInfo('drain', { draining: true }));
    expect(retryAt(store, { target: 'shop.example' })).toBeUndefined();
  });

  it('counts only the proxies the selector matches', () => {
    const { clock, store } = setup();
    store.upsertProxy(proxyInfo('eu', { labels: { pool: 'eu' } }));
    store.upsertProxy(proxyInfo('us', { labels: { pool: 'us' }, maxLeases: 1 }));
    grantId(store, { selector: 'pool=us', ttlSeconds: 30 });
    store.report(grantId(store, { selector: 'pool=eu', target: 'x.example' }), {
      result: 'blocked',
      cooldownSeconds: 600,
    });
    expect(retryAt(store, { selector: 'pool=eu', target: 'x.example' })).toBe(clock.now() + 600_000);
  });
});
