/**
 * bench/gateway-peer — the far sides of the gateway benchmark, each run as its own process so
 * none bills its CPU to the gateway: `origin` (raw TCP: every "\n" received is answered with
 * 1 MiB), `stock <upstreamUrl>` (a stock proxy-chain gateway chaining to the upstream, the
 * comparison the targets name), `gateway <json>` (this project's gateway over a lease store
 * holding the one upstream, alone in its process so its memory is measured by itself: a line
 * `rss` on stdin is answered with its RSS after a GC), and `load <json>` (the load generator:
 * CONNECT set-up latency with one client, bulk throughput over many tunnels, or idle tunnels
 * held open). Servers print one JSON line with their port and exit when stdin closes.
 */
// The product's V8 settings, applied first as cmd/main does.
import '../src/runtime/v8-flags.ts';
import { type AddressInfo, connect, createServer, type Socket } from 'node:net';
import { createInterface } from 'node:readline';
import { trace } from '@opentelemetry/api';
import { Registry } from 'prom-client';
import { Server as ProxyChainServer } from 'proxy-chain';
import { resolveEgressPolicy } from '../src/config/egress.ts';
import { Gateway } from '../src/gateway/server.ts';
import { LeaseStoreChooser } from '../src/gateway/upstreams.ts';
import { LeaseStore } from '../src/lease/store.ts';
import { silentLogger } from '../src/log/index.ts';
import { EgressGuard } from '../src/provider/local/egress.ts';
import { systemClock } from '../src/runtime/clock.ts';

export const BODY_BYTES = 1024 * 1024;

export interface ProxyTarget {
  port: number;
  /** `Proxy-Authorization` value, or '' for none. */
  auth: string;
}

export interface LoadSpec {
  mode: 'latency' | 'bulk' | 'idle';
  proxy: ProxyTarget;
  /** `host:port` the tunnels go to (the bulk origin). */
  target: string;
  /** latency: CONNECTs; bulk/idle: tunnels. */
  count: number;
  durationMs: number;
}

function serveUntilStdinEnds(out: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(out)}\n`);
  process.stdin.resume();
  process.stdin.on('end', () => process.exit(0));
  process.stdin.on('close', () => process.exit(0));
}

function listen(server: import('node:net').Server): Promise<number> {
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => resolve((server.address() as AddressInfo).port)),
  );
}

async function origin(): Promise<void> {
  const body = Buffer.alloc(BODY_BYTES, 120);
  const server = createServer({ noDelay: true }, (s) => {
    s.on('error', () => undefined);
    s.on('data', (d: Buffer) => {
      for (let i = d.indexOf(10); i >= 0; i = d.indexOf(10, i + 1)) s.write(body);
    });
  });
  serveUntilStdinEnds({ port: await listen(server) });
}

async function stock(upstreamUrl: string): Promise<void> {
  const server = new ProxyChainServer({
    port: 0,
    host: '127.0.0.1',
    verbose: false,
    prepareRequestFunction: () => ({ upstreamProxyUrl: upstreamUrl }),
  });
  await server.listen();
  serveUntilStdinEnds({ port: server.port });
}

export interface GatewaySpec {
  upstreamPort: number;
  username: string;
  password: string;
  originPort: number;
  token: string;
}

async function gateway(spec: GatewaySpec): Promise<void> {
  const leases = new LeaseStore({ clock: systemClock });
  leases.upsertProxy({
    key: 'bench/upstream',
    namespace: 'bench',
    name: 'upstream',
    uid: 'u1',
    labels: {},
    phase: 'Ready',
    healthy: true,
    draining: false,
    deleting: false,
    maxLeases: 0,
    host: '127.0.0.1',
    port: spec.upstreamPort,
    credentials: { username: spec.username, password: spec.password },
  });
  const gw = new Gateway({
    bind: { host: '127.0.0.1', port: 0 },
    token: spec.token,
    chooser: new LeaseStoreChooser(leases, systemClock),
    egress: new EgressGuard(
      resolveEgressPolicy({ allowCIDRs: ['127.0.0.0/8'], connectPorts: [spec.originPort] }),
    ),
    clock: systemClock,
    log: silentLogger(),
    registry: new Registry(),
    tracer: trace.getTracer('bench'),
  });
  await gw.listen();
  process.stdout.write(`${JSON.stringify({ port: gw.port })}\n`);
  const lines = createInterface({ input: process.stdin });
  lines.on('line', (l) => {
    if (l !== 'rss') return;
    global.gc?.();
    const answer = { rss: process.memoryUsage().rss, open: gw.openConnections };
    process.stdout.write(`${JSON.stringify(answer)}\n`);
  });
  lines.on('close', () => process.exit(0));
}

/** One CONNECT; resolves with the socket once the proxy answered 200. */
export function openTunnel(proxy: ProxyTarget, target: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect({ host: '127.0.0.1', port: proxy.port, noDelay: true }, () => {
      const auth = proxy.auth ? `Proxy-Authorization: ${proxy.auth}\r\n` : '';
      s.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n${auth}\r\n`);
    });
    let head = '';
    const onData = (d: Buffer) => {
      head += d.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      s.off('data', onData);
      if (!head.startsWith('HTTP/1.1 200') && !head.startsWith('HTTP/1.0 200')) {
        s.destroy();
        return reject(new Error(`CONNECT answered ${head.split('\r\n')[0]}`));
      }
      resolve(s);
    };
    s.on('data', onData);
    s.on('error', reject);
  });
}

