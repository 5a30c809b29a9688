/**
 * provider/local/forward-proxy — one authenticated HTTP forward proxy listener: CONNECT tunnels
 * and absolute-form HTTP requests, each checked against the egress policy (local/egress) and sent
 * to the address that was checked; header, request and idle timeouts and a connection cap, so an
 * unauthenticated client cannot hold sockets open; every socket it opened tracked so closing the
 * listener really cuts every client off (a deleted proxy must stop carrying traffic at once).
 */
import http from 'node:http';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { Credentials } from '../../api/credentials.ts';
import { type LeaseCredentialsCheck, PROXY_AUTHENTICATE, proxyAuthChecker } from './auth.ts';
import { type DenialReason, EGRESS_POLICY_HEADER, EGRESS_REFUSAL, EgressGuard } from './egress.ts';

/** Timeouts and the connection cap of one listener (docs/providers/local.md). */
export interface ProxyLimits {
  /** Complete request headers must arrive within this long of the connection or request start. */
  headersTimeoutMs: number;
  /** A whole absolute-form request (headers and body) must arrive within this long. */
  requestTimeoutMs: number;
  /** A connection, or a tunnel, with no traffic either way for this long is closed. */
  idleTimeoutMs: number;
  /** Connections open at once per listener, tunnels included; more are dropped on accept. */
  maxConnections: number;
}

export const DEFAULT_PROXY_LIMITS: ProxyLimits = {
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 60_000,
  idleTimeoutMs: 120_000,
  maxConnections: 512,
};

/** Connections open at once across every local proxy of the process, unless the fd limit says less. */
export const DEFAULT_LOCAL_PROXIES_MAX_CONNECTIONS = 4096;

/**
 * A cap shared by many listeners: the local proxies are as many as there are Proxies, so a
 * per-listener cap alone cannot keep their sum under the process's file-descriptor limit.
 */
export class SharedConnectionCap {
  private taken = 0;
  readonly max: number;

  constructor(max: number) {
    this.max = max;
  }

  /** Connections holding a place now. */
  get open(): number {
    return this.taken;
  }

  /** Takes one connection's place; false at the cap. */
  take(): boolean {
    if (this.taken >= this.max) return false;
    this.taken++;
    return true;
  }

  give(): void {
    this.taken = Math.max(0, this.taken - 1);
  }
}

export interface ForwardProxyOptions {
  credentials: Credentials;
  /**
   * Per-lease credentials: asked on every request and CONNECT, so a lease that ended is refused
   * with 407 from the next one on (a tunnel already open may finish).
   */
  leaseCredentials?: LeaseCredentialsCheck;
  log: Logger;
  /** Give up on an origin that has not accepted the TCP connection after this long. */
  connectTimeoutMs?: number;
  /**
   * Opens every origin connection (tunnels and forwarded requests) to an address the egress
   * guard checked; tests substitute one that records or never connects.
   */
  dial?: (host: string, port: number, localAddress?: string) => net.Socket;
  /**
   * Source address of every origin connection (`local.egressAddresses`): the origin sees this
   * proxy leave from it. Targets are then dialled on an address of the same family.
   */
  localAddress?: string;
  /** What lease holders may reach. Default: the default policy, no operator ports known. */
  egress?: EgressGuard;
  /** Called once per refused request (metrics). */
  onDenied?: (reason: DenialReason) => void;
  /** Called when a connection over the cap is dropped (metrics). */
  onDropped?: () => void;
  limits?: Partial<ProxyLimits>;
  /** A cap this listener shares with others (every local proxy of the process). */
  sharedCap?: SharedConnectionCap;
}

const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;

/** Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), plus the proxy's own auth. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

export class ForwardProxy {
  private readonly server: http.Server;
  private readonly sockets = new Set<Duplex>();
  private readonly agent: http.Agent;
  private readonly authorized: (header: string | undefined) => boolean;
  private readonly log: Logger;
  private readonly connectTimeoutMs: number;
  private readonly dial: (host: string, port: number) => net.Socket;
  private readonly family: 4 | 6 | undefined;
  private readonly egress: EgressGuard;
  private readonly onDenied: (reason: DenialReason) => void;
  private readonly limits: ProxyLimits;
  private closed = false;

  constructor(opts: ForwardProxyOptions) {
    this.authorized = proxyAuthChecker(opts.credentials, opts.leaseCredentials);
    this.log = opts.log;
    this.connectTimeoutMs = opts.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
    const localAddress = opts.localAddress;
    const dial =
      opts.dial ??
      ((host: string, port: number, local?: string) =>
        net.connect({
          host,
          port,
          allowHalfOpen: true,
          ...(local === undefined ? {} : { localAddress: local }),
        }));
    this.dial = (host, port) => dial(host, port, localAddress);
    this.family = localAddress === undefined ? undefined : net.isIP(localAddress) === 6 ? 6 : 4;
    this.egress = opts.egress ?? new EgressGuard();
    this.onDenied = opts.onDenied ?? (() => undefined);
    const limits = { ...DEFAULT_PROXY_LIMITS, ...opts.limits };
    this.limits = limits;
    this.agent = new http.Agent({ keepAlive: true, maxFreeSockets: 16 });
    // Forwarded requests connect through `dial` too, to the address the guard checked.
    (this.agent as unknown as { createConnection: unknown }).createConnection = (o: net.TcpNetConnectOpts) =>
      this.dial(o.host as string, o.port);
    this.server = http.createServer({
      headersTimeout: limits.headersTimeoutMs,
      requestTimeout: limits.requestTimeoutMs,
      // Node checks both timeouts on this tick (30 s by default, longer than a header timeout).
      connectionsCheckingInterval: Math.max(10, Math.min(1000, Math.floor(limits.headersTimeoutMs / 4))),
    });
    this.server.timeout = limits.idleTimeoutMs;
    this.server.maxConnections = limits.maxConnections;
    this.server.on('drop', () => opts.onDropped?.());
    const shared = opts.sharedCap;
    this.server.on('connection', (s: net.Socket) => {
      if (shared) {
        if (!shared.take()) {
          opts.onDropped?.();
          return void s.destroy();
        }
        s.once('close', () => shared.give());
      }
      this.track(s);
    });
    this.server.on('connect', (req: http.IncomingMessage, socket: Duplex, head: Buffer) =>
      this.onConnect(req, socket, head),
    );
    this.server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) =>
      this.onRequest(req, res),
    );
    // Node would answer `Expect: 100-continue` before any check, inviting a client without
    // credentials to upload its body: such requests go to the same handler, which sends 100
    // only once the request is authenticated and allowed (forward).
    this.server.on('checkContinue', (req: http.IncomingMessage, res: http.ServerResponse) =>
      this.onRequest(req, res),
    );
    this.server.on('error', (err) => this.log.warn({ err }, 'local proxy listener error'));
  }

  /** Binds the listener; rejects with the raw listen error (EADDRINUSE and friends). */
  listen(port: number, host: string): Promise<void> {
    return new Promise((resolve, reject) => {
      const onError = (err: Error) => {
        this.server.off('listening', onListening);
        reject(err);
      };
      const onListening = () => {
        this.server.off('error', onError);
        resolve();
      };
      this.server.once('error', onError);
      this.server.once('listening', onListening);
      this.server.listen({ port, host, exclusive: true });
    });
  }

  /** The bound port (after listen). */
  get port(): number {
    const a = this.server.address();
    return typeof a === 'object' && a ? a.port : 0;
  }

  get listening(): boolean {
    return this.server.listening && !this.closed;
  }

  /** Client and origin sockets currently open through this listener. */
  get openSockets(): number {
    return this.sockets.size;
  }

  /** Stops listening and destroys every open client and origin socket. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const done = new Promise<void>((resolve) => {
      if (!this.server.listening) return resolve();
      this.server.close(() => resolve());
    });
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
    this.agent.destroy();
    await done;
  }

  private track(s: Duplex): void {
    if (this.closed) {
      s.destroy();
      return;
    }
    if (this.sockets.has(s)) return; // a keep-alive origin socket being reused
    this.sockets.add(s);
    s.once('close', () => this.sockets.delete(s));
  }

  private onConnect(req: http.IncomingMessage, client: Duplex, head: Buffer): void {
    client.on('error', () => client.destroy());
    if (!this.authorized(req.headers['proxy-authorization'])) {
      endRaw(client, 407, 'Proxy Authentication Required', [`Proxy-Authenticate: ${PROXY_AUTHENTICATE}`]);
      return;
    }
    const target = parseAuthority(req.url ?? '');
    if (!target) {
      endRaw(client, 400, 'Bad Request');
      return;
    }
    void this.egress.decide(target.host, target.port, undefined, this.family).then((d) => {
      if (client.destroyed) return;
      if (d.allowed) return this.tunnel(client, head, d.address, target.port, req.url ?? '');
      if (d.reason === 'unresolvable') {
        this.log.debug({ target: req.url, err: d.error }, 'tunnel target did not resolve');
        return endRaw(client, 502, 'Bad Gateway', [marker('origin-unresolvable')]);
      }
      this.denied(req.url ?? '', d.reason, d.rule);
      // The header too: curl shows a refused CONNECT's headers (-v) but never its body.
      endRaw(
        client,
        403,
        'Forbidden',
        [marker('egress-denied'), `${EGRESS_POLICY_HEADER}: ${d.rule}`],
        `${EGRESS_REFUSAL}: ${d.rule}\n`,
      );
    });
  }

  private denied(target: string, reason: DenialReason, rule: string): void {
    this.onDenied(reason);
    // Only authenticated clients get this far, so the line cannot be flooded anonymously.
    this.log.info({ target, reason }, 'egress denied');
    this.log.debug({ target, reason, rule }, 'egress denied by rule');
  }

  /** Connects the tunnel to the checked address and pipes both ways. */
  private tunnel(client: Duplex, head: Buffer, address: string, port: number, target: string): void {
    const upstream = this.dial(address, port);
    this.track(upstream);
    let established = false;
    const timer = setTimeout(() => {
      upstream.destroy();
      this.log.debug({ target }, 'tunnel connect timed out');
      endRaw(client, 504, 'Gateway Timeout', [marker('origin-timeout')]);
    }, this.connectTimeoutMs);
    upstream.once('connect', () => {
      clearTimeout(timer);
      established = true;
      if (client.destroyed) {
        upstream.destroy();
        return;
      }
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      // No request timeout for a tunnel (it lives as long as it is used), but no idling forever.
      for (const s of [client, upstream] as net.Socket[]) {
        s.setTimeout?.(this.limits.idleTimeoutMs, () => {
          client.destroy();
          upstream.destroy();
        });
      }
      if (head.length > 0) upstream.write(head);
      // pipe() ends the other side when one side ends, so a half-close travels through the
      // tunnel (both sockets are half-open capable) instead of tearing it down early.
      client.pipe(upstream);
      upstream.pipe(client);
    });
    upstream.on('error', (err) => {
      clearTimeout(timer);
      if (!established) {
        this.log.debug({ target, err }, 'tunnel connect failed');
        endRaw(client, 502, 'Bad Gateway', [marker('origin-unreachable')]);
      } else {
        client.destroy();
      }
    });
    // A side that closed after both directions finished is a graceful close; the other side
    // then finishes flushing on its own. Anything else (reset, destroy) cuts the tunnel.
    const cut = (self: Duplex, other: Duplex) =>
      !(other.writableEnded && other.readableEnded) || self.errored;
    client.once('close', () => {
      clearTimeout(timer);
      if (cut(client, upstream)) upstream.destroy();
    });
    upstream.once('close', () => {
      // Before the tunnel is up, the error/timeout path owns the client (it sends 502/504).
      if (established && cut(upstream, client)) client.destroy();
    });
  }

  private onRequest(req: http.IncomingMessage, res: http.ServerResponse): void {
    if (!this.authorized(req.headers['proxy-authorization'])) {
      res.writeHead(407, { 'Proxy-Authenticate': PROXY_AUTHENTICATE, 'Content-Length': '0' }).end();
      return;
    }
    let url: URL;
    try {
      url = new URL(req.url ?? '');
    } catch {
      return void plain(res, 400, 'absolute-form request URL required');
    }
    if (url.protocol !== 'http:') return void plain(res, 400, 'only http:// URLs are forwarded; use CONNECT');
    const host = url.hostname.replace(/^\[(.*)\]$/, '$1');
    const port = url.port === '' ? 80 : Number(url.port);
    const path = `${url.pathname}${url.search}`;
    void this.egress.decide(host, port, { method: req.method ?? 'GET', path }, this.family).then((d) => {
      if (res.destroyed) return;
      if (d.allowed) return this.forward(req, res, url, d.address, port, path);
      if (d.reason === 'unresolvable') {
        this.log.debug({ target: url.host, err: d.error }, 'forwarding target did not resolve');
        return plain(res, 502, 'origin unreachable', 'origin-unresolvable');
      }
      this.denied(url.host, d.reason, d.rule);
      plain(res, 403, `${EGRESS_REFUSAL}: ${d.rule}`, 'egress-denied', { [EGRESS_POLICY_HEADER]: d.rule });
    });
  }

  /** Forwards an absolute-form request to the checked address. */
  private forward(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    url: URL,
    address: string,
    port: number,
    path: string,
  ): void {
    // An absolute-form target overrides whatever Host the client sent (RFC 9112 §3.2.2).
    const headers = forwardHeaders(req.rawHeaders).filter(([k]) => k.toLowerCase() !== 'host');
    headers.unshift(['Host', url.host]);
    const upReq = http.request({
      host: address,
      port,
      method: req.method,
      path,
      headers: headers.flat(),
      agent: this.agent,
    });
    let timedOut = false;
    upReq.on('socket', (s) => {
      this.track(s);
      if (!(s as net.Socket).connecting) return;
      const timer = setTimeout(() => {
        timedOut = true;
        upReq.destroy();
      }, this.connectTimeoutMs);
      s.once('connect', () => clearTimeout(timer));
      s.once('close', () => clearTimeout(timer));
    });
    upReq.on('response', (upRes) => {
      res.writeHead(upRes.statusCode ?? 502, upRes.statusMessage, forwardHeaders(upRes.rawHeaders).flat());
      upRes.pipe(res);
      upRes.on('error', () => res.destroy());
    });
    upReq.on('error', (err) => {
      this.log.debug({ target: url.host, err }, 'forwarding failed');
      if (res.headersSent) res.destroy();
      else if (timedOut) plain(res, 504, 'origin connect timed out', 'origin-timeout');
      else plain(res, 502, 'origin unreachable', 'origin-unreachable');
    });
    // The client going away mid-request must not leave the origin request running.
    res.on('close', () => {
      if (!res.writableFinished) upReq.destroy();
    });
    if (expectsContinue(req)) res.writeContinue();
    req.pipe(upReq);
  }
}

