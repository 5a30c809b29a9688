/**
 * metrics/listener — the HTTP(S) server under every API listener we own (discovery API,
 * metrics, the /healthz and /readyz probe port): header, request and idle timeouts and a connection cap, so a slow or idle client
 * cannot hold a socket forever, and optional TLS from PEM files or a self-signed certificate.
 * See docs/operations.md, "Listeners".
 */
import { readFileSync } from 'node:fs';
import { createServer as createHttpServer, type RequestListener, type Server } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { Socket } from 'node:net';
import { join } from 'node:path';
import { createSecureContext } from 'node:tls';
import { errorMessage } from '../log/errors.ts';

export interface ListenerLimits {
  /** Time to receive the complete request head (and the TLS handshake). */
  headersTimeoutMs: number;
  /** Time to receive the complete request, body included. */
  requestTimeoutMs: number;
  /** A connection with no traffic for this long is closed (keep-alive included). */
  idleTimeoutMs: number;
  /** Open connections at most; further ones are closed at once. */
  maxConnections: number;
}

export const DEFAULT_LISTENER_TIMEOUTS = {
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 30_000,
  idleTimeoutMs: 30_000,
} as const;

export const DEFAULT_DISCOVERY_MAX_CONNECTIONS = 1024;
export const DEFAULT_METRICS_MAX_CONNECTIONS = 64;
/** The kubelet opens one short connection per probe: a handful is plenty. */
export const DEFAULT_HEALTH_PROBE_MAX_CONNECTIONS = 16;

export interface TlsFiles {
  /** PEM certificate (chain). */
  cert: string;
  /** PEM private key. */
  key: string;
}

/** Problems with `limits`, as one message naming the field; undefined when fine. */
export function limitsProblem(limits: ListenerLimits): string | undefined {
  for (const k of ['headersTimeoutMs', 'requestTimeoutMs', 'idleTimeoutMs', 'maxConnections'] as const) {
    const v = limits[k];
    if (!Number.isInteger(v) || v <= 0) return `${k} must be a positive integer, got ${v}`;
  }
  // Node refuses a header timeout longer than the request timeout.
  if (limits.headersTimeoutMs > limits.requestTimeoutMs) {
    return 'the header timeout must not exceed the request timeout';
  }
  return undefined;
}

/**
 * A server for `handler` with `limits` applied; HTTPS when `tls` is given. Node only looks for
 * expired header and request timers every `connectionsCheckingInterval`, 30 s by default,
 * longer than the timeouts themselves: it is derived from them here.
 */
export function createListener(handler: RequestListener, limits: ListenerLimits, tls?: TlsFiles): Server {
  const problem = limitsProblem(limits);
  if (problem) throw new Error(`listener limits: ${problem}`);
  const options = {
    headersTimeout: limits.headersTimeoutMs,
    requestTimeout: limits.requestTimeoutMs,
    keepAliveTimeout: limits.idleTimeoutMs,
    connectionsCheckingInterval: Math.max(10, Math.min(1_000, Math.floor(limits.headersTimeoutMs / 4))),
  };
  const server = tls
    ? createHttpsServer(
        { ...options, cert: tls.cert, key: tls.key, handshakeTimeout: limits.headersTimeoutMs },
        handler,
      )
    : createHttpServer(options, handler);
  // Socket inactivity (a client that stops reading a response): without a 'timeout' listener
  // Node destroys the socket.
  server.timeout = limits.idleTimeoutMs;
  server.maxConnections = limits.maxConnections;
  // Node's header timer starts with the first byte of a request, so a plain-HTTP connection that
  // never sends one would stay open: it gets the header timeout from its first moment, unless a
  // byte came (then Node's own timer answers 408). (TLS connections have the handshake timeout.)
  // Not with a 'data' listener on the socket: that takes the socket away from Node's HTTP
  // parser, which otherwise reads it directly, and costs every request on it
  // (docs/benchmarks.md).
  if (!tls) {
    server.on('connection', (socket: Socket) => {
      const timer = setTimeout(() => {
        if (socket.bytesRead === 0) socket.destroy();
      }, limits.headersTimeoutMs);
      timer.unref();
      socket.once('close', () => clearTimeout(timer));
    });
  }
  return server;
}

/** Reads a PEM certificate and key, naming `what` (the flags) in any error. */
export function readTlsFiles(certPath: string, keyPath: string, what: string): TlsFiles {
  const read = (path: string): string => {
    try {
      return readFileSync(path, 'utf8');
    } catch (err) {
      throw new Error(`${what}: cannot read ${path}: ${errorMessage(err)}`);
    }
  };
  const files = { cert: read(certPath), key: read(keyPath) };
  if (!files.cert.includes('-----BEGIN CERTIFICATE-----'))
    throw new Error(`${what}: ${certPath} holds no PEM certificate`);
  if (!/-----BEGIN [A-Z ]*PRIVATE KEY-----/.test(files.key))
    throw new Error(`${what}: ${keyPath} holds no PEM private key`);
  try {
    createSecureContext(files);
  } catch (err) {
    throw new Error(`${what}: the certificate and key do not form a usable pair: ${errorMessage(err)}`);
  }
  return files;
}

/** `tls.crt` and `tls.key` of a directory, as a kubernetes.io/tls Secret mounts them. */
export function readTlsDir(dir: string, flag: string): TlsFiles {
  return readTlsFiles(join(dir, 'tls.crt'), join(dir, 'tls.key'), flag);
}
