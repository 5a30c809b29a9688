import { once } from 'node:events';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import pino from 'pino';
import { fetch, ProxyAgent } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { classify } from '../../../src/provider/errors.ts';
import { ForwardProxy } from '../../../src/provider/local/forward-proxy.ts';
import { createLocalProvider, type LocalProvider, preferredPort } from '../../../src/provider/local/index.ts';
import { captureLog } from '../../support/log.ts';
import { closedPort, type Origin, startTlsOrigin, testPki } from '../../support/origins.ts';
import { freePortRange } from '../../support/ports.ts';
import { callContext, createRequest, TEST_CREDENTIALS } from '../../support/provider-calls.ts';

const creds = TEST_CREDENTIALS;
const ctx = callContext;
const req = createRequest;

const basic = (u: string, p: string) => `Basic ${Buffer.from(`${u}:${p}`).toString('base64')}`;

/** Plain HTTP origin that echoes method, headers and body as JSON. */
async function startEchoOrigin(): Promise<{
  port: number;
  seen: http.IncomingHttpHeaders[];
  close(): Promise<void>;
}> {
  const seen: http.IncomingHttpHeaders[] = [];
  const server = http.createServer(async (rq, rs) => {
    seen.push(rq.headers);
    const chunks: Buffer[] = [];
    for await (const c of rq) chunks.push(c as Buffer);
    rs.writeHead(201, { 'Content-Type': 'application/json', 'X-Origin': 'echo', Connection: 'keep-alive' });
    rs.end(JSON.stringify({ method: rq.method, url: rq.url, body: Buffer.concat(chunks).toString('utf8') }));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: (server.address() as AddressInfo).port,
    seen,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

/**
 * TCP origin that reads until the client half-closes, then answers with what it got and
 * closes: only works when the proxy carries the FIN through the tunnel.
 */
async function startHalfCloseOrigin(): Promise<{
  port: number;
  open: Set<net.Socket>;
  close(): Promise<void>;
}> {
  const open = new Set<net.Socket>();
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    open.add(s);
    s.on('close', () => open.delete(s));
    s.on('error', () => undefined);
    const chunks: Buffer[] = [];
    s.on('data', (d) => {
      chunks.push(d);
      if (d.toString().includes('ping')) s.write('pong');
    });
    s.on('end', () => s.end(`got:${Buffer.concat(chunks).toString()}`));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: (server.address() as AddressInfo).port,
    open,
    close: () =>
      new Promise((r) => {
        for (const s of open) s.destroy();
        server.close(() => r());
      }),
  };
}

/** A raw CONNECT through the proxy; resolves with the socket and the proxy's status line. */
async function rawConnect(
  proxyPort: number,
  target: string,
  auth?: string,
): Promise<{ socket: net.Socket; status: number; head: string }> {
  const socket = net.connect({ host: '127.0.0.1', port: proxyPort });
  await once(socket, 'connect');
  const lines = [`CONNECT ${target} HTTP/1.1`, `Host: ${target}`];
  if (auth) lines.push(`Proxy-Authorization: ${auth}`);
  socket.write(`${lines.join('\r\n')}\r\n\r\n`);
  let buf = '';
  while (!buf.includes('\r\n\r\n')) {
    const [chunk] = (await once(socket, 'data')) as [Buffer];
    buf += chunk.toString('latin1');
  }
  const head = buf.slice(0, buf.indexOf('\r\n\r\n'));
  return { socket, status: Number(head.split(' ')[1]), head };
}

function absoluteRequest(
  proxyPort: number,
  url: string,
  opts: { method?: string; headers?: Record<string, string>; body?: string } = {},
): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    const r = http.request(
      {
        host: '127.0.0.1',
        port: proxyPort,
        method: opts.method ?? 'GET',
        path: url,
        headers: opts.headers,
        agent: false,
      },
      async (res) => {
        const chunks: Buffer[] = [];
        for await (const c of res) chunks.push(c as Buffer);
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          body: Buffer.concat(chunks).toString('utf8'),
        });
      },
    );
    r.on('error', reject);
    r.end(opts.body);
  });
}

