/**
 * The lease store's durable state and bounds: a checkpoint carries live leases, global and
 * per-target cooldowns and ended-but-reportable leases into a fresh store (the next process or
 * leader), expired cooldowns are purged by time, live leases and per-target cooldowns are
 * capped, a lease id stays reportable for 15 minutes after its end, and a draining proxy's
 * leases are not renewed past the drain deadline.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { parseLeaseState } from '../../../src/lease/durable.ts';
import { TooManyLeasesError } from '../../../src/lease/errors.ts';
import type { LeaseStoreOptions } from '../../../src/lease/options.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { LeaseGrant } from '../../../src/lease/types.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

const info = proxyInfo;

const stores: LeaseStore[] = [];
function store(clock: FakeClock, opts: LeaseStoreOptions = {}): LeaseStore {
  const s = new LeaseStore({ clock, ...opts });
  stores.push(s);
  return s;
}
afterEach(() => {
  for (const s of stores.splice(0)) s.close();
});

function grant(s: LeaseStore, req: Parameters<LeaseStore['lease']>[0] = {}): LeaseGrant {
  const out = s.lease(req);
  if (!out.granted) throw new Error(`expected a grant, got ${JSON.stringify(out.counts)}`);
  return out.grant;
}

/** What a restart does: the state goes through JSON text into a new store. */
function carry(from: LeaseStore): ReturnType<typeof parseLeaseState> {
  return parseLeaseState(JSON.stringify(from.exportState()));
}

describe('lease state survives a restart', () => {
  it('restores live leases, global and per-target cooldowns into a new store, fed before or after', () => {
    const clock = new FakeClock();
    const a = store(clock);
    for (const n of ['p1', 'p2', 'p3']) a.upsertProxy(info(n, { maxLeases: 1 }));
    const blocked = grant(a, { target: 'shop.example' });
    expect(a.report(blocked.id, { result: 'blocked', cooldownSeconds: 86_400 })).toBe(true);
    const failed = grant(a, { target: 'other.example' });
    expect(a.report(failed.id, { result: 'failed', cooldownSeconds: 3000 })).toBe(true);
    const live = grant(a, { target: 'news.example', ttlSeconds: 600 });
    const state = carry(a);

    clock.advance(1000);
    // The new process restores before the feed has delivered anything.
    const b = store(clock);
    expect(b.restoreState(state)).toEqual({ leases: 1, proxies: 2 });
    for (const n of ['p1', 'p2', 'p3']) b.upsertProxy(info(n, { maxLeases: 1 }));
    expect(b.activeLeases()).toBe(1);
    const byName = Object.fromEntries(b.snapshot({ target: 'shop.example' }).map((p) => [p.name, p]));
    expect(byName[blocked.proxy.name]?.reason).toBe('CoolingDownForTarget');
    expect(byName[failed.proxy.name]?.reason).toBe('CoolingDown');
    expect(byName[live.proxy.name]).toMatchObject({ activeLeases: 1, reason: 'AtCapacity' });
    // The live lease is renewable and releasable in the new process; capacity holds.
    expect(b.lease({ target: 'shop.example' }).granted).toBe(false);
    expect(b.renew(live.id, 60)).toBeDefined();
    expect(b.release(live.id)).toBe(true);
    expect(grant(b, { target: 'shop.example' }).proxy.name).toBe(live.proxy.name);

    // A store fed first, then restored, ends up the same.
    const c = store(clock);
    for (const n of ['p1', 'p2', 'p3']) c.upsertProxy(info(n, { maxLeases: 1 }));
    c.restoreState(state);
    expect(c.snapshot({ target: 'shop.example' }).map((p) => p.reason)).toEqual(
      b
        .snapshot({ target: 'shop.example' })
        .map((p) => (p.name === live.proxy.name ? 'AtCapacity' : p.reason)),
    );
  });

  it('skips what ended meanwhile and what belonged to a proxy recreated under the same name', () => {
    const clock = new FakeClock();
    const a = store(clock);
    a.upsertProxy(info('p1'));
    a.upsertProxy(info('p2'));
    const g1 = grant(a, { target: 't.example', ttlSeconds: 30 });
    a.report(g1.id, { result: 'blocked', cooldownSeconds: 60, release: false });
    const state = carry(a);
    clock.advance(61_000);
    const b = store(clock);
    b.upsertProxy(info('p1'));
    b.upsertProxy(info('p2'));
    b.restoreState(state);
    expect(b.activeLeases()).toBe(0);
    expect(b.snapshot().every((p) => p.targetCooldowns.length === 0)).toBe(true);

    const c = store(clock);
    c.upsertProxy(info(g1.proxy.name, { uid: 'recreated' }));
    c.restoreState({
      ...state,
      leases: state.leases.map((l) => [l[0], l[1], l[2], l[3], clock.now() + 1000]),
    });
    expect(c.activeLeases()).toBe(0);
  });

  it('refuses a damaged checkpoint whole, naming the field', () => {
    expect(() =>
      parseLeaseState('{"v":1,"at":1,"leases":[["id","k","u",null,"soon"]],"proxies":[],"ended":[]}'),
    ).toThrow(/leases\[0\]/);
    expect(() => parseLeaseState('{"v":2}')).toThrow(/version/);
    expect(() => parseLeaseState('not json')).toThrow(/JSON/);
  });
});

