/**
 * End-to-end: the real `standalone` CLI on examples/standalone, whose local provider gives each
 * proxy its own loopback source address (127.0.0.2–4). A fourth Proxy shares one of the three
 * (the documented sharing rule). An origin on 127.0.0.1 records where every request comes from
 * and answers 403 to one address: the crawler's `blocked` report on that proxy cools down
 * exactly the proxies leaving from that address for that site, the site's grants go to the
 * others, and after a restart every proxy is back on the same address. The origin is loopback,
 * which the default egress policy refuses: the workspace allows exactly it (createWorkspace).
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import type { DiscoveryClient } from '../../../src/discovery/client.ts';
import {
  cleanupCli,
  clientFor,
  createWorkspace,
  httpViaProxy,
  startStandalone,
  type Workspace,
  waitFor,
  waitForReady,
} from '../../support/cli.ts';
import { type Origin, startHttpOrigin } from '../../support/origins.ts';

vi.setConfig({ testTimeout: 150_000, hookTimeout: 90_000 });

const NAMES = ['local-1', 'local-2', 'local-3', 'local-4'];
const EXAMPLE_ADDRESSES = ['127.0.0.2', '127.0.0.3', '127.0.0.4'];
const SITE = '127.0.0.1';

afterEach(cleanupCli);

/** A fourth Proxy, like local-1, so one address has two proxies. */
function addFourthProxy(ws: Workspace): void {
  const one = readFileSync(join(ws.proxiesDir, 'local-1.yaml'), 'utf8');
  writeFileSync(join(ws.proxiesDir, 'local-4.yaml'), one.replace('name: local-1', 'name: local-4'));
}

async function egressByName(client: DiscoveryClient): Promise<Record<string, string | null>> {
  const rows = await client.listProxies();
  return Object.fromEntries(rows.map((p) => [p.name, p.egressIP]));
}

/** Leases the site once, fetches the origin through the grant, reports what it saw. */
async function crawlOnce(client: DiscoveryClient, origin: Origin): Promise<{ name: string; status: number }> {
  const grant = await client.lease({ target: SITE, ttlSeconds: 60 });
  const before = origin.sources.length;
  const { status } = await httpViaProxy(grant.proxy.url, `${origin.baseUrl}/`, true);
  expect(origin.sources.length).toBe(before + 1);
  await client.report(grant.id, { result: status === 403 ? 'blocked' : 'success' });
  return { name: grant.proxy.name, status };
}

describe('standalone CLI: one egress IP per local proxy', () => {
  it('origins see each proxy’s address; a block cools down that address only; restart keeps them', async () => {
    const origin = await startHttpOrigin();
    onTestFinished(() => origin.close());
    const ws = await createWorkspace({ openPorts: [origin.port] });
    addFourthProxy(ws);
    const first = startStandalone(ws);
    await waitForReady(ws, first, NAMES, 40_000);
    const client = clientFor(ws);
    // status.egressIP is written with Ready, so every proxy lists one.
    const egress = await egressByName(client);
    expect(new Set(Object.values(egress))).toEqual(new Set(EXAMPLE_ADDRESSES));
    const shared = EXAMPLE_ADDRESSES.find((a) => Object.values(egress).filter((e) => e === a).length === 2);
    if (!shared) throw new Error(`no address holds two proxies: ${JSON.stringify(egress)}`);
    const sharing = NAMES.filter((n) => egress[n] === shared).sort();

    // Every proxy reaches the origin from its own address.
    for (let i = 0; i < NAMES.length; i++) {
      const grant = await client.lease({ ttlSeconds: 60 });
      await httpViaProxy(grant.proxy.url, `${origin.baseUrl}/`, true);
      expect(origin.sources.at(-1)).toBe(egress[grant.proxy.name]);
      await client.release(grant.id);
    }

    // The site blocks one address: the first crawl through it gets 403 and reports `blocked`.
    origin.statusBySource.set(shared, 403);
    let blockedOn: string | undefined;
    for (let i = 0; i < NAMES.length && !blockedOn; i++) {
      const { name, status } = await crawlOnce(client, origin);
      if (status === 403) blockedOn = name;
      else expect(status).toBe(204);
    }
    expect(sharing).toContain(blockedOn);
    const forSite = await client.listProxies({ target: SITE });
    for (const p of forSite) {
      if (sharing.includes(p.name)) {
        expect(p.reason).toBe('CoolingDownForTarget');
        expect(p.targetCooldowns.map((c) => c.target)).toEqual([SITE]);
      } else expect(p.leasable).toBe(true);
    }
    // Only the other addresses are granted for the site, and every crawl gets through.
    const names = new Set<string>();
    for (let i = 0; i < 6; i++) {
      const { name, status } = await crawlOnce(client, origin);
      expect(status).toBe(204);
      names.add(name);
    }
    expect([...names].filter((n) => sharing.includes(n))).toEqual([]);
    expect(names.size).toBe(2);
    // Other sites still get the blocked address.
    expect((await client.listProxies({ target: 'other.example' })).every((p) => p.leasable)).toBe(true);

    first.signal('SIGTERM');
    const exit = await waitFor(() => first.hasExited && first.exited, 'exit after SIGTERM', 30_000);
    expect(exit.code).toBe(0);
    const second = startStandalone(ws);
    await waitForReady(ws, second, NAMES, 40_000);
    // Re-created after the restart (new listeners), each on the address it had.
    await waitFor(
      async () => {
        const now = await egressByName(client);
        return NAMES.every((n) => now[n] === egress[n]);
      },
      'the same egress IPs after the restart',
      30_000,
      second,
    );
    for (let i = 0; i < NAMES.length; i++) {
      const grant = await client.lease({ ttlSeconds: 60 });
      await httpViaProxy(grant.proxy.url, `${origin.baseUrl}/status/200`, true);
      expect(origin.sources.at(-1)).toBe(egress[grant.proxy.name]);
      await client.release(grant.id);
    }
  });
});
