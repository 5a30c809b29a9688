/**
 * The per-target views (lease/view) are an index, not a rule: a store that keeps them from the
 * first skipped cooldown must grant exactly what a store that never keeps them grants, through
 * blocks, expiring cooldowns, health flips, releases and proxies coming and going.
 */
import fc from 'fast-check';
import { afterEach, describe, expect, it } from 'vitest';
import { LeaseStore, type ProxyInfo } from '../../src/lease/store.ts';
import { FakeClock } from '../support/clock.ts';
import { TEST_SEED } from '../support/random.ts';

const TARGETS = ['shop.example', 'news.example', 'maps.example'];

function info(i: number, healthy = true): ProxyInfo {
  const name = `px-${String(i).padStart(3, '0')}`;
  return {
    key: `crawl/${name}`,
    namespace: 'crawl',
    name,
    uid: `uid-${name}`,
    labels: { pool: i % 2 ? 'odd' : 'even' },
    phase: 'Ready',
    healthy,
    draining: false,
    deleting: false,
    maxLeases: i % 3 === 0 ? 2 : 0,
    host: `10.0.0.${i + 1}`,
    port: 3128,
    latencyMillis: 10 + (i % 7),
  };
}

type Op =
  | { kind: 'lease'; target: number; selector: boolean }
  | { kind: 'block'; lease: number; seconds: number }
  | { kind: 'release'; lease: number }
  | { kind: 'advance'; seconds: number }
  | { kind: 'health'; proxy: number; healthy: boolean }
  | { kind: 'add'; proxy: number }
  | { kind: 'remove'; proxy: number };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({
      kind: fc.constant('lease' as const),
      target: fc.integer({ min: 0, max: 2 }),
      selector: fc.boolean(),
    }),
  },
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant('block' as const),
      lease: fc.nat(),
      seconds: fc.integer({ min: 1, max: 120 }),
    }),
  },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('release' as const), lease: fc.nat() }) },
  {
    weight: 2,
    arbitrary: fc.record({ kind: fc.constant('advance' as const), seconds: fc.integer({ min: 0, max: 60 }) }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant('health' as const),
      proxy: fc.integer({ min: 0, max: 7 }),
      healthy: fc.boolean(),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({ kind: fc.constant('add' as const), proxy: fc.integer({ min: 8, max: 11 }) }),
  },
  {
    weight: 1,
    arbitrary: fc.record({ kind: fc.constant('remove' as const), proxy: fc.integer({ min: 0, max: 11 }) }),
  },
);

const stores: LeaseStore[] = [];
afterEach(() => {
  for (const s of stores.splice(0)) s.close();
});

/** One store and the lease ids it granted, in order, so both sides address the same leases. */
function side(hotTargetSkips: number) {
  const clock = new FakeClock();
  const store = new LeaseStore({ clock, hotTargetSkips });
  stores.push(store);
  // A small fleet, so blocked proxies soon reach the front of the grant order.
  for (let i = 0; i < 8; i++) store.upsertProxy(info(i));
  return { clock, store, leases: [] as string[] };
}

/** Applies one op; returns what a client would see (granted proxy, or refusal counts). */
function apply(s: ReturnType<typeof side>, op: Op): unknown {
  switch (op.kind) {
    case 'lease': {
      const out = s.store.lease({
        target: TARGETS[op.target],
        ...(op.selector ? { selector: 'pool=odd' } : {}),
      });
      if (!out.granted) return { refused: out.counts };
      s.leases.push(out.grant.id);
      return out.grant.proxy.name;
    }
    case 'block': {
      const id = s.leases[op.lease % Math.max(1, s.leases.length)];
      return id === undefined
        ? false
        : s.store.report(id, { result: 'blocked', cooldownSeconds: op.seconds });
    }
    case 'release': {
      const id = s.leases[op.lease % Math.max(1, s.leases.length)];
      return id === undefined ? false : s.store.release(id);
    }
    case 'advance':
      s.clock.advance(op.seconds * 1000);
      return null;
    case 'health':
      return s.store.setHealth(info(op.proxy).key, undefined, { healthy: op.healthy });
    case 'add':
      s.store.upsertProxy(info(op.proxy));
      return null;
    case 'remove':
      s.store.removeProxy(info(op.proxy).key);
      return null;
  }
}

describe('per-target lease views', () => {
  it('grant exactly what walking the whole view grants', () => {
    let grants = 0;
    fc.assert(
      fc.property(fc.array(opArb, { minLength: 20, maxLength: 300 }), (ops) => {
        const indexed = side(0);
        const walking = side(Number.MAX_SAFE_INTEGER);
        for (const op of ops) {
          const got = apply(indexed, op);
          expect(got).toEqual(apply(walking, op));
          if (typeof got === 'string') grants++;
        }
      }),
      { seed: TEST_SEED, numRuns: 150 },
    );
    // A generator that stopped granting would prove nothing.
    expect(grants).toBeGreaterThan(1_000);
  });
});
