/**
 * HTTPS inspection and response rules (docs/gateway.md, "HTTPS inspection", "Rules"), through
 * real Squid upstreams (each leaving from its own 127.0.0.x address) to real loopback origins
 * that block by source address: a request blocked on one upstream is answered from the next,
 * the blocks are per site, observe mode only counts, excluded hosts and `inspect-off` keep the
 * origin's own certificate, a client that does not open TLS (`ws://`, a server that speaks
 * first) is tunnelled untouched, a WebSocket-style upgrade inside is switched through (its
 * handshake judged by the rules like any answer), and a refused origin certificate is a 502 that
 * says why.
 */
import { X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync } from 'node:fs';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { type AddressInfo, createServer as createTcpServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import { createServer as createTlsServer, type TLSSocket } from 'node:tls';
import { brotliCompressSync, deflateRawSync, deflateSync, gzipSync } from 'node:zlib';
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { GatewayRuleConfig } from '../../../src/config/schema.ts';
import { FileCaStore, GatewayCa } from '../../../src/gateway/ca.ts';
import { systemClock } from '../../../src/runtime/clock.ts';
import { httpsViaGateway, TunnelRefused } from '../../support/gateway/https-client.ts';
import { type RawClient, rawClient } from '../../support/gateway/local-world.ts';
import { startWorld, TOKEN, type World } from '../../support/gateway/world.ts';
import { captureLog } from '../../support/log.ts';
import { makePki } from '../../support/pki.ts';
import { until } from '../../support/wait.ts';

/** Each test its own site (origins listen on every loopback address), so cooldowns stay apart. */
const site = (n: number) => `127.0.0.${20 + n}`;
const SITES = Array.from({ length: 20 }, (_, i) => site(i));

const pki = makePki({ caName: 'inspect-origin-ca', dnsNames: ['localhost'], ipAddresses: SITES, days: 2 });
const wrongName = makePki({
  caName: 'wrong-name-ca',
  dnsNames: ['elsewhere.test'],
  ipAddresses: [],
  days: 2,
});
const expired = makePki({ caName: 'expired-ca', dnsNames: ['localhost'], ipAddresses: SITES, days: -1 });

const RULES: GatewayRuleConfig[] = [
  { name: 'blocked', status: [403], actions: ['block', 'retry'] },
  { name: 'rate-limited', status: [429], actions: ['rateLimit', 'retry'], rateLimit: { maxSeconds: 30 } },
  { name: 'captcha', status: [200], body: '(?i)captcha', actions: ['block', 'retry'] },
  { name: 'watch', header: { name: 'x-blocked', pattern: '^yes$' }, actions: ['block'], mode: 'observe' },
  { name: 'slow', hosts: [site(10)], timeToFirstByteMs: 300, actions: ['block', 'retry'] },
];

/** Per site, the first egress address seen on a blocking path: that one is blocked, every other not. */
const blockedFor = new Map<string, string>();

/** Answers by path; the blocking paths block the first upstream that asks for a site, and only it. */
function origin(req: IncomingMessage, res: ServerResponse): void {
  const source = (req.socket.remoteAddress ?? '').replace(/^::ffff:/, '');
  res.setHeader('X-Peer', source);
  const host = (req.headers.host ?? '').replace(/:\d+$/, '');
  const url = new URL(req.url ?? '/', 'https://origin.test');
  const path = url.pathname;
  if (!blockedFor.has(host) && ['/blocked', '/limited', '/captcha', '/slow', '/upload'].includes(path)) {
    blockedFor.set(host, source);
  }
  const good = blockedFor.get(host) !== source;
  if (path === '/upload' && good) {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => res.writeHead(200).end(`got ${Buffer.concat(chunks).length} bytes`));
    return;
  }
  req.resume();
  if ((path === '/blocked' || path === '/upload') && !good) return void res.writeHead(403).end('blocked');
  if (path === '/always403') return void res.writeHead(403).end('always blocked');
  if (path === '/limited' && !good) return void res.writeHead(429, { 'Retry-After': '120' }).end('slow down');
  if (path === '/captcha') {
    const text = good
      ? '<html>the real page</html>'
      : `<html>${'x'.repeat(5000)} Please solve this CAPTCHA</html>`;
    // `deflate-raw`: deflate without its zlib header, which some servers send as `deflate`.
    const [encoding, body] = {
      deflate: ['deflate', deflateSync(text)],
      'deflate-raw': ['deflate', deflateRawSync(text)],
      br: ['br', brotliCompressSync(text)],
    }[url.searchParams.get('enc') ?? ''] ?? ['gzip', gzipSync(text)];
    return void res.writeHead(200, { 'Content-Encoding': encoding as string }).end(body);
  }
  if (path === '/slow' && !good) {
    // Answers long after the `slow` rule gave up on it (or when the client is gone).
    const t = setTimeout(() => res.writeHead(200).end('late'), 5000);
    res.once('close', () => clearTimeout(t));
    return;
  }
  if (path === '/observed') return void res.writeHead(200, { 'X-Blocked': 'yes' }).end('watched');
  res.writeHead(200).end(`page from ${source}`);
}

