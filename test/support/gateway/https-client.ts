/**
 * test/support/gateway/https-client — an HTTPS request through the gateway the way any proxy
 * client makes one: CONNECT with Basic credentials, then TLS to the requested host inside the
 * tunnel, trusting `ca` only (the gateway's inspection CA, or an origin's own CA for a tunnel
 * left untouched). Answers with what a crawler sees, plus the certificate it was shown.
 */
import { X509Certificate } from 'node:crypto';
import http from 'node:http';
import { isIP } from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { gunzipSync } from 'node:zlib';

export interface HttpsAnswer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
  /** The certificate the client was shown (the gateway's leaf when inspected). */
  cert: X509Certificate;
  /** With `upgrade`, when the answer was 101: the connection in the new protocol and its first bytes. */
  upgraded?: { socket: Duplex; head: Buffer };
}

/** What the CONNECT got when it was not 200, or the TLS error when the handshake failed. */
export class TunnelRefused extends Error {
  readonly status: number | undefined;
  constructor(message: string, status?: number) {
    super(message);
    this.status = status;
  }
}

export function httpsViaGateway(
  gatewayPort: number,
  auth: { user: string; token: string },
  url: string,
  ca: string,
  /** `upgrade`: asks to switch to this protocol (as a WebSocket client does). */
  opts: { method?: string; body?: string; upgrade?: string } = {},
): Promise<HttpsAnswer> {
  const u = new URL(url);
  const host = u.hostname.replace(/^\[(.*)\]$/, '$1');
  const port = Number(u.port || 443);
  return new Promise((resolve, reject) => {
    const connect = http.request({
      host: '127.0.0.1',
      port: gatewayPort,
      method: 'CONNECT',
      path: `${u.hostname}:${port}`,
      headers: {
        'Proxy-Authorization': `Basic ${Buffer.from(`${auth.user}:${auth.token}`).toString('base64')}`,
      },
    });
    connect.once('error', reject);
    connect.once('connect', (res, socket) => {
      if (res.statusCode !== 200) {
        socket.destroy();
        return reject(new TunnelRefused(`CONNECT answered ${res.statusCode}`, res.statusCode));
      }
      const secure = tls.connect({ socket, ca, ...(isIP(host) ? {} : { servername: host }), host });
      secure.once('error', (err) => reject(new TunnelRefused(err.message)));
      secure.once('secureConnect', () => {
        const cert = new X509Certificate(secure.getPeerCertificate().raw);
        const req = http.request(
          {
            createConnection: () => secure,
            method: opts.method ?? 'GET',
            path: `${u.pathname}${u.search}`,
            headers: {
              Host: u.host,
              'Accept-Encoding': 'gzip',
              ...(opts.upgrade ? { Connection: 'Upgrade', Upgrade: opts.upgrade } : { Connection: 'close' }),
            },
          },
          (r) => {
            const chunks: Buffer[] = [];
            r.on('data', (c: Buffer) => chunks.push(c));
            r.on('end', () => {
              const raw = Buffer.concat(chunks);
              const body = r.headers['content-encoding'] === 'gzip' ? gunzipSync(raw) : raw;
              resolve({ status: r.statusCode ?? 0, headers: r.headers, body: body.toString('utf8'), cert });
              secure.destroy();
            });
          },
        );
        req.once('upgrade', (r, socket, head) =>
          resolve({
            status: r.statusCode ?? 0,
            headers: r.headers,
            body: '',
            cert,
            upgraded: { socket, head },
          }),
        );
        req.once('error', reject);
        req.end(opts.body);
      });
    });
    connect.end();
  });
}
