/**
 * The gateway when upstreams fail or fill up: a dead upstream costs no request (reported failed,
 * retried elsewhere), capacity is counted while a tunnel is open, and a tunnel client reports a
 * block through the discovery API's session route, which moves the session.
 */
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import { startDiscoveryServer } from '../../../src/discovery/server.ts';
import { GatewaySessions } from '../../../src/gateway/service.ts';
import {
  basic,
  peersOf,
  pythonCrawl,
  rawConnect,
  startWorld,
  type World,
} from '../../support/gateway/world.ts';

let w: World | undefined;
afterEach(async () => {
  await w?.close();
  w = undefined;
});

describe('gateway failures and capacity', () => {
  it('an upstream killed mid-crawl costs no failed request', async () => {
    w = await startWorld();
    const world = w;
    const crawl = pythonCrawl('urllib', world.url('crawler'), `${world.http.baseUrl}/`, 90, world.caFile);
    // Kill one upstream once the crawl is under way.
    await expect.poll(() => world.http.requests, { timeout: 20_000 }).toBeGreaterThan(15);
    await world.squids[1]!.stop();
    const r = await crawl;
    expect(r.stderr).toBe('');
    const lines = r.stdout.trim().split('\n');
    expect(lines).toHaveLength(90);
    expect(lines.every((l) => l.startsWith('204 '))).toBe(true);
    expect(world.leases.snapshot().find((p) => p.name === 'sq2')?.reason).toBe('CoolingDown');
    // TLS too: new tunnels never land on the dead upstream's address without a retry.
    const tls = await pythonCrawl('urllib', world.url('crawler'), `${world.tls.baseUrl}/`, 20, world.caFile);
    expect(peersOf(tls.stdout).get('127.0.0.12')).toBeUndefined();
    expect([...peersOf(tls.stdout).values()].reduce((a, b) => a + b, 0)).toBe(20);
  }, 90_000);

  it('a sticky session bound to a dead upstream moves on, and only then', async () => {
    w = await startWorld();
    const world = w;
    const first = await pythonCrawl(
      'requests',
      world.url('crawler-session-s9'),
      `${world.http.baseUrl}/`,
      5,
      world.caFile,
    );
    const [peer] = [...peersOf(first.stdout).keys()];
    const index = Number(peer?.split('.')[3]) - 11;
    await world.squids[index]!.stop();
    const after = await pythonCrawl(
      'requests',
      world.url('crawler-session-s9'),
      `${world.http.baseUrl}/`,
      20,
      world.caFile,
    );
    const peers = peersOf(after.stdout);
    expect([...peers.values()]).toEqual([20]);
    expect(peers.has(peer as string)).toBe(false);
  }, 60_000);

  it('capacity counts open tunnels: a full fleet answers 503, a closed tunnel frees a slot', async () => {
    w = await startWorld({ upstreams: 2, maxLeases: 1 });
    const authority = `127.0.0.1:${w.tls.port}`;
    const a = await rawConnect(w.gateway.port, authority, basic('crawler'));
    const b = await rawConnect(w.gateway.port, authority, basic('crawler'));
    expect(a.head).toMatch(/^HTTP\/1\.1 200/);
    expect(b.head).toMatch(/^HTTP\/1\.1 200/);
    expect(new Set([a.head, b.head]).size).toBe(2); // one tunnel per upstream
    const c = await rawConnect(w.gateway.port, authority, basic('crawler'));
    expect(c.head).toMatch(/^HTTP\/1\.1 503/);
    expect(c.head).toContain('2 at capacity');
    a.socket.destroy();
    const world = w;
    await expect.poll(() => world.leases.activeLeases()).toBe(1);
    const d = await rawConnect(w.gateway.port, authority, basic('crawler'));
    expect(d.head).toMatch(/^HTTP\/1\.1 200/);
    for (const s of [b, c, d]) s.socket.destroy();
  }, 60_000);

  it('POST /v1/sessions/{id}/report blocks the upstream for that site and moves the session', async () => {
    w = await startWorld();
    const world = w;
    const sessions = new GatewaySessions();
    sessions.serve(world.chooser);
    const api = await startDiscoveryServer({
      bindAddress: '127.0.0.1:0',
      leases: world.leases,
      registry: new Registry(),
      sessions,
    });
    try {
      const first = await pythonCrawl(
        'requests',
        world.url('crawler-session-t1'),
        `${world.tls.baseUrl}/`,
        3,
        world.caFile,
      );
      const [peer] = [...peersOf(first.stdout).keys()];
      const res = await fetch(`${api.url}/v1/sessions/t1/report`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ result: 'blocked' }),
      });
      expect(res.status).toBe(200);
      const body = (await res.json()) as { upstream: string; target: string };
      expect(body.target).toBe('127.0.0.1');
      expect(world.sourceOf.get(body.upstream)).toBe(peer);
      const next = await pythonCrawl(
        'requests',
        world.url('crawler-session-t1'),
        `${world.tls.baseUrl}/`,
        10,
        world.caFile,
      );
      const peers = peersOf(next.stdout);
      expect(peers.size).toBe(1);
      expect(peers.has(peer as string)).toBe(false);
      const unknown = await fetch(`${api.url}/v1/sessions/nope/report`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ result: 'blocked' }),
      });
      expect(unknown.status).toBe(404);
    } finally {
      await api.close();
    }
  }, 60_000);
});
