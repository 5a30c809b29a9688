/**
 * test/support/origins — real origin servers on 127.0.0.1 (or another local address, such as the
 * KVM tier's bridge address) for probe tests: an HTTPS server with a certificate from a
 * throwaway CA (support/pki.ts: in process, once per process) and a plain HTTP server. Paths
 * choose the behaviour: `/status/<code>` answers that code, `/hang`
 * never answers, anything else answers `defaultStatus` — or, for a source address listed in
 * `statusBySource`, that status (a site blocking one egress IP). Every request's source address
 * is recorded in `sources`.
 */
import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { makePki } from './pki.ts';

export interface TestPki {
  /** PEM of the CA that signed the leaf: pass as `ca` to trust the TLS origin. */
  caCert: string;
  /** Leaf certificate + key for 127.0.0.1, localhost and TLS_ORIGIN_BRIDGE_ADDRESS. */
  cert: string;
  key: string;
}

let pki: TestPki | undefined;

/** The CI bridge's host address (scripts/ci/libvirt-up.sh), where VMs reach a TLS origin. */
export const TLS_ORIGIN_BRIDGE_ADDRESS = '198.51.100.1';

/** A CA and a leaf for 127.0.0.1/localhost/the bridge address, made once per process (in process). */
export function testPki(): TestPki {
  pki ??= makePki({
    caName: 'health-test-ca',
    dnsNames: ['localhost'],
    ipAddresses: ['127.0.0.1', TLS_ORIGIN_BRIDGE_ADDRESS],
    days: 2,
  });
  return pki;
}

export interface Origin {
  port: number;
  /** `https://127.0.0.1:<port>` or `http://…`, no trailing slash. */
  baseUrl: string;
  /** Status for paths other than /status/<n> and /hang; change it at will. */
  defaultStatus: number;
  /** Requests answered or held so far. */
  requests: number;
  /** The source address of every request, in arrival order (IPv4-mapped forms unwrapped). */
  sources: string[];
  /** Status for every path but /status/<n> and /hang from these source addresses. */
  statusBySource: Map<string, number>;
  /** TLS handshakes that resumed a session (https only). */
  resumedSessions: () => number;
  close(): Promise<void>;
}

/** What an origin may do per request besides the defaults. */
export interface OriginOptions {
  defaultStatus?: number;
  /** A status for requests from this source address to this host (e.g. 403 to one upstream's egress IP for one site). */
  statusFor?: (source: string, host: string) => number | undefined;
}

interface OriginState {
  defaultStatus: number;
  requests: number;
  sources: string[];
  statusBySource: Map<string, number>;
}

function handler(origin: OriginState, statusFor: OriginOptions['statusFor']) {
  return (req: IncomingMessage, res: ServerResponse) => {
    origin.requests++;
    const source = (req.socket.remoteAddress ?? '').replace(/^::ffff:(\d+\.\d+\.\d+\.\d+)$/, '$1');
    origin.sources.push(source);
    // The source address the request came from, so a client can tell which upstream carried it.
    res.setHeader('X-Peer', source);
    const path = req.url ?? '/';
    if (path.startsWith('/hang')) return; // held until the client gives up or close()
    const m = /^\/status\/(\d{3})/.exec(path);
    const host = (req.headers.host ?? '').replace(/:\d+$/, '');
    res.statusCode = m
      ? Number(m[1])
      : (origin.statusBySource.get(source) ?? statusFor?.(source, host) ?? origin.defaultStatus);
    res.setHeader('Connection', 'close');
    res.end();
  };
}

async function listen(server: import('node:net').Server, host = '127.0.0.1'): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => resolve());
  });
  return (server.address() as AddressInfo).port;
}

/** An HTTPS origin with the test CA's leaf certificate, on 127.0.0.1 unless `host` says otherwise. */
export async function startTlsOrigin(opts: OriginOptions & { host?: string } = {}): Promise<Origin> {
  const { cert, key } = testPki();
  const state: OriginState = {
    defaultStatus: opts.defaultStatus ?? 204,
    requests: 0,
    sources: [],
    statusBySource: new Map(),
  };
  let resumed = 0;
  const server = createHttpsServer({ cert, key }, handler(state, opts.statusFor));
  server.on('secureConnection', (s) => {
    if (s.isSessionReused()) resumed++;
  });
  const host = opts.host ?? '127.0.0.1';
  const port = await listen(server, host);
  return Object.assign(state, {
    port,
    baseUrl: `https://${host.includes(':') ? `[${host}]` : host}:${port}`,
    resumedSessions: () => resumed,
    close: () => closeServer(server),
  });
}

/** A plain HTTP origin, on 127.0.0.1 unless `host` says otherwise (`::1` for IPv6). */
export async function startHttpOrigin(opts: OriginOptions & { host?: string } = {}): Promise<Origin> {
  const state: OriginState = {
    defaultStatus: opts.defaultStatus ?? 204,
    requests: 0,
    sources: [],
    statusBySource: new Map(),
  };
  const server = createHttpServer(handler(state, opts.statusFor));
  const host = opts.host ?? '127.0.0.1';
  const port = await listen(server, host);
  return Object.assign(state, {
    port,
    baseUrl: `http://${host.includes(':') ? `[${host}]` : host}:${port}`,
    resumedSessions: () => 0,
    close: () => closeServer(server),
  });
}

function closeServer(server: import('node:http').Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}

/** A 127.0.0.1 port nobody listens on (bound, then released). */
export async function closedPort(): Promise<number> {
  const { createServer } = await import('node:net');
  const s = createServer();
  const port = await listen(s);
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}
