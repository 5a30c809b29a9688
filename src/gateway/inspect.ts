/**
 * gateway/inspect — HTTPS inspection (docs/gateway.md, "HTTPS inspection"): an authenticated
 * CONNECT the egress policy allowed is answered 200 at once; when what the client sends first is
 * a TLS handshake (anything else — `ws://`, a protocol whose server speaks first — is tunnelled
 * untouched by gateway/tunnel), the client's TLS is terminated
 * with a certificate for the requested host from the operator CA (gateway/ca), and each request
 * inside goes through the one request pipeline (gateway/exchange), so response rules see HTTPS
 * as they see plain HTTP. Towards the origin a request leaves through a CONNECT tunnel of the
 * chosen upstream (gateway/dial) and TLS with full verification (the system store and
 * `--gateway-origin-ca`), spoken by the gateway's one HTTP/1.1 client (gateway/http1);
 * connections are kept alive per upstream and origin. A refused origin
 * certificate is an error the client reads (502 naming why), never a silent downgrade. Only
 * HTTP/1.1 is spoken inside (ALPN), so a client that insists on HTTP/2 cannot connect.
 */
import http from 'node:http';
import type net from 'node:net';
import { isIP } from 'node:net';
import tls from 'node:tls';
import { compileGlob } from '../config/gateway-rules.ts';
import type { GatewayCa } from './ca.ts';
import type { GatewayContext } from './context.ts';
import { dialSocket } from './dial.ts';
import {
  exchange,
  OriginCertificateError,
  OriginTlsError,
  plain,
  type Transport,
  UpstreamAnsweredError,
} from './exchange.ts';
import { ConnectionPool, request } from './http1.ts';
import type { Upstream } from './upstreams.ts';
import type { RoutingOptions } from './username.ts';

export interface InspectSetup {
  ca: GatewayCa;
  /** Host globs tunnelled untouched (`--gateway-inspect-exclude`). */
  exclude: readonly string[];
  /** Extra CA certificates (PEM) trusted for origins besides the system store (`--gateway-origin-ca`). */
  originCa?: string;
}

/** A CONNECT being inspected: where its requests go. */
interface InspectedTarget {
  host: string;
  port: number;
  /** `address:port` the egress policy checked, asked of the upstream. */
  checked: string;
  routing: RoutingOptions;
}

/**
 * How long a client in an inspected CONNECT may stay silent before the tunnel is taken for a
 * protocol whose server speaks first (SMTP, FTP…) and left untouched: a TLS client sends its
 * handshake at once.
 */
export const OPENING_WAIT_MS = 1000;

/** The first byte of a TLS record carrying a handshake (a ClientHello starts every TLS session). */
const TLS_HANDSHAKE = 0x16;

/**
 * Answers an inspected CONNECT 200 and waits for what the client sends first: those bytes (the
 * client paused, nothing put back), empty ones when the client stayed silent for `waitMs` or
 * ended its side, or undefined when it left.
 */
export function clientOpening(
  client: net.Socket,
  head: Buffer,
  waitMs = OPENING_WAIT_MS,
): Promise<Buffer | undefined> {
  client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
  if (head.length > 0) return Promise.resolve(head);
  return new Promise((resolve) => {
    const settle = (first: Buffer | undefined) => {
      clearTimeout(timer);
      client.off('data', onData);
      client.off('end', onEnd);
      client.off('close', onClose);
      client.pause();
      resolve(first);
    };
    const onData = (chunk: Buffer) => settle(chunk);
    const onEnd = () => settle(Buffer.alloc(0));
    const onClose = () => settle(undefined);
    const timer = setTimeout(() => settle(Buffer.alloc(0)), waitMs);
    client.on('data', onData);
    client.once('end', onEnd);
    client.once('close', onClose);
    // Node may hand over a CONNECT's socket paused: a 'data' listener alone would not start it.
    client.resume();
  });
}

/** Whether a client's first bytes open a TLS session (what inspection terminates). */
export function opensTls(first: Buffer): boolean {
  return first.length > 0 && first[0] === TLS_HANDSHAKE;
}

