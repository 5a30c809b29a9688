/**
 * test/support/gateway/world — a gateway in this process over a real lease store, with real Squid
 * upstreams (each leaving from its own 127.0.0.x source address, so origins can tell them apart)
 * and real TLS and plain-HTTP origins; plus the clients the tests drive it with: curl, Python's
 * urllib and Debian's python3-requests, each given nothing but the gateway URL.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { trace } from '@opentelemetry/api';
import { Registry } from 'prom-client';
import { resolveEgressPolicy } from '../../../src/config/egress.ts';
import { Gateway, type GatewayOptions } from '../../../src/gateway/server.ts';
import { LeaseStoreChooser } from '../../../src/gateway/upstreams.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { EgressGuard } from '../../../src/provider/local/egress.ts';
import { systemClock } from '../../../src/runtime/clock.ts';
import { proxyInfo } from '../lease.ts';
import { type Origin, type OriginOptions, startHttpOrigin, startTlsOrigin, testPki } from '../origins.ts';
import { type Squid, startSquid } from '../squid.ts';

export const TOKEN = 'gw-test-token';
export const PYTHON = '/usr/bin/python3';

export interface World {
  gateway: Gateway;
  leases: LeaseStore;
  chooser: LeaseStoreChooser;
  registry: Registry;
  squids: Squid[];
  /** Upstream key (`crawl/sqN`) → the source address its traffic leaves from. */
  sourceOf: Map<string, string>;
  tls: Origin;
  http: Origin;
  caFile: string;
  /** `http://user:TOKEN@127.0.0.1:<port>` */
  url(user: string): string;
  close(): Promise<void>;
}

export interface WorldOptions {
  upstreams?: number;
  maxLeases?: number;
  origin?: OriginOptions;
  /** More ports the gateway's clients may reach (origins a test starts itself). */
  extraPorts?: number[];
  /** Gateway options over the world's (response rules, inspection). */
  gateway?: Pick<GatewayOptions, 'rules' | 'inspect' | 'log' | 'tracer'>;
}

export async function startWorld(opts: WorldOptions = {}): Promise<World> {
  const n = opts.upstreams ?? 3;
  const squids = await Promise.all(
    Array.from({ length: n }, (_, i) => startSquid({ outgoingAddress: `127.0.0.${11 + i}` })),
  );
  const [tls, http] = await Promise.all([startTlsOrigin(opts.origin), startHttpOrigin(opts.origin)]);
  const leases = new LeaseStore({ clock: systemClock });
  const sourceOf = new Map<string, string>();
  squids.forEach((s, i) => {
    leases.upsertProxy(
      proxyInfo(`sq${i + 1}`, {
        host: s.host,
        port: s.port,
        credentials: { username: s.username, password: s.password },
        maxLeases: opts.maxLeases ?? 0,
      }),
    );
    sourceOf.set(`crawl/sq${i + 1}`, `127.0.0.${11 + i}`);
  });
  const chooser = new LeaseStoreChooser(leases, systemClock);
  const registry = new Registry();
  const egress = new EgressGuard(
    resolveEgressPolicy({
      allowCIDRs: ['127.0.0.0/8'],
      connectPorts: [tls.port, http.port, ...(opts.extraPorts ?? [])],
    }),
  );
  const gateway = new Gateway({
    bind: { host: '127.0.0.1', port: 0 },
    token: TOKEN,
    chooser,
    egress,
    clock: systemClock,
    log: silentLogger(),
    registry,
    tracer: trace.getTracer('test'),
    limits: { upstreamTimeoutMs: 3000 },
    ...opts.gateway,
  });
  await gateway.listen();
  const dir = mkdtempSync(join(tmpdir(), 'gw-ca-'));
  const caFile = join(dir, 'ca.pem');
  writeFileSync(caFile, testPki().caCert);
  return {
    gateway,
    leases,
    chooser,
    registry,
    squids,
    sourceOf,
    tls,
    http,
    caFile,
    url: (user) => `http://${user}:${TOKEN}@127.0.0.1:${gateway.port}`,
    close: async () => {
      await gateway.close();
      leases.close();
      await Promise.all([...squids.map((s) => s.stop()), tls.close(), http.close()]);
    },
  };
}

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

export function run(cmd: string, args: string[], env: NodeJS.ProcessEnv = {}): Promise<RunResult> {
  return new Promise((resolve) => {
    execFile(
      cmd,
      args,
      { env: { PATH: process.env.PATH, ...env }, timeout: 60_000 },
      (err, stdout, stderr) => {
        const code = err ? ((err as { code?: number }).code ?? 1) : 0;
        resolve({ code: typeof code === 'number' ? code : 1, stdout, stderr });
      },
    );
  });
}

/**
 * A Python crawl: `count` GETs of `url` through the proxy in HTTP(S)_PROXY (urllib) or in
 * requests' own environment handling; prints one line per request: status and X-Peer.
 */
export function pythonCrawl(
  client: 'urllib' | 'requests',
  proxyUrl: string,
  url: string,
  count: number,
  caFile: string,
): Promise<RunResult> {
  const script =
    client === 'urllib'
      ? `
import ssl, sys, urllib.request, urllib.error
ctx = ssl.create_default_context(cafile=sys.argv[3])
opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))
for _ in range(int(sys.argv[2])):
    try:
        r = opener.open(sys.argv[1], timeout=20)
        print(r.status, r.headers.get('X-Peer'))
    except urllib.error.HTTPError as e:
        print(e.code, e.headers.get('X-Peer'))
`
      : `
import sys, requests
s = requests.Session()
for _ in range(int(sys.argv[2])):
    r = s.get(sys.argv[1], verify=sys.argv[3], timeout=20)
    print(r.status_code, r.headers.get('X-Peer'))
`;
  return run(PYTHON, ['-c', script, url, String(count), caFile], {
    HTTP_PROXY: proxyUrl,
    HTTPS_PROXY: proxyUrl,
    http_proxy: proxyUrl,
    https_proxy: proxyUrl,
  });
}

/** Lines of `status peer` → counts per peer among answers with `status`. */
export function peersOf(stdout: string, status = 204): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of stdout.trim().split('\n')) {
    const [code, peer] = line.split(' ');
    if (Number(code) !== status || !peer) continue;
    out.set(peer, (out.get(peer) ?? 0) + 1);
  }
  return out;
}

/**
 * Opens a CONNECT tunnel through the gateway by hand and resolves with the reply head and the
 * socket (left open, so a test can hold the tunnel).
 */
export function rawConnect(
  port: number,
  authority: string,
  proxyAuth: string,
): Promise<{ head: string; socket: import('node:net').Socket }> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port }, () => {
      socket.write(
        `CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\nProxy-Authorization: ${proxyAuth}\r\n\r\n`,
      );
    });
    let head = '';
    socket.on('data', function onData(d: Buffer) {
      head += d.toString('latin1');
      if (head.includes('\r\n\r\n')) {
        socket.off('data', onData);
        resolve({ head, socket });
      }
    });
    socket.on('error', reject);
  });
}

export const basic = (user: string, pass = TOKEN): string =>
  `Basic ${Buffer.from(`${user}:${pass}`).toString('base64')}`;
