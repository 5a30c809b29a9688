/**
 * test/support/listeners — raw clients for listener tests on loopback: a request with any Host
 * header (fetch cannot set one), bytes on a bare socket, and a slow-header client that trickles
 * a request head until the server hangs up.
 */
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { connect, type Socket } from 'node:net';
import { connect as tlsConnect } from 'node:tls';

export interface RawResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
}

/** One request with exactly these headers (Host included); `ca` trusts a test certificate. */
export function send(
  url: string,
  init: { method?: string; headers?: Record<string, string>; body?: string; ca?: string } = {},
): Promise<RawResponse> {
  const u = new URL(url);
  const fn = u.protocol === 'https:' ? httpsRequest : httpRequest;
  return new Promise((resolve, reject) => {
    const req = fn(
      {
        host: u.hostname.replace(/^\[|\]$/g, ''),
        port: u.port,
        path: `${u.pathname}${u.search}`,
        method: init.method ?? 'GET',
        headers: init.headers,
        agent: false,
        ...(init.ca ? { ca: init.ca } : {}),
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => {
          text += c;
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text }));
      },
    );
    req.on('error', reject);
    req.end(init.body);
  });
}

export interface RawExchange {
  /** Everything the server sent before closing. */
  received: string;
  /** ms from connect to the server closing the connection. */
  closedAfterMs: number;
}

/** Writes `data` on a fresh connection and collects the answer until the server closes. */
export function exchange(
  port: number,
  data: string,
  opts: { tls?: boolean; timeoutMs?: number } = {},
): Promise<RawExchange> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const socket: Socket = opts.tls
      ? tlsConnect({ host: '127.0.0.1', port, rejectUnauthorized: false })
      : connect({ host: '127.0.0.1', port });
    let received = '';
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`server kept the connection open for ${opts.timeoutMs ?? 10_000} ms`));
    }, opts.timeoutMs ?? 10_000);
    socket.setEncoding('utf8');
    socket.on(opts.tls ? 'secureConnect' : 'connect', () => socket.write(data));
    socket.on('data', (c: string) => {
      received += c;
    });
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearTimeout(timer);
      resolve({ received, closedAfterMs: performance.now() - started });
    });
  });
}

/**
 * A slowloris client: sends a request line, then one header line every `everyMs`, never the
 * blank line that ends the head. Resolves when the server closes the connection (rejects after
 * `timeoutMs`), with what it answered and how many header lines got through.
 */
export function slowHeaders(
  port: number,
  opts: { everyMs?: number; timeoutMs?: number; tls?: boolean } = {},
): Promise<RawExchange & { linesSent: number }> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const socket: Socket = opts.tls
      ? tlsConnect({ host: '127.0.0.1', port, rejectUnauthorized: false })
      : connect({ host: '127.0.0.1', port });
    let received = '';
    let linesSent = 0;
    let ticker: NodeJS.Timeout | undefined;
    const timer = setTimeout(() => {
      clearInterval(ticker);
      socket.destroy();
      reject(new Error(`a slow-header client was kept for ${opts.timeoutMs ?? 10_000} ms`));
    }, opts.timeoutMs ?? 10_000);
    socket.setEncoding('utf8');
    socket.on(opts.tls ? 'secureConnect' : 'connect', () => {
      socket.write('GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n');
      ticker = setInterval(() => {
        if (socket.writable) {
          socket.write(`X-Slow-${linesSent}: x\r\n`);
          linesSent++;
        }
      }, opts.everyMs ?? 50);
    });
    socket.on('data', (c: string) => {
      received += c;
    });
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearInterval(ticker);
      clearTimeout(timer);
      resolve({ received, closedAfterMs: performance.now() - started, linesSent });
    });
  });
}

/** An open, idle connection (a bare TCP connect) and a promise of its close. */
export function openIdle(port: number): Promise<{ socket: Socket; closed: Promise<number> }> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const socket = connect({ host: '127.0.0.1', port });
    const closed = new Promise<number>((r) => socket.on('close', () => r(performance.now() - started)));
    socket.on('error', () => undefined);
    // A paused socket may never see the server's FIN (no 'end', so no 'close'): keep reading.
    socket.resume();
    socket.once('connect', () => resolve({ socket, closed }));
    socket.once('error', reject);
  });
}
