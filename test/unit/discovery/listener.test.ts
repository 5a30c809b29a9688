/**
 * The discovery API as a listener, over loopback: the DNS-rebinding guard of an API without a
 * token, HTTPS with a given certificate, and the header, idle and request timeouts and the
 * connection cap (small values, a real slow-header client).
 */
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import {
  type DiscoveryServer,
  type DiscoveryServerOptions,
  startDiscoveryServer,
} from '../../../src/discovery/server.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { selfSignedCertificate } from '../../../src/metrics/selfsigned.ts';
import { exchange, openIdle, send, slowHeaders } from '../../support/listeners.ts';
import { until } from '../../support/wait.ts';

const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

async function start(
  over: Partial<DiscoveryServerOptions> = {},
): Promise<DiscoveryServer & { port: number }> {
  const leases = new LeaseStore();
  const server = await startDiscoveryServer({
    bindAddress: '127.0.0.1:0',
    leases,
    registry: new Registry(),
    ...over,
  });
  closers.push(
    () => leases.close(),
    () => server.close(),
  );
  return Object.assign(server, { port: Number(new URL(server.url).port) });
}

describe('without a token: only loopback, bind-address and allowed Host names (DNS rebinding)', () => {
  it('refuses another Host with 403 in the documented shape, serves loopback names', async () => {
    const s = await start({ allowedHosts: ['proxies.internal', '.crawl.svc.cluster.local'] });
    const get = (host: string, path = '/v1/proxies') => send(`${s.url}${path}`, { headers: { host } });
    for (const host of [
      'attacker.example',
      `attacker.example:${s.port}`,
      '10.0.0.1',
      'localhost.attacker.example',
      'svc.cluster.local',
    ]) {
      const res = await get(host);
      expect(res.status, host).toBe(403);
      const body = JSON.parse(res.text) as { error: Record<string, string> };
      expect(body.error.code).toBe('forbidden_host');
      expect(Object.keys(body.error).sort()).toEqual(['code', 'message']);
      expect(res.text).not.toContain('attacker');
      expect((await get(host, '/openapi.json')).status).toBe(403);
      // Liveness and the probe target reveal nothing: served whatever the Host.
      expect((await get(host, '/healthz')).status).toBe(200);
      expect((await get(host, '/generate_204')).status).toBe(204);
    }
    for (const host of [
      `127.0.0.1:${s.port}`,
      '127.8.9.10',
      `localhost:${s.port}`,
      'LOCALHOST.',
      `[::1]:${s.port}`,
      'proxies.internal',
      'discovery.crawl.svc.cluster.local:8090',
    ]) {
      expect((await get(host)).status, host).toBe(200);
    }
  });

  it('serves a Host naming the bind address', async () => {
    const s = await start({ bindAddress: '127.0.0.2:0' });
    expect((await send(`${s.url}/v1/proxies`, { headers: { host: `127.0.0.2:${s.port}` } })).status).toBe(
      200,
    );
  });

  it('with a token, any Host is served (the token is the guard)', async () => {
    const s = await start({ token: 'tok-123' });
    const res = await send(`${s.url}/v1/proxies`, {
      headers: { host: 'api.example', authorization: 'Bearer tok-123' },
    });
    expect(res.status).toBe(200);
  });
});

describe('TLS', () => {
  it('serves HTTPS with the given certificate and key; plain HTTP is not answered', async () => {
    const tls = selfSignedCertificate();
    const s = await start({ tls, token: 'tok-123' });
    expect(s.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
    const res = await send(`${s.url}/v1/proxies`, {
      headers: { authorization: 'Bearer tok-123' },
      ca: tls.cert,
    });
    expect(res.status).toBe(200);
    expect(JSON.parse(res.text)).toEqual({ proxies: [] });
    const plain = await exchange(s.port, 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n', {
      timeoutMs: 5_000,
    });
    expect(plain.received).not.toContain('"status":"ok"');
  });
});

describe('timeouts and the connection cap', () => {
  const limits = { headersTimeoutMs: 300, requestTimeoutMs: 600, idleTimeoutMs: 400, maxConnections: 3 };

  it('closes a slow-header client after the header timeout, with 408 in the shape', async () => {
    const s = await start({ limits });
    const r = await slowHeaders(s.port, { everyMs: 50, timeoutMs: 5_000 });
    expect(r.received).toMatch(/^HTTP\/1\.1 408 /);
    expect(r.received).toContain('"code":"request_timeout"');
    // It kept sending header lines all along: only the head timeout can have ended it.
    expect(r.linesSent).toBeGreaterThan(2);
    expect(r.closedAfterMs).toBeLessThan(3_000);
  });

  it('closes a slow-header client over TLS too', async () => {
    const s = await start({ limits, tls: selfSignedCertificate() });
    const r = await slowHeaders(s.port, { everyMs: 50, timeoutMs: 5_000, tls: true });
    expect(r.closedAfterMs).toBeLessThan(3_000);
  });

  it('closes a connection that never sends a byte, plain and TLS', async () => {
    const plain = await start({ limits });
    expect(await (await openIdle(plain.port)).closed).toBeLessThan(3_000);
    const tls = await start({ limits, tls: selfSignedCertificate() });
    expect(await (await openIdle(tls.port)).closed).toBeLessThan(3_000);
  });

  it('closes a kept-alive connection left idle after a request', async () => {
    // Node adds a one-second buffer to the keep-alive timeout; the head timeouts are far beyond.
    const s = await start({ limits: { ...limits, headersTimeoutMs: 6_000, requestTimeoutMs: 6_000 } });
    const r = await exchange(s.port, 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n', {
      timeoutMs: 5_000,
    });
    expect(r.received).toMatch(/^HTTP\/1\.1 200 [\s\S]*"status":"ok"/);
    expect(r.closedAfterMs).toBeLessThan(5_000);
  });

  it('refuses connections beyond the cap and serves again once one closes', async () => {
    const s = await start({
      limits: { ...limits, idleTimeoutMs: 10_000, headersTimeoutMs: 5_000, requestTimeoutMs: 10_000 },
    });
    const held = await Promise.all([openIdle(s.port), openIdle(s.port), openIdle(s.port)]);
    const extra = await exchange(s.port, 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n', {
      timeoutMs: 5_000,
    });
    expect(extra.received).toBe('');
    held[0]?.socket.destroy();
    await until('a connection below the cap to be served', async () => {
      const res = await send(`${s.url}/healthz`).catch(() => undefined);
      return res?.status === 200;
    });
    for (const h of held) h.socket.destroy();
  });
});
