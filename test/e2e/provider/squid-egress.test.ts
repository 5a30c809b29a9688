/**
 * test/e2e/provider/squid-egress — the egress policy of the generated squid.conf, run by a real
 * Squid as the Pod runs it: by default a lease holder cannot reach loopback (by address or by a
 * name resolving there), private ranges or ports outside connectPorts; allowCIDRs opens exactly
 * what it names. Only loopback destinations ever receive traffic: the private-range cases are
 * refused by the policy before any connect (HIER_NONE in the access log), and a test-only
 * never_direct rule makes any non-loopback forward fail without connecting even if the policy
 * were broken. IPv6 spellings of denied IPv4 addresses (IPv4-mapped, NAT64, 6to4) and the special
 * ranges are refused like the rest; the operator's own listeners stay closed even where
 * allowCIDRs opens their address, except `GET`/`HEAD /generate_204` on the discovery port.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { chmodSync, chownSync, mkdtempSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fetch, ProxyAgent } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type EgressPolicyConfig,
  type OperatorEndpoints,
  resolveEgressPolicy,
} from '../../../src/config/egress.ts';
import { squidConfig } from '../../../src/provider/squid/config.ts';
import { htpasswdLine } from '../../../src/provider/squid/htpasswd.ts';
import { closedPort, type Origin, startHttpOrigin, startTlsOrigin, testPki } from '../../support/origins.ts';
import { basicAuthHeader, statusViaProxy, stopSquidProcess, untilSquidAnswers } from '../../support/squid.ts';

const creds = { username: 'crawler-1', password: `pw-${randomBytes(6).toString('hex')}` };
const auth = basicAuthHeader(creds.username, creds.password);

interface RunningSquid {
  port: number;
  stdout(): string;
  stop(): Promise<void>;
}

/** The pod-profile squid.conf with `policy`, run as the `proxy` user like in the Pod. */
async function runSquid(policy: EgressPolicyConfig, operator?: OperatorEndpoints): Promise<RunningSquid> {
  const dir = mkdtempSync(join(tmpdir(), 'squid-egress-'));
  const port = await closedPort();
  const service = `sqe${process.pid}${randomBytes(3).toString('hex')}`;
  const conf = squidConfig({
    profile: 'pod',
    port,
    listenAddress: '127.0.0.1',
    htpasswdPath: join(dir, 'htpasswd'),
    egress: resolveEgressPolicy(policy),
    ...(operator ? { operator } : {}),
  });
  // Safety net of the test only: whatever the policy says, Squid may open connections to
  // loopback alone (anything else fails with 503, never with the 403 the tests expect).
  const net = 'acl test_loopback dst 127.0.0.0/8\nnever_direct allow !test_loopback\n';
  writeFileSync(join(dir, 'squid.conf'), conf + net);
  writeFileSync(join(dir, 'htpasswd'), htpasswdLine(creds));
  for (const f of ['stdout', 'stderr']) writeFileSync(join(dir, f), '');
  const asProxy = process.getuid?.() === 0;
  if (asProxy)
    for (const f of ['', 'squid.conf', 'htpasswd', 'stdout', 'stderr']) chownSync(join(dir, f), 13, 13);
  chmodSync(dir, 0o755);
  const child: ChildProcess = spawn('/usr/sbin/squid', ['-N', '-n', service, '-f', join(dir, 'squid.conf')], {
    stdio: ['ignore', openSync(join(dir, 'stdout'), 'a'), openSync(join(dir, 'stderr'), 'a')],
    ...(asProxy ? { uid: 13, gid: 13 } : {}),
  });
  await untilSquidAnswers(child, port, () => readFileSync(join(dir, 'stderr'), 'utf8').slice(-2000), dir);
  return {
    port,
    stdout: () => readFileSync(join(dir, 'stdout'), 'utf8'),
    stop: () => stopSquidProcess(child, dir, service),
  };
}

/** Status of a raw CONNECT to `target` through the proxy on 127.0.0.1:`port`. */
async function connectStatus(port: number, target: string, withAuth = true): Promise<number> {
  const s = net.connect({ host: '127.0.0.1', port });
  await once(s, 'connect');
  const lines = [`CONNECT ${target} HTTP/1.1`, `Host: ${target}`];
  if (withAuth) lines.push(`Proxy-Authorization: ${auth}`);
  s.write(`${lines.join('\r\n')}\r\n\r\n`);
  let buf = '';
  while (!buf.includes('\r\n')) buf += ((await once(s, 'data')) as [Buffer])[0].toString('latin1');
  s.destroy();
  return Number(buf.split(' ')[1]);
}

