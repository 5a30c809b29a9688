/**
 * test/unit/provider/local-egress — the local provider's forward proxies apply the egress policy and
 * the listener limits a lease holder relies on being there: loopback, link-local and private
 * addresses are refused with 403 (also behind a name), CONNECT only to connectPorts, the
 * operator's own ports closed except its probe target `GET /generate_204`, every decision made on
 * the address that is then connected to; slow-header clients are cut off and connections capped.
 * Only loopback destinations receive traffic: every connection attempt goes through a spy `dial`,
 * and the refused private destinations must never reach it.
 */
import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import { Registry } from 'prom-client';
import { fetch, ProxyAgent } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { EgressPolicyConfig } from '../../../src/config/egress.ts';
import {
  createLocalProvider,
  type LocalProvider,
  type LocalProviderOptions,
} from '../../../src/provider/local/index.ts';
import { captureLog } from '../../support/log.ts';
import { type Origin, startHttpOrigin, startTlsOrigin, testPki } from '../../support/origins.ts';
import { freePortRange } from '../../support/ports.ts';
import { callContext, createRequest, TEST_CREDENTIALS as creds } from '../../support/provider-calls.ts';
import { basicAuthHeader, statusViaProxy } from '../../support/squid.ts';

const auth = basicAuthHeader(creds.username, creds.password);

