/**
 * The gateway's connections before they authenticate, in process over loopback: each has a
 * deadline from accept (silent, half a head or a 407 and nothing after, alike) and their own
 * cap, refused on accept when full, while connections that authenticated (a tunnel through a
 * local forward proxy to an origin, all in process) keep their place and their idle timeout. And the bookkeeping alone, on the fake clock.
 */
import type net from 'node:net';
import { trace } from '@opentelemetry/api';
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import { resolveEgressPolicy } from '../../../src/config/egress.ts';
import { type GatewayLimits, gatewayLimits, unauthenticatedCap } from '../../../src/gateway/context.ts';
import { Gateway } from '../../../src/gateway/server.ts';
import { UnauthenticatedConnections } from '../../../src/gateway/unauthenticated.ts';
import { LeaseStoreChooser } from '../../../src/gateway/upstreams.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { EgressGuard } from '../../../src/provider/local/egress.ts';
import { ForwardProxy } from '../../../src/provider/local/forward-proxy.ts';
import { systemClock } from '../../../src/runtime/clock.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';
import { openIdle } from '../../support/listeners.ts';
import { type Origin, startHttpOrigin } from '../../support/origins.ts';
import { until } from '../../support/wait.ts';

const TOKEN = 'unit-gateway-token';
const AUTH = `Proxy-Authorization: Basic ${Buffer.from(`crawler:${TOKEN}`).toString('base64')}\r\n`;

const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

const UPSTREAM = { username: 'up', password: 'up-pass' };

/**
 * A gateway over one real upstream (a local forward proxy in this process) and a plain-HTTP
 * origin, so a client can hold an authenticated tunnel.
 */
async function startGateway(
  limits: Partial<GatewayLimits>,
): Promise<{ gateway: Gateway; registry: Registry; origin: Origin }> {
  const origin = await startHttpOrigin();
  closers.push(() => origin.close());
  const upstream = new ForwardProxy({
    credentials: UPSTREAM,
    log: silentLogger(),
    egress: new EgressGuard(
      resolveEgressPolicy({ allowCIDRs: ['127.0.0.0/8'], connectPorts: [origin.port] }),
    ),
  });
  await upstream.listen(0, '127.0.0.1');
  closers.push(() => upstream.close());
  const leases = new LeaseStore({ clock: systemClock });
  leases.upsertProxy(proxyInfo('up1', { host: '127.0.0.1', port: upstream.port, credentials: UPSTREAM }));
  const registry = new Registry();
  const gateway = new Gateway({
    bind: { host: '127.0.0.1', port: 0 },
    token: TOKEN,
    chooser: new LeaseStoreChooser(leases, systemClock),
    egress: new EgressGuard(
      resolveEgressPolicy({ allowCIDRs: ['127.0.0.0/8'], connectPorts: [origin.port] }),
    ),
    clock: systemClock,
    log: silentLogger(),
    registry,
    tracer: trace.getTracer('test'),
    limits,
  });
  await gateway.listen();
  closers.push(() => leases.close());
  closers.push(() => gateway.close());
  return { gateway, registry, origin };
}

/** Reads from `socket` until `text` has arrived (resolves with all of it) or it closes (rejects). */
function readUntil(socket: net.Socket, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let got = '';
    const onClose = () => reject(new Error(`closed after ${JSON.stringify(got)}`));
    const onData = (b: Buffer) => {
      got += b.toString('latin1');
      if (!got.includes(text)) return;
      socket.off('data', onData).off('close', onClose);
      resolve(got);
    };
    socket.on('data', onData).once('close', onClose);
  });
}

/** A connection that opened an authenticated CONNECT tunnel to the origin. */
async function tunnel(
  port: number,
  origin: Origin,
): Promise<{ socket: net.Socket; closed: Promise<number> }> {
  const c = await idle(port);
  const answer = readUntil(c.socket, '\r\n\r\n');
  c.socket.write(
    `CONNECT 127.0.0.1:${origin.port} HTTP/1.1\r\nHost: 127.0.0.1:${origin.port}\r\n${AUTH}\r\n`,
  );
  expect(await answer).toMatch(/^HTTP\/1\.1 200/);
  return c;
}

/** A GET to the origin through an open tunnel: its status line. */
async function getThrough(socket: net.Socket): Promise<string> {
  const answer = readUntil(socket, '\r\n\r\n');
  socket.write('GET / HTTP/1.1\r\nHost: origin\r\n\r\n');
  return (await answer).split('\r\n')[0] as string;
}

async function idle(port: number): Promise<{ socket: net.Socket; closed: Promise<number> }> {
  const c = await openIdle(port);
  closers.push(() => void c.socket.destroy());
  return c;
}

