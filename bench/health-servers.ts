/**
 * bench/health-servers — the far side of the health benchmark, run as a child process so its
 * CPU is not billed to the engine: one TLS origin (test CA) and/or a few minimal authenticated
 * CONNECT proxies on 127.0.0.1 (`<origin|proxies|both> [count]`). Prints one JSON line with
 * what it serves ({origin, ca} / {proxies[], username, password}); exits when stdin closes.
 */
import { type AddressInfo, connect, createServer, type Socket } from 'node:net';
import { createServer as createTlsServer } from 'node:tls';
import { testPki } from '../test/support/origins.ts';

const ROLE = process.argv[2] ?? 'both';
const PROXIES = Number(process.argv[3] ?? 20);
const username = 'bench';
const password = 'bench-password';
const expected = `Basic ${Buffer.from(`${username}:${password}`).toString('base64')}`;

function listen(server: import('node:net').Server): Promise<number> {
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => resolve((server.address() as AddressInfo).port)),
  );
}

/** CONNECT-only forward proxy: enough for probes, as cheap as possible. */
function connectProxy(): import('node:net').Server {
  return createServer({ noDelay: true }, (client: Socket) => {
    client.on('error', () => undefined);
    let buf = '';
    const onData = (d: Buffer) => {
      buf += d.toString('latin1');
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      client.off('data', onData);
      const head = buf.slice(0, end);
      const m = /^CONNECT ([^\s:]+):(\d+) HTTP\/1\.[01]\r\n/.exec(head);
      const auth = /\r\nproxy-authorization: *([^\r\n]+)/i.exec(head)?.[1];
      if (!m) return void client.end('HTTP/1.1 405 Method Not Allowed\r\nConnection: close\r\n\r\n');
      if (auth !== expected) {
        return void client.end('HTTP/1.1 407 Proxy Authentication Required\r\nConnection: close\r\n\r\n');
      }
      const upstream = connect({ host: m[1], port: Number(m[2]), noDelay: true }, () => {
        client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        const rest = buf.slice(end + 4);
        if (rest) upstream.write(Buffer.from(rest, 'latin1'));
        client.pipe(upstream).pipe(client);
      });
      upstream.on('error', () => client.destroy());
      client.on('close', () => upstream.destroy());
    };
    client.on('data', onData);
  });
}

const out: Record<string, unknown> = { username, password };
if (ROLE !== 'proxies') {
  const { cert, key, caCert } = testPki();
  // Raw TLS with a fixed answer: the far side must stay cheap enough to keep up on a small box.
  const origin = createTlsServer({ cert, key }, (socket) => {
    socket.on('error', () => undefined);
    socket.once('data', () => socket.end('HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n'));
  });
  out.origin = await listen(origin);
  out.ca = caCert;
}
if (ROLE !== 'origin') {
  const proxies: number[] = [];
  for (let i = 0; i < PROXIES; i++) proxies.push(await listen(connectProxy()));
  out.proxies = proxies;
}
process.stdout.write(`${JSON.stringify(out)}\n`);
process.stdin.resume();
process.stdin.on('end', () => process.exit(0));
process.stdin.on('close', () => process.exit(0));