describe('bounded memory', () => {
  it('purges ended per-target cooldowns on the timer, without any request', () => {
    const clock = new FakeClock();
    const s = store(clock);
    s.upsertProxy(info('p1'));
    for (let i = 0; i < 50; i++) {
      const g = grant(s, { target: `site${i}.example` });
      s.report(g.id, { result: 'blocked', cooldownSeconds: 10 + i });
    }
    expect(s.targetCooldownCount()).toBe(50);
    clock.advance(35_000);
    // Read the count without a tick of its own: only the sweep timer has run.
    expect((s as unknown as { cooldowns: { targetCount: number } }).cooldowns.targetCount).toBe(24);
    clock.advance(60_000);
    expect((s as unknown as { cooldowns: { targetCount: number } }).cooldowns.targetCount).toBe(0);
  });

  it('caps per-target cooldowns, evicting the soonest-ending first and counting it', () => {
    const clock = new FakeClock();
    let evicted = 0;
    const s = store(clock, { maxTargetCooldowns: 3, onCooldownEvicted: () => evicted++ });
    s.upsertProxy(info('p1'));
    const seconds = [500, 100, 900, 300];
    seconds.forEach((sec, i) => {
      const g = grant(s, { target: `s${i}.example` });
      s.report(g.id, { result: 'blocked', cooldownSeconds: sec });
    });
    expect(evicted).toBe(1);
    expect(s.targetCooldownCount()).toBe(3);
    const targets = s.snapshot()[0]?.targetCooldowns.map((t) => t.target);
    expect(targets).toEqual(['s0.example', 's2.example', 's3.example']);
  });

  it('refuses grants past --max-active-leases with TooManyLeasesError', () => {
    const clock = new FakeClock();
    const s = store(clock, { maxActiveLeases: 2 });
    s.upsertProxy(info('p1'));
    const g = grant(s);
    grant(s);
    expect(() => s.lease({})).toThrow(TooManyLeasesError);
    s.release(g.id);
    expect(s.lease({}).granted).toBe(true);
  });
});

describe('reports after the fact and the drain deadline', () => {
  it('keeps a lease id reportable for 15 minutes after release or expiry, across a restart', () => {
    const clock = new FakeClock();
    const a = store(clock);
    a.upsertProxy(info('p1'));
    const released = grant(a, { target: 'late.example' });
    a.release(released.id);
    const expired = grant(a, { target: 'later.example', ttlSeconds: 10 });
    clock.advance(11_000);
    expect(a.activeLeases()).toBe(0);
    const b = store(clock);
    b.restoreState(carry(a));
    b.upsertProxy(info('p1'));
    clock.advance(14 * 60_000);
    expect(b.report(released.id, { result: 'blocked' })).toBe(true);
    expect(b.renew(released.id)).toBeUndefined();
    expect(b.snapshot({ target: 'late.example' })[0]?.reason).toBe('CoolingDownForTarget');
    clock.advance(60_000);
    expect(b.report(expired.id, { result: 'blocked' })).toBe(false);
  });

  it('does not renew a draining proxy lease past the drain timeout', () => {
    const clock = new FakeClock();
    const s = store(clock, { drainTimeoutMs: 10 * 60_000 });
    s.upsertProxy(info('p1'));
    const g = grant(s, { ttlSeconds: 3600 });
    clock.advance(60_000);
    s.upsertProxy(info('p1', { draining: true }));
    clock.advance(6 * 60_000);
    const r = s.renew(g.id, 3600);
    expect(r && Date.parse(r.expiresAt)).toBe(clock.now() + 4 * 60_000);
    // The drain start survives a restart: the deadline does not move.
    const b = store(clock, { drainTimeoutMs: 10 * 60_000 });
    b.restoreState(carry(s));
    b.upsertProxy(info('p1', { draining: true }));
    clock.advance(4 * 60_000 - 1);
    expect(b.renew(g.id, 60)).toBeDefined();
    clock.advance(1);
    expect(b.renew(g.id, 60)).toBeUndefined();
  });
});