async function closedCount(registry: Registry, reason: string): Promise<number> {
  const m = await registry.getSingleMetric('proxy_operator_gateway_connections_closed_total')?.get();
  return m?.values.find((v) => v.labels.reason === reason)?.value ?? 0;
}

describe('gateway: unauthenticated connections', () => {
  it('are closed at their deadline whatever they sent; authenticated ones stay', async () => {
    const { gateway, registry, origin } = await startGateway({ unauthenticatedTimeoutMs: 300 });
    const silent = await idle(gateway.port);
    const partial = await idle(gateway.port);
    partial.socket.write('CONNECT example.com:443 HTTP/1.1\r\nHost: exa');
    const ok = await tunnel(gateway.port, origin);
    let okClosed = false;
    void ok.closed.then(() => {
      okClosed = true;
    });
    for (const c of [silent, partial]) {
      const after = await c.closed;
      expect(after).toBeGreaterThanOrEqual(250);
      expect(after).toBeLessThan(5_000);
    }
    expect(await closedCount(registry, 'unauthenticated_timeout')).toBe(2);
    // Well past the deadline, the authenticated connection is still open and usable.
    await until('a second deadline to pass', async () => (await idle(gateway.port)).closed.then(() => true));
    expect(okClosed).toBe(false);
    expect(await getThrough(ok.socket)).toBe('HTTP/1.1 204 No Content');
  });

  it('have their own cap: refused on accept when full, authenticated clients unaffected', async () => {
    const { gateway, registry, origin } = await startGateway({
      maxConnections: 10,
      unauthenticatedMaxConnections: 2,
      unauthenticatedTimeoutMs: 30_000,
    });
    const ok = await tunnel(gateway.port, origin);
    const held = [await idle(gateway.port), await idle(gateway.port)];
    // The cap is reached: the next connection is closed at once, long before any deadline.
    const third = await idle(gateway.port);
    expect(await third.closed).toBeLessThan(5_000);
    expect(await closedCount(registry, 'unauthenticated_cap')).toBeGreaterThanOrEqual(1);
    expect(held.every((c) => !c.socket.destroyed)).toBe(true);
    // The authenticated tunnel goes on working, and a client that authenticates once there is
    // room gets a tunnel too.
    expect(await getThrough(ok.socket)).toBe('HTTP/1.1 204 No Content');
    // One leaves: a newcomer gets its place, and can authenticate.
    held[0]?.socket.destroy();
    await until('a new connection to be let in', async () => {
      const c = await idle(gateway.port);
      const closedSoon = await Promise.race([
        c.closed.then(() => true),
        new Promise((r) => setTimeout(r, 200, false)),
      ]);
      return !closedSoon;
    });
  });

  it('default to an eighth of the gateway cap, at most 1024', () => {
    expect(gatewayLimits().unauthenticatedMaxConnections).toBe(1024);
    expect(gatewayLimits({ maxConnections: 800 }).unauthenticatedMaxConnections).toBe(100);
    expect(
      gatewayLimits({ maxConnections: 800, unauthenticatedMaxConnections: 7 }).unauthenticatedMaxConnections,
    ).toBe(7);
    expect(unauthenticatedCap(3)).toBe(1);
  });
});

describe('UnauthenticatedConnections', () => {
  class Conn {
    destroyed = false;
    destroy(): void {
      this.destroyed = true;
    }
  }

  it('closes each at its deadline with one timer, in accept order; leaving clears it', () => {
    const clock = new FakeClock();
    const reasons: string[] = [];
    const u = new UnauthenticatedConnections<Conn>({
      cap: 10,
      timeoutMs: 1000,
      clock,
      onClose: (r) => reasons.push(r),
    });
    const [a, b, c] = [new Conn(), new Conn(), new Conn()];
    u.admit(a);
    clock.advance(400);
    u.admit(b);
    u.admit(c);
    u.leave(c);
    clock.advance(600);
    expect([a.destroyed, b.destroyed]).toEqual([true, false]);
    clock.advance(400);
    expect([b.destroyed, c.destroyed]).toEqual([true, false]);
    expect(reasons).toEqual(['timeout', 'timeout']);
    expect(u.size).toBe(0);
  });

  it('at the cap, closes the oldest for a newcomer', () => {
    const clock = new FakeClock();
    const counts: number[] = [];
    const u = new UnauthenticatedConnections<Conn>({
      cap: 2,
      timeoutMs: 1000,
      clock,
      onCount: (n) => counts.push(n),
    });
    const [a, b, c] = [new Conn(), new Conn(), new Conn()];
    u.admit(a);
    u.admit(b);
    u.admit(c);
    expect([a.destroyed, b.destroyed, c.destroyed]).toEqual([true, false, false]);
    expect(u.size).toBe(2);
    expect(counts.at(-1)).toBe(2);
  });
});
