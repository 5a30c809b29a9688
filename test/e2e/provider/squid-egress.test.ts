/**
 * test/e2e/provider/squid-egress — the egress policy of the generated squid.conf, run by a real
 * Squid as the Pod runs it: by default a lease holder cannot reach loopback (by address or by a
 * name resolving there), private ranges or ports outside connectPorts; allowCIDRs opens exactly
 * what it names. Only loopback destinations ever receive traffic: the private-range cases are
 * refused by the policy before any connect (HIER_NONE in the access log), and a test-only
 * never_direct rule makes any non-loopback forward fail without connecting even if the policy
 * were broken.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { chmodSync, chownSync, mkdtempSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fetch, ProxyAgent } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type EgressPolicyConfig, resolveEgressPolicy } from '../../../src/config/egress.ts';
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
async function runSquid(policy: EgressPolicyConfig): Promise<RunningSquid> {
  const dir = mkdtempSync(join(tmpdir(), 'squid-egress-'));
  const port = await closedPort();
  const service = `sqe${process.pid}${randomBytes(3).toString('hex')}`;
  const conf = squidConfig({
    profile: 'pod',
    port,
    listenAddress: '127.0.0.1',
    htpasswdPath: join(dir, 'htpasswd'),
    egress: resolveEgressPolicy(policy),
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
});
