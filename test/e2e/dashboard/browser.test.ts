/**
 * The dashboard in a real browser (headless Chromium from Debian) against the real standalone
 * app with a token: the page asks for the token once, lists the example fleet, shows a
 * `blocked` report as a cooldown within 2 s, shows the example's ProxyPool with the counts of
 * its own status and follows a scale, shows a proxy a new manifest adds, and never carries a
 * credential — not in the DOM, not in any response. Leaves a screenshot for
 * docs/dashboard.md (path in DASHBOARD_SCREENSHOT, else a temp file).
 */
import { mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { trace } from '@opentelemetry/api';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { type App, buildApp } from '../../../src/cmd/compose.ts';
import { parseCommandLine } from '../../../src/cmd/flags.ts';
import { DiscoveryClient } from '../../../src/discovery/client.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { type Browser, launchChromium } from '../../support/browser.ts';
import {
  cleanupCli,
  createWorkspace,
  EXAMPLE_POOL_FILE,
  healthCheckUrl,
  standaloneArgs,
  type Workspace,
} from '../../support/cli.ts';
import { until } from '../../support/wait.ts';

vi.setConfig({ testTimeout: 90_000, hookTimeout: 120_000 });

const TOKEN = 'dashboard-test-token-7f3a9c';
const EXAMPLE = ['crawl/local-1', 'crawl/local-2', 'crawl/local-3'];
/** The example's three Proxies and its ProxyPool `demo` of two. */
const EXAMPLE_PROXIES = 5;

let ws: Workspace;
let app: App;
let running: Promise<void>;
let browser: Browser;
let page: Page;
let client: DiscoveryClient;
/** Every response body the page received, and every secret that must never be in one. */
const bodies: { url: string; body: string }[] = [];
/** Every URL the page asked for: all of them on the discovery API's origin (no CDN). */
const requested: string[] = [];
const secrets = new Set<string>([TOKEN]);

const tracing = () => ({ tracer: trace.getTracer('test'), enabled: false, shutdown: async () => {} });

/** The generated passwords of the proxies (their `<name>-auth` Secrets). */
async function proxyPasswords(): Promise<string[]> {
  const out: string[] = [];
  for (const p of app.store.proxies.list()) {
    const s = await app.store.secrets
      .read({ namespace: p.metadata.namespace ?? '', name: `${p.metadata.name}-auth` })
      .catch(() => undefined);
    const pw = s?.data?.password;
    if (pw) out.push(Buffer.from(pw, 'base64').toString('utf8'));
  }
  return out;
}

function row(key: string): string {
  return `#fleet tr[data-proxy="${key}"]`;
}

beforeAll(async () => {
  ws = await createWorkspace({ pool: true });
  const parsed = parseCommandLine(standaloneArgs(ws));
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
    'the example proxies Ready and healthy',
    async () => {
      const proxies = await client.listProxies();
      return proxies.length === EXAMPLE_PROXIES && proxies.every((p) => p.phase === 'Ready' && p.healthy);
    },
    { timeoutMs: 60_000 },
  );
  browser = await launchChromium();
  page = await browser.context.newPage();
  page.on('request', (req) => requested.push(req.url()));
  page.on('response', (res) => {
    void res.text().then(
      (body) => bodies.push({ url: res.url(), body }),
      () => undefined,
    );
  });
});

afterAll(async () => {
  await browser?.close();
  await app?.stop();
  await running?.catch(() => undefined);
  await cleanupCli();
});

