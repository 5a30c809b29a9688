/**
 * test/support/gateway/local-world — a gateway in this process over a real lease store whose
 * upstreams are the local provider's forward proxies, also in this process (no Squid), so the
 * unit tier can drive the gateway's own behaviour — credentials, 100-continue, timeouts, the
 * connection cap, metrics — with raw node:net clients on loopback. The origins: a plain-HTTP
 * server that reads the whole body and says how many bytes it got (with any status asked for),
 * and a TCP echo server for tunnels.
 */
import http from 'node:http';
import net from 'node:net';
import { trace } from '@opentelemetry/api';
import { Registry } from 'prom-client';
import { resolveEgressPolicy } from '../../../src/config/egress.ts';
import type { GatewayLimits } from '../../../src/gateway/context.ts';
import { Gateway } from '../../../src/gateway/server.ts';
import { LeaseStoreChooser } from '../../../src/gateway/upstreams.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { EgressGuard } from '../../../src/provider/local/egress.ts';
import { ForwardProxy } from '../../../src/provider/local/forward-proxy.ts';
import { systemClock } from '../../../src/runtime/clock.ts';
import { proxyInfo } from '../lease.ts';
import { until } from '../wait.ts';
import { basic, TOKEN } from './world.ts';

export { basic, TOKEN };

export interface LocalWorld {
  gateway: Gateway;
  leases: LeaseStore;
  registry: Registry;
  /** One per upstream, in order; upstream i is `crawl/up<i+1>` in pool `p<i+1>`. */
  upstreams: ForwardProxy[];
  /**
   * Plain-HTTP origin: answers `got <n> bytes` once the whole request body has arrived, with
   * status 200, or `<code>` for the path `/status/<code>`.
   */
  httpPort: number;
  /** Requests the HTTP origin has seen (counted when their head arrives). */
  originRequests(): number;
  /** TCP echo origin for tunnels. */
  echoPort: number;
  close(): Promise<void>;
}

export interface LocalWorldOptions {
  upstreams?: number;
  limits?: Partial<GatewayLimits>;
}

function listen(server: net.Server): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve((server.address() as net.AddressInfo).port));
  });
}

export async function startLocalWorld(opts: LocalWorldOptions = {}): Promise<LocalWorld> {
  const originSockets = new Set<net.Socket>();
  let requests = 0;
  const origin = http.createServer((req, res) => {
    requests++;
    let n = 0;
    req.on('data', (d: Buffer) => {
      n += d.length;
    });
    const status = Number(/^\/status\/(\d{3})$/.exec(req.url ?? '')?.[1] ?? 200);
    req.on('end', () => res.writeHead(status, { 'Content-Type': 'text/plain' }).end(`got ${n} bytes`));
  });
  const echo = net.createServer((s) => {
    s.on('error', () => s.destroy());
    s.pipe(s);
  });
  for (const server of [origin, echo]) {
    server.on('connection', (s: net.Socket) => {
      originSockets.add(s);
      s.once('close', () => originSockets.delete(s));
    });
  }
  const [httpPort, echoPort] = await Promise.all([listen(origin), listen(echo)]);
  const policy = resolveEgressPolicy({ allowCIDRs: ['127.0.0.0/8'], connectPorts: [httpPort, echoPort] });
  const leases = new LeaseStore({ clock: systemClock });
  const upstreams: ForwardProxy[] = [];
  for (let i = 0; i < (opts.upstreams ?? 2); i++) {
    const credentials = { username: `up${i + 1}`, password: `pw${i + 1}` };
    const proxy = new ForwardProxy({ credentials, log: silentLogger(), egress: new EgressGuard(policy) });
    await proxy.listen(0, '127.0.0.1');
    upstreams.push(proxy);
    leases.upsertProxy(
      proxyInfo(`up${i + 1}`, {
        host: '127.0.0.1',
        port: proxy.port,
        credentials,
        labels: { pool: `p${i + 1}` },
      }),
    );
  }
  const registry = new Registry();
  const gateway = new Gateway({
    bind: { host: '127.0.0.1', port: 0 },
    token: TOKEN,
    chooser: new LeaseStoreChooser(leases, systemClock),
    egress: new EgressGuard(policy),
    clock: systemClock,
    log: silentLogger(),
    registry,
    tracer: trace.getTracer('test'),
    limits: { upstreamTimeoutMs: 3000, ...opts.limits },
  });
  await gateway.listen();
  return {
    gateway,
    leases,
    registry,
    upstreams,
    httpPort,
    originRequests: () => requests,
    echoPort,
    close: async () => {
      await gateway.close();
      leases.close();
      await Promise.all(upstreams.map((u) => u.close()));
      for (const s of originSockets) s.destroy();
      await Promise.all([origin, echo].map((s) => new Promise<void>((resolve) => s.close(() => resolve()))));
    },
  };
}

/** A raw TCP client on loopback that records every byte it receives and when it closed. */
export interface RawClient {
  socket: net.Socket;
  /** Everything received so far, as latin1. */
  received(): string;
  /** True once the other side closed the connection (or it errored). */
  isClosed(): boolean;
  /** Resolves once the connection has closed. */
  closed: Promise<void>;
  /** Waits until the received bytes contain `text`; returns everything received. */
  waitFor(text: string, timeoutMs?: number): Promise<string>;
  write(data: string | Buffer): void;
}

/** Connects to `port` on 127.0.0.1; resolves once connected. */
export function rawClient(port: number): Promise<RawClient> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: '127.0.0.1', port });
    let data = '';
    let ended = false;
    socket.on('data', (d: Buffer) => {
      data += d.toString('latin1');
    });
    const closed = new Promise<void>((done) =>
      socket.once('close', () => {
        ended = true;
        done();
      }),
    );
    socket.on('error', () => socket.destroy());
    socket.once('connect', () => {
      socket.off('error', reject);
      resolve({
        socket,
        received: () => data,
        isClosed: () => ended,
        closed,
        waitFor: (text, timeoutMs = 5000) =>
          until(`${JSON.stringify(text)} from the gateway`, () => data.includes(text) && data, {
            timeoutMs,
            failFast: () =>
              ended && !data.includes(text) ? `connection closed after ${JSON.stringify(data)}` : undefined,
          }),
        write: (d) => socket.write(d),
      });
    });
    socket.once('error', reject);
  });
}

/** Opens an authenticated CONNECT tunnel to the echo origin through `pool` (e.g. `p1`). */
export async function openTunnel(w: LocalWorld, pool: string): Promise<RawClient> {
  const c = await rawClient(w.gateway.port);
  const target = `127.0.0.1:${w.echoPort}`;
  c.write(
    `CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: ${basic(`crawler-pool-${pool}`)}\r\n\r\n`,
  );
  await c.waitFor('\r\n\r\n');
  if (!c.received().startsWith('HTTP/1.1 200 ')) throw new Error(`CONNECT refused: ${c.received()}`);
  return c;
}
