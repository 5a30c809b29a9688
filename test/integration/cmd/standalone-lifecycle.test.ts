/**
 * End-to-end: the real `standalone` CLI's process lifecycle — state survives kill -9 (same
 * proxies, same credentials, no duplicates), one process per state file, and SIGTERM shuts
 * down cleanly and closes every proxy listener.
 */
import { existsSync } from 'node:fs';
import net from 'node:net';
import { afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import type { DiscoveryClient, LeaseGrant } from '../../../src/discovery/client.ts';
import {
  accepts,
  basicAuth,
  type CliProcess,
  cleanupCli,
  clientFor,
  createWorkspace,
  freePort,
  httpViaProxy,
  listeningInRange,
  startStandalone,
  waitFor,
  waitForReady,
} from '../../support/cli.ts';
import { startHttpOrigin } from '../../support/origins.ts';

// Real child processes on a possibly loaded 2-core machine: generous, one-sided limits.
vi.setConfig({ testTimeout: 120_000, hookTimeout: 90_000 });

const NAMES = ['local-1', 'local-2', 'local-3'];

afterEach(cleanupCli);

/** One lease per proxy (the least-loaded rule spreads three leases over three proxies). */
async function leaseEach(client: DiscoveryClient): Promise<Map<string, LeaseGrant>> {
  const grants = new Map<string, LeaseGrant>();
  for (let i = 0; i < NAMES.length; i++) {
    const g = await client.lease({ ttlSeconds: 60 });
    grants.set(g.proxy.name, g);
  }
  expect([...grants.keys()].sort()).toEqual(NAMES);
  return grants;
}

/** proxy name → instance name, from the "local proxy started" log lines. */
function instancesOf(proc: CliProcess): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const l of proc.logs) {
    if (l.msg !== 'local proxy started') continue;
    const name = String(l.proxy).replace(/^crawl\//, '');
    out.set(name, [...(out.get(name) ?? []), String(l.instance)]);
  }
  return out;
}

describe('standalone CLI: restarts', () => {
  it('keeps proxies and credentials across kill -9, and refuses a second process on the same state', async () => {
    const origin = await startHttpOrigin();
    const ws = await createWorkspace({ openPorts: [origin.port] });
    onTestFinished(() => origin.close());
    const first = startStandalone(ws);
    const client = clientFor(ws);
    const before = await waitForReady(ws, first, NAMES, 40_000);
    const grantsBefore = await leaseEach(client);
    const instancesBefore = instancesOf(first);
    expect([...instancesBefore.keys()].sort()).toEqual(NAMES);
    for (const list of instancesBefore.values()) expect(list).toHaveLength(1);

    // A second process on the same state file fails fast and names the lock.
    const [d2, h2] = [await freePort(), await freePort()];
    const second = startStandalone(ws, [], { discovery: d2, health: h2 });
    const secondExit = await waitFor(
      () => second.hasExited && second.exited,
      'second process to exit',
      45_000,
    );
    expect(secondExit.code).not.toBe(0);
    expect(secondExit.code).not.toBeNull();
    expect(second.stderr).toContain(`${ws.statePath}.lock`);
    expect(second.stderr).toContain(`pid ${first.pid}`);
    expect(second.stderr.trim().split('\n')).toHaveLength(1);
    expect(await accepts(d2)).toBe(false);
    // …and the first one is unharmed.
    expect((await client.listProxies()).map((p) => p.name)).toEqual(NAMES);

    const killed = await first.killHard();
    expect(killed.signal).toBe('SIGKILL');
    for (const p of before) expect(await accepts(p.port as number)).toBe(false);

    // Restart on the same state: the same proxies, credentials and instances; nothing doubled.
    const third = startStandalone(ws);
    const after = await waitForReady(ws, third, NAMES, 40_000);
    expect(after.map((p) => p.name)).toEqual(NAMES);
    // The state still says Ready from before the kill: wait until the listeners are back.
    await waitFor(() => instancesOf(third).size === NAMES.length, 'instances re-created', 30_000, third);
    const instancesAfter = instancesOf(third);
    expect(instancesAfter).toEqual(instancesBefore);

    const grantsAfter = await leaseEach(client);
    for (const name of NAMES) {
      const oldGrant = grantsBefore.get(name) as LeaseGrant;
      const newGrant = grantsAfter.get(name) as LeaseGrant;
      expect(newGrant.proxy.url.replace(/^.*@/, '')).toBe(oldGrant.proxy.url.replace(/^.*@/, ''));
      // The new grant's own credentials open the re-created instance.
      const res = await httpViaProxy(newGrant.proxy.url, `${origin.baseUrl}/status/200`, true);
      expect(res.status).toBe(200);
      // Whether the old leases (and their credentials) came back depends on a checkpoint
      // having run before the kill: test/integration/cmd/standalone-leases.test.ts covers that.
    }
    expect((await listeningInRange(ws)).sort()).toEqual(after.map((p) => p.port as number).sort());
    expect(await listeningInRange(ws)).toHaveLength(3);
  });
});