/** Why an origin's certificate was refused, in words, by OpenSSL/Node error code. */
const CERT_REASONS: Readonly<Record<string, string>> = {
  ERR_TLS_CERT_ALTNAME_INVALID: 'hostname mismatch',
  CERT_HAS_EXPIRED: 'certificate has expired',
  CERT_NOT_YET_VALID: 'certificate is not yet valid',
  DEPTH_ZERO_SELF_SIGNED_CERT: 'self-signed certificate',
  SELF_SIGNED_CERT_IN_CHAIN: 'self-signed certificate in chain',
  UNABLE_TO_VERIFY_LEAF_SIGNATURE: 'unknown issuer',
  UNABLE_TO_GET_ISSUER_CERT_LOCALLY: 'unknown issuer',
  UNABLE_TO_GET_ISSUER_CERT: 'unknown issuer',
  CERT_REVOKED: 'certificate revoked',
  CERT_SIGNATURE_FAILURE: 'certificate signature failure',
  CERT_UNTRUSTED: 'certificate not trusted',
  INVALID_CA: 'invalid CA certificate in chain',
};

/** A TLS error as an origin certificate refusal, or undefined when it is something else. */
export function certificateRefusal(err: Error): OriginCertificateError | undefined {
  const code = (err as NodeJS.ErrnoException).code ?? '';
  const reason = CERT_REASONS[code];
  if (reason) return new OriginCertificateError(`${reason} (${code})`, { cause: err });
  if (/^(CERT_|ERR_TLS_CERT)/.test(code))
    return new OriginCertificateError(`${err.message} (${code})`, { cause: err });
  return undefined;
}

/**
 * A new connection to an origin through `up`: a CONNECT tunnel and a verified TLS handshake,
 * failing with the error the pipeline reports (refused certificate, failed TLS, the upstream's
 * refusal, or the upstream failing).
 */
function connectOrigin(
  up: Upstream,
  target: InspectedTarget,
  trust: tls.SecureContext,
  dialTimeoutMs: number,
): Promise<net.Socket> {
  return dialSocket(up, target.checked, dialTimeoutMs).then(
    (d) =>
      new Promise<net.Socket>((resolve, reject) => {
        if (!d.ok) {
          if (d.kind === 'answered') return reject(new UpstreamAnsweredError(d.status, d.reason));
          return reject(Object.assign(new Error(`upstream ${d.why}`), { code: d.why }));
        }
        const s = tls.connect({
          socket: d.socket,
          host: target.host,
          ...(isIP(target.host) ? {} : { servername: target.host }),
          secureContext: trust,
          ALPNProtocols: ['http/1.1'],
        });
        const onError = (err: Error) =>
          reject(
            certificateRefusal(err) ??
              new OriginTlsError((err as NodeJS.ErrnoException).code ?? err.message, { cause: err }),
          );
        s.once('error', onError);
        s.once('secureConnect', () => {
          s.off('error', onError);
          resolve(s);
        });
      }),
  );
}

/** The trust for origins: Node's bundled roots, the system store and the configured extra CAs. */
function originTrust(extra: string | undefined): tls.SecureContext {
  const ca = new Set([...tls.getCACertificates('bundled'), ...tls.getCACertificates('system')]);
  if (extra) ca.add(extra);
  return tls.createSecureContext({ ca: [...ca], minVersion: 'TLSv1.2' });
}

export class Inspector {
  private readonly ctx: GatewayContext;
  private readonly ca: GatewayCa;
  private readonly exclude: RegExp[];
  private readonly trust: tls.SecureContext;
  /** Kept-alive origin connections, per upstream (and its address and credentials) and origin. */
  private readonly pool: ConnectionPool;
  private readonly targets = new WeakMap<object, InspectedTarget>();
  /** Parses the requests of every inspected connection; never listens itself. */
  private readonly inner: http.Server;

