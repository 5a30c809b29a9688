/**
 * Model-based test of the lease store's views: random sequences of feed updates, health
 * verdicts, grants, renewals, releases, reports and clock moves run against the store and a
 * naive reference — every proxy in a list, filtered and sorted afresh on each call — and every
 * answer (grant or refusal counts, renew, report, snapshot with and without filters) must agree.
 * The store keeps incremental per-(namespace, selector) indexes; the model has none, so any
 * index left stale by some update shows up as a disagreement. Seeded (TEST_SEED).
 */
import fc from 'fast-check';
import { afterEach, describe, expect, it } from 'vitest';
import { LeaseInputError } from '../../../src/lease/errors.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import type {
  LeaseOutcome,
  NoneLeasableCounts,
  NotLeasableReason,
  ProxyInfo,
  ProxySnapshot,
} from '../../../src/lease/types.ts';
import { FakeClock } from '../../support/clock.ts';
import { TEST_SEED } from '../../support/random.ts';

const NAMES = ['a', 'b', 'c', 'd', 'e'];
const NAMESPACES = ['crawl', 'other'];
const TARGETS = ['a.example', 'b.example'];
/** Selector text and the naive reading of it. */
const SELECTORS: Array<[string, (l: Record<string, string>) => boolean]> = [
  ['tier=a', (l) => l.tier === 'a'],
  ['tier!=a', (l) => l.tier !== 'a'],
  ['tier in (a,b)', (l) => l.tier === 'a' || l.tier === 'b'],
  ['tier', (l) => l.tier !== undefined],
  ['!tier', (l) => l.tier === undefined],
];
const DEFAULT_TTL_S = 300;
const BLOCKED_COOLDOWN_S = 600;
const FAILED_COOLDOWN_S = 60;

interface MProxy {
  key: string;
  namespace: string;
  name: string;
  uid: string;
  labels: Record<string, string>;
  phase: string;
  healthy: boolean;
  fromVerdict: boolean;
  draining: boolean;
  deleting: boolean;
  maxLeases: number;
  host: string;
  port: number;
  latency: number | undefined;
  active: number;
  lastSeq: number;
  lastAt: number | undefined;
  globalUntil: number;
  targetUntil: Map<string, number>;
}

interface MLease {
  proxy: MProxy;
  target: string | undefined;
  expiresAt: number;
}

/** The reference: a list, scanned in full on every call. */
class Model {
  proxies = new Map<string, MProxy>();
  leases = new Map<string, MLease>();
  /** Released or expired leases, still reportable for 15 minutes. */
  ended = new Map<string, MLease & { endedAt: number }>();
  seq = 0;
  readonly clock: FakeClock;
  constructor(clock: FakeClock) {
    this.clock = clock;
  }

  expire(): void {
    const now = this.clock.now();
    for (const [id, l] of this.leases) {
      if (l.expiresAt <= now) this.drop(id);
    }
  }

  drop(id: string): void {
    const l = this.leases.get(id)!;
    l.proxy.active--;
    this.leases.delete(id);
    this.ended.set(id, { ...l, endedAt: this.clock.now() });
  }

  upsert(info: ProxyInfo): void {
    let p = this.proxies.get(info.key);
    if (!p || p.uid !== info.uid) {
      p = {
        key: info.key,
        namespace: info.namespace,
        name: info.name,
        uid: info.uid,
        labels: {},
        phase: '',
        healthy: false,
        fromVerdict: false,
        draining: false,
        deleting: false,
        maxLeases: 0,
        host: '',
        port: 0,
        latency: undefined,
        active: 0,
        lastSeq: 0,
        lastAt: undefined,
        globalUntil: 0,
        targetUntil: new Map(),
      };
      this.proxies.set(info.key, p);
    }
    p.labels = { ...info.labels };
    p.phase = info.phase;
    if (!p.fromVerdict) {
      p.healthy = info.healthy;
      if (info.latencyMillis !== undefined) p.latency = info.latencyMillis;
    }
    p.draining = info.draining;
    p.deleting = info.deleting;
    p.maxLeases = info.maxLeases;
    p.host = info.host;
    p.port = info.port;
  }

