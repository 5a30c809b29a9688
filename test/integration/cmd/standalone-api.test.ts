/**
 * End-to-end: the real `standalone` CLI on the bundled example — the three proxies come up,
 * a crawler leases one over HTTP and really tunnels traffic through it (HTTPS via CONNECT and
 * plain HTTP), credentials are required, and per-target cooldowns steer the leases.
 */
import net from 'node:net';
import { ProxyAgent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { type DiscoveryClient, NoneLeasableError } from '../../../src/discovery/client.ts';
import {
  type CliProcess,
  cleanupCli,
  clientFor,
  createWorkspace,
  httpViaProxy,
  startStandalone,
  type Workspace,
  waitForReady,
} from '../../support/cli.ts';
import { type Origin, startHttpOrigin, startTlsOrigin, testPki } from '../../support/origins.ts';

// Real child processes on a possibly loaded 2-core machine: generous, one-sided limits.
vi.setConfig({ testTimeout: 120_000, hookTimeout: 90_000 });

const NAMES = ['local-1', 'local-2', 'local-3'];

let ws: Workspace;
let proc: CliProcess;
let client: DiscoveryClient;
let tlsOrigin: Origin;
let httpOrigin: Origin;
/** Every proxy password a grant handed out; none may ever reach the logs. */
const passwords = new Set<string>();

beforeAll(async () => {
  [tlsOrigin, httpOrigin] = await Promise.all([startTlsOrigin(), startHttpOrigin()]);
  ws = await createWorkspace({ openPorts: [tlsOrigin.port, httpOrigin.port] });
  proc = startStandalone(ws);
  client = clientFor(ws);
  await waitForReady(ws, proc, NAMES, 40_000);
}, 60_000);

afterAll(async () => {
  await cleanupCli();
  await Promise.all([tlsOrigin?.close(), httpOrigin?.close()]);
});

/** Sends raw bytes to the proxy and returns the first response line (status line). */
function rawStatusLine(port: number, request: string): Promise<string> {
  return new Promise((ok, fail) => {
    const sock = net.connect({ host: '127.0.0.1', port }, () => sock.write(request));
    let buf = '';
    sock.setEncoding('utf8');
    sock.setTimeout(10_000, () => {
      sock.destroy();
      fail(new Error(`no answer from proxy port ${port}`));
    });
    sock.on('data', (d: string) => {
      buf += d;
      const i = buf.indexOf('\r\n');
      if (i >= 0) {
        sock.destroy();
        ok(buf.slice(0, i));
      }
    });
    sock.once('error', fail);
  });
}

describe('standalone CLI: quick start', () => {
  it('brings all three example proxies to Ready and healthy, and /readyz answers 200', async () => {
    const proxies = await client.listProxies();
    expect(proxies.map((p) => p.name)).toEqual(NAMES);
    for (const p of proxies) {
      expect(p).toMatchObject({ phase: 'Ready', healthy: true, host: '127.0.0.1', leasable: true });
      expect(p.port).toBeGreaterThanOrEqual(ws.portRange.from);
      expect(p.port).toBeLessThanOrEqual(ws.portRange.to);
    }
    expect(new Set(proxies.map((p) => p.port)).size).toBe(3);
    const ready = await fetch(`${ws.healthUrl}/readyz`);
    expect(ready.status).toBe(200);
    const healthz = await fetch(`${ws.healthUrl}/healthz`);
    expect(healthz.status).toBe(200);
  });
});

describe('standalone CLI: lease and use a proxy', () => {
  it('tunnels HTTPS and forwards plain HTTP through a leased proxy, with its credentials', async () => {
    const grant = await client.lease({ target: tlsOrigin.baseUrl, ttlSeconds: 60 });
    try {
      const url = new URL(grant.proxy.url);
      expect(url.username).not.toBe('');
      expect(url.password.length).toBeGreaterThanOrEqual(16);
      passwords.add(decodeURIComponent(url.password));
      expect(`${url.hostname}:${url.port}`).toBe(`${grant.proxy.host}:${grant.proxy.port}`);

      const agent = new ProxyAgent({ uri: grant.proxy.url, requestTls: { ca: testPki().caCert } });
      try {
        const before = tlsOrigin.requests;
        const res = await undiciFetch(`${tlsOrigin.baseUrl}/status/200`, { dispatcher: agent });
        expect(res.status).toBe(200);
        await res.arrayBuffer();
        expect(tlsOrigin.requests).toBe(before + 1);
      } finally {
        await agent.close();
      }
      // The same client with a wrong password is refused by the proxy: the tunnel above was real.
      const wrong = new URL(grant.proxy.url);
      wrong.password = 'wrong';
      const denied = new ProxyAgent({ uri: wrong.href, requestTls: { ca: testPki().caCert } });
      try {
        const before = tlsOrigin.requests;
        await expect(
          undiciFetch(`${tlsOrigin.baseUrl}/status/200`, { dispatcher: denied }),
        ).rejects.toThrow();
        expect(tlsOrigin.requests).toBe(before);
      } finally {
        await denied.close();
      }

      const beforeHttp = httpOrigin.requests;
      const plain = await httpViaProxy(grant.proxy.url, `${httpOrigin.baseUrl}/status/202`, true);
      expect(plain.status).toBe(202);
      expect(httpOrigin.requests).toBe(beforeHttp + 1);
    } finally {
      await client.release(grant.id);
    }
  });

  it('refuses the same requests without credentials with 407 (no open proxy)', async () => {
    const grant = await client.lease({ ttlSeconds: 60 });
    try {
      const { port } = grant.proxy;
      const target = `127.0.0.1:${tlsOrigin.port}`;
      const before = tlsOrigin.requests + httpOrigin.requests;
      expect(await rawStatusLine(port, `CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`)).toMatch(
        /^HTTP\/1\.1 407 /,
      );
      const wrong = Buffer.from(`${new URL(grant.proxy.url).username}:not-the-password`).toString('base64');
      expect(
        await rawStatusLine(
          port,
          `CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: Basic ${wrong}\r\n\r\n`,
        ),
      ).toMatch(/^HTTP\/1\.1 407 /);
      const plain = await httpViaProxy(grant.proxy.url, `${httpOrigin.baseUrl}/`, false);
      expect(plain.status).toBe(407);
      expect(plain.headers['proxy-authenticate']).toMatch(/^Basic /);
      expect(tlsOrigin.requests + httpOrigin.requests).toBe(before);
    } finally {
      await client.release(grant.id);
    }
  });
});

describe('standalone CLI: per-target cooldowns', () => {
  it('a blocked report cools the proxy down for that target only; 409 explains; release is idempotent', async () => {
    const blockedSite = 'https://shop.example/cart';
    // local-3 is the only proxy in pool=us: the selector makes every choice deterministic.
    const first = await client.lease({ target: blockedSite, selector: 'pool=us', ttlSeconds: 60 });
    expect(first.proxy.name).toBe('local-3');
    expect(first.target).toBe('shop.example');
    expect(await client.report(first.id, { result: 'blocked', cooldownSeconds: 600 })).toEqual({
      id: first.id,
      released: true,
    });

    const listed = await client.listProxies({ target: 'shop.example' });
    const l3 = listed.find((p) => p.name === 'local-3');
    expect(l3?.targetCooldowns.map((c) => c.target)).toEqual(['shop.example']);
    expect(l3).toMatchObject({ leasable: false, reason: 'CoolingDownForTarget' });
    const until = Date.parse(l3?.targetCooldowns[0]?.until ?? '');
    expect(until).toBeGreaterThan(Date.now() + 500_000);

    // Same site from the only us proxy: refused with the arithmetic of why.
    const refused = await client.lease({ target: 'shop.example:8443', selector: 'pool=us' }).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(refused).toBeInstanceOf(NoneLeasableError);
    expect((refused as NoneLeasableError).counts).toEqual({
      matching: 1,
      ready: 1,
      healthy: 1,
      draining: 0,
      coolingDown: 0,
      coolingDownForTarget: 1,
      atCapacity: 0,
    });
    expect((refused as NoneLeasableError).message).toContain('shop.example');

    // Another site still gets local-3.
    const other = await client.lease({ target: 'other.example', selector: 'pool=us', ttlSeconds: 60 });
    expect(other.proxy.name).toBe('local-3');

    // The blocked site is served by the other pools' proxies, never local-3.
    const again: string[] = [];
    for (let i = 0; i < 4; i++) {
      const g = await client.lease({ target: 'shop.example', ttlSeconds: 60 });
      again.push(g.proxy.name);
      await client.release(g.id);
    }
    expect(again).not.toContain('local-3');
    expect(new Set(again)).toEqual(new Set(['local-1', 'local-2']));

    // Release twice: 204 both times, and the proxy is free again.
    for (let i = 0; i < 2; i++) {
      const res = await fetch(`${ws.discoveryUrl}/v1/leases/${other.id}`, { method: 'DELETE' });
      expect(res.status).toBe(204);
    }
    const after = (await client.listProxies()).find((p) => p.name === 'local-3');
    expect(after?.activeLeases).toBe(0);
  });
});

describe('standalone CLI: secrets stay out of the logs', () => {
  it('never writes a proxy password to stdout or stderr', async () => {
    const before = passwords.size;
    for (let i = 0; i < 3; i++) {
      const g = await client.lease({ ttlSeconds: 30 });
      expect(decodeURIComponent(new URL(g.proxy.url).username)).toBe(`lease-${g.id}`);
      passwords.add(decodeURIComponent(new URL(g.proxy.url).password));
    }
    await client.listProxies();
    // Local proxies hand out credentials per lease: three grants, three new passwords.
    expect(passwords.size).toBe(before + 3);
    expect(proc.logs.length).toBeGreaterThan(10);
    for (const pw of passwords) {
      expect(proc.stdout).not.toContain(pw);
      expect(proc.stderr).not.toContain(pw);
    }
  });
});