/** Status line of a raw CONNECT; the socket stays open for the caller when `keep` is set. */
async function connectVia(port: number, target: string): Promise<{ status: number; socket: net.Socket }> {
  const socket = net.connect({ host: '127.0.0.1', port });
  await once(socket, 'connect');
  socket.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: ${auth}\r\n\r\n`);
  let buf = '';
  while (!buf.includes('\r\n\r\n')) buf += ((await once(socket, 'data')) as [Buffer])[0].toString('latin1');
  return { status: Number(buf.split(' ')[1]), socket };
}

async function connectStatus(port: number, target: string): Promise<number> {
  const { status, socket } = await connectVia(port, target);
  socket.destroy();
  return status;
}

function requestVia(port: number, url: string, method = 'GET'): Promise<number> {
  return new Promise((resolve, reject) => {
    const r = http.request(
      { host: '127.0.0.1', port, method, path: url, headers: { 'Proxy-Authorization': auth }, agent: false },
      (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      },
    );
    r.on('error', reject);
    r.end();
  });
}

const closed = (s: net.Socket) => s.destroyed || s.closed;

describe('local provider egress policy', () => {
  let tls: Origin;
  /** Stands in for the operator's discovery API: answers 204 to everything. */
  let discovery: Origin;
  const dialed: string[] = [];
  const captured = captureLog('debug');
  const providers: LocalProvider[] = [];

  const make = async (
    egressPolicy?: EgressPolicyConfig,
    extra: Partial<LocalProviderOptions> = {},
  ): Promise<{ provider: LocalProvider; port: number; registry: Registry }> => {
    const registry = new Registry();
    const provider = createLocalProvider({
      name: 'dev',
      config: { portRange: await freePortRange(4), ...(egressPolicy ? { egressPolicy } : {}) },
      log: captured.log,
      registry,
      operator: { ports: [discovery.port], probePort: discovery.port },
      // Every origin connection goes through here; it only ever connects to loopback.
      dial: (host, port) => {
        dialed.push(`${host}:${port}`);
        if (!host.startsWith('127.')) throw new Error(`test dial refused ${host}`);
        return net.connect({ host, port, allowHalfOpen: true });
      },
      ...extra,
    });
    providers.push(provider);
    const inst = await provider.create(callContext(), createRequest('px-egress'));
    return { provider, port: inst.port as number, registry };
  };

  beforeAll(async () => {
    tls = await startTlsOrigin({ defaultStatus: 204 });
    discovery = await startHttpOrigin({ defaultStatus: 204 });
  });
  afterEach(async () => {
    dialed.length = 0;
    await Promise.all(providers.splice(0).map((p) => p.close()));
  });
  afterAll(async () => {
    await Promise.all([tls.close(), discovery.close()]);
    const all = captured.raw.join('');
    expect(all).not.toContain(creds.password);
    expect(all).not.toContain(auth.slice('Basic '.length));
  });

  it('refuses a loopback origin by default with 403, and allowCIDRs opens it', async () => {
    const closedByDefault = await make({ connectPorts: [tls.port] });
    const before = tls.requests;
    expect(await connectStatus(closedByDefault.port, `127.0.0.1:${tls.port}`)).toBe(403);
    expect(await connectStatus(closedByDefault.port, `127.0.0.9:${tls.port}`)).toBe(403);
    expect(await connectStatus(closedByDefault.port, `[::1]:${tls.port}`)).toBe(403);
    expect(await connectStatus(closedByDefault.port, `[::ffff:127.0.0.1]:${tls.port}`)).toBe(403);
    expect(await requestVia(closedByDefault.port, `http://127.0.0.1:${tls.port}/`)).toBe(403);
    expect(dialed).toEqual([]);
    expect(tls.requests).toBe(before);

    const lab = await make({ allowCIDRs: ['127.0.0.1/32'], connectPorts: [tls.port] });
    const dispatcher = new ProxyAgent({
      uri: `http://127.0.0.1:${lab.port}`,
      token: auth,
      requestTls: { ca: testPki().caCert },
    });
    try {
      expect((await fetch(`${tls.baseUrl}/status/204`, { dispatcher })).status).toBe(204);
    } finally {
      await dispatcher.close();
    }
    // Still loopback, but outside the allowed /32.
    expect(await connectStatus(lab.port, `127.0.0.2:${tls.port}`)).toBe(403);
  });

  it('resolves a name, refuses it when an address is denied, and connects to the checked address', async () => {
    const closedByDefault = await make({ connectPorts: [tls.port] });
    expect(await connectStatus(closedByDefault.port, `localhost:${tls.port}`)).toBe(403);
    expect(dialed).toEqual([]);

    const lab = await make({ allowCIDRs: ['127.0.0.1/32', '::1/128'], connectPorts: [tls.port] });
    expect(await connectStatus(lab.port, `localhost:${tls.port}`)).toBe(200);
    // The name was resolved once, checked, and the checked address dialled: no second lookup.
    expect(dialed).toEqual([`127.0.0.1:${tls.port}`]);
  });

  it('CONNECT reaches connectPorts only; absolute-form http:// reaches port 80 and connectPorts', async () => {
    const lab = await make({ allowCIDRs: ['127.0.0.0/8'], connectPorts: [tls.port] });
    expect(await connectStatus(lab.port, `127.0.0.1:22`)).toBe(403);
    expect(await connectStatus(lab.port, `127.0.0.1:${tls.port + 1}`)).toBe(403);
    expect(await requestVia(lab.port, `http://127.0.0.1:22/`)).toBe(403);
    expect(dialed).toEqual([]);
  });

  it('refuses link-local, private and CGNAT destinations before any connection is attempted', async () => {
    const { port, registry } = await make();
    for (const target of ['169.254.169.254:443', '10.0.0.1:443', '172.16.0.1:443', '192.168.1.1:443']) {
      expect(await connectStatus(port, target)).toBe(403);
    }
    for (const target of ['100.64.0.1:443', '[fe80::1]:443', '[fd00::1]:443', '0.0.0.0:443']) {
      expect(await connectStatus(port, target)).toBe(403);
    }
    expect(await requestVia(port, 'http://169.254.169.254/latest/meta-data/')).toBe(403);
    expect(dialed).toEqual([]);
    // Denials are counted and logged, with the target but never the credentials.
    const text = await registry.metrics();
    expect(text).toMatch(/proxy_operator_local_egress_denied_total\{provider="dev",reason="address"\} 9/);
    const lines = captured.lines.filter((l) => l.msg === 'egress denied');
    expect(lines.map((l) => l.target)).toContain('169.254.169.254:443');
  });

  it('decides IPv6 spellings of IPv4 addresses by the IPv4 address, and dials that address', async () => {
    const { port } = await make();
    for (const target of [
      '[64:ff9b::a00:1]:443',
      '[64:ff9b::127.0.0.1]:443',
      '[2002:a9fe:a9fe::1]:443',
      '[::ffff:10.0.0.1]:443',
      '192.0.0.8:443',
      '224.0.0.1:443',
      '255.255.255.255:443',
      '[ff02::1]:443',
    ]) {
      expect(await connectStatus(port, target), target).toBe(403);
    }
    expect(dialed).toEqual([]);
    // An IPv4-mapped destination is checked and dialled as the IPv4 address it stands for.
    const lab = await make({ allowCIDRs: ['127.0.0.0/8'], connectPorts: [tls.port] });
    expect(await connectStatus(lab.port, `[::ffff:127.0.0.1]:${tls.port}`)).toBe(200);
    expect(dialed).toEqual([`127.0.0.1:${tls.port}`]);
  });

  it("keeps the operator's own ports closed, except GET /generate_204 of its probe target", async () => {
    // Even a policy that opens all of loopback on the discovery port keeps the API closed.
    const lab = await make({ allowCIDRs: ['127.0.0.0/8'], connectPorts: [discovery.port] });
    expect(await connectStatus(lab.port, `127.0.0.1:${discovery.port}`)).toBe(403);
    expect(await requestVia(lab.port, `http://127.0.0.1:${discovery.port}/v1/proxies`)).toBe(403);
    expect(await requestVia(lab.port, `http://127.0.0.1:${discovery.port}/generate_204`, 'POST')).toBe(403);
    expect(await requestVia(lab.port, `http://127.0.0.1:${discovery.port}/generate_204?x=1`)).toBe(403);
    expect(dialed).toEqual([]);
    expect(await requestVia(lab.port, `http://127.0.0.1:${discovery.port}/generate_204`)).toBe(204);

    // With the default policy too: this is what the standalone example's health checks use.
    const byDefault = await make();
    expect(
      await statusViaProxy(byDefault.port, `http://127.0.0.1:${discovery.port}/generate_204`, auth),
    ).toBe(204);
    expect(
      await statusViaProxy(byDefault.port, `http://localhost:${discovery.port}/generate_204`, auth),
    ).toBe(204);
    expect(await connectStatus(byDefault.port, `127.0.0.1:${discovery.port}`)).toBe(403);
  });
});

