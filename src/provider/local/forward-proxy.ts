/**
 * provider/local/forward-proxy — one authenticated HTTP forward proxy listener: CONNECT tunnels
 * and absolute-form HTTP requests, with every socket it opened tracked so closing the listener
 * really cuts every client off (a deleted proxy must stop carrying traffic at once).
 */
import http from 'node:http';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { Credentials } from '../contract.ts';
import { basicAuthChecker, PROXY_AUTHENTICATE } from './auth.ts';

export interface ForwardProxyOptions {
  credentials: Credentials;
  log: Logger;
  /** Give up on an origin that has not accepted the TCP connection after this long. */
  connectTimeoutMs?: number;
  /** Opens the origin connection of a tunnel; tests substitute one that never connects. */
  dial?: (host: string, port: number) => net.Socket;
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
  private closed = false;

  constructor(opts: ForwardProxyOptions) {
    this.authorized = basicAuthChecker(opts.credentials);
    this.log = opts.log;
    this.connectTimeoutMs = opts.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
    this.dial = opts.dial ?? ((host, port) => net.connect({ host, port, allowHalfOpen: true }));
    this.agent = new http.Agent({ keepAlive: true, maxFreeSockets: 16 });
    this.server = http.createServer({ requestTimeout: 0 });
    this.server.on('connection', (s: net.Socket) => this.track(s));
    this.server.on('connect', (req: http.IncomingMessage, socket: Duplex, head: Buffer) =>
      this.onConnect(req, socket, head),
    );
    this.server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) =>
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
    const upstream = this.dial(target.host, target.port);
    this.track(upstream);
    let established = false;
    const timer = setTimeout(() => {
      upstream.destroy();
      this.log.debug({ target: req.url }, 'tunnel connect timed out');
      endRaw(client, 504, 'Gateway Timeout');
    }, this.connectTimeoutMs);
    upstream.once('connect', () => {
      clearTimeout(timer);
      established = true;
      if (client.destroyed) {
        upstream.destroy();
        return;
      }
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length > 0) upstream.write(head);
      // pipe() ends the other side when one side ends, so a half-close travels through the
      // tunnel (both sockets are half-open capable) instead of tearing it down early.
      client.pipe(upstream);
      upstream.pipe(client);
    });
    upstream.on('error', (err) => {
      clearTimeout(timer);
      if (!established) {
        this.log.debug({ target: req.url, err }, 'tunnel connect failed');
        endRaw(client, 502, 'Bad Gateway');
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

    // An absolute-form target overrides whatever Host the client sent (RFC 9112 §3.2.2).
    const headers = forwardHeaders(req.rawHeaders).filter(([k]) => k.toLowerCase() !== 'host');
    headers.unshift(['Host', url.host]);
    const upReq = http.request({
      host: url.hostname.replace(/^\[(.*)\]$/, '$1'),
      port: url.port === '' ? 80 : Number(url.port),
      method: req.method,
      path: `${url.pathname}${url.search}`,
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
      else plain(res, timedOut ? 504 : 502, timedOut ? 'origin connect timed out' : 'origin unreachable');
    });
    // The client going away mid-request must not leave the origin request running.
    res.on('close', () => {
      if (!res.writableFinished) upReq.destroy();
    });
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

function plain(res: http.ServerResponse, status: number, body: string): void {
  res
    .writeHead(status, { 'Content-Type': 'text/plain; charset=utf-8', Connection: 'close' })
    .end(`${body}\n`);
}

/** A complete response on a socket the HTTP parser has let go of (CONNECT), then close it. */
function endRaw(socket: Duplex, status: number, reason: string, extra: string[] = []): void {
  if (socket.destroyed || socket.writableEnded) return;
  const lines = [`HTTP/1.1 ${status} ${reason}`, ...extra, 'Content-Length: 0', 'Connection: close', '', ''];
  // The listener sockets are half-open capable, so close fully once the answer is flushed.
  socket.once('finish', () => socket.destroy());
  socket.end(lines.join('\r\n'));
}
