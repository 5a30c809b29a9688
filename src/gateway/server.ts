/**
 * gateway/server — the gateway's listener (docs/gateway.md): one HTTP forward proxy endpoint
 * for the whole fleet. It authenticates every CONNECT and absolute-form request (gateway/auth),
 * hands them to gateway/tunnel and gateway/forward, renews the leases of open connections, and
 * enforces header, request and idle timeouts and a connection cap; connections that have not
 * authenticated yet have their own deadline and smaller cap (gateway/unauthenticated). Without a
 * token it serves loopback clients only. With inspection on, CONNECTs go to gateway/inspect.
 */
import http from 'node:http';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import type { Tracer } from '@opentelemetry/api';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { GatewayRuleConfig } from '../config/schema.ts';
import { type BindAddress, closeServer, formatAddress, listenOn } from '../metrics/bind.ts';
import type { EgressGuard } from '../provider/local/egress.ts';
import type { Clock, TimerHandle } from '../runtime/clock.ts';
import { gatewayAuthChecker, isLoopbackClient, PROXY_AUTHENTICATE } from './auth.ts';
import { type GatewayContext, type GatewayLimits, gatewayLimits } from './context.ts';
import { handleForward, plain } from './forward.ts';
import { ConnectionPool } from './http1.ts';
import { Inspector, type InspectSetup } from './inspect.ts';
import { gatewayMetrics } from './metrics.ts';
import { compileRules, DEFAULT_RULES } from './rules.ts';
import { endRaw, handleConnect } from './tunnel.ts';
import { UnauthenticatedConnections } from './unauthenticated.ts';
import type { Acquired, UpstreamChooser } from './upstreams.ts';

/** Open connections' leases are renewed this often (they last CONNECTION_LEASE_TTL_SECONDS). */
const RENEW_INTERVAL_MS = 60_000;

export interface GatewayOptions {
  bind: BindAddress;
  /** The gateway token; undefined = loopback clients only, no password checked. */
  token: string | undefined;
  chooser: UpstreamChooser;
  egress: EgressGuard;
  clock: Clock;
  log: Logger;
  registry: Registry;
  tracer: Tracer;
  limits?: Partial<GatewayLimits>;
  /** Response rules (gateway/rules); default DEFAULT_RULES. */
  rules?: readonly GatewayRuleConfig[];
  /** HTTPS inspection (gateway/inspect); off when absent. */
  inspect?: InspectSetup;
}

export class Gateway {
  private readonly server: http.Server;
  private readonly ctx: GatewayContext;
  private readonly opts: GatewayOptions;
  private readonly held = new Map<Acquired, () => void>();
  private readonly sockets = new Set<Duplex>();
  private readonly unauthenticated: UnauthenticatedConnections<net.Socket>;
  private readonly inspector: Inspector | undefined;
  private timer: TimerHandle | undefined;
  private address: { host: string; port: number } | undefined;

