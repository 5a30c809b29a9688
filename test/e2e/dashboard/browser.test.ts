/**
 * The dashboard in a real browser (headless Chromium from Debian) against the real standalone
 * app with a token: the page asks for the token once, lists the example fleet, shows a
 * `blocked` report as a cooldown within 2 s, shows the example's ProxyPool with the counts of
 * its own status and follows a scale, shows a proxy a new manifest adds, and never carries a
 * credential — not in the DOM, not in any response; shows each provider's health as its
 * ProviderHealth object says and follows a change. Leaves a screenshot for
 * docs/dashboard.md (path in DASHBOARD_SCREENSHOT, else a temp file).
 */
import { mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { trace } from '@opentelemetry/api';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { API_VERSION, PROVIDER_HEALTH_KIND } from '../../../src/api/constants.ts';
import { type App, buildApp } from '../../../src/cmd/compose.ts';
import { parseCommandLine } from '../../../src/cmd/flags.ts';
import { DiscoveryClient } from '../../../src/discovery/client.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { type Browser, launchChromium } from '../../support/browser.ts';
import {
  cleanupCli,
  createWorkspace,
  EXAMPLE_POOL_FILE,
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

/**
 * Writes the ProviderHealth `name` as the monitor would after a check of `targets`: Ready when
 * every target is, else not ready with the monitor's reason.
 */
async function writeProviderHealth(
  name: string,
  type: string,
  targets: { name: string; ready: boolean; reason: string; message?: string }[],
): Promise<void> {
  const client = app.store.providerHealths;
  if (!(await client.read({ name }).catch(() => undefined))) {
    await client.create({ apiVersion: API_VERSION, kind: PROVIDER_HEALTH_KIND, metadata: { name } });
  }
  const now = new Date().toISOString();
  const ready = targets.filter((t) => t.ready).length;
  const all = ready === targets.length;
  await client.patchStatus(
    { name },
    {
      type,
      conditions: [
        {
          type: 'Ready',
          status: all ? 'True' : 'False',
          reason: all ? 'AllTargetsReady' : 'TargetsNotReady',
          lastTransitionTime: now,
        },
      ],
      targets: targets.map((t) => ({ ...t, lastTransitionTime: now })),
      targetsReady: `${ready}/${targets.length}`,
      lastCheckTime: now,
    },
  );
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
    // The example's health check follows the API wherever it listens.
    expect(manifest).toContain('http://operator.invalid/generate_204');
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

  it('shows each provider as its ProviderHealth says: ready, or not with its reason; and follows a change', async () => {
    const panel = (name: string) => page.locator(`#providers .provider[data-provider="${name}"]`);
    // The example's own provider: whatever its object says is what the panel says.
    const own = await until('the example provider checked', async () => {
      const list = await app.store.providerHealths.readList();
      return list.length > 0 && list.every((o) => o.status?.conditions) && list;
    });
    for (const o of own) {
      const ready = o.status?.conditions?.find((c) => c.type === 'Ready');
      const shown = ready?.status === 'True' ? 'true' : ready?.status === 'False' ? 'false' : 'unknown';
      await expect.poll(() => panel(o.metadata.name).getAttribute('data-ready')).toBe(shown);
      if (shown !== 'true')
        expect(await panel(o.metadata.name).locator('.reason').textContent()).toContain(ready?.reason);
    }

    // Two more providers' objects, as the monitor would write them: one ready, one not.
    await writeProviderHealth('kvm-lab', 'kvm', [{ name: 'hv-1', ready: true, reason: 'Reachable' }]);
    await writeProviderHealth('gcp-eu', 'gcp', [
      {
        name: 'my-project',
        ready: false,
        reason: 'Unreachable',
        message: 'connect ETIMEDOUT 203.0.113.7:443',
      },
    ]);
    await expect.poll(() => panel('kvm-lab').getAttribute('data-ready'), { timeout: 10_000 }).toBe('true');
    expect(await panel('kvm-lab').locator('.provider-head').textContent()).toContain(
      'kvm · 1/1 targets ready',
    );
    expect(await panel('kvm-lab').locator('.reason').count()).toBe(0);
    expect(await panel('kvm-lab').locator('.dot.healthy').count()).toBe(2);
    await expect.poll(() => panel('gcp-eu').getAttribute('data-ready'), { timeout: 10_000 }).toBe('false');
    expect(await panel('gcp-eu').locator('.reason').textContent()).toContain('TargetsNotReady');
    expect(await panel('gcp-eu').locator('li').textContent()).toContain('my-project: Unreachable');
    expect(await panel('gcp-eu').locator('.why').textContent()).toBe('connect ETIMEDOUT 203.0.113.7:443');

    // They change places: the panel follows within a few polls, with no reload.
    await writeProviderHealth('kvm-lab', 'kvm', [
      { name: 'hv-1', ready: false, reason: 'Unreachable', message: 'ssh: connection refused' },
    ]);
    await writeProviderHealth('gcp-eu', 'gcp', [{ name: 'my-project', ready: true, reason: 'Reachable' }]);
    await expect.poll(() => panel('kvm-lab').getAttribute('data-ready'), { timeout: 10_000 }).toBe('false');
    expect(await panel('kvm-lab').locator('.reason').textContent()).toContain('TargetsNotReady');
    expect(await panel('kvm-lab').locator('.why').textContent()).toBe('ssh: connection refused');
    await expect.poll(() => panel('gcp-eu').getAttribute('data-ready'), { timeout: 10_000 }).toBe('true');
    expect(await panel('gcp-eu').locator('.reason').count()).toBe(0);

    // Gone from the store, gone from the panel (and from the screenshot below).
    for (const name of ['kvm-lab', 'gcp-eu']) await app.store.providerHealths.delete({ name });
    await expect.poll(() => panel('kvm-lab').count(), { timeout: 10_000 }).toBe(0);
    await expect.poll(() => panel('gcp-eu').count(), { timeout: 10_000 }).toBe(0);
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