/** host and port of a CONNECT request target (`host:port` or `[v6]:port`). */
export function parseAuthority(s: string): { host: string; port: number } | undefined {
  const m = /^(?:\[([0-9A-Fa-f:.]+)\]|([^\s:[\]/@]+)):(\d{1,5})$/.exec(s);
  if (!m) return undefined;
  const port = Number(m[3]);
  if (port < 1 || port > 65535) return undefined;
  return { host: (m[1] ?? m[2]) as string, port };
}

/** Raw header pairs minus hop-by-hop ones, including any the Connection header names. */
/** The client waits for `100 Continue` before it sends its body (the pattern Node's server uses). */
export function expectsContinue(req: http.IncomingMessage): boolean {
  return /(?:^|\W)100-continue(?:$|\W)/i.test(req.headers.expect ?? '');
}

export function forwardHeaders(raw: string[]): [string, string][] {
  const named = new Set<string>();
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i]?.toLowerCase() === 'connection') {
      for (const tok of (raw[i + 1] ?? '').split(',')) named.add(tok.trim().toLowerCase());
    }
  }
  const out: [string, string][] = [];
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const k = raw[i] as string;
    const lk = k.toLowerCase();
    if (HOP_BY_HOP.has(lk) || named.has(lk)) continue;
    out.push([k, raw[i + 1] as string]);
  }
  return out;
}

