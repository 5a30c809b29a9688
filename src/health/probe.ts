/**
 * health/probe — one health probe through one forward proxy (see docs/health.md): CONNECT
 * tunnel + TLS + GET for https URLs, an absolute-form GET for http URLs, bounded by one
 * deadline, classified into a fixed set of reasons. Raw sockets instead of node:http keep the
 * per-probe CPU low (every proxy is probed every second; docs/health.md, "Cost"), and TLS
 * sessions are resumed per origin through a small cache.
 * Messages name hosts, ports and statuses only: never credentials.
 */
import { isIP, type Socket, connect as tcpConnect } from 'node:net';
import {
  type ConnectionOptions,
  createSecureContext,
  type SecureContext,
  type TLSSocket,
  connect as tlsConnect,
} from 'node:tls';
import { redactUrl } from '../api/url.ts';
import { errorMessage } from '../log/errors.ts';

export const PROBE_REASONS = [
  'ConnectFailed',
  'ProxyAuthRequired',
  'ConnectRejected',
  'TLSFailed',
  'Timeout',
  'UnexpectedStatus',
] as const;
export type ProbeReason = (typeof PROBE_REASONS)[number];

export type ProbeResult =
  | { ok: true; latencyMs: number; status?: number }
  | { ok: false; reason: ProbeReason; message: string; latencyMs: number; status?: number };

export interface ProbeTarget {
  host: string;
  port: number;
  credentials?: { username: string; password: string };
}

export interface ProbeCheck {
  url: string;
  expectStatus: number;
  timeoutMs: number;
}

export interface ProbeOptions {
  /** Last TLS session per origin; reusing it roughly halves the handshake CPU. */
  tlsSessionCache?: TlsSessionCache;
  /** Extra trust anchors (tests, private origins); the system roots are used otherwise. */
  ca?: string | Buffer | Array<string | Buffer>;
  signal?: AbortSignal;
}

export type ProbeFn = (target: ProbeTarget, check: ProbeCheck, opts?: ProbeOptions) => Promise<ProbeResult>;
export type DirectProbeFn = (check: ProbeCheck, opts?: ProbeOptions) => Promise<ProbeResult>;

/** Keeps the most recent session per `host:port:servername`, bounded, oldest evicted first. */
export class TlsSessionCache {
  private readonly sessions = new Map<string, Buffer>();
  private readonly max: number;

  constructor(max = 10_000) {
    this.max = max;
  }

  get(key: string): Buffer | undefined {
    return this.sessions.get(key);
  }

  set(key: string, session: Buffer): void {
    this.sessions.delete(key);
    this.sessions.set(key, session);
    if (this.sessions.size > this.max) {
      const oldest = this.sessions.keys().next().value;
      if (oldest !== undefined) this.sessions.delete(oldest);
    }
  }

  get size(): number {
    return this.sessions.size;
  }
}

const MAX_HEADER_BYTES = 64 * 1024;
const USER_AGENT = 'egress-proxies-operator-health/1';

interface ParsedUrl {
  https: boolean;
  /** Host without IPv6 brackets, for connecting and certificate checks. */
  host: string;
  /** `host:port` as written in CONNECT and Host headers (IPv6 bracketed). */
  authority: string;
  port: number;
  path: string;
  /** The URL without userinfo, for absolute-form requests. */
  href: string;
  /** The URL as messages show it (api/url redactUrl: no userinfo, query or fragment). */
  shown: string;
}

const urlCache = new Map<string, ParsedUrl>();

