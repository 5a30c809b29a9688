/**
 * Gateway scale-out in one process: two replica choosers linked to one hub over a real lease
 * store. No upstream is ever over capacity counting both replicas and API leases; a block
 * reported through one replica is avoided by the other, and a rate limit keeps its own cooldown on
 * the way to the leader; a sticky session binds to the same
 * upstream on both; bad sync bodies are refused on the API's sync route naming the field.
 */

import { Registry } from 'prom-client';
import { Agent } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { LeaseAuthority } from '../../../src/discovery/authority.ts';
import { startDiscoveryServer } from '../../../src/discovery/server.ts';
import { gatewaySyncHandler } from '../../../src/gateway/cluster.ts';
import { GatewayHub } from '../../../src/gateway/hub.ts';
import { GatewayLink, leaderTransport } from '../../../src/gateway/link.ts';
import { ReplicaChooser } from '../../../src/gateway/replica.ts';
import { GatewaySessions } from '../../../src/gateway/service.ts';
import { SYNC_PATH } from '../../../src/gateway/share.ts';
import type { Acquired } from '../../../src/gateway/upstreams.ts';
import { DEFAULT_SESSION_TTL_SECONDS } from '../../../src/gateway/username.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { systemClock } from '../../../src/runtime/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

const routing = { sessionTtlSeconds: DEFAULT_SESSION_TTL_SECONDS };
const stops: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const s of stops.splice(0).reverse()) await s();
});

function cluster(maxLeases: number, upstreams = 3) {
  const leases = new LeaseStore({ clock: systemClock });
  for (let i = 1; i <= upstreams; i++) {
    leases.upsertProxy(
      proxyInfo(`up${i}`, { maxLeases, port: 3000 + i, labels: { pool: i === 3 ? 'us' : 'eu' } }),
    );
  }
  const authority = new LeaseAuthority({ leaderUrl: () => undefined, isLeader: () => true });
  authority.startServing();
  const hub = new GatewayHub({ leases, clock: systemClock, log: silentLogger(), isServing: () => true });
  const agent = new Agent();
  const abort = new AbortController();
  const replicas = [0, 1].map(() => {
    const replica = new ReplicaChooser(systemClock);
    const link = new GatewayLink({
      replica,
      transport: leaderTransport({ hub, authority, token: undefined, agent }),
      clock: systemClock,
      log: silentLogger(),
    });
    const running = link.run(abort.signal);
    stops.push(async () => {
      await running;
      replica.close();
    });
    return replica;
  });
  stops.push(async () => {
    abort.abort();
    hub.close();
    leases.close();
    await agent.close();
  });
  return { leases, hub, replicas };
}

/** The session report route as the leader runs it: its own gateway's sessions, then the hub's ask. */
function leaderSessions(hub: GatewayHub, own: ReplicaChooser): GatewaySessions {
  const sessions = new GatewaySessions((id, r, t) => hub.askSession(id, r, t));
  sessions.serve(own);
  return sessions;
}