/**
 * Why the proxy answered instead of the origin: anything but `egress-denied` says the origin
 * failed while the proxy works, so a crawler must not report the proxy `failed` (docs/lease-api.md).
 */
export type ProxyErrorKind =
  | 'origin-unreachable'
  | 'origin-unresolvable'
  | 'origin-timeout'
  | 'egress-denied';
export const PROXY_ERROR_HEADER = 'X-Proxy-Error';

function marker(kind: ProxyErrorKind): string {
  return `${PROXY_ERROR_HEADER}: ${kind}`;
}

function plain(
  res: http.ServerResponse,
  status: number,
  body: string,
  kind?: ProxyErrorKind,
  extra: Record<string, string> = {},
): void {
  res
    .writeHead(status, {
      'Content-Type': 'text/plain; charset=utf-8',
      Connection: 'close',
      ...(kind ? { [PROXY_ERROR_HEADER]: kind } : {}),
      ...extra,
    })
    .end(`${body}\n`);
}

/**
 * A complete response on a socket the HTTP parser has let go of (CONNECT), then close it; the
 * local proxies and the gateway answer a CONNECT they will not tunnel with it.
 */
export function endRaw(
  socket: Duplex,
  status: number,
  reason: string,
  extra: string[] = [],
  body = '',
): void {
  if (socket.destroyed || socket.writableEnded) return;
  const lines = [
    `HTTP/1.1 ${status} ${reason}`,
    ...extra,
    ...(body === '' ? [] : ['Content-Type: text/plain; charset=utf-8']),
    `Content-Length: ${Buffer.byteLength(body)}`,
    'Connection: close',
    '',
    body,
  ];
  // The listener sockets are half-open capable, so close fully once the answer is flushed.
  socket.once('finish', () => socket.destroy());
  socket.end(lines.join('\r\n'));
}
