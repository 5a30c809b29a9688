/**
 * bench/gateway-peer — the far sides of the gateway benchmark, each run as its own process so
 * none bills its CPU to the gateway: `origin` (raw TCP: every "\n" received is answered with
 * 1 MiB), `stock <upstreamUrl>` (a stock proxy-chain gateway chaining to the upstream, the
 * comparison the targets name), `gateway <json>` (this project's gateway over a lease store
 * holding the one upstream, alone in its process so its memory is measured by itself: a line
 * `rss` on stdin is answered with its RSS after a GC), and `load <json>` (the load generator:
 * CONNECT set-up latency with one client, bulk throughput over many tunnels, or idle tunnels
 * held open). For the inspected path: `tls-origin <count>` (an HTTPS origin on 127.0.0.1 and
 * `count` more loopback addresses, so every new-host CONNECT goes to a host never seen: `GET
 * /small` answers 2 bytes, `GET /bulk` 1 MiB, keep-alive), `gateway` with `inspect` set (HTTPS
 * inspection with a CA in a directory of its own, trusting the origin's CA), and `load` in
 * `tls-latency` (CONNECT, TLS handshake and one small exchange, one client) or `tls-bulk` (1 MiB
 * bodies over many TLS tunnels) mode. Servers print one JSON line with their port and exit when
 * stdin closes.
 */
// The product's V8 settings, applied first as cmd/main does.
import '../src/runtime/v8-flags.ts';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer as createHttpsServer, type Server as HttpsServer } from 'node:https';
import { type AddressInfo, connect, createServer, isIP, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { type TLSSocket, connect as tlsConnect } from 'node:tls';
import { setFlagsFromString } from 'node:v8';
import { trace } from '@opentelemetry/api';
import { Registry } from 'prom-client';
import { Server as ProxyChainServer } from 'proxy-chain';
import { resolveEgressPolicy } from '../src/config/egress.ts';
import { FileCaStore, GatewayCa } from '../src/gateway/ca.ts';
import { Gateway } from '../src/gateway/server.ts';
import { LeaseStoreChooser } from '../src/gateway/upstreams.ts';
import { LeaseStore } from '../src/lease/store.ts';
import { silentLogger } from '../src/log/index.ts';
import { EgressGuard } from '../src/provider/local/egress.ts';
import { systemClock } from '../src/runtime/clock.ts';
import { makePki } from '../test/support/pki.ts';

export const BODY_BYTES = 1024 * 1024;

export interface ProxyTarget {
  port: number;
  /** `Proxy-Authorization` value, or '' for none. */
  auth: string;
}

export interface LoadSpec {
  mode: 'latency' | 'bulk' | 'idle' | 'tls-latency' | 'tls-bulk';
  proxy: ProxyTarget;
  /** `host:port` the tunnels go to (the bulk origin). */
  target: string;
  /** latency: CONNECTs; bulk/idle: tunnels. */
  count: number;
  durationMs: number;
  /** tls-*: the hosts to go to in turn (`target` is then only the port), and the CA file to trust. */
  hosts?: string[];
  caFile?: string;
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
  /** HTTPS inspection: the CA is made in `caDir` (its certificate is `caDir/ca.pem`); origins verified against `originCaFile`. */
  inspect?: { caDir: string; originCaFile: string; tlsOriginPort: number };
}

export interface TlsOriginInfo {
  port: number;
  /** 127.0.0.1 first, then the addresses new-host CONNECTs go to. */
  hosts: string[];
  caFile: string;
}

async function tlsOrigin(count: number): Promise<void> {
  const hosts = [
    '127.0.0.1',
    ...Array.from({ length: count }, (_, i) => `127.0.${1 + Math.floor(i / 250)}.${1 + (i % 250)}`),
  ];
  const pki = makePki({ caName: 'bench-origin-ca', dnsNames: ['localhost'], ipAddresses: hosts, days: 2 });
  const caFile = join(mkdtempSync(join(tmpdir(), 'bench-origin-')), 'ca.pem');
  writeFileSync(caFile, pki.caCert);
  const small = Buffer.from('ok');
  const big = Buffer.alloc(BODY_BYTES, 120);
  let port = 0;
  for (const host of hosts) {
    const server: HttpsServer = createHttpsServer(
      { cert: pki.cert, key: pki.key, keepAliveTimeout: 120_000, noDelay: true },
      (req, res) => {
        const body = req.url === '/bulk' ? big : small;
        res.writeHead(200, { 'Content-Type': 'application/octet-stream', 'Content-Length': body.length });
        res.end(body);
      },
    );
    port = await new Promise<number>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => resolve((server.address() as AddressInfo).port));
    });
  }
  serveUntilStdinEnds({ port, hosts, caFile } satisfies TlsOriginInfo);
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
      resolveEgressPolicy({
        allowCIDRs: ['127.0.0.0/8'],
        connectPorts: [spec.originPort, ...(spec.inspect ? [spec.inspect.tlsOriginPort] : [])],
      }),
    ),
    clock: systemClock,
    log: silentLogger(),
    registry: new Registry(),
    tracer: trace.getTracer('bench'),
    ...(spec.inspect
      ? {
          inspect: {
            ca: await GatewayCa.open(new FileCaStore(spec.inspect.caDir), Date.now),
            exclude: [],
            originCa: readFileSync(spec.inspect.originCaFile, 'utf8'),
          },
        }
      : {}),
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

