/**
 * The per-target views (lease/view) and the refusal census (lease/census) are indexes, not
 * rules: a store that keeps target views from the first skipped cooldown must grant exactly what
 * a store that never keeps them grants, and every refusal's counts must equal a walk of the whole
 * fleet through the leasing rule, through blocks, failures, expiring cooldowns, health flips,
 * drains, relabels, releases and proxies coming and going.
 */
import fc from 'fast-check';
import { afterEach, describe, expect, it } from 'vitest';
import { type Entry, notLeasableReason } from '../../../src/lease/entry.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { NoneLeasableCounts, ProxyInfo } from '../../../src/lease/types.ts';
import { FakeClock } from '../../support/clock.ts';
import { TEST_SEED } from '../../support/random.ts';

const TARGETS = ['shop.example', 'news.example', 'maps.example'];

function info(i: number, healthy = true, change: { draining?: boolean; pool?: string } = {}): ProxyInfo {
  const name = `px-${String(i).padStart(3, '0')}`;
  return {
    key: `crawl/${name}`,
    namespace: 'crawl',
    name,
    uid: `uid-${name}`,
    labels: { pool: change.pool ?? (i % 2 ? 'odd' : 'even') },
    phase: 'Ready',
    healthy,
    draining: change.draining ?? false,
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
  | { kind: 'fail'; lease: number; seconds: number }
  | { kind: 'change'; proxy: number; draining: boolean; pool: 'odd' | 'even' }
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
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant('fail' as const),
      lease: fc.nat(),
      seconds: fc.integer({ min: 1, max: 90 }),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant('change' as const),
      proxy: fc.integer({ min: 0, max: 11 }),
      draining: fc.boolean(),
      pool: fc.constantFrom('odd' as const, 'even' as const),
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

/** A refusal counted the slow way: every proxy of `store` through the leasing rule. */
function refusalByWalk(store: LeaseStore, target: string, oddOnly: boolean): NoneLeasableCounts {
  const now = store.now();
  const c: NoneLeasableCounts = {
    matching: 0,
    ready: 0,
    healthy: 0,
    draining: 0,
    coolingDown: 0,
    coolingDownForTarget: 0,
    atCapacity: 0,
  };
  const entries: Entry[] = [...store.parts.fleet.all()].filter((e) => !oddOnly || e.labels.pool === 'odd');
  for (const e of entries) {
    c.matching++;
    const reason = notLeasableReason(e, target, now);
    if (reason === 'NotReady' || reason === 'Deleting') continue;
    c.ready++;
    if (reason === 'Unhealthy') continue;
    c.healthy++;
    if (reason === 'Draining') c.draining++;
    else if (reason === 'CoolingDown') c.coolingDown++;
    else if (reason === 'CoolingDownForTarget') c.coolingDownForTarget++;
    else if (reason === 'AtCapacity') c.atCapacity++;
  }
  return c;
}

const stores: LeaseStore[] = [];
let refusals = 0;
const reasonsSeen = new Set<string>();
afterEach(() => {
  for (const s of stores.splice(0)) s.close();
});

/** One store and the lease ids it granted, in order, so both sides address the same leases. */
function side(hotTargetSkips: number, fleet = 8) {
  const clock = new FakeClock();
  const store = new LeaseStore({ clock, hotTargetSkips });
  stores.push(store);
  // A small fleet, so blocked proxies soon reach the front of the grant order.
  for (let i = 0; i < fleet; i++) store.upsertProxy(info(i));
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
      if (!out.granted) {
        const target = TARGETS[op.target] ?? '';
        expect(out.counts, 'refusal counts vs a walk of the fleet').toEqual(
          refusalByWalk(s.store, target, op.selector),
        );
        refusals++;
        for (const [reason, n] of Object.entries(out.counts)) if (n > 0) reasonsSeen.add(reason);
        return { refused: out.counts };
      }
      s.leases.push(out.grant.id);
      return out.grant.proxy.name;
    }
    case 'block': {
      const id = s.leases[op.lease % Math.max(1, s.leases.length)];
      return id === undefined
        ? false
        : s.store.report(id, { result: 'blocked', cooldownSeconds: op.seconds });
    }
    case 'fail': {
      const id = s.leases[op.lease % Math.max(1, s.leases.length)];
      return id === undefined ? false : s.store.report(id, { result: 'failed', cooldownSeconds: op.seconds });
    }
    case 'change':
      s.store.upsertProxy(info(op.proxy, true, { draining: op.draining, pool: op.pool }));
      return null;
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

  it('refuse with the counts a walk of the whole fleet gives', () => {
    refusals = 0;
    fc.assert(
      fc.property(fc.array(opArb, { minLength: 20, maxLength: 300 }), (ops) => {
        // Two proxies to start with: refusals are common, for every reason the funnel knows.
        const indexed = side(0, 2);
        const walking = side(Number.MAX_SAFE_INTEGER, 2);
        for (const op of ops) expect(apply(indexed, op)).toEqual(apply(walking, op));
      }),
      { seed: TEST_SEED, numRuns: 300 },
    );
    expect(refusals).toBeGreaterThan(500);
    expect([...reasonsSeen].sort()).toEqual(
      [
        'atCapacity',
        'coolingDown',
        'coolingDownForTarget',
        'draining',
        'healthy',
        'matching',
        'ready',
      ].sort(),
    );
  });
});