/**
 * Upgrades on the HTTPS origin: `/echo` switches to a protocol that echoes what it gets (after a
 * first `hello`); `/echo-blocked` refuses the first upstream that asks for a site with a 403.
 */
function upgradeAnswers(req: IncomingMessage, socket: Duplex): void {
  socket.on('error', () => undefined);
  const source = (req.socket.remoteAddress ?? '').replace(/^::ffff:/, '');
  const host = (req.headers.host ?? '').replace(/:\d+$/, '');
  if (req.url === '/echo-blocked' && !blockedFor.has(host)) blockedFor.set(host, source);
  if (req.url === '/echo-blocked' && blockedFor.get(host) === source) {
    socket.end('HTTP/1.1 403 Forbidden\r\nContent-Length: 7\r\nConnection: close\r\n\r\nblocked');
    return;
  }
  socket.write(
    `HTTP/1.1 101 Switching Protocols\r\nUpgrade: ${req.headers.upgrade}\r\nConnection: Upgrade\r\nX-Peer: ${source}\r\n\r\nhello`,
  );
  socket.on('data', (d: Buffer) => socket.write(`echo ${d.toString('latin1')}`));
}

/** An HTTPS origin that breaks HTTP: a NUL in a header (`/bad-head`), a body cut short (`/cut`). */
function brokenAnswers(s: TLSSocket): void {
  s.on('error', () => undefined);
  let head = '';
  s.on('data', (c: Buffer) => {
    head += c.toString('latin1');
    if (!head.includes('\r\n\r\n')) return;
    if (head.startsWith('GET /bad-head '))
      s.end('HTTP/1.1 200 OK\r\nX-Bad: a\u0000b\r\nContent-Length: 2\r\n\r\nok');
    else s.end('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b');
  });
}

/** A server that speaks first (as SMTP or FTP do), then echoes each line. */
function greeter(s: Socket): void {
  s.on('error', () => undefined);
  s.write('220 ready\r\n');
  s.on('data', (d: Buffer) => s.write(`echo ${d.toString('latin1')}`));
}

async function listen(server: Server): Promise<number> {
  await new Promise<void>((r) => server.listen(0, '0.0.0.0', r));
  return (server.address() as AddressInfo).port;
}

let w: World;
let ca: GatewayCa;
let caDir: string;
let tlsPort: number;
let httpPort: number;
let wrongPort: number;
let expiredPort: number;
let brokenPort: number;
let greeterPort: number;
const servers: Server[] = [];
const log = captureLog('debug');
const spans = new InMemorySpanExporter();

