/**
 * End-to-end: a ProxyPool in the real `standalone` CLI with the local provider, edited through
 * its manifest as a user would — 5 replicas, scaled to 8, scaled to 3 while crawlers hold
 * leases (their proxies are chosen last; a chosen one drains until its lease ends), a template
 * change, then `maxAge: 20s` rotation. A sampler every 100 ms counts leasable pool proxies
 * (never below replicas − maxUnavailable during the roll-out and the rotation) and fetches
 * through every proxy it is granted (no grant points at a proxy that does not serve).
 * The controller's arithmetic on a fake clock is covered in test/unit/pool/pool.test.ts; this run
 * needs wall time because real proxies start and real probes pass.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import type { DiscoveryClient, LeaseGrant } from '../../../src/discovery/client.ts';
import {
  cleanupCli,
  clientFor,
  createWorkspace,
  healthCheckUrl,
  httpViaProxy,
  startStandalone,
  type Workspace,
  waitFor,
} from '../../support/cli.ts';
import { startHttpOrigin } from '../../support/origins.ts';

vi.setConfig({ testTimeout: 240_000, hookTimeout: 90_000 });
afterEach(cleanupCli);

const SELECTOR = 'pool=e2e';

function writePool(ws: Workspace, replicas: number, extra: { tier?: string; maxAge?: string } = {}): void {
  const rotation = extra.maxAge ? `\n  rotation: {maxAge: ${extra.maxAge}, jitter: 0.1}` : '';
  writeFileSync(
    join(ws.proxiesDir, 'e2e-pool.yaml'),
    `apiVersion: crawl.example.com/v1alpha1
kind: ProxyPool
metadata: {name: e2e, namespace: crawl}
spec:
  replicas: ${replicas}${rotation}
  template:
    metadata:
      labels: {pool: e2e, tier: ${extra.tier ?? 'a'}}
    spec:
      provider: local
      healthCheck: {url: "${healthCheckUrl(ws)}", expectStatus: 204}
`,
  );
}

/** Samples the pool every 100 ms: the fewest leasable proxies seen, and grants that did not serve. */
class Sampler {
  minLeasable = Number.POSITIVE_INFINITY;
  samples = 0;
  readonly broken: string[] = [];
  private timer: NodeJS.Timeout | undefined;
  private busy = false;
  private readonly client: DiscoveryClient;
  private readonly originUrl: string;
  constructor(client: DiscoveryClient, originUrl: string) {
    this.client = client;
    this.originUrl = originUrl;
  }

  start(): void {
    this.minLeasable = Number.POSITIVE_INFINITY;
    this.timer = setInterval(() => void this.tick(), 100);
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await waitFor(() => !this.busy, 'last sample', 15_000);
  }

  private async tick(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      const list = await this.client.listProxies({ selector: SELECTOR });
      this.minLeasable = Math.min(this.minLeasable, list.filter((p) => p.leasable).length);
      this.samples += 1;
      const grant = await this.client.lease({ selector: SELECTOR, ttlSeconds: 10 });
      try {
        const res = await httpViaProxy(grant.proxy.url, `${this.originUrl}/status/200`, true);
        if (res.status !== 200) this.broken.push(`${grant.proxy.name}: status ${res.status}`);
      } catch (err) {
        this.broken.push(`${grant.proxy.name}: ${(err as Error).message}`);
      } finally {
        await this.client.release(grant.id);
      }
    } catch (err) {
      this.broken.push(`sample: ${(err as Error).message}`);
    } finally {
      this.busy = false;
    }
  }
}

/** Waits until the pool lists exactly `n` proxies, all Ready, healthy and not draining. */
async function steady(
  client: DiscoveryClient,
  n: number,
  what: string,
  extra: (names: string[]) => boolean = () => true,
  selector = SELECTOR,
) {
  return waitFor(
    async () => {
      const list = await client.listProxies({ selector });
      const ok =
        list.length === n &&
        list.every((p) => p.phase === 'Ready' && p.healthy && !p.draining && !p.deleting) &&
        extra(list.map((p) => p.name));
      return ok && list.map((p) => p.name).sort();
    },
    what,
    90_000,
  );
}

describe('ProxyPool end to end (standalone, local provider)', () => {
  it('scales 5 → 8 → 3 around held leases, rolls a template out and rotates by age without dropping capacity', async () => {
    const origin = await startHttpOrigin();
    onTestFinished(() => origin.close());
    // The example's own pool (`npm start`) comes up beside the one under test.
    const ws = await createWorkspace({ openPorts: [origin.port], pool: true });
    writePool(ws, 5);
    startStandalone(ws);
    const client = clientFor(ws);
    const five = await steady(client, 5, '5 pool proxies');
    for (const name of five) expect(name).toMatch(/^e2e-[bcdfghjklmnpqrstvwxz2456789]{5}$/);
    const demo = await steady(client, 2, "the example's demo pool", () => true, 'pool=demo');
    for (const name of demo) expect(name).toMatch(/^demo-[bcdfghjklmnpqrstvwxz2456789]{5}$/);

    writePool(ws, 8);
    await steady(client, 8, '8 pool proxies');

    // Four crawlers hold leases on four proxies; scaling to 3 removes the four idle ones and one
    // holder, which drains: no new leases, still serving its crawler, gone once released.
    const held: LeaseGrant[] = [];
    for (let i = 0; i < 4; i++) held.push(await client.lease({ selector: SELECTOR, ttlSeconds: 120 }));
    const holders = new Set(held.map((g) => g.proxy.name));
    expect(holders.size).toBe(4);
    writePool(ws, 3);
    const draining = await waitFor(
      async () => {
        const list = await client.listProxies({ selector: SELECTOR });
        const d = list.filter((p) => p.draining);
        return list.length === 4 && d.length === 1 && d[0];
      },
      'three holders kept and one draining',
      60_000,
    );
    expect(holders.has(draining.name)).toBe(true);
    const drainingGrant = held.find((g) => g.proxy.name === draining.name) as LeaseGrant;
    expect((await httpViaProxy(drainingGrant.proxy.url, `${origin.baseUrl}/status/200`, true)).status).toBe(
      200,
    );
    await client.release(drainingGrant.id);
    const three = await steady(client, 3, 'the drained holder deleted');
    expect(three.every((n) => holders.has(n))).toBe(true);
    for (const g of held) if (g !== drainingGrant) await client.release(g.id);

    const sampler = new Sampler(client, origin.baseUrl);
    sampler.start();
    writePool(ws, 3, { tier: 'b' });
    const rolled = await steady(client, 3, 'template rolled out', (names) =>
      names.every((n) => !three.includes(n)),
    );
    writePool(ws, 3, { tier: 'b', maxAge: '20s' });
    await steady(client, 3, 'every proxy rotated', (names) => names.every((n) => !rolled.includes(n)));
    await sampler.stop();

    expect(sampler.broken).toEqual([]);
    expect(sampler.samples).toBeGreaterThan(20);
    expect(sampler.minLeasable).toBeGreaterThanOrEqual(3);
  });
});