  setHealth(key: string, uid: string, healthy: boolean, latency: number | undefined): boolean {
    const p = this.proxies.get(key);
    if (!p || p.uid !== uid) return false;
    p.healthy = healthy;
    p.fromVerdict = true;
    if (latency !== undefined) p.latency = latency;
    return true;
  }

  reason(p: MProxy, target: string | undefined): NotLeasableReason | null {
    const now = this.clock.now();
    if (p.deleting) return 'Deleting';
    if (!(p.phase === 'Ready' || p.phase === 'Replacing') || p.host === '') return 'NotReady';
    if (!p.healthy) return 'Unhealthy';
    if (p.draining) return 'Draining';
    if (p.globalUntil > now) return 'CoolingDown';
    if (target !== undefined && (p.targetUntil.get(target) ?? 0) > now) return 'CoolingDownForTarget';
    if (p.maxLeases > 0 && p.active >= p.maxLeases) return 'AtCapacity';
    return null;
  }

  matching(ns: string | undefined, sel: number | undefined): MProxy[] {
    return [...this.proxies.values()].filter(
      (p) => (ns === undefined || p.namespace === ns) && (sel === undefined || SELECTORS[sel]![1](p.labels)),
    );
  }

  /** Least active leases, then least recently leased, then lowest latency, then name, namespace. */
  pick(ns: string | undefined, sel: number | undefined, target: string | undefined): MProxy | undefined {
    const order = (p: MProxy) => [p.active, p.lastSeq, p.latency ?? Number.POSITIVE_INFINITY] as const;
    return this.matching(ns, sel)
      .filter((p) => this.reason(p, target) === null)
      .sort((x, y) => {
        const [a, b] = [order(x), order(y)];
        for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i]! < b[i]! ? -1 : 1;
        if (x.name !== y.name) return x.name < y.name ? -1 : 1;
        return x.namespace < y.namespace ? -1 : x.namespace > y.namespace ? 1 : 0;
      })[0];
  }

  counts(ns: string | undefined, sel: number | undefined, target: string | undefined): NoneLeasableCounts {
    const all = this.matching(ns, sel).map((p) => this.reason(p, target));
    const ready = all.filter((r) => r !== 'NotReady' && r !== 'Deleting');
    const healthy = ready.filter((r) => r !== 'Unhealthy');
    const n = (r: NotLeasableReason) => healthy.filter((x) => x === r).length;
    return {
      matching: all.length,
      ready: ready.length,
      healthy: healthy.length,
      draining: n('Draining'),
      coolingDown: n('CoolingDown'),
      coolingDownForTarget: n('CoolingDownForTarget'),
      atCapacity: n('AtCapacity'),
    };
  }

  /** The earliest time a matching proxy is leasable by time alone: cooldown ends, expiries at full proxies. */
  retryAt(ns: string | undefined, sel: number | undefined, target: string | undefined): number | undefined {
    const now = this.clock.now();
    const times = this.matching(ns, sel).flatMap((p) => {
      const reason = this.reason(p, target);
      if (reason !== 'CoolingDown' && reason !== 'CoolingDownForTarget' && reason !== 'AtCapacity') return [];
      const ends = [now, p.globalUntil];
      const forTarget = target === undefined ? 0 : (p.targetUntil.get(target) ?? 0);
      if (forTarget > now) ends.push(forTarget);
      if (p.maxLeases > 0 && p.active >= p.maxLeases) {
        const expiries = [...this.leases.values()].filter((l) => l.proxy === p).map((l) => l.expiresAt);
        ends.push(Math.min(...expiries));
      }
      return [Math.max(...ends)];
    });
    return times.length === 0 ? undefined : Math.min(...times);
  }

  snapshot(ns: string | undefined, sel: number | undefined, target: string | undefined): ProxySnapshot[] {
    const now = this.clock.now();
    const iso = (ms: number) => new Date(ms).toISOString();
    return this.matching(ns, sel)
      .map((p) => {
        const reason = this.reason(p, target);
        return {
          namespace: p.namespace,
          name: p.name,
          phase: p.phase,
          healthy: p.healthy,
          draining: p.draining,
          deleting: p.deleting,
          host: p.host || null,
          egressIP: null,
          port: p.host ? p.port : null,
          latencyMillis: p.latency ?? null,
          activeLeases: p.active,
          maxLeases: p.maxLeases,
          lastLeasedAt: p.lastAt === undefined ? null : iso(p.lastAt),
          cooldownUntil: p.globalUntil > now ? iso(p.globalUntil) : null,
          targetCooldowns: [...p.targetUntil]
            .filter(([, until]) => until > now)
            .sort(([a], [b]) => (a < b ? -1 : 1))
            .map(([t, until]) => ({ target: t, until: iso(until) })),
          leasable: reason === null,
          reason,
          problem: null,
        };
      })
      .sort((a, b) => `${a.namespace}/${a.name}`.localeCompare(`${b.namespace}/${b.name}`));
  }
}