beforeAll(async () => {
  const tlsOrigin = createHttpsServer({ cert: pki.cert, key: pki.key }, origin);
  tlsOrigin.on('upgrade', upgradeAnswers);
  const httpOrigin = http.createServer(origin);
  const wrongOrigin = createHttpsServer({ cert: wrongName.cert, key: wrongName.key }, origin);
  const expiredOrigin = createHttpsServer({ cert: expired.cert, key: expired.key }, origin);
  const brokenOrigin = createTlsServer({ cert: pki.cert, key: pki.key }, brokenAnswers);
  servers.push(tlsOrigin, httpOrigin, wrongOrigin, expiredOrigin, brokenOrigin, createTcpServer(greeter));
  [tlsPort, httpPort, wrongPort, expiredPort, brokenPort, greeterPort] = (await Promise.all(
    servers.map(listen),
  )) as [number, number, number, number, number, number];
  caDir = mkdtempSync(join(tmpdir(), 'gw-inspect-'));
  ca = await GatewayCa.open(new FileCaStore(caDir), systemClock.now);
  w = await startWorld({
    upstreams: 3,
    extraPorts: [tlsPort, httpPort, wrongPort, expiredPort, brokenPort, greeterPort],
    gateway: {
      rules: RULES,
      log: log.log,
      tracer: new TracerProvider({
        spanProcessors: [new SimpleSpanProcessor({ exporter: spans })],
      }).getTracer('test'),
      inspect: {
        ca,
        exclude: [site(9)],
        originCa: `${pki.caCert}${wrongName.caCert}${expired.caCert}`,
      },
    },
  });
}, 60_000);

afterAll(async () => {
  await w?.close();
  for (const s of servers) s.close();
});

const crawler = { user: 'crawler', token: TOKEN };

/** The upstream the origin blocked for `target` (by its egress address). */
function blockedUpstream(target: string): string {
  const source = blockedFor.get(target);
  return [...w.sourceOf].find(([, s]) => s === source)?.[0] ?? `none for ${target}`;
}

/** Upstreams cooling down for `target`, by key. */
function cooling(target: string): string[] {
  return w.leases
    .snapshot()
    .filter((p) => p.targetCooldowns.some((c) => c.target === target))
    .map((p) => `${p.namespace}/${p.name}`)
    .sort();
}

/** Tunnels and switched connections the gateway holds open, of `kind`. */
function openGatewayConnections(kind = 'https'): Promise<number> {
  return w.registry
    .getSingleMetric('proxy_operator_gateway_open')!
    .get()
    .then((m) => m.values.filter((v) => v.labels.kind === kind).reduce((n, v) => n + v.value, 0));
}

function reports(result: string): Promise<number> {
  return w.registry
    .getSingleMetric('proxy_operator_gateway_upstream_reports_total')!
    .get()
    .then((m) => m.values.filter((v) => v.labels.result === result).reduce((n, v) => n + v.value, 0));
}

function ruleMatches(rule: string, action: string, mode: string): Promise<number> {
  return w.registry
    .getSingleMetric('proxy_operator_gateway_rule_matches_total')!
    .get()
    .then((m) =>
      m.values
        .filter((v) => v.labels.rule === rule && v.labels.action === action && v.labels.mode === mode)
        .reduce((n, v) => n + v.value, 0),
    );
}

