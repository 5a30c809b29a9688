/**
 * The dashboard in headless Chromium against the real standalone app (the README's example with
 * its ProxyPool, and the gateway): every proxy shows its pool by the rule users select on (the
 * `pool: eu`/`pool: us` labels, the ProxyPool's members), the Pools table's numbers sit under
 * their own headers, the lease holders list a lease taken through the API and one held by a
 * gateway connection (id prefix, target, age, origin; never a full id), and a block reported on
 * one proxy shows on the proxies sharing its egress address as "via <address>, blocked on
 * <proxy>", with the event naming the proxy that was reported.
 */
import { appendFileSync } from 'node:fs';
import type { Socket } from 'node:net';
import { trace } from '@opentelemetry/api';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { type App, buildApp } from '../../../src/cmd/compose.ts';
import { parseCommandLine } from '../../../src/cmd/flags.ts';
import { DiscoveryClient } from '../../../src/discovery/client.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { type Browser, launchChromium } from '../../support/browser.ts';
import { cleanupCli, createWorkspace, standaloneArgs, type Workspace } from '../../support/cli.ts';
import { basic, rawConnect } from '../../support/gateway/world.ts';
import { type Origin, startHttpOrigin } from '../../support/origins.ts';
import { freePort } from '../../support/ports.ts';
import { until } from '../../support/wait.ts';

vi.setConfig({ testTimeout: 90_000, hookTimeout: 120_000 });

const TOKEN = 'dashboard-pools-test-token-41c2';
/** The example's three Proxies and its ProxyPool `demo` of two. */
const EXAMPLE_PROXIES = 5;

let ws: Workspace;
let app: App;
let running: Promise<void>;
let browser: Browser;
let page: Page;
let client: DiscoveryClient;
let origin: Origin;
let gatewayPort: number;
const tunnels: Socket[] = [];
/** Full lease ids: the page may show their first characters only. */
const fullIds: string[] = [];

const tracing = () => ({ tracer: trace.getTracer('test'), enabled: false, shutdown: async () => {} });

function row(key: string): string {
  return `#fleet tr[data-proxy="${key}"]`;
}

beforeAll(async () => {
  origin = await startHttpOrigin();
  ws = await createWorkspace({ pool: true, openPorts: [origin.port] });
  appendFileSync(
    ws.providersFile,
    `\ngateway:\n  egressPolicy: {allowCIDRs: ["127.0.0.1/32"], connectPorts: [${origin.port}]}\n`,
  );
  gatewayPort = await freePort();
  const parsed = parseCommandLine(standaloneArgs(ws, ['--gateway-bind-address', `127.0.0.1:${gatewayPort}`]));
  if (parsed.command !== 'standalone') throw new Error('not standalone');
  app = await buildApp(parsed, {
    log: silentLogger(),
    env: { DISCOVERY_TOKEN: TOKEN },
    deps: { setupTracing: tracing },
  });
  running = app.run();
  const url = await until('the discovery API', () => app.discoveryUrl(), { timeoutMs: 30_000 });
  client = new DiscoveryClient({ baseUrl: url, token: TOKEN, timeoutMs: 5_000 });
  await until(
    'the example proxies Ready, healthy and with their egress IPs',
    async () => {
      const proxies = await client.listProxies();
      return (
        proxies.length === EXAMPLE_PROXIES &&
        proxies.every((p) => p.phase === 'Ready' && p.healthy && p.egressIP !== null)
      );
    },
    { timeoutMs: 60_000 },
  );
  browser = await launchChromium();
  page = await browser.context.newPage();
  // The token as a user enters it once; the tab keeps it.
  await page.goto(`${ws.discoveryUrl}/`);
  await page.fill('#token', TOKEN);
  await page.click('#token-form button[type=submit]');
  await page.locator(row('crawl/local-1')).waitFor();
});

afterAll(async () => {
  for (const s of tunnels) s.destroy();
  await browser?.close();
  await app?.stop();
  await running?.catch(() => undefined);
  await origin?.close();
  await cleanupCli();
});