  constructor(opts: GatewayOptions) {
    this.opts = opts;
    const limits = gatewayLimits(opts.limits);
    this.ctx = {
      chooser: opts.chooser,
      egress: opts.egress,
      metrics: gatewayMetrics(opts.registry),
      tracer: opts.tracer,
      log: opts.log,
      limits,
      clock: opts.clock,
      rules: compileRules(opts.rules ?? DEFAULT_RULES),
      hold: (a, cut) => this.held.set(a, cut),
      letGo: (a) => {
        if (this.held.delete(a)) opts.chooser.release(a);
      },
      upstreamPool: new ConnectionPool({ maxFree: 64, idleMs: limits.idleTimeoutMs }),
    };
    this.inspector = opts.inspect ? new Inspector(this.ctx, opts.inspect) : undefined;
    const authorize = gatewayAuthChecker(opts.token);
    this.server = http.createServer({
      headersTimeout: limits.headersTimeoutMs,
      requestTimeout: limits.requestTimeoutMs,
      connectionsCheckingInterval: Math.max(10, Math.min(1000, Math.floor(limits.headersTimeoutMs / 4))),
      noDelay: true,
    });
    this.server.timeout = limits.idleTimeoutMs;
    this.server.maxConnections = limits.maxConnections;
    const shed = this.ctx.metrics.shed;
    // Room for the authenticated connections plus what is left of the unauthenticated cap: Node
    // then refuses the next one on accept, before it builds a socket and an HTTP parser for it
    // (evicting instead would leave that garbage, and the heap it grows, behind every refusal).
    const fitCap = () => {
      this.server.maxConnections = Math.min(
        limits.maxConnections,
        this.sockets.size - this.unauthenticated.size + limits.unauthenticatedMaxConnections,
      );
    };
    this.unauthenticated = new UnauthenticatedConnections({
      cap: limits.unauthenticatedMaxConnections,
      timeoutMs: limits.unauthenticatedTimeoutMs,
      clock: opts.clock,
      onClose: (why) => shed.inc({ reason: `unauthenticated_${why}` }),
      onCount: fitCap,
    });
    this.server.on('drop', () => {
      const full = this.unauthenticated.size >= limits.unauthenticatedMaxConnections;
      shed.inc({ reason: full ? 'unauthenticated_cap' : 'max_connections' });
    });
    const loopbackOnly = opts.token === undefined;
    this.server.on('connection', (s: net.Socket) => {
      if (loopbackOnly && !isLoopbackClient(s.remoteAddress)) return void s.destroy();
      this.sockets.add(s);
      this.unauthenticated.admit(s);
      s.once('close', () => {
        this.sockets.delete(s);
        this.unauthenticated.leave(s);
        fitCap();
      });
    });
    this.server.on('connect', (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => {
      socket.on('error', () => socket.destroy());
      const auth = authorize(req.headers['proxy-authorization']);
      if (auth.ok) this.unauthenticated.leave(socket);
      else {
        this.ctx.metrics.requests.inc({ kind: 'connect', upstream: '', result: 'unauthorized' });
        return endRaw(
          socket,
          407,
          'Proxy Authentication Required',
          [`Proxy-Authenticate: ${PROXY_AUTHENTICATE}`],
          `${auth.message}\n`,
        );
      }
      void handleConnect(this.ctx, socket, req.url ?? '', head, auth.options, this.inspector).catch((err) => {
        opts.log.warn({ err }, 'gateway CONNECT failed unexpectedly');
        endRaw(socket, 500, 'Internal Server Error');
      });
    });
    this.server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
      const auth = authorize(req.headers['proxy-authorization']);
      if (auth.ok) this.unauthenticated.leave(req.socket as net.Socket);
      else {
        this.ctx.metrics.requests.inc({ kind: 'http', upstream: '', result: 'unauthorized' });
        res.setHeader('Proxy-Authenticate', PROXY_AUTHENTICATE);
        return plain(res, 407, auth.message);
      }
      void handleForward(this.ctx, req, res, auth.options).catch((err) => {
        opts.log.warn({ err }, 'gateway request failed unexpectedly');
        plain(res, 500, 'internal error');
      });
    });
    // Without a listener here Node answers `Expect: 100-continue` with 100 before any handler
    // runs, inviting a client without credentials to upload its body. Routed to the request
    // handler instead: credentials first, and gateway/forward sends 100 only once the request
    // may go to an upstream.
    this.server.on('checkContinue', (req: http.IncomingMessage, res: http.ServerResponse) =>
      this.server.emit('request', req, res),
    );
    this.server.on('error', (err) => opts.log.warn({ err }, 'gateway listener error'));
  }

  /** Listens; resolves with `host:port` actually bound. */
  async listen(): Promise<string> {
    this.address = await listenOn(this.server, this.opts.bind);
    this.scheduleRenewals();
    return formatAddress(this.address.host, this.address.port);
  }

  get port(): number {
    return this.address?.port ?? 0;
  }

  /** Connections whose leases are held now (tunnels and in-flight requests). */
  get openConnections(): number {
    return this.held.size;
  }

  /** Stops listening, cuts every connection and releases every lease. */
  async close(): Promise<void> {
    if (this.timer) this.opts.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.unauthenticated.close();
    const closing = closeServer(this.server, 0);
    for (const s of this.sockets) s.destroy();
    for (const cut of this.held.values()) cut();
    this.inspector?.close();
    this.ctx.upstreamPool.close();
    await closing;
  }

  private scheduleRenewals(): void {
    this.timer = this.opts.clock.setTimeout(() => {
      this.renewAll();
      this.opts.chooser.purge();
      this.scheduleRenewals();
    }, RENEW_INTERVAL_MS);
  }

  /** Keeps open connections' leases alive; a connection whose lease may not go on is cut. */
  private renewAll(): void {
    for (const [a, cut] of this.held) {
      if (this.opts.chooser.renew(a.leaseId)) continue;
      this.opts.log.info(
        { upstream: a.upstream.key },
        'connection lease ended (drain deadline or gone); closing it',
      );
      cut();
    }
  }
}