type Op =
  | {
      op: 'upsert';
      name: number;
      ns: number;
      gen: number;
      tier: string | undefined;
      phase: string;
      healthy: boolean;
      draining: boolean;
      deleting: boolean;
      maxLeases: number;
      addressed: boolean;
      latency: number | undefined;
    }
  | { op: 'remove'; name: number; ns: number }
  | { op: 'health'; name: number; ns: number; gen: number; healthy: boolean; latency: number | undefined }
  | {
      op: 'lease';
      ns: number | undefined;
      sel: number | undefined;
      target: number | undefined;
      ttl: number | undefined;
    }
  | { op: 'release'; lease: number }
  | { op: 'renew'; lease: number; ttl: number | undefined }
  | {
      op: 'report';
      lease: number;
      result: 'success' | 'blocked' | 'failed';
      cooldown: number | undefined;
      release: boolean;
    }
  | { op: 'advance'; ms: number };

const opt = <T>(a: fc.Arbitrary<T>) => fc.option(a, { nil: undefined });
const nameIdx = fc.integer({ min: 0, max: NAMES.length - 1 });
const nsIdx = fc.integer({ min: 0, max: NAMESPACES.length - 1 });

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      op: fc.constant('upsert' as const),
      name: nameIdx,
      ns: nsIdx,
      gen: fc.integer({ min: 0, max: 1 }),
      tier: opt(fc.constantFrom('a', 'b', 'c')),
      phase: fc.constantFrom('Ready', 'Ready', 'Ready', 'Replacing', 'Provisioning'),
      healthy: fc.constantFrom(true, true, true, false),
      draining: fc.constantFrom(false, false, false, true),
      deleting: fc.constantFrom(false, false, false, false, false, true),
      maxLeases: fc.integer({ min: 0, max: 2 }),
      addressed: fc.constantFrom(true, true, true, true, true, false),
      latency: opt(fc.integer({ min: 1, max: 3 })),
    }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('remove' as const), name: nameIdx, ns: nsIdx }) },
  {
    weight: 2,
    arbitrary: fc.record({
      op: fc.constant('health' as const),
      name: nameIdx,
      ns: nsIdx,
      gen: fc.integer({ min: 0, max: 1 }),
      healthy: fc.constantFrom(true, true, false),
      latency: opt(fc.integer({ min: 1, max: 3 })),
    }),
  },
  {
    weight: 6,
    arbitrary: fc.record({
      op: fc.constant('lease' as const),
      ns: opt(nsIdx),
      sel: opt(fc.integer({ min: 0, max: SELECTORS.length - 1 })),
      target: opt(fc.integer({ min: 0, max: TARGETS.length - 1 })),
      ttl: opt(fc.integer({ min: 1, max: 20 })),
    }),
  },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('release' as const), lease: fc.nat() }) },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant('renew' as const),
      lease: fc.nat(),
      ttl: opt(fc.integer({ min: 1, max: 20 })),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      op: fc.constant('report' as const),
      lease: fc.nat(),
      result: fc.constantFrom('success' as const, 'blocked' as const, 'failed' as const),
      cooldown: opt(fc.integer({ min: 1, max: 30 })),
      release: fc.boolean(),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({ op: fc.constant('advance' as const), ms: fc.integer({ min: 0, max: 15_000 }) }),
  },
);

