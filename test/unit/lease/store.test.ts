import { afterEach, describe, expect, it } from 'vitest';
import { LeaseInputError } from '../../../src/lease/errors.ts';
import { iso, newLeaseId } from '../../../src/lease/lease.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { normalizeTarget } from '../../../src/lease/target.ts';
import type { LeaseGrant } from '../../../src/lease/types.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

const info = proxyInfo;

const stores: LeaseStore[] = [];
function setup(opts: { probes?: string[] } = {}) {
  const clock = new FakeClock();
  const store = new LeaseStore({ clock, requestProbe: (k) => opts.probes?.push(k) });
  stores.push(store);
  return { clock, store };
}
afterEach(() => {
  for (const s of stores.splice(0)) s.close();
});

function grant(store: LeaseStore, req: Parameters<LeaseStore['lease']>[0] = {}): LeaseGrant {
  const out = store.lease(req);
  if (!out.granted) throw new Error(`expected a grant, got ${JSON.stringify(out.counts)}`);
  return out.grant;
}

function refused(store: LeaseStore, req: Parameters<LeaseStore['lease']>[0] = {}) {
  const out = store.lease(req);
  if (out.granted) throw new Error(`expected refusal, got ${out.grant.proxy.name}`);
  return out.counts;
}

describe('leasable rules', () => {
  it('grants a Ready healthy proxy with credentials in the URL only', () => {
    const { store, clock } = setup();
    store.upsertProxy(info('a', { credentials: { username: 'u', password: 'p@ss' } }));
    const g = grant(store, { target: 'Example.COM', ttlSeconds: 30 });
    expect(g.proxy).toEqual({
      namespace: 'crawl',
      name: 'a',
      url: 'http://u:p%40ss@10.0.0.1:3128',
      host: '10.0.0.1',
      port: 3128,
    });
    expect(g.target).toBe('example.com');
    expect(g.expiresAt).toBe(new Date(clock.now() + 30_000).toISOString());
    expect(g.id).toMatch(/^[0-9a-f-]{36}$/);
    expect(JSON.stringify(store.snapshot())).not.toContain('p@ss');
  });

  it.each([
    ['not Ready', { phase: 'Provisioning' }, { ready: 0, healthy: 0 }],
    ['Replacing before it ever had an address', { phase: 'Replacing', host: '' }, { ready: 0, healthy: 0 }],
    ['Failed', { phase: 'Failed' }, { ready: 0, healthy: 0 }],
    ['no address', { host: '' }, { ready: 0, healthy: 0 }],
    ['being deleted', { deleting: true }, { ready: 0, healthy: 0 }],
    ['unhealthy', { healthy: false }, { ready: 1, healthy: 0 }],
    ['draining', { draining: true }, { ready: 1, healthy: 1, draining: 1 }],
  ] as const)('refuses a proxy that is %s, with the arithmetic', (_, over, counts) => {
    const { store } = setup();
    store.upsertProxy(info('a', over));
    const base = {
      matching: 1,
      ready: 1,
      healthy: 1,
      draining: 0,
      coolingDown: 0,
      coolingDownForTarget: 0,
      atCapacity: 0,
    };
    expect(refused(store)).toEqual({ ...base, ...counts });
  });

  it('keeps leasing a Replacing proxy at its address: the old instance serves until the switch', () => {
    const { store } = setup();
    store.upsertProxy(info('a', { phase: 'Replacing', host: '10.0.0.1' }));
    expect(grant(store).proxy).toMatchObject({ name: 'a', host: '10.0.0.1' });
    expect(store.snapshot()[0]).toMatchObject({ phase: 'Replacing', leasable: true, reason: null });
    // The switch moves the address; new grants go to the new instance.
    store.upsertProxy(info('a', { phase: 'Ready', host: '10.0.0.2' }));
    expect(grant(store).proxy.host).toBe('10.0.0.2');
    // Replacing is still subject to every other rule.
    store.upsertProxy(info('a', { phase: 'Replacing', healthy: false }));
    expect(refused(store)).toMatchObject({ matching: 1, ready: 1, healthy: 0 });
  });

  it('respects maxLeases and frees capacity on release', () => {
    const { store } = setup();
    store.upsertProxy(info('a', { maxLeases: 2 }));
    const g1 = grant(store);
    grant(store);
    expect(refused(store)).toMatchObject({ matching: 1, healthy: 1, atCapacity: 1 });
    expect(store.release(g1.id)).toBe(true);
    expect(grant(store).proxy.name).toBe('a');
  });

  it('maxLeases 0 is unlimited', () => {
    const { store } = setup();
    store.upsertProxy(info('a'));
    for (let i = 0; i < 500; i++) grant(store);
    expect(store.activeLeases()).toBe(500);
  });

  it('filters by selector and namespace', () => {
    const { store } = setup();
    store.upsertProxy(info('eu', { labels: { pool: 'eu' } }));
    store.upsertProxy(info('us', { labels: { pool: 'us' } }));
    store.upsertProxy(info('other', { namespace: 'x', labels: { pool: 'eu' } }));
    expect(grant(store, { selector: 'pool=us' }).proxy.name).toBe('us');
    expect(grant(store, { selector: 'pool in (eu)', namespace: 'x' }).proxy.name).toBe('other');
    expect(refused(store, { selector: 'pool=asia' }).matching).toBe(0);
    expect(refused(store, { selector: 'pool=us', namespace: 'x' }).matching).toBe(0);
    // A second, differently written but equal selector reuses the index and still sees updates.
    store.upsertProxy(info('us2', { labels: { pool: 'us' } }));
    expect(grant(store, { selector: 'pool==us' }).proxy.name).toBe('us2');
  });

  it('rejects bad input naming the field and changes nothing', () => {
    const { store } = setup();
    store.upsertProxy(info('a'));
    const field = (fn: () => unknown) => {
      try {
        fn();
      } catch (err) {
        if (err instanceof LeaseInputError) return err.field;
        throw err;
      }
      return 'no error';
    };
    expect(field(() => store.lease({ ttlSeconds: 0 }))).toBe('ttlSeconds');
    expect(field(() => store.lease({ ttlSeconds: 3601 }))).toBe('ttlSeconds');
    expect(field(() => store.lease({ ttlSeconds: 1.5 }))).toBe('ttlSeconds');
    expect(field(() => store.lease({ selector: 'a in (' }))).toBe('selector');
    expect(field(() => store.lease({ target: 'not a host' }))).toBe('target');
    expect(store.activeLeases()).toBe(0);
    const g = grant(store);
    expect(field(() => store.report(g.id, { result: 'blocked' }))).toBe('result');
    expect(field(() => store.report(g.id, { result: 'success', cooldownSeconds: 5 }))).toBe(
      'cooldownSeconds',
    );
    expect(field(() => store.renew(g.id, 0))).toBe('ttlSeconds');
    expect(store.activeLeases()).toBe(1);
  });
});

