/**
 * The gateway's timeouts and connection cap (docs/gateway.md, "Timeouts and limits"), with
 * small limits so each shows in well under a second: a client that never completes its request
 * head, or its body, is answered 408 and closed; an idle tunnel is closed and its lease let go,
 * while a tunnel carrying traffic outlives the idle timeout; past the cap a new connection is
 * closed on accept without an answer, and is served again once a connection has closed.
 */
import { afterEach, describe, expect, it } from 'vitest';
import {
  basic,
  type LocalWorld,
  openTunnel,
  rawClient,
  startLocalWorld,
} from '../../support/gateway/local-world.ts';
import { until } from '../../support/wait.ts';

let w: LocalWorld | undefined;
afterEach(async () => {
  await w?.close();
  w = undefined;
});

describe('gateway timeouts', () => {
  it('a connection that never sends a byte is closed after the header timeout', async () => {
    w = await startLocalWorld({ limits: { headersTimeoutMs: 300 } });
    const c = await rawClient(w.gateway.port);
    await until('the silent connection to be closed', () => c.isClosed(), 5000);
  });

  it('a request head sent one line at a time and never finished is answered 408 and closed', async () => {
    w = await startLocalWorld({ limits: { headersTimeoutMs: 300 } });
    const c = await rawClient(w.gateway.port);
    const target = `127.0.0.1:${w.echoPort}`;
    c.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n`);
    // Still trickling header lines: the timeout counts from the request's start, not the last line.
    const trickle = setInterval(() => c.write('X-Slow: 1\r\n'), 50);
    try {
      await until('the slow client to be closed', () => c.isClosed(), 5000);
    } finally {
      clearInterval(trickle);
    }
    expect(c.received()).toMatch(/^HTTP\/1\.1 408 /);
  });

  it('an authenticated request whose body stops arriving is answered 408 and closed', async () => {
    w = await startLocalWorld({ limits: { headersTimeoutMs: 300, requestTimeoutMs: 600 } });
    const c = await rawClient(w.gateway.port);
    c.write(
      `POST http://127.0.0.1:${w.httpPort}/up HTTP/1.1\r\nHost: 127.0.0.1:${w.httpPort}\r\n` +
        `Proxy-Authorization: ${basic('crawler')}\r\nContent-Length: 100\r\n\r\n0123456789`,
    );
    await until('the stalled upload to be closed', () => c.isClosed(), 5000);
    expect(c.received()).toMatch(/^HTTP\/1\.1 408 /);
    await until('its lease to be let go', () => w?.gateway.openConnections === 0);
  });

  it('an idle tunnel is closed and its lease let go', async () => {
    w = await startLocalWorld({ limits: { idleTimeoutMs: 400 } });
    const t = await openTunnel(w, 'p1');
    t.write('ping');
    await t.waitFor('ping');
    expect(w.gateway.openConnections).toBe(1);
    await until('the idle tunnel to be closed', () => t.isClosed(), 5000);
    await until('its lease to be let go', () => w?.gateway.openConnections === 0);
    expect(w.leases.snapshot().every((p) => p.activeLeases === 0)).toBe(true);
  });

  it('a tunnel carrying traffic stays open past the idle timeout', async () => {
    const idle = 1500;
    w = await startLocalWorld({ limits: { idleTimeoutMs: idle } });
    const t = await openTunnel(w, 'p1');
    const started = Date.now();
    // A message well within every idle period, each echoed before the next, for twice the timeout.
    for (let i = 0; Date.now() - started < 2 * idle; i++) {
      t.write(`m${i};`);
      await t.waitFor(`m${i};`);
      await until('a short pause', () => Date.now() - started >= (i + 1) * 150);
    }
    expect(t.isClosed()).toBe(false);
    t.socket.destroy();
  });
});

describe('gateway connection cap', () => {
  it('past the cap a new connection is closed on accept without an answer; a closed one makes room', async () => {
    w = await startLocalWorld({ limits: { maxConnections: 3 } });
    const world = w;
    const open = [
      await openTunnel(world, 'p1'),
      await openTunnel(world, 'p2'),
      await openTunnel(world, 'p1'),
    ];
    const extra = await rawClient(world.gateway.port);
    extra.write(
      `CONNECT 127.0.0.1:${world.echoPort} HTTP/1.1\r\nProxy-Authorization: ${basic('crawler')}\r\n\r\n`,
    );
    await until('the connection over the cap to be closed', () => extra.isClosed(), 5000);
    expect(extra.received()).toBe('');
    // The tunnels within the cap are untouched.
    for (const [i, t] of open.entries()) {
      t.write(`still-${i}`);
      await t.waitFor(`still-${i}`);
    }
    open[0]?.socket.destroy();
    await until('a new tunnel once one has closed', () => openTunnel(world, 'p2').catch(() => false), 5000);
    for (const t of open) t.socket.destroy();
  });
});