describe('dashboard in Chromium', () => {
  it('asks for the token once, then lists the example fleet with provider, phase and health', async () => {
    await page.goto(`${ws.discoveryUrl}/`);
    await page.locator('#token-form').waitFor({ state: 'visible' });
    await page.fill('#token', TOKEN);
    await page.click('#token-form button[type=submit]');
    for (const key of EXAMPLE) await page.locator(row(key)).waitFor();
    const first = page.locator(row('crawl/local-1'));
    await expect.poll(() => first.locator('td').nth(3).textContent()).toContain('Ready');
    expect(await first.locator('td').nth(1).textContent()).toBe('eu');
    expect(await first.locator('td').nth(2).textContent()).toBe('local');
    await expect.poll(() => first.locator('.dot.healthy').count()).toBe(1);
    // The token field is emptied once used, and a reload keeps the session without asking again.
    expect(await page.inputValue('#token')).toBe('');
    await page.reload();
    await page.locator(row('crawl/local-1')).waitFor();
    expect(await page.locator('#token-form').isVisible()).toBe(false);
  });

  it('shows a blocked report as a cooldown for that target within 2 s', async () => {
    const grant = await client.lease({ target: 'shop.example', ttlSeconds: 60 });
    secrets.add(decodeURIComponent(new URL(grant.proxy.url).password));
    await client.report(grant.id, { result: 'blocked', cooldownSeconds: 600 });
    const reported = Date.now();
    const key = `${grant.proxy.namespace}/${grant.proxy.name}`;
    const cooldown = page.locator(`${row(key)} li[data-target="shop.example"]`);
    await cooldown.waitFor({ timeout: 2000 });
    expect(Date.now() - reported).toBeLessThan(2000);
    expect(await cooldown.locator('.left').textContent()).toMatch(/^(9|10) min/);
    await page.locator('#events li[data-kind="blocked"]').first().waitFor({ timeout: 10_000 });
    expect(await page.locator('#events li[data-kind="blocked"] .message').first().textContent()).toContain(
      'shop.example',
    );
  });

  it('filters and sorts the table', async () => {
    // Proxies sharing the blocked proxy's egress IP share its cooldown (the example has more
    // proxies than addresses): the filter keeps exactly the rows that show one.
    const cooling = await page.locator('#fleet tbody tr:has(li[data-target="shop.example"])').count();
    expect(cooling).toBeGreaterThanOrEqual(1);
    expect(cooling).toBeLessThan(EXAMPLE_PROXIES);
    await page.fill('#filter', 'shop.example');
    await expect.poll(() => page.locator('#fleet tbody tr').count()).toBe(cooling);
    await page.fill('#filter', '');
    await expect.poll(() => page.locator('#fleet tbody tr').count()).toBeGreaterThanOrEqual(3);
    await page.click('#fleet th[data-sort="key"] button');
    expect(await page.getAttribute('#fleet th[data-sort="key"]', 'aria-sort')).toBe('descending');
    const keys = await page
      .locator('#fleet tbody tr')
      .evaluateAll((rows) => rows.map((r) => r.getAttribute('data-proxy')));
    expect(keys).toEqual([...keys].sort().reverse());
    await page.click('#fleet th[data-sort="key"] button');
  });

  it("shows the example's ProxyPool with the counts from its status, and follows a scale", async () => {
    const demo = page.locator('#pools tr[data-pool="crawl/demo"]');
    const cell = (col: string) => demo.locator(`td[data-col="${col}"]`).textContent();
    await demo.waitFor({ timeout: 10_000 });
    for (const col of ['desired', 'replicas', 'ready', 'healthy', 'leasable'])
      await expect.poll(() => cell(col), { timeout: 30_000 }).toBe('2');
    await expect
      .poll(() => demo.locator('[data-condition="Available"]').getAttribute('data-status'))
      .toBe('True');
    // Its proxies carry the pool in their row.
    const members = page
      .locator('#fleet tbody tr')
      .filter({ has: page.locator('td:nth-child(2)', { hasText: /^demo$/ }) });
    await expect.poll(() => members.count()).toBe(2);

    // A scale, as a user does it: edit replicas in the manifest. Desired follows the spec at once,
    // the other counts the status the pool controller writes as the new proxy comes up.
    const file = join(ws.proxiesDir, EXAMPLE_POOL_FILE);
    const manifest = readFileSync(file, 'utf8');
    expect(manifest).toContain('replicas: 2');
    writeFileSync(file, manifest.replace('replicas: 2', 'replicas: 3'));
    await expect.poll(() => cell('desired'), { timeout: 30_000 }).toBe('3');
    await expect.poll(() => cell('leasable'), { timeout: 60_000 }).toBe('3');
    expect(await cell('ready')).toBe('3');
    await expect.poll(() => members.count()).toBe(3);
    await page.locator('#events li[data-kind="pool"]').first().waitFor();
    expect(await page.locator('#events li[data-kind="pool"] .message').allTextContents()).toContain(
      'pool crawl/demo scaled 2 → 3',
    );
  });

  it('shows a proxy added by a manifest, with its pool', async () => {
    const manifest = readFileSync(join(ws.proxiesDir, 'local-1.yaml'), 'utf8')
      .replace('name: local-1', 'name: local-4')
      .replace('labels: {pool: eu}', 'labels: {crawl.example.com/pool: research}');
    expect(manifest).toContain(healthCheckUrl(ws));
    writeFileSync(join(ws.proxiesDir, 'local-4.yaml'), manifest);
    const added = page.locator(row('crawl/local-4'));
    await added.waitFor({ timeout: 30_000 });
    expect(await added.locator('td').nth(1).textContent()).toBe('research');
    // No ProxyPool named research: the label alone is listed, marked as such.
    const research = page.locator('#pools tr[data-pool="crawl/research"]');
    await research.waitFor({ timeout: 30_000 });
    expect(await research.locator('td[data-col="desired"]').textContent()).toBe('–');
    expect(await research.locator('.pool-status').textContent()).toContain('no ProxyPool');
    await expect.poll(() => added.locator('td').nth(3).textContent(), { timeout: 60_000 }).toContain('Ready');
    await page.locator('#events li[data-kind="added"]').first().waitFor();
  });

  it('loads nothing from another origin', () => {
    expect(requested.length).toBeGreaterThan(5);
    const foreign = requested.filter((u) => !u.startsWith(`${ws.discoveryUrl}/`) && !u.startsWith('data:'));
    expect(foreign).toEqual([]);
  });

  it('never has a credential in the DOM or in any response', async () => {
    for (const pw of await proxyPasswords()) secrets.add(pw);
    expect(secrets.size).toBeGreaterThanOrEqual(5);
    // Leases handed out while the page watches: their per-lease passwords must not show either.
    for (let i = 0; i < 3; i++) {
      const g = await client.lease({ ttlSeconds: 60 });
      secrets.add(decodeURIComponent(new URL(g.proxy.url).password));
    }
    await expect.poll(() => page.locator('#totals').textContent()).toMatch(/3 leases/);
    const dom = await page.evaluate(() => document.documentElement.outerHTML);
    const storage = await page.evaluate(() => JSON.stringify(Object.entries(localStorage)));
    expect(bodies.some((b) => b.url.includes('/v1/dashboard/state'))).toBe(true);
    expect(bodies.some((b) => b.url.includes('/v1/dashboard/history'))).toBe(true);
    for (const secret of secrets) {
      expect(dom).not.toContain(secret);
      expect(storage).not.toContain(secret);
      for (const b of bodies) expect(b.body, b.url).not.toContain(secret);
    }
  });

  it('writes a screenshot for the docs', async () => {
    const path =
      process.env.DASHBOARD_SCREENSHOT ?? join(mkdtempSync(join(tmpdir(), 'dashboard-')), 'dashboard.png');
    // A line needs two history steps (10 s each): the chart really draws the history.
    await page.locator('#fleet .spark polyline').first().waitFor({ timeout: 45_000 });
    await page.screenshot({ path, fullPage: true });
    const png = readFileSync(path);
    expect(png.subarray(1, 4).toString('latin1')).toBe('PNG');
    expect(statSync(path).size).toBeGreaterThan(20_000);
  });
});