describe('local provider', () => {
  let tls: Origin;
  let echo: Awaited<ReturnType<typeof startEchoOrigin>>;
  let halfClose: Awaited<ReturnType<typeof startHalfCloseOrigin>>;
  /** A loopback port nobody listens on, for the 502 cases. */
  let refusing: number;
  // The origins live on loopback, which the default egress policy refuses
  // (test/unit/provider/local-egress.test.ts): these tests open exactly them.
  const lab = () => ({
    allowCIDRs: ['127.0.0.1/32'],
    connectPorts: [tls.port, echo.port, halfClose.port, refusing],
  });
  const captured = captureLog('debug');
  const providers: LocalProvider[] = [];
  const make = async (size = 20) => {
    const p = createLocalProvider({
      name: 'dev',
      config: { portRange: await freePortRange(size), egressPolicy: lab() },
      log: captured.log,
      connectTimeoutMs: 2000,
    });
    providers.push(p);
    return p;
  };

  beforeAll(async () => {
    tls = await startTlsOrigin({ defaultStatus: 204 });
    echo = await startEchoOrigin();
    halfClose = await startHalfCloseOrigin();
    refusing = await closedPort();
  });
  afterEach(async () => {
    await Promise.all(providers.splice(0).map((p) => p.close()));
  });
  afterAll(async () => {
    await Promise.all([tls.close(), echo.close(), halfClose.close()]);
    // Credentials must never reach the logs, whatever happened above.
    const all = captured.raw.join('');
    expect(all).not.toContain(creds.password);
    expect(all).not.toContain(Buffer.from(`${creds.username}:${creds.password}`).toString('base64'));
  });

  it('creates a Running instance with an address, port and the Proxy identity', async () => {
    const p = await make();
    const inst = await p.create(ctx(), req('px-a'));
    expect(inst).toMatchObject({
      id: 'local/px-a',
      name: 'px-a',
      state: 'Running',
      address: '127.0.0.1',
      uid: 'uid-px-a',
      namespace: 'crawl',
    });
    expect(inst.port).toBeGreaterThan(0);
    expect(inst.createdAt).toBeInstanceOf(Date);
    expect(await p.get(ctx(), inst.id)).toEqual(inst);
    expect(await p.listByTag(ctx())).toEqual([inst]);
  });

  it('tunnels HTTPS through CONNECT for an authenticated client (undici ProxyAgent)', async () => {
    const p = await make();
    const inst = await p.create(ctx(), req('px-tls'));
    const dispatcher = new ProxyAgent({
      uri: `http://127.0.0.1:${inst.port}`,
      token: basic(creds.username, creds.password),
      requestTls: { ca: testPki().caCert },
    });
    try {
      const res = await fetch(`${tls.baseUrl}/status/204`, { dispatcher });
      expect(res.status).toBe(204);
      const res2 = await fetch(`https://localhost:${tls.port}/status/200`, { dispatcher });
      expect(res2.status).toBe(200);
    } finally {
      await dispatcher.close();
    }
  });

  it('forwards absolute-form HTTP with the body both ways and strips hop-by-hop and proxy auth', async () => {
    const p = await make();
    const inst = await p.create(ctx(), req('px-http'));
    const body = 'x'.repeat(200_000);
    const res = await absoluteRequest(inst.port!, `http://127.0.0.1:${echo.port}/upload?q=1`, {
      method: 'POST',
      headers: {
        'Proxy-Authorization': basic(creds.username, creds.password),
        Connection: 'keep-alive, X-Hop',
        'X-Hop': 'drop me',
        'Keep-Alive': 'timeout=5',
        'X-Keep': 'kept',
        'Content-Type': 'text/plain',
      },
      body,
    });
    expect(res.status).toBe(201);
    expect(res.headers['x-origin']).toBe('echo');
    expect(JSON.parse(res.body)).toEqual({ method: 'POST', url: '/upload?q=1', body });
    const seen = echo.seen.at(-1)!;
    expect(seen['proxy-authorization']).toBeUndefined();
    expect(seen['x-hop']).toBeUndefined();
    expect(seen['keep-alive']).toBeUndefined();
    expect(seen['x-keep']).toBe('kept');
    expect(seen.host).toBe(`127.0.0.1:${echo.port}`);
  });

  it('answers 407 with a Basic challenge for missing or wrong credentials', async () => {
    const p = await make();
    const inst = await p.create(ctx(), req('px-auth'));
    const target = `http://127.0.0.1:${echo.port}/`;
    const before = echo.seen.length;
    for (const auth of [
      undefined,
      basic(creds.username, 'wrong'),
      basic('other', creds.password),
      'Bearer abc',
    ]) {
      const res = await absoluteRequest(
        inst.port!,
        target,
        auth ? { headers: { 'Proxy-Authorization': auth } } : {},
      );
      expect(res.status).toBe(407);
      expect(res.headers['proxy-authenticate']).toBe('Basic realm="egress-proxies-operator"');
      const tunnel = await rawConnect(inst.port!, `127.0.0.1:${tls.port}`, auth);
      expect(tunnel.status).toBe(407);
      expect(tunnel.head).toContain('Proxy-Authenticate: Basic realm="egress-proxies-operator"');
      tunnel.socket.destroy();
    }
    expect(echo.seen.length).toBe(before);
  });

  it('carries a half-close through the tunnel so the origin can still answer', async () => {
    const p = await make();
    const inst = await p.create(ctx(), req('px-half'));
    const { socket, status } = await rawConnect(
      inst.port!,
      `127.0.0.1:${halfClose.port}`,
      basic(creds.username, creds.password),
    );
    expect(status).toBe(200);
    const chunks: Buffer[] = [];
    socket.on('data', (d) => chunks.push(d));
    socket.end('hello');
    await once(socket, 'end');
    expect(Buffer.concat(chunks).toString()).toBe('got:hello');
    socket.destroy();
  });

  it('answers 502 marked origin-unreachable when the tunnel target refuses, 400 for a malformed target', async () => {
    const p = await make();
    const inst = await p.create(ctx(), req('px-502'));
    const auth = basic(creds.username, creds.password);
    const refused = await rawConnect(inst.port!, `127.0.0.1:${refusing}`, auth);
    expect(refused.status).toBe(502);
    // The mark tells a crawler that the origin failed, not this proxy (docs/lease-api.md).
    expect(refused.head).toMatch(/\r\nX-Proxy-Error: origin-unreachable\r\n/i);
    refused.socket.destroy();
    const bad = await rawConnect(inst.port!, 'no-port-here', auth);
    expect(bad.status).toBe(400);
    bad.socket.destroy();
    const http502 = await absoluteRequest(inst.port!, `http://127.0.0.1:${refusing}/`, {
      headers: { 'Proxy-Authorization': auth },
    });
    expect(http502.status).toBe(502);
    expect(http502.headers['x-proxy-error']).toBe('origin-unreachable');
  });

  it('answers 504 when the tunnel target does not accept within the connect timeout', async () => {
    const proxy = new ForwardProxy({
      credentials: creds,
      log: pino({ level: 'silent' }),
      connectTimeoutMs: 150,
      dial: () => new net.Socket(), // a connection attempt that never completes
    });
    await proxy.listen(0, '127.0.0.1');
    try {
      const started = Date.now();
      const r = await rawConnect(proxy.port, '203.0.113.9:443', basic(creds.username, creds.password));
      expect(r.status).toBe(504);
      expect(r.head).toMatch(/\r\nX-Proxy-Error: origin-timeout\r\n/i);
      expect(Date.now() - started).toBeGreaterThanOrEqual(100);
      r.socket.destroy();
    } finally {
      await proxy.close();
    }
  });

  it('delete closes the listener and kills open tunnels; get then answers NotFound', async () => {
    const p = await make();
    const inst = await p.create(ctx(), req('px-del'));
    const { socket, status } = await rawConnect(
      inst.port!,
      `127.0.0.1:${halfClose.port}`,
      basic(creds.username, creds.password),
    );
    expect(status).toBe(200);
    socket.write('ping');
    const [pong] = (await once(socket, 'data')) as [Buffer];
    expect(pong.toString()).toBe('pong');
    expect(halfClose.open.size).toBeGreaterThan(0);
    const closed = once(socket, 'close');
    await p.delete(ctx(), inst.id);
    await closed;
    // The origin side of the tunnel is gone too.
    await expect.poll(() => halfClose.open.size).toBe(0);
    const err = await p.get(ctx(), inst.id).catch((e: unknown) => e);
    expect(classify(err)).toBe('NotFound');
    const refused = net.connect({ host: '127.0.0.1', port: inst.port! });
    const [connErr] = (await once(refused, 'error')) as [NodeJS.ErrnoException];
    expect(connErr.code).toBe('ECONNREFUSED');
    await p.delete(ctx(), inst.id); // idempotent
    expect(await p.listByTag(ctx())).toEqual([]);
  });

  it('create is idempotent by name, also for concurrent calls, and a re-create reuses the port', async () => {
    const p = await make();
    const [a, b] = await Promise.all([p.create(ctx(), req('px-same')), p.create(ctx(), req('px-same'))]);
    expect(b).toEqual(a);
    const c = await p.create(ctx(), req('px-same'));
    expect(c).toEqual(a);
    expect(await p.listByTag(ctx())).toHaveLength(1);
    const other = await p.create(ctx(), req('px-other'));
    expect(other.port).not.toBe(a.port);
    await p.delete(ctx(), a.id);
    const again = await p.create(ctx(), req('px-same'));
    expect(again.port).toBe(a.port);
  });

  it('honours a port hint inside the range and skips ports someone else holds', async () => {
    const range = await freePortRange(3);
    const q = createLocalProvider({ name: 'dev', config: { portRange: range } });
    providers.push(q);
    // Someone else holds the port this name would get first: the next free one is used.
    const first = preferredPort('px-skip', range.from, range.to);
    const hint = first === range.to ? range.from : range.to;
    const hinted = await q.create(ctx(), req('px-hint', { port: hint }));
    expect(hinted.port).toBe(hint);
    const squatter = net.createServer();
    squatter.listen(first, '127.0.0.1');
    await once(squatter, 'listening');
    try {
      const next = await q.create(ctx(), req('px-skip'));
      expect(next.port).not.toBe(first);
      expect(next.port).not.toBe(hint);
      expect(next.port).toBeGreaterThanOrEqual(range.from);
      expect(next.port).toBeLessThanOrEqual(range.to);
    } finally {
      squatter.close();
    }
  });

  it('re-creates an instance on the same port after a restart of the process', async () => {
    const range = await freePortRange(50);
    const before = createLocalProvider({ name: 'dev', config: { portRange: range } });
    providers.push(before);
    // Names whose slots differ (a shared slot goes to whoever is created first).
    const names: string[] = [];
    for (let i = 0; names.length < 3; i++) {
      const slot = preferredPort(`px-r${i}`, range.from, range.to);
      if (!names.some((n) => preferredPort(n, range.from, range.to) === slot)) names.push(`px-r${i}`);
    }
    const ports = new Map<string, number | undefined>();
    for (const n of names) ports.set(n, (await before.create(ctx(), req(n))).port);
    await before.close();
    // A new process knows nothing: get answers NotFound, and the reconciler re-creates.
    const after = createLocalProvider({ name: 'dev', config: { portRange: range } });
    providers.push(after);
    expect(classify(await after.get(ctx(), 'local/px-r1').catch((e: unknown) => e))).toBe('NotFound');
    for (const n of [...names].reverse()) expect((await after.create(ctx(), req(n))).port).toBe(ports.get(n));
  });

  it('fails with QuotaExceeded when the port range is used up, and check says so', async () => {
    const p = await make(2);
    await p.create(ctx(), req('px-1'));
    await p.create(ctx(), req('px-2'));
    const [ready] = await p.check(ctx());
    expect(ready).toMatchObject({ name: 'local', ready: false, reason: 'PortRangeExhausted' });
    const err = await p.create(ctx(), req('px-3')).catch((e: unknown) => e);
    expect(classify(err)).toBe('QuotaExceeded');
    expect(String((err as Error).message)).toMatch(/no free port/);
    expect(String((err as Error).message)).not.toContain(creds.password);
    await p.delete(ctx(), 'local/px-1');
    expect((await p.create(ctx(), req('px-3'))).state).toBe('Running');
  });

  it('check reports a ready target with listener count and port range', async () => {
    const p = await make(5);
    await p.create(ctx(), req('px-c'));
    const [t] = await p.check(ctx());
    expect(t).toMatchObject({ name: 'local', address: '127.0.0.1', ready: true, reason: 'PortsAvailable' });
    expect(t?.details?.listeners).toBe('1');
    expect(t?.details?.portRange).toMatch(/^\d+-\d+$/);
  });

  it('rejects malformed provider IDs and names as permanent, and bad config naming the field', async () => {
    const p = await make();
    for (const id of ['px-a', 'gcp/px-a', 'local/', 'local/a/b']) {
      expect(classify(await p.get(ctx(), id).catch((e: unknown) => e))).toBe('Permanent');
    }
    expect(classify(await p.create(ctx(), req('../evil')).catch((e: unknown) => e))).toBe('Permanent');
    expect(() =>
      createLocalProvider({ name: 'x', config: { portRange: { from: 20010, to: 20000 } } }),
    ).toThrow(/local\.portRange/);
    expect(() => createLocalProvider({ name: 'x', config: { bindAddress: 'not an ip' } })).toThrow(
      /local\.bindAddress/,
    );
  });

  it('publishes advertiseAddress while listening on bindAddress', async () => {
    const p = createLocalProvider({
      name: 'dev',
      config: {
        bindAddress: '127.0.0.1',
        advertiseAddress: 'proxy.example.test',
        portRange: await freePortRange(3),
        egressPolicy: lab(),
      },
    });
    providers.push(p);
    const inst = await p.create(ctx(), req('px-adv'));
    expect(inst.address).toBe('proxy.example.test');
    const res = await absoluteRequest(inst.port!, `http://127.0.0.1:${echo.port}/`, {
      headers: { 'Proxy-Authorization': basic(creds.username, creds.password) },
    });
    expect(res.status).toBe(201);
  });

  it('close stops every listener', async () => {
    const p = await make();
    const a = await p.create(ctx(), req('px-x'));
    await p.close();
    const s = net.connect({ host: '127.0.0.1', port: a.port! });
    const [e] = (await once(s, 'error')) as [NodeJS.ErrnoException];
    expect(e.code).toBe('ECONNREFUSED');
    expect(classify(await p.create(ctx(), req('px-y')).catch((e2: unknown) => e2))).toBe('Transient');
  });
});