async function latency(spec: LoadSpec): Promise<Record<string, number>> {
  const times: number[] = [];
  for (let i = 0; i < spec.count; i++) {
    const t0 = performance.now();
    const s = await openTunnel(spec.proxy, spec.target);
    times.push(performance.now() - t0);
    s.destroy();
  }
  const warm = times.slice(Math.floor(times.length / 10)).sort((a, b) => a - b);
  return { p50Millis: warm[Math.floor(warm.length / 2)] ?? 0 };
}

/** Each tunnel asks for 1 MiB at a time and counts what arrives, for `durationMs`. */
async function bulk(spec: LoadSpec): Promise<Record<string, number>> {
  const tunnels = await Promise.all(
    Array.from({ length: spec.count }, () => openTunnel(spec.proxy, spec.target)),
  );
  let bytes = 0;
  let measuring = false;
  for (const s of tunnels) {
    let pending = BODY_BYTES;
    s.on('data', (d: Buffer) => {
      if (measuring) bytes += d.length;
      pending -= d.length;
      if (pending <= 0) {
        pending += BODY_BYTES;
        s.write('\n');
      }
    });
    s.write('\n');
  }
  await new Promise((r) => setTimeout(r, 500)); // warm-up
  measuring = true;
  const t0 = performance.now();
  await new Promise((r) => setTimeout(r, spec.durationMs));
  const seconds = (performance.now() - t0) / 1000;
  measuring = false;
  for (const s of tunnels) s.destroy();
  return { mbPerSecond: bytes / seconds / 1e6 };
}

async function idle(spec: LoadSpec): Promise<void> {
  const held: Socket[] = [];
  // In batches, so the listen backlog is never the limit.
  for (let i = 0; i < spec.count; i += 100) {
    const batch = Math.min(100, spec.count - i);
    held.push(
      ...(await Promise.all(Array.from({ length: batch }, () => openTunnel(spec.proxy, spec.target)))),
    );
  }
  process.stdout.write(`${JSON.stringify({ open: held.length })}\n`);
  process.stdin.resume();
  await new Promise((r) => process.stdin.once('end', r));
}

const [role, arg] = process.argv.slice(2);
if (role === 'origin') await origin();
else if (role === 'stock') await stock(arg ?? '');
else if (role === 'gateway') await gateway(JSON.parse(arg ?? '{}') as GatewaySpec);
else if (role === 'load') {
  const spec = JSON.parse(arg ?? '{}') as LoadSpec;
  if (spec.mode === 'idle') await idle(spec);
  else {
    const result = spec.mode === 'latency' ? await latency(spec) : await bulk(spec);
    process.stdout.write(`${JSON.stringify(result)}\n`);
    process.exit(0);
  }
}