const stats = { grants: 0, refusals: 0 };
const stores: LeaseStore[] = [];
afterEach(() => {
  for (const s of stores.splice(0)) s.close();
});

/** Runs one command on both sides and compares what each answers. */
function step(store: LeaseStore, model: Model, ids: string[], o: Op): void {
  const key = (name: number, ns: number) => `${NAMESPACES[ns]}/${NAMES[name]}`;
  const pickId = (i: number) => (ids.length === 0 ? 'no-such-lease' : ids[i % ids.length]!);
  if (o.op === 'advance') {
    model.clock.advance(o.ms);
    return;
  }
  model.expire();
  switch (o.op) {
    case 'upsert': {
      const info: ProxyInfo = {
        key: key(o.name, o.ns),
        namespace: NAMESPACES[o.ns]!,
        name: NAMES[o.name]!,
        uid: `uid-${o.gen}`,
        labels: o.tier === undefined ? {} : { tier: o.tier },
        phase: o.phase,
        healthy: o.healthy,
        draining: o.draining,
        deleting: o.deleting,
        maxLeases: o.maxLeases,
        host: o.addressed ? `10.0.0.${o.name + 1}` : '',
        port: 3128,
        ...(o.latency === undefined ? {} : { latencyMillis: o.latency }),
      };
      store.upsertProxy(info);
      model.upsert(info);
      return;
    }
    case 'remove':
      store.removeProxy(key(o.name, o.ns));
      model.proxies.delete(key(o.name, o.ns));
      return;
    case 'health': {
      const h = { healthy: o.healthy, ...(o.latency === undefined ? {} : { latencyMillis: o.latency }) };
      expect(store.setHealth(key(o.name, o.ns), `uid-${o.gen}`, h)).toBe(
        model.setHealth(key(o.name, o.ns), `uid-${o.gen}`, o.healthy, o.latency),
      );
      return;
    }
    case 'lease': {
      const ns = o.ns === undefined ? undefined : NAMESPACES[o.ns];
      const target = o.target === undefined ? undefined : TARGETS[o.target];
      const got: LeaseOutcome = store.lease({
        ...(ns === undefined ? {} : { namespace: ns }),
        ...(o.sel === undefined ? {} : { selector: SELECTORS[o.sel]![0] }),
        ...(target === undefined ? {} : { target }),
        ...(o.ttl === undefined ? {} : { ttlSeconds: o.ttl }),
      });
      const want = model.pick(ns, o.sel, target);
      if (!want) {
        stats.refusals++;
        expect(got).toEqual({
          granted: false,
          counts: model.counts(ns, o.sel, target),
          retryAt: model.retryAt(ns, o.sel, target),
        });
        return;
      }
      stats.grants++;
      if (!got.granted)
        throw new Error(`store refused ${JSON.stringify(got.counts)}; model grants ${want.key}`);
      const now = model.clock.now();
      expect(got.grant.proxy).toMatchObject({ namespace: want.namespace, name: want.name, host: want.host });
      expect(got.grant.target).toBe(target ?? null);
      expect(got.grant.expiresAt).toBe(new Date(now + (o.ttl ?? DEFAULT_TTL_S) * 1000).toISOString());
      model.seq++;
      want.active++;
      want.lastSeq = model.seq;
      want.lastAt = now;
      model.leases.set(got.grant.id, {
        proxy: want,
        target,
        expiresAt: now + (o.ttl ?? DEFAULT_TTL_S) * 1000,
      });
      ids.push(got.grant.id);
      return;
    }
    case 'release': {
      const id = pickId(o.lease);
      const live = model.leases.has(id);
      expect(store.release(id)).toBe(live);
      if (live) model.drop(id);
      return;
    }
    case 'renew': {
      const id = pickId(o.lease);
      const l = model.leases.get(id);
      const got = store.renew(id, o.ttl);
      if (!l) {
        expect(got).toBeUndefined();
        return;
      }
      l.expiresAt = model.clock.now() + (o.ttl ?? DEFAULT_TTL_S) * 1000;
      expect(got).toEqual({ id, expiresAt: new Date(l.expiresAt).toISOString() });
      return;
    }
    case 'report': {
      const id = pickId(o.lease);
      const cooldown = o.result === 'success' ? undefined : o.cooldown;
      const req = {
        result: o.result,
        release: o.release,
        ...(cooldown === undefined ? {} : { cooldownSeconds: cooldown }),
      };
      const live = model.leases.get(id);
      const past = model.ended.get(id);
      const l = live ?? (past && past.endedAt + 15 * 60_000 > model.clock.now() ? past : undefined);
      if (l && o.result === 'blocked' && l.target === undefined) {
        expect(() => store.report(id, req)).toThrow(LeaseInputError);
        return;
      }
      expect(store.report(id, req)).toBe(l !== undefined);
      if (!l) return;
      const now = model.clock.now();
      if (o.result === 'blocked') {
        const until = now + (cooldown ?? BLOCKED_COOLDOWN_S) * 1000;
        l.proxy.targetUntil.set(l.target!, Math.max(until, l.proxy.targetUntil.get(l.target!) ?? 0));
      } else if (o.result === 'failed') {
        l.proxy.globalUntil = Math.max(l.proxy.globalUntil, now + (cooldown ?? FAILED_COOLDOWN_S) * 1000);
      }
      if (live && o.release) model.drop(id);
      return;
    }
  }
}