/** Parses (and memoises: a fleet shares a handful of URLs) an http(s) probe URL. */
export function parseProbeUrl(raw: string): ParsedUrl {
  const hit = urlCache.get(raw);
  if (hit) return hit;
  const u = new URL(raw);
  if (u.protocol !== 'https:' && u.protocol !== 'http:') {
    throw new Error(`healthCheck.url: scheme must be http or https, got ${u.protocol}`);
  }
  const https = u.protocol === 'https:';
  const port = u.port ? Number(u.port) : https ? 443 : 80;
  const host = u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname;
  const hostForAuthority = isIP(host) === 6 ? `[${host}]` : host;
  const parsed: ParsedUrl = {
    https,
    host,
    authority: `${hostForAuthority}:${port}`,
    port,
    path: `${u.pathname || '/'}${u.search}`,
    href: `${u.protocol}//${hostForAuthority}${u.port ? `:${u.port}` : ''}${u.pathname}${u.search}`,
    shown: redactUrl(raw),
  };
  if (urlCache.size > 1000) urlCache.clear();
  urlCache.set(raw, parsed);
  return parsed;
}

function basicAuth(creds: { username: string; password: string }): string {
  return `Basic ${Buffer.from(`${creds.username}:${creds.password}`, 'utf8').toString('base64')}`;
}

/** Status code of a complete HTTP/1.x response head, or undefined when malformed. */
function statusOf(head: string): number | undefined {
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(head);
  return m ? Number(m[1]) : undefined;
}

const ignore = (): void => undefined;

class ProbeFailure extends Error {
  readonly reason: ProbeReason;
  readonly status: number | undefined;
  constructor(reason: ProbeReason, message: string, status?: number) {
    super(message);
    this.reason = reason;
    this.status = status;
  }
}

/**
 * Reads one response head from a socket. Bytes after the head are pushed back so a TLS
 * handshake on the same socket sees them (a proxy may coalesce its 200 with origin bytes).
 */
function readHead(socket: Socket, onEnd: () => ProbeFailure): Promise<{ status: number; head: string }> {
  return new Promise((resolve, reject) => {
    let buf: Buffer | undefined;
    const cleanup = () => {
      socket.off('data', onData);
      socket.off('end', onClose);
      socket.off('close', onClose);
      socket.off('error', onError);
    };
    const onData = (chunk: Buffer) => {
      buf = buf ? Buffer.concat([buf, chunk]) : chunk;
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) {
        if (buf.length > MAX_HEADER_BYTES) {
          cleanup();
          reject(new ProbeFailure('UnexpectedStatus', 'response headers too large'));
        }
        return;
      }
      cleanup();
      socket.pause();
      const head = buf.subarray(0, end).toString('latin1');
      const rest = buf.subarray(end + 4);
      if (rest.length > 0) socket.unshift(rest);
      const status = statusOf(head);
      if (status === undefined) reject(new ProbeFailure('UnexpectedStatus', 'malformed HTTP response'));
      else resolve({ status, head });
    };
    const onClose = () => {
      cleanup();
      reject(onEnd());
    };
    const onError = (err: Error) => {
      cleanup();
      reject(Object.assign(onEnd(), { cause: err }));
    };
    socket.on('data', onData);
    socket.once('end', onClose);
    socket.once('close', onClose);
    socket.once('error', onError);
    socket.resume();
  });
}

function tcp(
  sockets: Set<Socket>,
  host: string,
  port: number,
  failure: (code: string) => ProbeFailure,
): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = tcpConnect({ host, port, noDelay: true });
    sockets.add(s);
    // Late errors (after the probe settled) must not become uncaught exceptions.
    s.on('error', ignore);
    const onError = (err: NodeJS.ErrnoException) => reject(failure(err.code ?? err.message));
    s.once('error', onError);
    s.once('connect', () => {
      s.off('error', onError);
      resolve(s);
    });
  });
}

/**
 * Classical groups only. OpenSSL 3.5's default leads with a hybrid ML-KEM key share, which
 * costs ~0.2 ms CPU per handshake (≈20 % of a resumed probe); a probe carries no secret that
 * needs post-quantum protection. X25519 first, so no HelloRetryRequest with common servers.
 */
export const PROBE_ECDH_CURVES = 'X25519:P-256:P-384';