/**
 * Reads HTTP/1.1 responses (with Content-Length) off `s`: `onBody` for every body byte count,
 * `onResponse` once a response is complete.
 */
function readResponses(s: TLSSocket, onBody: (n: number) => void, onResponse: () => void): void {
  let head = Buffer.alloc(0);
  let remaining = -1;
  s.on('data', (d: Buffer) => {
    let chunk = d;
    while (chunk.length > 0 || remaining === 0) {
      if (remaining < 0) {
        head = Buffer.concat([head, chunk]);
        const end = head.indexOf('\r\n\r\n');
        if (end < 0) return;
        remaining = Number(
          /content-length: *(\d+)/i.exec(head.subarray(0, end).toString('latin1'))?.[1] ?? 0,
        );
        chunk = head.subarray(end + 4);
        head = Buffer.alloc(0);
      }
      const take = Math.min(remaining, chunk.length);
      remaining -= take;
      onBody(take);
      chunk = chunk.subarray(take);
      if (remaining === 0) {
        remaining = -1;
        onResponse();
      }
    }
  });
}

/** A TLS session to `host:port` through `proxy`, trusting `ca`; resolves once the handshake is done. */
async function openTls(proxy: ProxyTarget, host: string, port: number, ca: string): Promise<TLSSocket> {
  const raw = await openTunnel(proxy, `${host}:${port}`);
  return new Promise((resolve, reject) => {
    const s = tlsConnect({ socket: raw, ca, host, ...(isIP(host) ? {} : { servername: host }) }, () =>
      resolve(s),
    );
    s.once('error', reject);
  });
}

const request = (host: string, path: string) => `GET ${path} HTTP/1.1\r\nHost: ${host}\r\n\r\n`;

/** CONNECT, TLS handshake and one small exchange on a new connection, one client, hosts in turn. */
async function tlsLatency(spec: LoadSpec): Promise<Record<string, number>> {
  const hosts = spec.hosts ?? [];
  const ca = readFileSync(spec.caFile ?? '', 'utf8');
  const port = Number(spec.target);
  const times: number[] = [];
  for (let i = 0; i < spec.count; i++) {
    const host = hosts[i % hosts.length] as string;
    const t0 = performance.now();
    const s = await openTls(spec.proxy, host, port, ca);
    await new Promise<void>((resolve) => {
      readResponses(s, () => undefined, resolve);
      s.write(request(host, '/small'));
    });
    times.push(performance.now() - t0);
    s.destroy();
  }
  const sorted = [...times].sort((a, b) => a - b);
  return { p50Millis: sorted[Math.floor(sorted.length / 2)] ?? 0 };
}

/** Each of `count` TLS tunnels to the first host asks for 1 MiB after 1 MiB, for `durationMs`. */
async function tlsBulk(spec: LoadSpec): Promise<Record<string, number>> {
  const host = spec.hosts?.[0] ?? '127.0.0.1';
  const ca = readFileSync(spec.caFile ?? '', 'utf8');
  const port = Number(spec.target);
  const tunnels = await Promise.all(
    Array.from({ length: spec.count }, () => openTls(spec.proxy, host, port, ca)),
  );
  let bytes = 0;
  let measuring = false;
  for (const s of tunnels) {
    s.on('error', () => undefined);
    readResponses(
      s,
      (n) => {
        if (measuring) bytes += n;
      },
      () => s.write(request(host, '/bulk')),
    );
    s.write(request(host, '/bulk'));
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
// The far sides keep V8's default accounting of Buffers, as they had before the product took it
// up (src/runtime/v8-flags.ts): direct is measured as it always was, only the gateway changed.
if (role !== 'gateway') setFlagsFromString('--no-external-memory-accounted-in-global-limit');
if (role === 'origin') await origin();
else if (role === 'stock') await stock(arg ?? '');
else if (role === 'tls-origin') await tlsOrigin(Number(arg ?? 0));
else if (role === 'gateway') await gateway(JSON.parse(arg ?? '{}') as GatewaySpec);
else if (role === 'load') {
  const spec = JSON.parse(arg ?? '{}') as LoadSpec;
  if (spec.mode === 'idle') await idle(spec);
  else {
    const run = { latency, bulk, 'tls-latency': tlsLatency, 'tls-bulk': tlsBulk }[spec.mode];
    const result = await run(spec);
    process.stdout.write(`${JSON.stringify(result)}\n`);
    process.exit(0);
  }
}