function compareViews(store: LeaseStore, model: Model): void {
  model.expire();
  expect(store.activeLeases()).toBe(model.leases.size);
  for (const ns of [undefined, ...NAMESPACES]) {
    for (const sel of [undefined, 0, 3]) {
      for (const target of [undefined, TARGETS[0]]) {
        expect(
          store.snapshot({
            ...(ns === undefined ? {} : { namespace: ns }),
            ...(sel === undefined ? {} : { selector: SELECTORS[sel]![0] }),
            ...(target === undefined ? {} : { target }),
          }),
        ).toEqual(model.snapshot(ns, sel, target));
      }
    }
  }
}

describe('lease store views against a naive filter-and-sort model', () => {
  // hotTargetSkips 0 keeps a per-target view from the first skipped cooldown, so the path a
  // large fleet takes when most proxies cool down for a target is checked against the model too.
  it.each([
    ['plain views', undefined],
    ['per-target views', 0],
  ])('agree on every grant, refusal, renewal, report and snapshot (%s)', (_name, hotTargetSkips) => {
    fc.assert(
      fc.property(fc.array(opArb, { minLength: 1, maxLength: 150, size: 'max' }), (ops) => {
        const clock = new FakeClock();
        const store = new LeaseStore({ clock, ...(hotTargetSkips === undefined ? {} : { hotTargetSkips }) });
        stores.push(store);
        const model = new Model(clock);
        const ids: string[] = [];
        for (const o of ops) {
          step(store, model, ids, o);
          compareViews(store, model);
        }
        store.close();
      }),
      { seed: TEST_SEED, numRuns: 100 },
    );
    // Guard against a generator that drifts into refusing everything (a vacuous pass).
    expect(stats.grants).toBeGreaterThan(200);
  });
});
