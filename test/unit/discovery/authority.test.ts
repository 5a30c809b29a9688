/**
 * One lease authority behind several discovery listeners: a standby forwards every /v1 request
 * to the leader, so grants, renewals, reports and releases through either listener hit one
 * store; while no leader is known (or the leader is still restoring) the answer is 503
 * no_leader with Retry-After: 1; the cap on live leases answers 503 too_many_leases.
 */
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import { LeaseAuthority } from '../../../src/discovery/authority.ts';
import { type DiscoveryServer, startDiscoveryServer } from '../../../src/discovery/server.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { ProxyInfo } from '../../../src/lease/types.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

const TOKEN = 'authority-token-0123456789';

const info = (name: string): ProxyInfo => proxyInfo(name, { maxLeases: 1, host: '127.0.0.1' });

const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

interface Replica {
  server: DiscoveryServer;
  leases: LeaseStore;
  authority: LeaseAuthority;
  leading: { value: boolean };
}

async function replica(leaderUrl: () => string | undefined, maxActiveLeases = 100): Promise<Replica> {
  const leases = new LeaseStore({ clock: new FakeClock(Date.now()), maxActiveLeases });
  for (const n of ['p1', 'p2', 'p3']) leases.upsertProxy(info(n));
  const leading = { value: false };
  const authority = new LeaseAuthority({ leaderUrl, isLeader: () => leading.value });
  const server = await startDiscoveryServer({
    bindAddress: '127.0.0.1:0',
    leases,
    token: TOKEN,
    registry: new Registry(),
    authority,
  });
  closers.push(
    () => leases.close(),
    () => server.close(),
  );
  return { server, leases, authority, leading };
}

async function call(base: string, method: string, path: string, body?: unknown) {
  const res = await fetch(`${base}${path}`, {
    method,
    headers: {
      authorization: `Bearer ${TOKEN}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, body: text ? JSON.parse(text) : undefined };
}

describe('standby replicas forward to the leader', () => {
  it('serves every lease operation through either listener from the one leader store', async () => {
    let leaderUrl: string | undefined;
    const leader = await replica(() => undefined);
    leader.leading.value = true;
    leader.authority.startServing();
    const standby = await replica(() => leaderUrl);
    leaderUrl = leader.server.url;

    const granted = [];
    for (const base of [standby.server.url, leader.server.url, standby.server.url]) {
      const r = await call(base, 'POST', '/v1/leases', { target: 'shop.example', ttlSeconds: 60 });
      expect(r.status).toBe(201);
      granted.push(r.body as { id: string; proxy: { name: string } });
    }
    // Capacity is the leader's: three proxies with maxLeases 1, three grants, then 409 anywhere.
    expect(new Set(granted.map((g) => g.proxy.name)).size).toBe(3);
    expect((await call(standby.server.url, 'POST', '/v1/leases', {})).status).toBe(409);
    expect(leader.leases.activeLeases()).toBe(3);
    expect(standby.leases.activeLeases()).toBe(0);

    const [g0, g1, g2] = granted as unknown as [{ id: string }, { id: string }, { id: string }];
    expect(
      (await call(standby.server.url, 'POST', `/v1/leases/${g1.id}/renew`, { ttlSeconds: 30 })).status,
    ).toBe(200);
    const report = await call(standby.server.url, 'POST', `/v1/leases/${g0.id}/report`, {
      result: 'blocked',
    });
    expect(report).toMatchObject({ status: 200, body: { id: g0.id, released: true } });
    expect((await call(standby.server.url, 'DELETE', `/v1/leases/${g2.id}`)).status).toBe(204);
    expect(leader.leases.activeLeases()).toBe(1);
    // The blocked report is the leader's, so every later request for that site sees it.
    const listed = await call(standby.server.url, 'GET', '/v1/proxies?target=shop.example');
    const reasons = (listed.body as { proxies: { reason: string | null }[] }).proxies.map((p) => p.reason);
    expect(reasons.sort()).toEqual(['AtCapacity', 'CoolingDownForTarget', null].sort());
    // Auth is checked where the request lands.
    expect((await fetch(`${standby.server.url}/v1/proxies`)).status).toBe(401);
  });

  it('answers 503 no_leader with Retry-After: 1 while no leader is known or the leader restores', async () => {
    const standby = await replica(() => undefined);
    const r = await call(standby.server.url, 'POST', '/v1/leases', {});
    expect(r.status).toBe(503);
    expect(r.headers.get('retry-after')).toBe('1');
    expect(r.body).toMatchObject({ error: { code: 'no_leader' } });
    expect((await call(standby.server.url, 'GET', '/v1/proxies')).status).toBe(503);
    // Liveness and the probe target never depend on the leader.
    expect((await fetch(`${standby.server.url}/healthz`)).status).toBe(200);

    const restoring = await replica(() => undefined);
    restoring.leading.value = true;
    expect((await call(restoring.server.url, 'POST', '/v1/leases', {})).status).toBe(503);
    restoring.authority.startServing();
    expect((await call(restoring.server.url, 'POST', '/v1/leases', {})).status).toBe(201);

    // A leader address that does not answer is no leader either.
    const gone = await replica(() => 'http://127.0.0.1:9');
    const g = await call(gone.server.url, 'POST', '/v1/leases', {});
    expect(g).toMatchObject({ status: 503, body: { error: { code: 'no_leader' } } });
  });

  it('never forwards twice: two standbys naming each other answer no_leader', async () => {
    let aUrl: string | undefined;
    let bUrl: string | undefined;
    const a = await replica(() => bUrl);
    const b = await replica(() => aUrl);
    aUrl = a.server.url;
    bUrl = b.server.url;
    const r = await call(a.server.url, 'POST', '/v1/leases', {});
    expect(r).toMatchObject({ status: 503, body: { error: { code: 'no_leader' } } });
  });

  it('answers 503 too_many_leases at --max-active-leases, through a standby too', async () => {
    let leaderUrl: string | undefined;
    const leader = await replica(() => undefined, 1);
    leader.leading.value = true;
    leader.authority.startServing();
    const standby = await replica(() => leaderUrl);
    leaderUrl = leader.server.url;
    expect((await call(standby.server.url, 'POST', '/v1/leases', {})).status).toBe(201);
    const r = await call(standby.server.url, 'POST', '/v1/leases', {});
    expect(r).toMatchObject({ status: 503, body: { error: { code: 'too_many_leases' } } });
  });
});
