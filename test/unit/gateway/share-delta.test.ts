/**
 * Gateway sync answers are deltas: after the first answer a replica hears only the upstreams that
 * changed (and the removed ones) and only the slots that differ from what it holds, so an idle
 * sync costs the same bytes at any fleet size; replicas that followed the deltas know exactly
 * what a replica that just joined learns from one whole answer, and choose the same way.
 */
import { describe, expect, it } from 'vitest';
import { GatewayHub, REPLICA_TIMEOUT_MS } from '../../../src/gateway/hub.ts';
import { GatewayLink, type SyncTransport } from '../../../src/gateway/link.ts';
import { ReplicaChooser } from '../../../src/gateway/replica.ts';
import type { SyncAnswer, SyncRequest, UpstreamState } from '../../../src/gateway/share.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { ProxyInfo } from '../../../src/lease/types.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { FakeClock } from '../../support/clock.ts';
import { acquire, newLeader, newReplica, sync } from '../../support/gateway/in-process.ts';
import { proxyInfo } from '../../support/lease.ts';

function hubOver(fleet: ProxyInfo[]) {
  const clock = new FakeClock();
  const leases = new LeaseStore({ clock });
  for (const p of fleet) leases.upsertProxy(p);
  const hub = new GatewayHub({ leases, clock, log: silentLogger(), isServing: () => true });
  return {
    clock,
    leases,
    hub,
    close: () => {
      hub.close();
      leases.close();
    },
  };
}

const fleetOf = (n: number) =>
  Array.from({ length: n }, (_, i) =>
    proxyInfo(`p${i}`, { maxLeases: 4, labels: { pool: i % 2 ? 'a' : 'b' } }),
  );

/** A replica's view of the upstreams rebuilt from answers: whole lists replace it, deltas merge. */
function follow(view: Map<string, UpstreamState>, a: SyncAnswer): void {
  if (a.upstreamsFull !== false) view.clear();
  for (const u of a.upstreams) view.set(u.key, u);
  for (const key of a.removed ?? []) view.delete(key);
}

const wire = (a: SyncAnswer) => JSON.parse(JSON.stringify(a)) as SyncAnswer;