  constructor(ctx: GatewayContext, setup: InspectSetup) {
    this.ctx = ctx;
    this.ca = setup.ca;
    this.exclude = setup.exclude.map(compileGlob);
    this.trust = originTrust(setup.originCa);
    this.pool = new ConnectionPool({ maxFree: 16, idleMs: ctx.limits.idleTimeoutMs });
    this.inner = http.createServer({
      headersTimeout: ctx.limits.headersTimeoutMs,
      requestTimeout: ctx.limits.requestTimeoutMs,
      noDelay: true,
    });
    this.inner.timeout = ctx.limits.idleTimeoutMs;
    this.inner.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
      const target = this.targets.get(req.socket);
      if (!target) return plain(res, 500, 'internal error');
      void this.serve(target, req, res).catch((err) => {
        ctx.log.warn({ err }, 'gateway inspected request failed unexpectedly');
        plain(res, 500, 'internal error');
      });
    });
    // A request asking to switch protocols (a WebSocket) goes through the same pipeline with a
    // response made for its connection, which Node has taken off its HTTP parser: an answer
    // other than 101 is passed on and the connection closed; a 101 joins client and origin.
    this.inner.on('upgrade', (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => {
      const target = this.targets.get(socket);
      if (!target) return socket.destroy();
      if (head.length > 0) socket.unshift(head);
      const res = new http.ServerResponse(req);
      res.shouldKeepAlive = false;
      res.assignSocket(socket);
      res.once('finish', () => socket.end());
      void this.serve(target, req, res, String(req.headers.upgrade)).catch((err) => {
        ctx.log.warn({ err }, 'gateway inspected upgrade failed unexpectedly');
        plain(res, 500, 'internal error');
      });
    });
    this.inner.on('clientError', (_err, socket) => socket.destroy());
  }

  /** Whether a CONNECT to `host` by a client with `routing` is inspected. */
  applies(host: string, routing: RoutingOptions): boolean {
    if (routing.inspect === false) return false;
    const h = host.toLowerCase();
    return !this.exclude.some((g) => g.test(h));
  }

  /** Makes (or finds cached) the certificate for `host` ahead of its handshake; failures are take()'s to report. */
  prepare(host: string): void {
    try {
      this.ca.contextFor(host);
    } catch {
      // take() meets the same error and says so.
    }
  }

  /**
   * Terminates the client's TLS in a CONNECT already answered (`clientOpening`), `head` being
   * what the client sent first; its requests are served from here on.
   */
  take(client: net.Socket, head: Buffer, target: InspectedTarget): void {
    if (head.length > 0) client.unshift(head);
    let secure: tls.TLSSocket;
    try {
      secure = new tls.TLSSocket(client, {
        isServer: true,
        secureContext: this.ca.contextFor(target.host),
        ALPNProtocols: ['http/1.1'],
      });
    } catch (err) {
      this.ctx.log.warn({ err, target: target.host }, 'could not issue a certificate for an inspected host');
      client.destroy();
      return;
    }
    secure.on('error', (err) => {
      this.ctx.log.debug({ err: err.message, target: target.host }, 'inspected client TLS failed');
      secure.destroy();
    });
    this.targets.set(secure, target);
    this.inner.emit('connection', secure);
  }

  private serve(
    target: InspectedTarget,
    req: http.IncomingMessage,
    res: http.ServerResponse,
    upgrade?: string,
  ): Promise<void> {
    const span = this.ctx.tracer.startSpan('gateway HTTPS', {
      attributes: { 'server.address': target.host, 'http.request.method': req.method ?? '' },
    });
    const path = originPath(req.url ?? '/');
    const transport: Transport = {
      kind: 'https',
      request: (a, method, headers) => {
        if (!headers.some(([k]) => k.toLowerCase() === 'host')) headers.unshift(['Host', authority(target)]);
        const up = a.upstream;
        return request({
          method,
          target: path,
          headers,
          pool: this.pool,
          key: [up.key, up.host, up.port, up.authorization ?? '', target.checked, target.host].join('\n'),
          connect: () => connectOrigin(up, target, this.trust, this.ctx.limits.upstreamTimeoutMs),
          idleMs: this.ctx.limits.idleTimeoutMs,
        });
      },
    };
    return exchange(this.ctx, req, res, {
      host: target.host,
      transport,
      routing: target.routing,
      span,
      ...(upgrade === undefined ? {} : { upgrade }),
    });
  }

  /** Ends every pooled origin connection. */
  close(): void {
    this.pool.close();
  }
}

function authority(t: InspectedTarget): string {
  const host = t.host.includes(':') ? `[${t.host}]` : t.host;
  return t.port === 443 ? host : `${host}:${t.port}`;
}

/** The origin-form of a request target (a client may send absolute-form inside the tunnel too). */
function originPath(url: string): string {
  if (url.startsWith('/')) return url;
  try {
    const u = new URL(url);
    return `${u.pathname}${u.search}`;
  } catch {
    return '/';
  }
}
