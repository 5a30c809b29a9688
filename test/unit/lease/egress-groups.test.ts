/**
 * Proxies sharing an egress IP share `blocked` cooldowns (lease/egress-groups): a block reported
 * on one cools down every proxy leaving from that address for that target only, grants go to
 * the others, and a proxy that takes a blocked address later is blocked there too. A property
 * test drives random grants, blocks, address moves and time through a store with and without
 * per-target views and checks that no grant ever lands on an address blocked for its target.
 */
import fc from 'fast-check';
import { afterEach, describe, expect, it } from 'vitest';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { ProxyInfo } from '../../../src/lease/types.ts';
import { FakeClock } from '../../support/clock.ts';
import { TEST_SEED } from '../../support/random.ts';

const IPS = ['203.0.113.1', '203.0.113.2', '203.0.113.3'];
const TARGETS = ['shop.example', 'news.example'];

function info(i: number, egressIP: string | undefined): ProxyInfo {
  const name = `px-${i}`;
  return {
    key: `crawl/${name}`,
    namespace: 'crawl',
    name,
    uid: `uid-${name}`,
    labels: {},
    phase: 'Ready',
    healthy: true,
    draining: false,
    deleting: false,
    maxLeases: 0,
    host: `10.0.0.${i + 1}`,
    port: 3128,
    ...(egressIP ? { egressIP } : {}),
  };
}

const stores: LeaseStore[] = [];
afterEach(() => {
  for (const s of stores.splice(0)) s.close();
});

function storeWith(assign: Array<string | undefined>, hotTargetSkips?: number) {
  const clock = new FakeClock();
  const store = new LeaseStore({ clock, ...(hotTargetSkips === undefined ? {} : { hotTargetSkips }) });
  stores.push(store);
  for (const [i, ip] of assign.entries()) store.upsertProxy(info(i, ip));
  return { clock, store };
}

/** The proxies `n` grant-and-release rounds for `target` go to. */
function granted(store: LeaseStore, target: string, n = 8): Set<string | undefined> {
  return new Set(Array.from({ length: n }, () => drainOne(store, target)));
}

describe('egress groups', () => {
  it('a block on one proxy cools down every proxy with its egress IP, for that target only', () => {
    const { store } = storeWith([IPS[0], IPS[0], IPS[1], undefined]);
    let lease = store.lease({ target: 'shop.example' });
    while (lease.granted && lease.grant.proxy.name !== 'px-1') {
      store.release(lease.grant.id);
      lease = store.lease({ target: 'shop.example' });
    }
    if (!lease.granted) throw new Error('px-1 never granted');
    expect(store.report(lease.grant.id, { result: 'blocked', cooldownSeconds: 600 })).toBe(true);

    const snap = new Map(store.snapshot({ target: 'shop.example' }).map((p) => [p.name, p]));
    expect(snap.get('px-0')?.reason).toBe('CoolingDownForTarget');
    expect(snap.get('px-1')?.reason).toBe('CoolingDownForTarget');
    expect(snap.get('px-2')?.leasable).toBe(true);
    expect(snap.get('px-3')?.leasable).toBe(true);
    expect(snap.get('px-0')?.egressIP).toBe(IPS[0]);
    // Grants for the site go to the other addresses only, and other sites still get everyone.
    expect(granted(store, 'shop.example')).toEqual(new Set(['px-2', 'px-3']));
    expect(granted(store, 'news.example')).toEqual(new Set(['px-0', 'px-1', 'px-2', 'px-3']));
  });

  it('a proxy that takes a blocked address later is blocked there, also once the last holder left', () => {
    const { clock, store } = storeWith([IPS[0], IPS[1]]);
    const lease = store.lease({ target: 'shop.example' });
    if (!lease.granted) throw new Error('no grant');
    const blockedName = lease.grant.proxy.name;
    const blockedIp = blockedName === 'px-0' ? IPS[0] : IPS[1];
    store.report(lease.grant.id, { result: 'blocked', cooldownSeconds: 600 });
    // The blocked proxy goes away; a new Proxy is given its address.
    store.removeProxy(`crawl/${blockedName}`);
    store.upsertProxy(info(7, blockedIp));
    expect(granted(store, 'shop.example').has('px-7')).toBe(false);
    clock.advance(601_000);
    expect(granted(store, 'shop.example').has('px-7')).toBe(true);
  });
});

function drainOne(store: LeaseStore, target: string): string | undefined {
  const out = store.lease({ target, ttlSeconds: 60 });
  if (!out.granted) return undefined;
  store.release(out.grant.id);
  return out.grant.proxy.name;
}

type Op =
  | { kind: 'lease'; target: number }
  | { kind: 'block'; lease: number; seconds: number }
  | { kind: 'move'; proxy: number; ip: number }
  | { kind: 'advance'; seconds: number };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({ kind: fc.constant('lease' as const), target: fc.integer({ min: 0, max: 1 }) }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant('block' as const),
      lease: fc.nat(),
      seconds: fc.integer({ min: 1, max: 120 }),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant('move' as const),
      proxy: fc.integer({ min: 0, max: 7 }),
      ip: fc.integer({ min: 0, max: 3 }),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({ kind: fc.constant('advance' as const), seconds: fc.integer({ min: 0, max: 60 }) }),
  },
);

describe('egress groups (property)', () => {
  it.each([
    ['plain views', Number.MAX_SAFE_INTEGER],
    ['per-target views', 0],
  ])('never grants a proxy whose egress IP is blocked for the target (%s)', (_label, skips) => {
    let grants = 0;
    fc.assert(
      fc.property(fc.array(opArb, { minLength: 20, maxLength: 200 }), (ops) => {
        const ipOf = Array.from({ length: 8 }, (_, i) => IPS[i % IPS.length] as string | undefined);
        const { clock, store } = storeWith(ipOf, skips);
        /** The model: (address, target) → end of its block. */
        const blocked = new Map<string, number>();
        const leases: Array<{ id: string; proxy: number; target: string }> = [];
        for (const op of ops) {
          if (op.kind === 'lease') {
            const target = TARGETS[op.target] as string;
            const out = store.lease({ target, ttlSeconds: 3600 });
            if (!out.granted) continue;
            grants++;
            const proxy = Number(out.grant.proxy.name.slice(3));
            const ip = ipOf[proxy];
            if (ip) expect(blocked.get(`${ip} ${target}`) ?? 0).toBeLessThanOrEqual(clock.now());
            leases.push({ id: out.grant.id, proxy, target });
          } else if (op.kind === 'block') {
            const l = leases[op.lease % Math.max(1, leases.length)];
            if (!l) continue;
            store.report(l.id, { result: 'blocked', cooldownSeconds: op.seconds });
            const ip = ipOf[l.proxy];
            const key = `${ip} ${l.target}`;
            if (ip) blocked.set(key, Math.max(blocked.get(key) ?? 0, clock.now() + op.seconds * 1000));
          } else if (op.kind === 'move') {
            ipOf[op.proxy] = IPS[op.ip];
            store.upsertProxy(info(op.proxy, IPS[op.ip]));
          } else {
            clock.advance(op.seconds * 1000);
          }
        }
      }),
      { seed: TEST_SEED, numRuns: 150 },
    );
    // A generator that stopped granting would prove nothing.
    expect(grants).toBeGreaterThan(1_000);
  });
});
