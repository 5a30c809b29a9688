/**
 * metrics/server — the Prometheus scrape endpoint (`GET /metrics`) on `--metrics-bind-address`,
 * optionally over HTTPS behind an Authorize (`--metrics-secure`). Plain node:http(s) on the
 * shared listener (timeouts, connection cap): one route, no framework.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import { silentLogger } from '../log/index.ts';
import type { Authorize } from './authorize.ts';
import { closeServer, formatAddress, listenOn, parseBindAddress } from './bind.ts';
import {
  createListener,
  DEFAULT_LISTENER_TIMEOUTS,
  DEFAULT_METRICS_MAX_CONNECTIONS,
  type ListenerLimits,
  type TlsFiles,
} from './listener.ts';

export interface MetricsServerOptions {
  /** `--metrics-bind-address`: "0" = off, ":8080", "127.0.0.1:9090", "127.0.0.1:0" (ephemeral). */
  bindAddress: string;
  registry: Registry;
  log?: Logger;
  /** When set, every scrape must pass it (401 without credentials, 403 when refused). */
  authorize?: Authorize;
  /** Flag name used in errors about bindAddress. Default `--metrics-bind-address`. */
  flag?: string;
  /** Serve HTTPS with this certificate (`--metrics-secure`). */
  tls?: TlsFiles;
  /** Timeouts and the connection cap; defaults in metrics/listener. */
  limits?: Partial<ListenerLimits>;
}

export interface MetricsServer {
  /** Where it listens, e.g. `127.0.0.1:41234` / `:::8080`. */
  readonly address: string;
  readonly port: number;
  close(): Promise<void>;
}

function send(res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', ...headers });
  res.end(body);
}

/**
 * Starts the metrics endpoint, or returns null when bindAddress is "0". Rejects on a bad
 * address (naming the flag) or when the port cannot be bound.
 */
export async function startMetricsServer(opts: MetricsServerOptions): Promise<MetricsServer | null> {
  const flag = opts.flag ?? '--metrics-bind-address';
  const bind = parseBindAddress(opts.bindAddress, flag);
  const log = opts.log ?? silentLogger();
  if (bind === null) {
    log.info('metrics endpoint disabled (%s=0)', flag);
    return null;
  }

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    if (path !== '/metrics') return send(res, 404, 'not found\n');
    if (req.method !== 'GET' && req.method !== 'HEAD')
      return send(res, 405, 'method not allowed\n', { allow: 'GET' });
    if (opts.authorize) {
      const verdict = await opts.authorize(req);
      if (verdict === 'unauthenticated') {
        return send(res, 401, 'unauthorized\n', { 'www-authenticate': 'Bearer realm="metrics"' });
      }
      if (verdict !== true && verdict !== 'allowed') return send(res, 403, 'forbidden\n');
    }
    const body = await opts.registry.metrics();
    res.writeHead(200, { 'content-type': opts.registry.contentType });
    res.end(req.method === 'HEAD' ? undefined : body);
  };

  const limits: ListenerLimits = {
    ...DEFAULT_LISTENER_TIMEOUTS,
    maxConnections: DEFAULT_METRICS_MAX_CONNECTIONS,
    ...opts.limits,
  };
  const server = createListener(
    (req, res) => {
      handle(req, res).catch((err: unknown) => {
        log.error({ err }, 'metrics scrape failed');
        if (!res.headersSent) send(res, 500, 'metrics collection failed\n');
        else res.destroy();
      });
    },
    limits,
    opts.tls,
  );
  const bound = await listenOn(server, bind);
  const address = formatAddress(bound.host, bound.port);
  log.info(
    { address, https: Boolean(opts.tls), authorized: Boolean(opts.authorize) },
    'metrics endpoint listening',
  );
  let closing: Promise<void> | undefined;
  return {
    address,
    port: bound.port,
    close() {
      closing ??= closeServer(server);
      return closing;
    },
  };
}
