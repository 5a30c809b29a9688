/**
 * discovery/server — the API listener (see docs/lease-api.md): one Fastify pipeline for every route of
 * the table in discovery/schemas, assembled from its concerns (telemetry, auth, validation, error
 * mapping, routes); listens, and says at startup whether the API is authenticated.
 */
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { type Tracer, trace } from '@opentelemetry/api';
import Fastify from 'fastify';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { GatewaySessions } from '../gateway/service.ts';
import type { LeaseStore } from '../lease/store.ts';
import { silentLogger } from '../log/index.ts';
import { parseBindAddress } from '../metrics/bind.ts';
import {
  createListener,
  DEFAULT_DISCOVERY_MAX_CONNECTIONS,
  DEFAULT_LISTENER_TIMEOUTS,
  type ListenerLimits,
  type TlsFiles,
} from '../metrics/listener.ts';
import { bearerAdmits, bearerGuard, expectedToken } from './auth.ts';
import { installAuthority, type LeaseAuthority } from './authority.ts';
import { errorOptions, installErrorHandling, ROUTER_MAX_PARAM_LENGTH } from './errors.ts';
import { hostAdmitter, hostGuard } from './host.ts';
import { type ApiOperation, apiHandlers, registerRoutes } from './routes.ts';
import type { Handlers } from './schemas.ts';
import { installTelemetry } from './telemetry.ts';
import { installValidation } from './validation.ts';

export { FieldError, toFieldError } from './validation.ts';

export const BODY_LIMIT_BYTES = 16 * 1024;

export interface DiscoveryServerOptions {
  /** `host:port`; `:8090` listens on all interfaces, port 0 picks a free one. */
  bindAddress: string;
  leases: LeaseStore;
  /**
   * Bearer token (DISCOVERY_TOKEN), surrounding whitespace ignored. Without it the API is open and
   * says so at startup; an empty or blank token is refused (fail fast, never silently open).
   */
  token?: string;
  /** Serve HTTPS with this certificate and key (`--discovery-tls-cert`, `--discovery-tls-key`). */
  tls?: TlsFiles;
  /** Timeouts and the connection cap; defaults in metrics/listener. */
  limits?: Partial<ListenerLimits>;
  /** Host names served without a token besides loopback and the bind address (`--discovery-allowed-hosts`). */
  allowedHosts?: string[];
  log?: Logger;
  registry: Registry;
  tracer?: Tracer;
  /**
   * Who decides leases (docs/deployment.md): without one, this process always does; with one, a
   * standby forwards `/v1/*` to the leader and answers 503 no_leader while none is known.
   */
  authority?: LeaseAuthority;
  /**
   * Handlers of the table's routes that only some processes serve: the dashboard's
   * (dashboard/routes) and the gateway sync (gateway/cluster). Without one, its route is a 404.
   */
  handlers?: Partial<Omit<Handlers, ApiOperation>>;
  /** The gateway's sticky sessions, for `POST /v1/sessions/{id}/report`. */
  sessions?: GatewaySessions;
}

export interface DiscoveryServer {
  /** Base URL, e.g. `http://127.0.0.1:41234`. */
  url: string;
  close(): Promise<void>;
}

/** The discovery API's listen address: `:port` means every IPv4 interface; it cannot be disabled. */
export function discoveryBindAddress(bind: string): { host: string; port: number } {
  const parsed = parseBindAddress(bind, 'discovery bind address');
  if (!parsed)
    throw new Error(
      `discovery bind address "${bind}" must be host:port; the discovery API cannot be disabled`,
    );
  return { host: parsed.host ?? '0.0.0.0', port: parsed.port };
}

/** A URL a client on this host can use: wildcard listen addresses become loopback. */
function reachableUrl(addr: AddressInfo, scheme: 'http' | 'https'): string {
  const shown = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  return `${scheme}://${shown === '0.0.0.0' ? '127.0.0.1' : shown === '[::]' ? '[::1]' : shown}:${addr.port}`;
}

/**
 * Node answers `Expect: 100-continue` with 100 before any route runs, inviting a client without
 * the token to upload its body; here only a request that would pass the token (or Host) check is
 * invited, and every other one goes straight to the routes, which refuse it.
 */
function continueOnlyWhen<S extends Server>(server: S, admits: (req: IncomingMessage) => boolean): S {
  server.on('checkContinue', (req: IncomingMessage, res: ServerResponse) => {
    if (admits(req)) res.writeContinue();
    server.emit('request', req, res);
  });
  return server;
}

export async function startDiscoveryServer(opts: DiscoveryServerOptions): Promise<DiscoveryServer> {
  const log = opts.log ?? silentLogger();
  const tracer = opts.tracer ?? trace.getTracer('egress-proxies-operator/discovery');
  const { host, port } = discoveryBindAddress(opts.bindAddress);
  const token = expectedToken(opts.token);

  const limits: ListenerLimits = {
    ...DEFAULT_LISTENER_TIMEOUTS,
    maxConnections: DEFAULT_DISCOVERY_MAX_CONNECTIONS,
    ...opts.limits,
  };

  const admitsHost = hostAdmitter(host, opts.allowedHosts ?? []);
  const app = Fastify({
    logger: false,
    bodyLimit: BODY_LIMIT_BYTES,
    return503OnClosing: true,
    routerOptions: { maxParamLength: ROUTER_MAX_PARAM_LENGTH },
    serverFactory: (handler) =>
      continueOnlyWhen(
        createListener(handler, limits, opts.tls),
        token ? bearerAdmits(token) : (req) => admitsHost(req.headers.host),
      ),
    ...errorOptions(),
  });
  installValidation(app);
  // Telemetry before auth: a refused request is traced and counted too.
  installTelemetry(app, { registry: opts.registry, tracer, log });
  const guard = token ? bearerGuard(token) : hostGuard(admitsHost);
  installErrorHandling(app, log, BODY_LIMIT_BYTES, guard);
  if (opts.authority) installAuthority(app, opts.authority, { log, tls: opts.tls });
  registerRoutes(app, { ...apiHandlers(opts.leases, opts.sessions), ...opts.handlers }, guard);

  await app.listen({ host, port });
  const url = reachableUrl(app.server.address() as AddressInfo, opts.tls ? 'https' : 'http');
  if (!token) {
    log.warn(
      { address: url },
      'DISCOVERY API IS UNAUTHENTICATED: DISCOVERY_TOKEN is not set, so anyone who can reach this port can lease proxies and read their credentials',
    );
  } else {
    log.info({ address: url }, 'discovery API listening (bearer token required)');
  }
  return {
    url,
    close: () => app.close(),
  };
}