describe('selection order', () => {
  it('prefers fewest active leases', () => {
    const { store } = setup();
    for (const n of ['a', 'b', 'c']) store.upsertProxy(info(n));
    const names = [1, 2, 3, 4, 5, 6].map(() => grant(store).proxy.name);
    expect(names).toEqual(['a', 'b', 'c', 'a', 'b', 'c']);
  });

  it('then least recently leased', () => {
    const { store } = setup();
    for (const n of ['a', 'b', 'c']) store.upsertProxy(info(n));
    const ga = grant(store);
    const gb = grant(store);
    store.release(gb.id); // b leased more recently than a
    store.release(ga.id);
    expect(grant(store).proxy.name).toBe('c'); // never leased
    expect(grant(store).proxy.name).toBe('a');
    expect(grant(store).proxy.name).toBe('b');
  });

  it('then lowest latency, then name', () => {
    const { store } = setup();
    store.upsertProxy(info('a', { latencyMillis: 50 }));
    store.upsertProxy(info('b', { latencyMillis: 10 }));
    store.upsertProxy(info('c'));
    store.upsertProxy(info('d', { latencyMillis: 10 }));
    expect([1, 2, 3, 4].map(() => grant(store).proxy.name)).toEqual(['b', 'd', 'a', 'c']);
  });

  it('a health verdict latency reorders candidates', () => {
    const { store } = setup();
    store.upsertProxy(info('a', { latencyMillis: 50 }));
    store.upsertProxy(info('b', { latencyMillis: 60 }));
    store.setHealth('crawl/b', 'uid-b', { healthy: true, latencyMillis: 5 });
    expect(grant(store).proxy.name).toBe('b');
  });
});

describe('health and lifecycle', () => {
  it('verdicts override the condition the feed passes; stale uids are ignored', () => {
    const { store } = setup();
    store.upsertProxy(info('a'));
    expect(store.setHealth('crawl/a', 'other-uid', { healthy: false })).toBe(false);
    grant(store);
    store.setHealth('crawl/a', 'uid-a', { healthy: false });
    store.upsertProxy(info('a', { healthy: true })); // lagging condition must not revive it
    expect(refused(store)).toMatchObject({ ready: 1, healthy: 0 });
    store.setHealth('crawl/a', 'uid-a', { healthy: true });
    expect(grant(store).proxy.name).toBe('a');
  });

  it('a removed or unhealthy proxy keeps its leases but gets no new ones', () => {
    const { store } = setup();
    store.upsertProxy(info('a', { maxLeases: 1 }));
    store.upsertProxy(info('b'));
    const ga = grant(store);
    const gb = grant(store);
    store.removeProxy('crawl/a');
    store.setHealth('crawl/b', 'uid-b', { healthy: false });
    expect(refused(store)).toMatchObject({ matching: 1, healthy: 0 });
    expect(store.activeLeases()).toBe(2);
    expect(store.renew(ga.id, 60)).toBeDefined();
    expect(store.release(ga.id)).toBe(true);
    expect(store.release(gb.id)).toBe(true);
    expect(store.snapshot().map((p) => p.name)).toEqual(['b']);
  });

  it('recreation under the same name (new uid) starts fresh', () => {
    const { store } = setup();
    store.upsertProxy(info('a', { maxLeases: 1 }));
    const g = grant(store);
    store.upsertProxy(info('a', { maxLeases: 1, uid: 'uid-a2' }));
    expect(grant(store).proxy.name).toBe('a');
    expect(store.release(g.id)).toBe(true);
    expect(store.snapshot()[0]?.activeLeases).toBe(1);
  });
});