/**
 * tls.connect builds a fresh SecureContext (parsing every trust anchor) per call unless given
 * one: at a thousand probes a second that would dwarf the handshake itself.
 */
const contexts = new Map<ProbeOptions['ca'] | undefined, SecureContext>();
function secureContextFor(ca: ProbeOptions['ca']): SecureContext {
  let ctx = contexts.get(ca);
  if (!ctx) {
    ctx = createSecureContext(
      ca === undefined ? { ecdhCurve: PROBE_ECDH_CURVES } : { ca, ecdhCurve: PROBE_ECDH_CURVES },
    );
    if (contexts.size > 16) contexts.clear();
    contexts.set(ca, ctx);
  }
  return ctx;
}

function tls(
  sockets: Set<Socket>,
  socket: Socket | undefined,
  url: ParsedUrl,
  opts: ProbeOptions,
  viaProxy: boolean,
): Promise<TLSSocket> {
  const servername = isIP(url.host) ? undefined : url.host;
  const cacheKey = `${url.host}:${url.port}:${servername ?? ''}`;
  const options: ConnectionOptions = {
    host: url.host,
    port: url.port,
    servername,
    secureContext: secureContextFor(opts.ca),
    session: opts.tlsSessionCache?.get(cacheKey),
    ALPNProtocols: ['http/1.1'],
  };
  if (socket) options.socket = socket;
  return new Promise((resolve, reject) => {
    const s = tlsConnect(options);
    sockets.add(s);
    s.on('error', ignore);
    const cache = opts.tlsSessionCache;
    if (cache) s.on('session', (session: Buffer) => cache.set(cacheKey, session));
    const onError = (err: NodeJS.ErrnoException) => {
      const what = err.code ?? err.message;
      // Without a proxy a refused TCP connect is not a TLS problem.
      if (
        !viaProxy &&
        (err.code === 'ECONNREFUSED' || err.code === 'EHOSTUNREACH' || err.code === 'ENOTFOUND')
      ) {
        reject(new ProbeFailure('ConnectFailed', `connect to ${url.authority} failed: ${what}`));
      } else {
        reject(new ProbeFailure('TLSFailed', `TLS handshake with ${url.authority} failed: ${what}`));
      }
    };
    s.once('error', onError);
    s.once('secureConnect', () => {
      s.off('error', onError);
      resolve(s);
    });
  });
}

async function request(
  socket: Socket,
  url: ParsedUrl,
  absolute: boolean,
  proxyAuth?: string,
): Promise<number> {
  let req = `GET ${absolute ? url.href : url.path} HTTP/1.1\r\nHost: ${url.authority}\r\nUser-Agent: ${USER_AGENT}\r\nAccept: */*\r\nConnection: close\r\n`;
  if (proxyAuth) req += `Proxy-Authorization: ${proxyAuth}\r\n`;
  socket.write(`${req}\r\n`);
  const { status } = await readHead(
    socket,
    () => new ProbeFailure('UnexpectedStatus', `${url.shown} closed the connection without a response`),
  );
  return status;
}

/** Runs `body` under one deadline; every socket it opened is destroyed when it settles. */
async function withDeadline(
  check: ProbeCheck,
  signal: AbortSignal | undefined,
  body: (sockets: Set<Socket>) => Promise<number>,
): Promise<ProbeResult> {
  const start = performance.now();
  const sockets = new Set<Socket>();
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  const elapsed = () => Math.max(0, Math.round(performance.now() - start));
  const stop = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new ProbeFailure('Timeout', `no response within ${check.timeoutMs} ms`)),
      check.timeoutMs,
    );
    if (signal) {
      onAbort = () => reject(new ProbeFailure('Timeout', 'probe aborted'));
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
    }
  });
  stop.catch(() => undefined);
  const work = body(sockets);
  try {
    const status = await Promise.race([work, stop]);
    const latencyMs = elapsed();
    if (status !== check.expectStatus) {
      return {
        ok: false,
        reason: 'UnexpectedStatus',
        status,
        latencyMs,
        message: `expected status ${check.expectStatus}, got ${status}`,
      };
    }
    return { ok: true, latencyMs, status };
  } catch (err) {
    work.catch(() => undefined);
    if (err instanceof ProbeFailure) {
      const r: ProbeResult = { ok: false, reason: err.reason, message: err.message, latencyMs: elapsed() };
      if (err.status !== undefined) r.status = err.status;
      return r;
    }
    return {
      ok: false,
      reason: 'ConnectFailed',
      message: `probe failed: ${errorMessage(err)}`,
      latencyMs: elapsed(),
    };
  } finally {
    clearTimeout(timer);
    if (onAbort) signal?.removeEventListener('abort', onAbort);
    for (const s of sockets) s.destroy();
  }
}