describe('gateway replicas', () => {
  it('share capacity: all replicas plus API leases never exceed maxLeases', async () => {
    const { leases, replicas } = cluster(2);
    const [a, b] = replicas as [ReplicaChooser, ReplicaChooser];
    await expect.poll(() => a.ready && b.ready, { timeout: 10_000 }).toBe(true);
    const open: { r: ReplicaChooser; a: Acquired }[] = [];
    const inUse = () => {
      const n = new Map<string, number>();
      for (const o of open) n.set(o.a.upstream.key, (n.get(o.a.upstream.key) ?? 0) + 1);
      return n;
    };
    // Keep asking from both replicas until the fleet's 6 slots are all carrying connections.
    await expect
      .poll(
        async () => {
          for (const r of [a, b]) {
            const got = await r.acquire('example.com', routing);
            if (got.ok) open.push({ r, a: got.acquired });
          }
          return open.length;
        },
        { timeout: 20_000, interval: 50 },
      )
      .toBe(6);
    for (const [key, n] of inUse()) expect(n, key).toBeLessThanOrEqual(2);
    // The leader's store counts every one of them: an API client gets nothing.
    const refused = leases.lease({ target: 'example.com' });
    expect(refused.granted).toBe(false);
    for (const p of leases.snapshot()) expect(p.activeLeases).toBeLessThanOrEqual(2);
    // Closing connections on one replica lets the shares move: the other replica gets them.
    for (const o of open.filter((x) => x.r === a)) o.r.release(o.a);
    const before = open.filter((x) => x.r === b).length;
    await expect
      .poll(
        async () => {
          const got = await b.acquire('example.com', routing);
          if (got.ok) open.push({ r: b, a: got.acquired });
          return open.filter((x) => x.r === b).length;
        },
        { timeout: 20_000, interval: 100 },
      )
      .toBeGreaterThan(before);
    for (const p of leases.snapshot()) expect(p.activeLeases).toBeLessThanOrEqual(2);
  });

  it("a rate limit through a replica reaches the leader with the answer's cooldown", async () => {
    const { leases, replicas } = cluster(0);
    const [a] = replicas as [ReplicaChooser, ReplicaChooser];
    await expect.poll(() => a.ready, { timeout: 10_000 }).toBe(true);
    const got = await a.acquire('limits.example', routing);
    expect(got.ok).toBe(true);
    if (!got.ok) return;
    const started = Date.now();
    a.report(got.acquired, 'blocked', 45);
    a.release(got.acquired);
    await expect
      .poll(
        () =>
          leases
            .snapshot()
            .flatMap((p) => p.targetCooldowns)
            .find((c) => c.target === 'limits.example')?.until,
        { timeout: 10_000 },
      )
      .toBeDefined();
    const ends = leases
      .snapshot()
      .flatMap((p) => p.targetCooldowns)
      .filter((c) => c.target === 'limits.example')
      .map((c) => Date.parse(c.until) - started);
    expect(ends).toHaveLength(1);
    // 45 s, not the default 10 min of a block.
    expect(ends[0]).toBeGreaterThan(40_000);
    expect(ends[0]).toBeLessThanOrEqual(46_000);
  });

  it('a block through one replica is avoided by the other, for that site only', async () => {
    const { leases, replicas } = cluster(0);
    const [a, b] = replicas as [ReplicaChooser, ReplicaChooser];
    await expect.poll(() => a.ready && b.ready, { timeout: 10_000 }).toBe(true);
    const got = await a.acquire('blocks.example', { ...routing, selector: 'pool=eu' });
    expect(got.ok).toBe(true);
    if (!got.ok) return;
    const blocked = got.acquired.upstream.key;
    a.report(got.acquired, 'blocked');
    a.release(got.acquired);
    await expect
      .poll(() => leases.snapshot().find((p) => `crawl/${p.name}` === blocked)?.targetCooldowns.length, {
        timeout: 10_000,
      })
      .toBe(1);
    // b learns it from the hub's push, not from a lease per connection.
    await expect
      .poll(
        async () => {
          const seen = new Set<string>();
          for (let i = 0; i < 6; i++) {
            const g = await b.acquire('blocks.example', { ...routing, selector: 'pool=eu' });
            if (g.ok) {
              seen.add(g.acquired.upstream.key);
              b.release(g.acquired);
            }
          }
          return seen.has(blocked) ? 'still used' : [...seen].length;
        },
        { timeout: 10_000 },
      )
      .toBe(1);
    // Another site still gets it.
    const seen = new Set<string>();
    for (let i = 0; i < 6; i++) {
      const g = await b.acquire('other.example', { ...routing, selector: 'pool=eu' });
      if (g.ok) {
        seen.add(g.acquired.upstream.key);
        b.release(g.acquired);
      }
    }
    expect(seen.has(blocked)).toBe(true);
  });

  it('binds a sticky session to the same upstream on every replica', async () => {
    const { replicas } = cluster(0, 3);
    const [a, b] = replicas as [ReplicaChooser, ReplicaChooser];
    await expect.poll(() => a.ready && b.ready, { timeout: 10_000 }).toBe(true);
    await expect
      .poll(async () => {
        const ga = await a.acquire('s.example', { ...routing, session: 's1' });
        const gb = await b.acquire('s.example', { ...routing, session: 's1' });
        return ga.ok && gb.ok && ga.acquired.upstream.key === gb.acquired.upstream.key;
      })
      .toBe(true);
    for (const id of ['s2', 's3', 's4', 's5']) {
      const ga = await a.acquire('s.example', { ...routing, session: id });
      const gb = await b.acquire('s.example', { ...routing, session: id });
      expect(ga.ok && gb.ok && ga.acquired.upstream.key === gb.acquired.upstream.key, id).toBe(true);
    }
  });

  it('a new hub (a new leader) adopts the slot leases a replica holds instead of granting anew', async () => {
    const leases = new LeaseStore({ clock: systemClock });
    stops.push(async () => leases.close());
    leases.upsertProxy(proxyInfo('cap', { maxLeases: 2 }));
    const hub = (isServing = () => true) =>
      new GatewayHub({ leases, clock: systemClock, log: silentLogger(), isServing });
    const first = hub();
    const got = await first.sync({
      replica: 'r1',
      epoch: '',
      cursor: 0,
      waitMs: 0,
      want: { 'crawl/cap': 2 },
    });
    const slots = got.slots?.['crawl/cap'] ?? [];
    expect(slots).toHaveLength(2);
    expect(slots.every((x) => x.url.startsWith('http://'))).toBe(true);
    first.close();
    const second = hub();
    stops.push(async () => second.close());
    const again = await second.sync({
      replica: 'r1',
      epoch: got.epoch,
      cursor: got.cursor,
      waitMs: 0,
      held: { 'crawl/cap': slots.map((x) => x.id) },
      want: { 'crawl/cap': 2 },
    });
    expect(again.epoch).not.toBe(got.epoch);
    expect(again.full).toBe(true);
    expect(again.slots?.['crawl/cap']?.map((x) => x.id)).toEqual(slots.map((x) => x.id));
    expect(leases.activeLeases()).toBe(2);
    // Another replica gets nothing: the capacity is held.
    const other = await second.sync({
      replica: 'r2',
      epoch: '',
      cursor: 0,
      waitMs: 0,
      want: { 'crawl/cap': 1 },
    });
    expect(other.slots?.['crawl/cap']).toBeUndefined();
    expect(other.upstreams[0]?.contended).toBe(true);
  });

  it('a session report reaches the replica that knows the session', async () => {
    const { leases, hub, replicas } = cluster(0);
    const [a, b] = replicas as [ReplicaChooser, ReplicaChooser];
    await expect.poll(() => a.ready && b.ready, { timeout: 10_000 }).toBe(true);
    // The session's tunnels went through b only; the report reaches the leader, whose gateway is a.
    const got = await b.acquire('shop.example', { ...routing, session: 'far' });
    expect(got.ok).toBe(true);
    if (!got.ok) return;
    b.release(got.acquired);
    const sessions = leaderSessions(hub, a);
    const out = await sessions.report('far', 'blocked', undefined);
    expect(out).toEqual({ ok: true, upstream: got.acquired.upstream.key, target: 'shop.example' });
    await expect
      .poll(
        () =>
          leases
            .snapshot()
            .find((p) => `crawl/${p.name}` === got.acquired.upstream.key)
            ?.targetCooldowns.map((c) => c.target),
        { timeout: 10_000 },
      )
      .toEqual(['shop.example']);
    // A session nobody knows is a 404 once no replica answers.
    const none = await sessions.report('nobody', 'blocked', 'shop.example');
    expect(none).toMatchObject({ ok: false, status: 404 });
  });

  it('refuses a bad sync body naming the field, and changes nothing', async () => {
    const leases = new LeaseStore({ clock: systemClock });
    leases.upsertProxy(proxyInfo('up1', { maxLeases: 2 }));
    const hub = new GatewayHub({ leases, clock: systemClock, log: silentLogger(), isServing: () => true });
    stops.push(async () => {
      hub.close();
      leases.close();
    });
    const server = await startDiscoveryServer({
      bindAddress: '127.0.0.1:0',
      leases,
      registry: new Registry(),
      handlers: { gatewaySync: gatewaySyncHandler(hub) },
    });
    stops.push(() => server.close());
    const sync = async (body: unknown) => {
      const res = await fetch(`${server.url}${SYNC_PATH}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      return { status: res.status, body: (await res.json()) as { error?: { field?: string } } };
    };
    const base = { replica: 'r', epoch: '', cursor: 0, waitMs: 0 };
    for (const [body, field] of [
      [{ ...base, replica: 'a b' }, 'replica'],
      [{ ...base, want: { 'crawl/x': -1 } }, 'want["crawl/x"]'],
      [{ ...base, want: { nokey: 1 } }, 'want.nokey'],
      [{ ...base, reports: [{ upstream: 'crawl/up1', result: 'blocked' }] }, 'reports[0].target'],
      [{ ...base, reports: [{ upstream: 'crawl/up1', result: 'gone' }] }, 'reports[0].result'],
      [{ ...base, waitMs: 60_000 }, 'waitMs'],
      [{ replica: 'r' }, 'epoch'],
    ] as const) {
      const res = await sync(body);
      expect(res, JSON.stringify(body)).toMatchObject({ status: 400, body: { error: { field } } });
    }
    expect(leases.activeLeases()).toBe(0);
    const ok = await sync({ ...base, want: { 'crawl/up1': 1 } });
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({ full: true, slots: { 'crawl/up1': [expect.any(Object)] } });
  });
});
