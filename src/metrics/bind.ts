/**
 * metrics/bind — the `host:port` bind-address flags shared by the metrics, discovery and
 * health-probe servers: parse them once, precisely, and listen on what they say.
 */
import type { Server } from 'node:http';
import { isIP } from 'node:net';

export interface BindAddress {
  /** undefined = every interface (what `:8080` means). */
  host: string | undefined;
  /** 0 = an ephemeral port (tests). */
  port: number;
}

const HOSTNAME =
  /^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;

/**
 * Parses `"0"` (disabled → null), `":8080"` (all interfaces), `"127.0.0.1:9090"`,
 * `"[::1]:9090"` or `"localhost:8080"`. Anything else throws an error naming `flag`.
 *
 * Fastify note: `listen({port})` without a host binds localhost only; pass
 * `host: bind.host ?? '::'` (or use `listenOn(app.server, bind)`) to get every interface.
 */
export function parseBindAddress(value: string, flag: string): BindAddress | null {
  const v = value.trim();
  const bad = (why: string): Error =>
    new Error(`${flag}: ${JSON.stringify(value)} ${why} (want "host:port", ":port", or "0" to disable)`);
  if (v === '0') return null;
  if (v === '') throw bad('is empty');
  let host: string;
  let portText: string;
  if (v.startsWith('[')) {
    const close = v.indexOf(']');
    if (close < 0 || v[close + 1] !== ':') throw bad('has a malformed [IPv6] host');
    host = v.slice(1, close);
    portText = v.slice(close + 2);
    if (isIP(host) !== 6) throw bad(`has an invalid IPv6 address "${host}"`);
  } else {
    const colon = v.lastIndexOf(':');
    if (colon < 0) throw bad('has no port');
    host = v.slice(0, colon);
    portText = v.slice(colon + 1);
    if (host.includes(':')) throw bad('needs brackets around an IPv6 host');
    if (host !== '' && isIP(host) === 0 && !HOSTNAME.test(host)) throw bad(`has an invalid host "${host}"`);
  }
  if (!/^\d{1,5}$/.test(portText)) throw bad('has no valid port');
  const port = Number(portText);
  if (port > 65535) throw bad('has a port above 65535');
  return { host: host === '' ? undefined : host, port };
}

/** `host:port` for logs, with brackets for IPv6. */
export function formatAddress(host: string, port: number): string {
  return isIP(host) === 6 ? `[${host}]:${port}` : `${host}:${port}`;
}

/** Listens `server` on `bind` and resolves with the port actually bound (useful with port 0). */
export function listenOn(server: Server, bind: BindAddress): Promise<{ host: string; port: number }> {
  return new Promise((resolve, reject) => {
    const onError = (err: Error): void => reject(err);
    server.once('error', onError);
    const done = (): void => {
      server.off('error', onError);
      const addr = server.address();
      if (addr === null || typeof addr === 'string') {
        reject(new Error('server is not listening on a TCP address'));
        return;
      }
      resolve({ host: addr.address, port: addr.port });
    };
    if (bind.host === undefined) server.listen(bind.port, done);
    else server.listen(bind.port, bind.host, done);
  });
}

/**
 * Stops accepting, drops idle keep-alive connections, waits for in-flight requests and, after
 * `graceMs`, cuts whatever is still open.
 */
export function closeServer(server: Server, graceMs = 5_000): Promise<void> {
  return new Promise((resolve, reject) => {
    if (!server.listening) {
      resolve();
      return;
    }
    const timer = setTimeout(() => server.closeAllConnections(), graceMs);
    timer.unref();
    server.close((err) => {
      clearTimeout(timer);
      if (err) reject(err);
      else resolve();
    });
    server.closeIdleConnections();
  });
}