describe('gateway sync deltas', () => {
  it('an idle sync answers the same bytes at 10 and at 1,000 upstreams', async () => {
    const bytes: number[] = [];
    for (const n of [10, 1000]) {
      const { hub, close } = hubOver(fleetOf(n));
      const want = Object.fromEntries(fleetOf(n).map((p) => [p.key, 1]));
      const first = await hub.sync({
        replica: 'r1',
        epoch: '',
        cursor: 0,
        waitMs: 0,
        upstreamCursor: 0,
        want,
      });
      expect(first.upstreams).toHaveLength(n);
      expect(first.upstreamsFull).toBe(true);
      const held = Object.fromEntries(
        Object.entries(first.slots ?? {}).map(([k, s]) => [k, s.map((x) => x.id)]),
      );
      const base = {
        replica: 'r1',
        epoch: first.epoch,
        cursor: first.cursor,
        upstreamCursor: first.upstreamCursor,
      };
      // A share round that changes nothing, and a watch with nothing new.
      const round = await hub.sync({ ...base, waitMs: 0, want, held });
      expect(round).toMatchObject({ upstreams: [], upstreamsFull: false, slots: {}, slotsPartial: true });
      const watch = await hub.sync({ ...base, waitMs: 0 });
      expect(watch).toMatchObject({ upstreams: [], upstreamsFull: false, cooldowns: [] });
      // The counters' digits aside (they count changes, not proxies).
      bytes.push(JSON.stringify({ ...watch, epoch: '', upstreamCursor: 0, cursor: 0 }).length);
      close();
    }
    expect(bytes[1]).toBe(bytes[0]);
  });

  it('deltas rebuild exactly the whole answer: changes, removals, additions, health', async () => {
    const { leases, hub, clock, close } = hubOver(fleetOf(6));
    const ask = (r: Partial<SyncRequest>) =>
      hub.sync({ replica: 'r1', epoch: '', cursor: 0, waitMs: 0, ...r }).then(wire);
    const view = new Map<string, UpstreamState>();
    let a = await ask({ upstreamCursor: 0 });
    follow(view, a);
    const steps: (() => void)[] = [
      () => leases.upsertProxy(proxyInfo('p1', { maxLeases: 4, labels: { pool: 'c' } })),
      () => leases.removeProxy('crawl/p2'),
      () => leases.upsertProxy(proxyInfo('p9', { maxLeases: 1 })),
      () => leases.setHealth('crawl/p3', undefined, { healthy: false }),
      () => leases.upsertProxy(proxyInfo('p2', { maxLeases: 2 })),
      () => leases.upsertProxy(proxyInfo('p4', { maxLeases: 4, labels: { pool: 'b' }, draining: true })),
    ];
    for (const step of steps) {
      step();
      clock.advance(10);
      a = await ask({ epoch: a.epoch, cursor: a.cursor, upstreamCursor: a.upstreamCursor ?? 0 });
      expect(a.upstreamsFull).toBe(false);
      expect(a.upstreams.length + (a.removed?.length ?? 0)).toBeLessThanOrEqual(1);
      follow(view, a);
      const whole = await ask({});
      expect(whole.upstreamsFull).toBeUndefined();
      expect(new Map(whole.upstreams.map((u) => [u.key, u]))).toEqual(view);
    }
    close();
  });

  it('a latency that moves a little is not news; one that moves a lot is', async () => {
    const { leases, hub, close } = hubOver([proxyInfo('p0', { latencyMillis: 100 })]);
    const first = await hub.sync({ replica: 'r1', epoch: '', cursor: 0, waitMs: 0, upstreamCursor: 0 });
    const next = (c: number) =>
      hub.sync({ replica: 'r1', epoch: first.epoch, cursor: first.cursor, waitMs: 0, upstreamCursor: c });
    leases.setHealth('crawl/p0', undefined, { healthy: true, latencyMillis: 120 });
    expect((await next(first.upstreamCursor ?? 0)).upstreams).toEqual([]);
    leases.setHealth('crawl/p0', undefined, { healthy: true, latencyMillis: 450 });
    expect((await next(first.upstreamCursor ?? 0)).upstreams).toMatchObject([{ latencyMillis: 450 }]);
    close();
  });

  it("an idle replica's share rounds send and receive the same bytes at 10 and at 1,000 upstreams", async () => {
    const perRound: number[] = [];
    for (const n of [10, 1000]) {
      const { clock, leases, hub, close } = hubOver(fleetOf(n));
      const replica = new ReplicaChooser(clock);
      const sizes: number[] = [];
      const transport: SyncTransport = async (req) => {
        const answer = JSON.stringify(await hub.sync(req));
        // The counters' digits aside (they count changes, not proxies).
        const flat = (t: string) => t.replace(/"(cursor|upstreamCursor)":\d+/g, '"$1":0').length;
        sizes.push(flat(JSON.stringify(req)) + flat(answer));
        return JSON.parse(answer) as unknown;
      };
      const link = new GatewayLink({ replica, transport, clock, log: silentLogger() });
      for (let i = 0; i < 3; i++) expect(await link.syncOnce(new AbortController().signal)).toBe(true);
      // Every upstream usable here holds one slot for this replica.
      expect(leases.activeLeases()).toBe(n);
      sizes.length = 0;
      for (let i = 0; i < 3; i++) await link.syncOnce(new AbortController().signal);
      expect(new Set(sizes).size).toBe(1);
      perRound.push(sizes[0] as number);
      replica.close();
      close();
    }
    expect(perRound[1]).toBe(perRound[0]);
  });

  it('a delta share request the hub has no record for changes nothing; the whole share follows', async () => {
    const clock = new FakeClock();
    const leader = newLeader(clock, fleetOf(3));
    const r = newReplica(clock, () => leader);
    for (let i = 0; i < 2; i++) await sync(r);
    expect(leader.store.activeLeases()).toBe(3);
    // Silent past the timeout: the hub gives the share back and forgets the replica.
    clock.advance(REPLICA_TIMEOUT_MS + 2000);
    expect(leader.hub.replicaCount).toBe(0);
    expect(leader.store.activeLeases()).toBe(0);
    // Its next (delta) request finds no record: nothing granted from it, and the answer says so.
    await sync(r);
    expect(leader.store.activeLeases()).toBe(0);
    // The whole request that follows gets the share back.
    await sync(r);
    expect(leader.store.activeLeases()).toBe(3);
    expect(r.chooser.shares().map((s) => s.slots)).toEqual([1, 1, 1]);
    const got = await acquire(r, clock, 'shop.example');
    expect(got.ok).toBe(true);
    r.chooser.close();
    leader.hub.close();
    leader.store.close();
  });

  it('replicas that followed deltas choose like one that just joined', async () => {
    const clock = new FakeClock();
    const fleet = fleetOf(5);
    const leader = newLeader(clock, fleet);
    const old = newReplica(clock, () => leader);
    for (let i = 0; i < 2; i++) await sync(old);
    leader.store.upsertProxy(proxyInfo('p1', { maxLeases: 4, labels: { pool: 'gold' } }));
    leader.store.removeProxy('crawl/p3');
    leader.store.upsertProxy(proxyInfo('p7', { maxLeases: 4, labels: { pool: 'gold' } }));
    for (let i = 0; i < 2; i++) await sync(old);
    const fresh = newReplica(clock, () => leader);
    for (let i = 0; i < 2; i++) await sync(fresh);
    const keys = (r: typeof old) =>
      r.chooser
        .shares()
        .map((s) => s.upstream)
        .sort();
    expect(keys(old)).toEqual(keys(fresh));
    expect(keys(old)).not.toContain('crawl/p3');
    for (const r of [old, fresh]) {
      const picked = new Set<string>();
      for (let i = 0; i < 2; i++) {
        const got = await acquire(r, clock, 'shop.example', { selector: 'pool=gold' });
        if (!got.ok) throw new Error(got.message);
        picked.add(got.acquired.upstream.key);
      }
      expect([...picked].sort()).toEqual(['crawl/p1', 'crawl/p7']);
    }
    old.chooser.close();
    fresh.chooser.close();
    leader.hub.close();
    leader.store.close();
  });
});