describe('dashboard pools, lease holders and shared cooldowns in Chromium', () => {
  it('shows the pool users select on for every proxy: pool=eu/us labels and the ProxyPool members', async () => {
    const pool = (key: string) => page.locator(row(key)).locator('td').nth(1);
    await expect.poll(() => pool('crawl/local-1').textContent()).toBe('eu');
    expect(await pool('crawl/local-2').textContent()).toBe('eu');
    expect(await pool('crawl/local-3').textContent()).toBe('us');
    expect(await pool('crawl/local-1').getAttribute('title')).toBe('pool=eu');
    const members = page.locator('#fleet tbody tr[data-proxy^="crawl/demo-"]');
    await expect.poll(() => members.count()).toBe(2);
    for (const td of await members.locator('td:nth-child(2)').all()) {
      expect(await td.textContent()).toBe('demo');
      expect(await td.getAttribute('title')).toBe('crawl.example.com/pool=demo');
    }
  });

  it('lists every pool with its numbers under the right headers', async () => {
    const pools = page.locator('#pools tbody tr');
    await expect
      .poll(() => pools.evaluateAll((rows) => rows.map((r) => r.getAttribute('data-pool'))), {
        timeout: 30_000,
      })
      .toEqual(['crawl/demo', 'crawl/eu', 'crawl/us']);
    const cell = (pool: string, col: string) =>
      page.locator(`#pools tr[data-pool="${pool}"] td[data-col="${col}"]`).textContent();
    await expect.poll(() => cell('crawl/demo', 'leasable'), { timeout: 30_000 }).toBe('2');
    expect(await cell('crawl/eu', 'desired')).toBe('–');
    expect(await cell('crawl/eu', 'replicas')).toBe('2');
    expect(await cell('crawl/us', 'replicas')).toBe('1');
    expect(await page.locator('#pools tr[data-pool="crawl/eu"] .pool-status').textContent()).toContain(
      'pool=eu',
    );

    // Each number's text lies under its own header's text: same column, same alignment.
    const placement = await page.evaluate(() => {
      const table = document.getElementById('pools') as HTMLTableElement;
      const textBox = (el: Element) => {
        const range = document.createRange();
        range.selectNodeContents(el);
        const r = range.getBoundingClientRect();
        return { left: r.left, right: r.right };
      };
      const heads = [...table.tHead!.rows[0]!.cells];
      const out: { header: string; col: string; inside: boolean }[] = [];
      for (const tr of table.tBodies[0]!.rows) {
        for (const td of tr.cells) {
          const col = td.dataset.col;
          if (!col) continue;
          const th = heads[td.cellIndex]!;
          const [h, n] = [textBox(th), textBox(td)];
          out.push({
            header: th.textContent ?? '',
            col,
            inside: n.left >= h.left - 1 && n.right <= h.right + 1,
          });
        }
      }
      return out;
    });
    const headerOf: Record<string, string> = {
      desired: 'Desired',
      replicas: 'Proxies',
      ready: 'Ready',
      healthy: 'Healthy',
      leasable: 'Leasable',
      leases: 'Leases',
    };
    expect(placement.length).toBe(3 * 6);
    for (const p of placement) {
      expect(p.header, p.col).toBe(headerOf[p.col]);
      expect(p.inside, `${p.col} under ${p.header}`).toBe(true);
    }
  });

  it('lists the lease holders: one through the API, one held by a gateway connection', async () => {
    const grant = await client.lease({ target: 'shop.example', selector: 'pool=us', ttlSeconds: 120 });
    fullIds.push(grant.id);
    const { head, socket } = await rawConnect(
      gatewayPort,
      `127.0.0.1:${origin.port}`,
      // Without GATEWAY_TOKEN the gateway takes the discovery API's token.
      basic('crawler-pool-eu-session-dash', TOKEN),
    );
    tunnels.push(socket);
    expect(head).toMatch(/^HTTP\/1\.1 200/);
    const upstream = /X-Egress-Proxy: (\S+)/i.exec(head)?.[1];
    expect(upstream).toMatch(/^crawl\/local-[12]$/);

    const api = page.locator(`#leases tr[data-lease="${grant.id.slice(0, 8)}"]`);
    await api.waitFor({ timeout: 5000 });
    const col = (tr: typeof api, c: string) => tr.locator(`td[data-col="${c}"]`).textContent();
    expect(await api.getAttribute('data-via')).toBe('api');
    expect(await col(api, 'id')).toBe(`${grant.id.slice(0, 8)}…`);
    expect(await col(api, 'proxy')).toBe('crawl/local-3');
    expect(await col(api, 'target')).toBe('shop.example');
    expect(await col(api, 'via')).toBe('API');
    expect(await col(api, 'age')).toMatch(/^\d+ s$/);
    expect(await col(api, 'left')).toMatch(/^(2 min 00 s|1 min \d\d s)$/);

    const gw = page.locator('#leases tr[data-via="gateway"]');
    await gw.waitFor({ timeout: 5000 });
    expect(await gw.count()).toBe(1);
    expect(await col(gw, 'proxy')).toBe(upstream);
    expect(await col(gw, 'target')).toBe('127.0.0.1');
    expect(await col(gw, 'via')).toBe('gateway');
    expect(await col(gw, 'id')).toMatch(/^[0-9a-f]{8}…$/);
    await expect.poll(() => page.locator('#lease-summary').textContent()).toBe('2 live: 1 API, 1 gateway');

    // The connection closes: its lease ends and leaves the list.
    socket.destroy();
    await expect.poll(() => gw.count(), { timeout: 5000 }).toBe(0);
    await client.release(grant.id);
    await expect.poll(() => page.locator('#leases tbody td.empty').textContent()).toBe('no live leases');
  });

  it('marks cooldowns taken on through a shared egress address, and names the reported proxy', async () => {
    const proxies = await client.listProxies();
    const byIp = new Map<string, string[]>();
    for (const p of proxies) byIp.set(p.egressIP ?? '', [...(byIp.get(p.egressIP ?? '') ?? []), p.name]);
    // Five proxies on three addresses: report one that shares its address, local-2 if it does.
    const shared = proxies.filter((p) => (byIp.get(p.egressIP ?? '')?.length ?? 0) > 1);
    const reported = shared.find((p) => p.name === 'local-2') ?? shared[0];
    if (!reported?.egressIP) throw new Error('no two example proxies share an egress address');
    const peers = (byIp.get(reported.egressIP) ?? []).filter((n) => n !== reported.name);
    await client.reportProxy(
      { namespace: 'crawl', name: reported.name },
      { target: 'shop.example', result: 'blocked', cooldownSeconds: 600 },
    );

    const own = page.locator(`${row(`crawl/${reported.name}`)} li[data-target="shop.example"]`);
    await own.waitFor({ timeout: 5000 });
    expect(await own.locator('.shared').count()).toBe(0);
    for (const peer of peers) {
      const li = page.locator(`${row(`crawl/${peer}`)} li[data-target="shop.example"]`);
      await li.waitFor({ timeout: 5000 });
      expect(await li.locator('.shared').textContent()).toBe(
        `via ${reported.egressIP}, blocked on ${reported.name}`,
      );
      expect(await li.getAttribute('data-shared-from')).toBe(`crawl/${reported.name}`);
    }

    // The event is the reported proxy's; those sharing its address are named in it, not blamed.
    const blocked = page.locator('#events li[data-kind="blocked"]');
    await blocked.first().waitFor({ timeout: 10_000 });
    expect(await blocked.count()).toBe(1);
    expect(await blocked.locator('.proxy').textContent()).toBe(`crawl/${reported.name}`);
    const message = await blocked.locator('.message').textContent();
    expect(message).toContain('blocked by shop.example');
    for (const peer of peers) expect(message).toContain(`crawl/${peer}`);
    expect(message).toContain(`on the same egress IP ${reported.egressIP}`);

    // The filter finds the shared ones by the reported proxy's name too.
    await page.fill('#filter', reported.name);
    await expect.poll(() => page.locator('#fleet tbody tr').count()).toBe(1 + peers.length);
    await page.fill('#filter', '');
  });

  it('never shows a full lease id', async () => {
    expect(fullIds.length).toBeGreaterThan(0);
    const dom = await page.evaluate(() => document.documentElement.outerHTML);
    for (const id of fullIds) expect(dom).not.toContain(id);
  });
});