describe('local proxy listener limits', () => {
  const providers: LocalProvider[] = [];
  afterEach(async () => {
    await Promise.all(providers.splice(0).map((p) => p.close()));
  });
  const make = async (limits: NonNullable<LocalProviderOptions['limits']>) => {
    const provider = createLocalProvider({
      name: 'dev',
      config: { portRange: await freePortRange(4), egressPolicy: { allowCIDRs: ['127.0.0.1/32'] } },
      limits,
    });
    providers.push(provider);
    const inst = await provider.create(callContext(), createRequest('px-limits'));
    return inst.port as number;
  };

  it('cuts off a client that trickles its headers within the header timeout', async () => {
    const port = await make({ headersTimeoutMs: 300, requestTimeoutMs: 600, idleTimeoutMs: 10_000 });
    const s = net.connect({ host: '127.0.0.1', port });
    await once(s, 'connect');
    s.on('error', () => undefined);
    const started = Date.now();
    s.write('GET http://127.0.0.1/ HTTP/1.1\r\n');
    // One header byte every 50 ms keeps the socket busy, so only the header timeout can end it.
    const drip = setInterval(() => s.writable && s.write('X'), 50);
    try {
      await expect.poll(() => closed(s), { timeout: 5000, interval: 20 }).toBe(true);
    } finally {
      clearInterval(drip);
    }
    expect(Date.now() - started).toBeLessThan(3000);
  });

  it('closes an idle connection and caps connections per listener', async () => {
    const port = await make({
      headersTimeoutMs: 5000,
      requestTimeoutMs: 5000,
      idleTimeoutMs: 300,
      maxConnections: 2,
    });
    const open = async () => {
      const s = net.connect({ host: '127.0.0.1', port });
      s.on('error', () => undefined);
      await once(s, 'connect');
      return s;
    };
    const [a, b] = [await open(), await open()];
    const c = await open();
    // The third connection is over the cap and dropped at once.
    await expect.poll(() => closed(c), { timeout: 3000, interval: 20 }).toBe(true);
    // The two silent ones are closed by the idle timeout.
    await expect.poll(() => closed(a) && closed(b), { timeout: 3000, interval: 20 }).toBe(true);
  });

  it('lets a busy tunnel outlive the request timeout, and closes it once idle', async () => {
    const echo = net.createServer((s) => s.pipe(s));
    echo.listen(0, '127.0.0.1');
    await once(echo, 'listening');
    const echoPort = (echo.address() as net.AddressInfo).port;
    try {
      const provider = createLocalProvider({
        name: 'dev',
        config: {
          portRange: await freePortRange(4),
          egressPolicy: { allowCIDRs: ['127.0.0.1/32'], connectPorts: [echoPort] },
        },
        limits: { headersTimeoutMs: 200, requestTimeoutMs: 200, idleTimeoutMs: 500 },
      });
      providers.push(provider);
      const inst = await provider.create(callContext(), createRequest('px-tunnel'));
      const { status, socket } = await connectVia(inst.port as number, `127.0.0.1:${echoPort}`);
      expect(status).toBe(200);
      socket.on('error', () => undefined);
      // Round trips for 3× the request timeout: a busy tunnel stays up.
      const start = Date.now();
      for (let i = 0; Date.now() - start < 600; i++) {
        socket.write(`ping${i}`);
        const [d] = (await once(socket, 'data')) as [Buffer];
        expect(d.toString()).toContain(`ping${i}`);
      }
      expect(closed(socket)).toBe(false);
      // Then silent: cut after the idle timeout.
      await expect.poll(() => closed(socket), { timeout: 3000, interval: 20 }).toBe(true);
    } finally {
      echo.close();
    }
  });
});