describe('cooldowns', () => {
  it('blocked cools down for the lease target only, for 10 minutes by default', () => {
    const { store, clock } = setup();
    store.upsertProxy(info('a'));
    const g = grant(store, { target: 'https://shop.example/page' });
    expect(store.report(g.id, { result: 'blocked' })).toBe(true);
    expect(store.activeLeases()).toBe(0); // release defaults to true
    expect(refused(store, { target: 'shop.example:443' })).toMatchObject({
      healthy: 1,
      coolingDownForTarget: 1,
    });
    expect(grant(store, { target: 'other.example' }).proxy.name).toBe('a');
    expect(grant(store).proxy.name).toBe('a');
    const snap = store.snapshot({ target: 'shop.example' })[0]!;
    expect(snap).toMatchObject({ leasable: false, reason: 'CoolingDownForTarget' });
    expect(snap.targetCooldowns).toEqual([
      { target: 'shop.example', until: new Date(clock.now() + 600_000).toISOString() },
    ]);
    clock.advance(599_000);
    refused(store, { target: 'shop.example' });
    clock.advance(1_000);
    expect(grant(store, { target: 'shop.example' }).proxy.name).toBe('a');
  });

  it('blocked skips cooling proxies in favour of the next candidate', () => {
    const { store } = setup();
    store.upsertProxy(info('a'));
    store.upsertProxy(info('b'));
    const g = grant(store, { target: 't.example' });
    expect(g.proxy.name).toBe('a');
    store.report(g.id, { result: 'blocked', cooldownSeconds: 30 });
    expect(grant(store, { target: 't.example' }).proxy.name).toBe('b');
    expect(grant(store, { target: 't.example' }).proxy.name).toBe('b');
  });

  it('failed cools down globally (60 s default), requests a probe, and can keep the lease', () => {
    const probes: string[] = [];
    const { store, clock } = setup({ probes });
    store.upsertProxy(info('a'));
    const g = grant(store, { target: 'x.example' });
    expect(store.report(g.id, { result: 'failed', release: false })).toBe(true);
    expect(probes).toEqual(['crawl/a']);
    expect(store.activeLeases()).toBe(1);
    expect(refused(store, { target: 'y.example' })).toMatchObject({ coolingDown: 1 });
    expect(store.snapshot()[0]).toMatchObject({ reason: 'CoolingDown', activeLeases: 1 });
    clock.advance(60_000);
    expect(grant(store).proxy.name).toBe('a');
    expect(store.release(g.id)).toBe(true);
  });

  it('success releases by default and changes no cooldown; unknown leases report false', () => {
    const { store } = setup();
    store.upsertProxy(info('a', { maxLeases: 1 }));
    const g = grant(store, { target: 'x.example' });
    expect(store.report(g.id, { result: 'success' })).toBe(true);
    expect(grant(store, { target: 'x.example' }).proxy.name).toBe('a');
    expect(store.report('no-such-lease', { result: 'failed' })).toBe(false);
  });
});