/** The parsed probe URL, or the failed result a malformed one gives (probes never throw). */
function parseOrFail(raw: string): ParsedUrl | ProbeResult {
  try {
    return parseProbeUrl(raw);
  } catch (err) {
    return {
      ok: false,
      reason: 'UnexpectedStatus',
      message: `invalid probe URL: ${errorMessage(err)}`,
      latencyMs: 0,
    };
  }
}

/** Probes `check.url` through the forward proxy at `target`. Never throws. */
export function probe(target: ProbeTarget, check: ProbeCheck, opts: ProbeOptions = {}): Promise<ProbeResult> {
  const url = parseOrFail(check.url);
  if ('ok' in url) return Promise.resolve(url);
  const proxyAuth = target.credentials ? basicAuth(target.credentials) : undefined;
  const proxyName = `${isIP(target.host) === 6 ? `[${target.host}]` : target.host}:${target.port}`;
  return withDeadline(check, opts.signal, async (sockets) => {
    const raw = await tcp(
      sockets,
      target.host,
      target.port,
      (code) => new ProbeFailure('ConnectFailed', `connect to proxy ${proxyName} failed: ${code}`),
    );
    if (!url.https) {
      const status = await request(raw, url, true, proxyAuth);
      if (status === 407) {
        throw new ProbeFailure('ProxyAuthRequired', `proxy ${proxyName} answered GET with 407`, status);
      }
      return status;
    }
    let req = `CONNECT ${url.authority} HTTP/1.1\r\nHost: ${url.authority}\r\nUser-Agent: ${USER_AGENT}\r\n`;
    if (proxyAuth) req += `Proxy-Authorization: ${proxyAuth}\r\n`;
    raw.write(`${req}\r\n`);
    const { status } = await readHead(
      raw,
      () => new ProbeFailure('ConnectFailed', `proxy ${proxyName} closed the connection during CONNECT`),
    );
    if (status === 407) {
      throw new ProbeFailure('ProxyAuthRequired', `proxy ${proxyName} answered CONNECT with 407`, status);
    }
    if (status < 200 || status > 299) {
      throw new ProbeFailure(
        'ConnectRejected',
        `proxy ${proxyName} refused CONNECT ${url.authority} with ${status}`,
        status,
      );
    }
    const secure = await tls(sockets, raw, url, opts, true);
    return request(secure, url, false);
  });
}

/** The control probe: fetches `check.url` without any proxy, to tell "target down" apart. */
export function probeDirect(check: ProbeCheck, opts: ProbeOptions = {}): Promise<ProbeResult> {
  const url = parseOrFail(check.url);
  if ('ok' in url) return Promise.resolve(url);
  return withDeadline(check, opts.signal, async (sockets) => {
    if (!url.https) {
      const raw = await tcp(
        sockets,
        url.host,
        url.port,
        (code) => new ProbeFailure('ConnectFailed', `connect to ${url.authority} failed: ${code}`),
      );
      return request(raw, url, false);
    }
    const secure = await tls(sockets, undefined, url, opts, false);
    return request(secure, url, false);
  });
}