/** Status of a plain-HTTP request with `method` through the proxy. */
function methodStatusVia(port: number, url: string, method: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const r = httpRequest(
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

/** Status and X-Proxy-Error of a plain-HTTP request through the proxy. */
async function proxyErrorVia(port: number, url: string): Promise<[number, string | undefined]> {
  const dispatcher = new ProxyAgent({ uri: `http://127.0.0.1:${port}`, token: auth });
  try {
    const res = await fetch(url, { dispatcher });
    await res.arrayBuffer();
    return [res.status, res.headers.get('x-proxy-error') ?? undefined];
  } finally {
    await dispatcher.close();
  }
}

async function fetchVia(port: number, url: string): Promise<number> {
  const dispatcher = new ProxyAgent({
    uri: `http://127.0.0.1:${port}`,
    token: auth,
    requestTls: { ca: testPki().caCert },
  });
  try {
    const res = await fetch(url, { dispatcher });
    await res.arrayBuffer();
    return res.status;
  } finally {
    await dispatcher.close();
  }
}

describe('generated Squid config: egress policy, run for real', () => {
  let tls: Origin;
  let http: Origin;
  let byDefault: RunningSquid;
  let lab: RunningSquid;
  let dead: number;

  beforeAll(async () => {
    tls = await startTlsOrigin({ defaultStatus: 204 });
    http = await startHttpOrigin({ defaultStatus: 200 });
    dead = await closedPort();
    // connectPorts name the origins' ports so that only the address rule is under test.
    [byDefault, lab] = await Promise.all([
      runSquid({ connectPorts: [tls.port] }),
      runSquid({ allowCIDRs: ['127.0.0.1/32'], connectPorts: [tls.port, http.port, dead] }),
    ]);
  });
  afterAll(async () => {
    await Promise.all([byDefault?.stop(), lab?.stop(), tls?.close(), http?.close()]);
  });

  it('refuses loopback by default with 403, by address and by a name resolving there', async () => {
    const before = tls.requests;
    expect(await connectStatus(byDefault.port, `127.0.0.1:${tls.port}`)).toBe(403);
    expect(await connectStatus(byDefault.port, `localhost:${tls.port}`)).toBe(403);
    expect(await connectStatus(byDefault.port, `[::1]:${tls.port}`)).toBe(403);
    expect(await statusViaProxy(byDefault.port, `${http.baseUrl}/`, auth)).toBe(403);
    expect(tls.requests).toBe(before);
    // An anonymous client learns nothing about the policy: it is asked to authenticate first.
    expect(await connectStatus(byDefault.port, `127.0.0.1:${tls.port}`, false)).toBe(407);
  });

  it('refuses link-local and private ranges before connecting anywhere', async () => {
    for (const target of ['169.254.169.254', '10.255.255.1', '172.16.0.1', '192.168.255.1', '100.64.0.1']) {
      expect(await connectStatus(byDefault.port, `${target}:${tls.port}`)).toBe(403);
    }
    await expect
      .poll(() =>
        byDefault
          .stdout()
          .split('\n')
          .filter((l) => l.includes('169.254.169.254'))
          .join('\n'),
      )
      .toMatch(/TCP_DENIED\/403 .* HIER_NONE\//);
    expect(byDefault.stdout()).not.toMatch(/10\.255\.255\.1.*HIER_DIRECT/);
  });

  it('allowCIDRs opens exactly the range it names, on connectPorts only', async () => {
    expect(await fetchVia(lab.port, `${tls.baseUrl}/status/204`)).toBe(204);
    expect(await fetchVia(lab.port, `https://localhost:${tls.port}/status/204`)).toBe(204);
    expect(await statusViaProxy(lab.port, `${http.baseUrl}/`, auth)).toBe(200);
    // Still loopback, but not the allowed /32.
    expect(await connectStatus(lab.port, `127.0.0.2:${tls.port}`)).toBe(403);
    // The right address on a port outside connectPorts (sshd, the operator's API …).
    expect(await connectStatus(lab.port, `127.0.0.1:${await closedPort()}`)).toBe(403);
    expect(await statusViaProxy(lab.port, `http://127.0.0.1:${await closedPort()}/`, auth)).toBe(403);
    // Absolute-form requests are http:// only.
    expect(await statusViaProxy(lab.port, `ftp://127.0.0.1:${http.port}/`, auth)).toBe(403);
    await expect.poll(() => lab.stdout()).toMatch(/TCP_DENIED\/403/);
  });

  it('marks an origin that cannot be reached, so a crawler does not blame the proxy', async () => {
    const [status, marker] = await proxyErrorVia(lab.port, `http://127.0.0.1:${dead}/`);
    expect(status).toBeGreaterThanOrEqual(502);
    expect(marker).toBe('origin-unreachable');
    // A CONNECT to it is answered by the proxy too (a 5xx, not a dropped connection).
    expect(await connectStatus(lab.port, `127.0.0.1:${dead}`)).toBeGreaterThanOrEqual(502);
    // What the origin itself answers is passed on unmarked.
    expect(await proxyErrorVia(lab.port, `${http.baseUrl}/status/403`)).toEqual([403, undefined]);
  });

  it('refuses IPv6 spellings of denied IPv4 addresses and the special ranges', async () => {
    const before = tls.requests;
    for (const target of [
      `[::ffff:127.0.0.1]:${tls.port}`,
      `[::ffff:7f00:1]:${tls.port}`,
      `[64:ff9b::127.0.0.1]:${tls.port}`,
      `[64:ff9b::a00:1]:${tls.port}`,
      `[2002:7f00:1::1]:${tls.port}`,
      `[2002:a9fe:a9fe::1]:${tls.port}`,
      `192.0.0.8:${tls.port}`,
      `224.0.0.1:${tls.port}`,
      `255.255.255.255:${tls.port}`,
      `[ff02::1]:${tls.port}`,
    ]) {
      expect(await connectStatus(byDefault.port, target), target).toBe(403);
    }
    expect(await statusViaProxy(byDefault.port, `http://[64:ff9b::7f00:1]:${http.port}/`, auth)).toBe(403);
    expect(tls.requests).toBe(before);
  });
});

describe("generated Squid config: the operator's own listeners, run for real", () => {
  /** Stand in for the operator's discovery API (the probe port) and its metrics listener. */
  let discovery: Origin;
  let metrics: Origin;
  let tls: Origin;
  let lab: RunningSquid;

  beforeAll(async () => {
    [discovery, metrics, tls] = await Promise.all([
      startHttpOrigin({ defaultStatus: 204 }),
      startHttpOrigin({ defaultStatus: 200 }),
      startTlsOrigin({ defaultStatus: 204 }),
    ]);
    // allowCIDRs opens the operator's address and connectPorts its ports: only the operator
    // rule stands between a lease holder and them. (Loopback stands in for the Pod IP.)
    lab = await runSquid(
      { allowCIDRs: ['127.0.0.0/8'], connectPorts: [tls.port, discovery.port, metrics.port] },
      { addresses: ['127.0.0.1'], ports: [discovery.port, metrics.port], probePort: discovery.port },
    );
  });
  afterAll(async () => {
    await Promise.all([lab?.stop(), discovery?.close(), metrics?.close(), tls?.close()]);
  });

  it('denies (operator address AND operator port) whatever allowCIDRs and connectPorts say', async () => {
    const seen = [discovery.requests, metrics.requests];
    expect(await connectStatus(lab.port, `127.0.0.1:${metrics.port}`)).toBe(403);
    expect(await connectStatus(lab.port, `127.0.0.1:${discovery.port}`)).toBe(403);
    expect(await connectStatus(lab.port, `[::ffff:127.0.0.1]:${discovery.port}`)).toBe(403);
    expect(await statusViaProxy(lab.port, `http://127.0.0.1:${metrics.port}/metrics`, auth)).toBe(403);
    expect(await statusViaProxy(lab.port, `http://127.0.0.1:${discovery.port}/v1/proxies`, auth)).toBe(403);
    expect(await statusViaProxy(lab.port, `http://localhost:${discovery.port}/v1/proxies`, auth)).toBe(403);
    expect(await methodStatusVia(lab.port, `http://127.0.0.1:${discovery.port}/generate_204`, 'POST')).toBe(
      403,
    );
    expect(await statusViaProxy(lab.port, `http://127.0.0.1:${discovery.port}/generate_204x`, auth)).toBe(
      403,
    );
    expect([discovery.requests, metrics.requests]).toEqual(seen);
    await expect
      .poll(() => lab.stdout())
      .toMatch(new RegExp(`TCP_DENIED/403 .*127\\.0\\.0\\.1:${metrics.port}`));
  });

  it('leaves the probe route and the same address on other ports to the rest of the policy', async () => {
    expect(await statusViaProxy(lab.port, `http://127.0.0.1:${discovery.port}/generate_204`, auth)).toBe(204);
    expect(await methodStatusVia(lab.port, `http://127.0.0.1:${discovery.port}/generate_204`, 'HEAD')).toBe(
      204,
    );
    expect(await fetchVia(lab.port, `${tls.baseUrl}/status/204`)).toBe(204);
  });
});