describe('lease lifetime', () => {
  it('expires after the TTL (default 300 s) via the sweep timer', () => {
    const { store, clock } = setup();
    store.upsertProxy(info('a', { maxLeases: 1 }));
    const g = grant(store);
    expect(g.expiresAt).toBe(new Date(clock.now() + 300_000).toISOString());
    clock.advance(299_000);
    expect(store.activeLeases()).toBe(1);
    clock.advance(1_000);
    expect(store.activeLeases()).toBe(0);
    expect(store.renew(g.id)).toBeUndefined();
    expect(grant(store).proxy.name).toBe('a');
  });

  it('the sweep timer runs until close()', () => {
    const { store, clock } = setup();
    expect(clock.pendingTimers()).toBe(1);
    clock.advance(5_000);
    expect(clock.pendingTimers()).toBe(1);
    store.close();
    expect(clock.pendingTimers()).toBe(0);
  });

  it('renew extends a live lease', () => {
    const { store, clock } = setup();
    store.upsertProxy(info('a'));
    const g = grant(store, { ttlSeconds: 10 });
    clock.advance(8_000);
    expect(store.renew(g.id, 10)?.expiresAt).toBe(new Date(clock.now() + 10_000).toISOString());
    clock.advance(8_000);
    expect(store.activeLeases()).toBe(1);
    clock.advance(2_000);
    expect(store.activeLeases()).toBe(0);
  });

  it('release is idempotent', () => {
    const { store } = setup();
    store.upsertProxy(info('a', { maxLeases: 2 }));
    const g = grant(store);
    grant(store);
    expect(store.release(g.id)).toBe(true);
    expect(store.release(g.id)).toBe(false);
    expect(store.release('unknown')).toBe(false);
    expect(store.snapshot()[0]?.activeLeases).toBe(1);
  });
});

describe('normalizeTarget', () => {
  it.each([
    ['Example.COM', 'example.com'],
    ['example.com:8443', 'example.com'],
    ['https://User:pw@Shop.Example:444/path?q=1', 'shop.example'],
    ['example.com.', 'example.com'],
    ['[2001:db8::1]:443', '[2001:db8::1]'],
    ['http://[2001:DB8::1]/', '[2001:db8::1]'],
    ['192.0.2.1:80', '192.0.2.1'],
    ['', undefined],
    // IPv6 literals: with or without brackets (a CONNECT authority once its brackets are off),
    // one RFC 5952 spelling in brackets; IPv4-mapped ones are the IPv4 site.
    ['2001:db8::1', '[2001:db8::1]'],
    ['2001:DB8:0:0:0:0:0:1', '[2001:db8::1]'],
    ['[2001:db8:0::1]', '[2001:db8::1]'],
    ['::1', '[::1]'],
    ['::ffff:1.2.3.4', '1.2.3.4'],
    ['[::ffff:1.2.3.4]:443', '1.2.3.4'],
    ['https://[::FFFF:102:304]/x', '1.2.3.4'],
    ['64:ff9b::1.2.3.4', '[64:ff9b::102:304]'],
  ])('%s → %s', (raw, want) => {
    expect(normalizeTarget(raw)).toBe(want);
  });

  it.each(['a b', 'http://', 'exa/mple', '-bad-.com', '[2001:db8::g]', '2001:db8:::1', '[::1'])(
    'rejects %s',
    (raw) => {
      expect(() => normalizeTarget(raw)).toThrow(LeaseInputError);
    },
  );

  it('an IPv6 address with a zone index names no site, and the error says so', () => {
    expect(() => normalizeTarget('fe80::1%eth0')).toThrow(/^target "fe80::1%eth0" has a zone index/);
    expect(() => normalizeTarget('[fe80::1%25eth0]:443')).toThrow(LeaseInputError);
  });

  it('a cooldown for the IPv4-mapped spelling of a site cools the IPv4 site', () => {
    const { store } = setup();
    store.upsertProxy(info('a'));
    const g = grant(store, { target: '[::ffff:1.2.3.4]' });
    expect(g.target).toBe('1.2.3.4');
    store.report(g.id, { result: 'blocked', cooldownSeconds: 60 });
    refused(store, { target: '1.2.3.4' });
    refused(store, { target: '::ffff:102:304' });
    expect(grant(store, { target: '5.6.7.8' }).proxy.name).toBe('a');
  });

  it('answers a repeated target the same way, valid or not (results are remembered, errors are not)', () => {
    for (let round = 0; round < 3; round++) {
      expect(normalizeTarget('HTTPS://Repeat.Example:8443/x')).toBe('repeat.example');
      expect(normalizeTarget('repeat.example')).toBe('repeat.example');
      expect(() => normalizeTarget('repeat example')).toThrow(LeaseInputError);
    }
  });

  it('stays right past the size of its memory', () => {
    for (let i = 0; i < 10_000; i++) expect(normalizeTarget(`Site-${i}.Example`)).toBe(`site-${i}.example`);
    expect(normalizeTarget('Site-0.Example')).toBe('site-0.example');
  });
});

describe('lease ids and times', () => {
  it('lease ids are random version 4 UUIDs, distinct over many grants', () => {
    const ids = new Set<string>();
    for (let i = 0; i < 5_000; i++) {
      const id = newLeaseId();
      expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
      ids.add(id);
    }
    expect(ids.size).toBe(5_000);
  });

  it('expiry times are ISO 8601 of the given instant, also when instants alternate', () => {
    const a = Date.UTC(2026, 0, 2, 3, 4, 5, 678);
    const b = a + 1;
    for (const t of [a, a, b, a, b, b]) expect(iso(t)).toBe(new Date(t).toISOString());
  });
});