describe('gateway HTTPS inspection', () => {
  it('terminates TLS with a leaf of the operator CA and verifies the origin', async () => {
    const r = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://${site(0)}:${tlsPort}/page`,
      ca.certPem,
    );
    expect(r.status).toBe(200);
    expect(r.body).toMatch(/^page from 127\.0\.0\.1[123]$/);
    expect(r.headers['x-egress-proxy']).toMatch(/^crawl\/sq[123]$/);
    expect(r.cert.checkIssued(new X509Certificate(ca.certPem))).toBe(true);
    expect(r.cert.checkIP(site(0))).toBe(site(0));
  });

  it('answers a blocked HTTPS request from the next upstream, cooling only the blocking ones for that site', async () => {
    const before = await ruleMatches('blocked', 'block', 'enforce');
    const r = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://${site(1)}:${tlsPort}/blocked`,
      ca.certPem,
    );
    expect(r.status).toBe(200);
    expect(r.body).toMatch(/^page from /);
    expect(r.headers['x-egress-proxy']).not.toBe(blockedUpstream(site(1)));
    // The upstream that was blocked cools down for this site only.
    expect(cooling(site(1))).toEqual([blockedUpstream(site(1))]);
    expect(cooling(site(0))).toEqual([]);
    expect(await ruleMatches('blocked', 'block', 'enforce')).toBe(before + 1);
    // The request's span names the rule and the retry.
    const span = spans
      .getFinishedSpans()
      .find((s) => s.name === 'gateway HTTPS' && s.attributes['server.address'] === site(1));
    expect(span?.attributes['gateway.rule']).toBe('blocked');
    expect(span?.events.map((e) => e.name)).toEqual(['gateway retry']);
    expect(span?.attributes['gateway.upstream']).toBe(r.headers['x-egress-proxy']);
  });

  it('reads a gzip body for a body rule and retries a captcha page', async () => {
    const r = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://${site(2)}:${tlsPort}/captcha`,
      ca.certPem,
    );
    expect(r.status).toBe(200);
    expect(r.body).toBe('<html>the real page</html>');
    expect(cooling(site(2))).toEqual([blockedUpstream(site(2))]);
  });

  it('decodes deflate, with its zlib header or without, and br for a body rule', async () => {
    for (const [i, enc] of ['deflate', 'deflate-raw', 'br'].entries()) {
      const host = site(17 + i);
      const r = await httpsViaGateway(
        w.gateway.port,
        crawler,
        `https://${host}:${tlsPort}/captcha?enc=${enc}`,
        ca.certPem,
      );
      expect(r.status, enc).toBe(200);
      // The captcha was seen through its encoding: that upstream is blocked, the next one answered.
      expect(cooling(host), enc).toEqual([blockedUpstream(host)]);
      expect(r.headers['x-egress-proxy'], enc).not.toBe(blockedUpstream(host));
    }
  });

  it('rate-limits for Retry-After, clamped to maxSeconds', async () => {
    const started = Date.now();
    const r = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://${site(3)}:${tlsPort}/limited`,
      ca.certPem,
    );
    expect(r.status).toBe(200);
    expect(cooling(site(3))).toEqual([blockedUpstream(site(3))]);
    const untils = w.leases
      .snapshot()
      .flatMap((p) => p.targetCooldowns.filter((c) => c.target === site(3)).map((c) => Date.parse(c.until)));
    expect(untils).toHaveLength(1);
    // Retry-After said 120 s; the rule caps it at 30 s.
    for (const u of untils) expect(u - started).toBeLessThanOrEqual(31_000);
  });

  it('sends a request body again on a retry (idempotent PUT, within 64 KiB)', async () => {
    const r = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://${site(12)}:${tlsPort}/upload`,
      ca.certPem,
      {
        method: 'PUT',
        body: 'x'.repeat(40_000),
      },
    );
    expect(r.status).toBe(200);
    expect(r.body).toBe('got 40000 bytes');
    expect(cooling(site(12))).toEqual([blockedUpstream(site(12))]);
  });

  it('gives the client the last answer when retries run out', async () => {
    const r = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://${site(4)}:${tlsPort}/always403`,
      ca.certPem,
    );
    expect(r.status).toBe(403);
    expect(r.body).toBe('always blocked');
    // One try and two retries (the default), each on another upstream.
    expect(cooling(site(4))).toEqual(['crawl/sq1', 'crawl/sq2', 'crawl/sq3']);
  });

  it('counts an observe rule without acting on it', async () => {
    const before = await ruleMatches('watch', 'block', 'observe');
    const r = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://${site(5)}:${tlsPort}/observed`,
      ca.certPem,
    );
    expect(r.status).toBe(200);
    expect(r.body).toBe('watched');
    expect(await ruleMatches('watch', 'block', 'observe')).toBe(before + 1);
    expect(cooling(site(5))).toEqual([]);
  });

  it('gives up on a slow answer at the time-to-first-byte limit and retries elsewhere', async () => {
    const before = await ruleMatches('slow', 'block', 'enforce');
    const r = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://${site(10)}:${tlsPort}/slow`,
      ca.certPem,
    );
    expect(r.status).toBe(200);
    expect(r.body).toMatch(/^page from /);
    expect(r.headers['x-egress-proxy']).not.toBe(blockedUpstream(site(10)));
    expect(await ruleMatches('slow', 'block', 'enforce')).toBe(before + 1);
  });

  it('tunnels excluded hosts and inspect-off clients untouched: the origin’s own certificate', async () => {
    const excluded = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://${site(9)}:${tlsPort}/page`,
      pki.caCert,
    );
    expect(excluded.cert.issuer).toBe('CN=inspect-origin-ca');
    const off = await httpsViaGateway(
      w.gateway.port,
      { user: 'crawler-inspect-off', token: TOKEN },
      `https://${site(6)}:${tlsPort}/page`,
      pki.caCert,
    );
    expect(off.cert.issuer).toBe('CN=inspect-origin-ca');
    // Untouched means no rules: a blocked answer reaches the client as it is.
    const blocked = await httpsViaGateway(
      w.gateway.port,
      { user: 'crawler-inspect-off', token: TOKEN },
      `https://${site(6)}:${tlsPort}/always403`,
      pki.caCert,
    );
    expect(blocked.status).toBe(403);
    // A client that trusts only the origin's CA cannot talk to an inspected host.
    await expect(
      httpsViaGateway(w.gateway.port, crawler, `https://${site(6)}:${tlsPort}/page`, pki.caCert),
    ).rejects.toBeInstanceOf(TunnelRefused);
  });

  it('tunnels a client that does not open TLS untouched: plain HTTP as ws:// sends it, a server that speaks first', async () => {
    const connect = async (target: string): Promise<RawClient> => {
      const c = await rawClient(w.gateway.port);
      const auth = Buffer.from(`${crawler.user}:${crawler.token}`).toString('base64');
      c.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: Basic ${auth}\r\n\r\n`);
      await c.waitFor('\r\n\r\n');
      expect(c.received()).toMatch(/^HTTP\/1\.1 200 /);
      return c;
    };
    // Chromium opens `ws://` with a CONNECT too, then speaks HTTP inside: that reaches the
    // origin as sent, through an upstream, and no rule looks at it (`/always403` stays a 403).
    const web = await connect(`${site(13)}:${httpPort}`);
    web.write(`GET /always403 HTTP/1.1\r\nHost: ${site(13)}:${httpPort}\r\nConnection: close\r\n\r\n`);
    await web.closed;
    expect(web.received()).toMatch(/\r\n\r\nHTTP\/1\.1 403 Forbidden\r\n/);
    expect(web.received()).toMatch(/\r\nX-Peer: 127\.0\.0\.1[123]\r\n/);
    expect(web.received()).toContain('\r\n\r\ne\r\nalways blocked\r\n0\r\n');
    expect(cooling(site(13))).toEqual([]);
    // A silent client is waited for a moment, then tunnelled: the server's greeting arrives.
    const mail = await connect(`${site(14)}:${greeterPort}`);
    await mail.waitFor('220 ready\r\n', 15_000);
    mail.write('HELO crawler\r\n');
    await mail.waitFor('echo HELO crawler\r\n');
    mail.socket.destroy();
  });

  it('switches protocols inside an inspected connection: the upgrade is judged by the rules, then joined', async () => {
    const echo = async (path: string) => {
      const r = await httpsViaGateway(
        w.gateway.port,
        crawler,
        `https://${site(15)}:${tlsPort}${path}`,
        ca.certPem,
        {
          upgrade: 'echo',
        },
      );
      const up = r.upgraded;
      if (!up) throw new Error(`no switch: ${r.status} ${r.body}`);
      let got = up.head.toString('latin1');
      up.socket.on('data', (d: Buffer) => {
        got += d.toString('latin1');
      });
      await until('the origin speaking first in the new protocol', () => got === 'hello');
      up.socket.write('ping');
      await until('the echo through the gateway', () => got === 'helloecho ping');
      up.socket.destroy();
      return r;
    };
    const switched = await echo('/echo');
    expect(switched.status).toBe(101);
    expect(switched.headers.upgrade).toBe('echo');
    expect(switched.headers['x-egress-proxy']).toMatch(/^crawl\/sq[123]$/);
    expect(switched.headers['x-peer']).toMatch(/^127\.0\.0\.1[123]$/);
    // A handshake refused with 403 is an answer like any other: blocked for that site, retried.
    const retried = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://${site(16)}:${tlsPort}/echo-blocked`,
      ca.certPem,
      { upgrade: 'echo' },
    );
    expect(retried.status).toBe(101);
    retried.upgraded?.socket.destroy();
    expect(retried.headers['x-egress-proxy']).not.toBe(blockedUpstream(site(16)));
    expect(cooling(site(16))).toEqual([blockedUpstream(site(16))]);
    // The connection's lease goes back once it closes.
    await until('the switched connections released', async () => (await openGatewayConnections()) === 0);
  });

  it('answers 502 naming the reason when the origin certificate is refused', async () => {
    const mismatch = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://localhost:${wrongPort}/page`,
      ca.certPem,
    );
    expect(mismatch.status).toBe(502);
    expect(mismatch.headers['x-egress-certificate-error']).toMatch(/^hostname mismatch/);
    expect(mismatch.body).toMatch(/origin certificate refused for localhost: hostname mismatch/);
    const old = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://localhost:${expiredPort}/page`,
      ca.certPem,
    );
    expect(old.status).toBe(502);
    expect(old.headers['x-egress-certificate-error']).toMatch(/^certificate has expired/);
  });

  it('answers 502 for an origin that does not speak TLS, without blaming the upstream', async () => {
    const failedBefore = await reports('failed');
    const r = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://localhost:${httpPort}/page`,
      ca.certPem,
    );
    expect(r.status).toBe(502);
    expect(r.body).toMatch(/^localhost: TLS with the origin failed: /);
    expect(await reports('failed')).toBe(failedBefore);
  });

  it('refuses a malformed answer with 502 without blaming the upstream, and cuts a body cut short', async () => {
    const failedBefore = await reports('failed');
    const bad = await httpsViaGateway(
      w.gateway.port,
      crawler,
      `https://localhost:${brokenPort}/bad-head`,
      ca.certPem,
    );
    expect(bad.status).toBe(502);
    expect(bad.body).toMatch(/invalid character in header X-Bad/);
    expect(await reports('failed')).toBe(failedBefore);
    // The head went out before the origin stopped: the client sees its connection cut, not a short page.
    await expect(
      httpsViaGateway(w.gateway.port, crawler, `https://localhost:${brokenPort}/cut`, ca.certPem),
    ).rejects.toThrow(/aborted|socket hang up|ECONNRESET/);
  });

  it('never logs the CA key', () => {
    const pem = readFileSync(join(caDir, 'ca.key'), 'utf8');
    const body = pem.split('\n').slice(1, -2).join('');
    const all = log.raw.join('\n');
    expect(all.length).toBeGreaterThan(0);
    expect(all).not.toContain('PRIVATE KEY');
    expect(all).not.toContain(body.slice(0, 40));
  });
});