describe('standalone CLI: shutdown', () => {
  // SIGTERM from a supervisor, SIGINT from Ctrl-C after `npm start`.
  it.each(['SIGTERM', 'SIGINT'] as const)(
    'exits 0 on %s, closes every proxy listener and removes its lock',
    async (sig) => {
      const origin = await startHttpOrigin();
      const ws = await createWorkspace({ openPorts: [origin.port] });
      onTestFinished(() => origin.close());
      const proc = startStandalone(ws);
      const proxies = await waitForReady(ws, proc, NAMES, 40_000);
      const grant = await clientFor(ws).lease({ ttlSeconds: 60 });
      expect(await accepts(grant.proxy.port)).toBe(true);
      expect(existsSync(`${ws.statePath}.lock`)).toBe(true);
      // A crawler in the middle of its work: an open CONNECT tunnel and a kept-alive API connection.
      const tunnel = await openTunnel(grant.proxy.url, origin.port);
      const tunnelClosed = new Promise<void>((ok) => tunnel.once('close', () => ok()));
      const keepAlive = await openKeepAlive(ws.discoveryPort);

      const sentAt = Date.now();
      proc.signal(sig);
      const exit = await waitFor(() => proc.hasExited && proc.exited, `exit after ${sig}`, 25_000);
      expect(exit).toEqual({ code: 0, signal: null });
      // The grace period is 30 s by default; idle connections must not hold the process that long.
      expect(Date.now() - sentAt).toBeLessThan(25_000);
      await tunnelClosed;
      keepAlive.destroy();

      for (const p of proxies) expect(await accepts(p.port as number)).toBe(false);
      expect(await accepts(ws.discoveryPort)).toBe(false);
      expect(await accepts(ws.healthPort)).toBe(false);
      expect(existsSync(`${ws.statePath}.lock`)).toBe(false);
      expect(proc.logs.filter((l) => l.level >= 50)).toEqual([]);
    },
  );
});

/** A CONNECT tunnel through the proxy to 127.0.0.1:port, established and left open. */
function openTunnel(proxyUrl: string, port: number): Promise<net.Socket> {
  const u = new URL(proxyUrl);
  return new Promise((ok, fail) => {
    const sock = net.connect({ host: u.hostname, port: Number(u.port) }, () =>
      sock.write(
        `CONNECT 127.0.0.1:${port} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n` +
          `Proxy-Authorization: ${basicAuth(proxyUrl)}\r\n\r\n`,
      ),
    );
    sock.setEncoding('utf8');
    sock.once('data', (d: string) => {
      if (/^HTTP\/1\.1 200 /.test(d)) ok(sock);
      else fail(new Error(`CONNECT refused: ${d.split('\r\n')[0]}`));
    });
    sock.once('error', fail);
  });
}

/** An HTTP/1.1 keep-alive connection to the discovery API, after one answered request. */
function openKeepAlive(port: number): Promise<net.Socket> {
  return new Promise((ok, fail) => {
    const sock = net.connect({ host: '127.0.0.1', port }, () =>
      sock.write('GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n'),
    );
    sock.once('data', () => ok(sock));
    sock.once('error', fail);
    sock.on('error', () => undefined);
  });
}