describe('gateway rules on plain HTTP', () => {
  it('answers a blocked request from the next upstream', async () => {
    const res = await fetchVia(`http://${site(7)}:${httpPort}/blocked`);
    expect(res.status).toBe(200);
    expect(res.headers['x-egress-proxy']).not.toBe(blockedUpstream(site(7)));
    expect(cooling(site(7))).toEqual([blockedUpstream(site(7))]);
  });

  it('counts an observe rule and passes the answer on untouched', async () => {
    const before = await ruleMatches('watch', 'block', 'observe');
    const res = await fetchVia(`http://${site(11)}:${httpPort}/observed`);
    expect(res.status).toBe(200);
    expect(res.headers['x-blocked']).toBe('yes');
    expect(await ruleMatches('watch', 'block', 'observe')).toBe(before + 1);
    expect(cooling(site(11))).toEqual([]);
  });

  it('does not retry a non-idempotent method', async () => {
    const res = await fetchVia(`http://${site(8)}:${httpPort}/always403`, 'POST');
    expect(res.status).toBe(403);
    expect(cooling(site(8))).toHaveLength(1);
  });
});

/** An absolute-form request through the gateway (what `curl -x` sends for http://). */
function fetchVia(
  url: string,
  method = 'GET',
): Promise<{ status: number; headers: IncomingMessage['headers'] }> {
  return new Promise((resolve, reject) => {
    const req = createHttpRequest(url, method);
    req.once('response', (r) => {
      r.resume();
      r.once('end', () => resolve({ status: r.statusCode ?? 0, headers: r.headers }));
    });
    req.once('error', reject);
    req.end();
  });
}

function createHttpRequest(url: string, method: string) {
  return http.request({
    host: '127.0.0.1',
    port: w.gateway.port,
    method,
    path: url,
    headers: {
      Host: new URL(url).host,
      'Proxy-Authorization': `Basic ${Buffer.from(`crawler:${TOKEN}`).toString('base64')}`,
    },
  });
}
