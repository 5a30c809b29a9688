/**
 * The dashboard's routes on a real discovery server: the page and its scripts answer without
 * the token (they hold no data) and with a strict CSP, the data routes need it like the API,
 * the scripts are valid JavaScript once their types are stripped, and without a token the Host
 * guard still keeps foreign pages away from the data.
 */
import { request } from 'node:http';
import { Registry } from 'prom-client';
import { Value } from 'typebox/value';
import { afterEach, describe, expect, it } from 'vitest';
import { loadDashboardAssets } from '../../../src/dashboard/assets.ts';
import { Dashboard } from '../../../src/dashboard/dashboard.ts';
import { dashboardHandlers } from '../../../src/dashboard/routes.ts';
import { DashboardStateBody, LatencyHistoryBody } from '../../../src/dashboard/schemas.ts';
import { type DiscoveryServer, startDiscoveryServer } from '../../../src/discovery/server.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { systemClock } from '../../../src/runtime/clock.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { proxyInfo } from '../../support/lease.ts';

const TOKEN = 'routes-test-token';
let server: DiscoveryServer | undefined;

afterEach(async () => {
  await server?.close();
  server = undefined;
});

async function start(token?: string): Promise<string> {
  const leases = new LeaseStore();
  leases.upsertProxy(proxyInfo('a', { credentials: { username: 'u', password: 'never-shown-pw' } }));
  const dashboard = new Dashboard({ leases, store: createMemoryStore(), clock: systemClock });
  const assets = loadDashboardAssets();
  server = await startDiscoveryServer({
    bindAddress: '127.0.0.1:0',
    leases,
    registry: new Registry(),
    ...(token ? { token } : {}),
    handlers: dashboardHandlers(dashboard, assets),
  });
  return server.url;
}

/** GET with a chosen Host header (fetch cannot set one). */
function getWithHost(url: string, host: string): Promise<number> {
  return new Promise((ok, fail) => {
    const req = request(url, { headers: { host } }, (res) => {
      res.resume();
      ok(res.statusCode ?? 0);
    });
    req.once('error', fail);
    req.end();
  });
}

describe('dashboard routes', () => {
  it('serves the page and its scripts without the token, with a strict content security policy', async () => {
    const url = await start(TOKEN);
    const page = await fetch(`${url}/`);
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toMatch(/^text\/html/);
    expect(page.headers.get('content-security-policy')).toContain("script-src 'self'");
    const html = await page.text();
    const entry = /<script type="module" src="\/dashboard\/([^"]+)"/.exec(html)?.[1];
    expect(entry).toMatch(/^app\.(ts|js)$/);
    const script = await fetch(`${url}/dashboard/${entry}`);
    expect(script.headers.get('content-type')).toMatch(/^text\/javascript/);
    expect((await fetch(`${url}/dashboard/app.css`)).status).toBe(200);
    expect((await fetch(`${url}/dashboard/nope.ts`)).status).toBe(404);
    expect((await fetch(`${url}/dashboard/..%2Fassets.ts`)).status).toBe(404);
  });

  it('is small and self-contained: no CDN, nothing from another origin', () => {
    const assets = loadDashboardAssets();
    const bodies = [assets.page, ...[...assets.files.values()].map((a) => a.body)];
    const bytes = bodies.reduce((n, b) => n + Buffer.byteLength(b), 0);
    // docs/dashboard.md says about 30 KB; a framework or a bundled library would blow this.
    expect(bytes).toBeLessThan(64 * 1024);
    for (const body of bodies) {
      expect(body).not.toMatch(/(src|href)=["']?(https?:)?\/\//);
      expect(body).not.toMatch(/import\s[^;]*from\s*['"](https?:)?\/\//);
      expect(body).not.toMatch(/@import|url\((?!data:)/);
    }
  });

  it('serves the page modules as JavaScript a browser can run (types stripped)', async () => {
    const url = await start(TOKEN);
    const source = await (await fetch(`${url}/dashboard/format.ts`)).text();
    const mod = (await import(`data:text/javascript,${encodeURIComponent(source)}`)) as {
      timeLeft(until: number, now: number): string;
    };
    expect(mod.timeLeft(90_000, 0)).toBe('1 min 30 s');
  });

  it('answers the data only with the token, and never with a credential', async () => {
    const url = await start(TOKEN);
    for (const path of ['/v1/dashboard/state', '/v1/dashboard/history']) {
      expect((await fetch(`${url}${path}`)).status).toBe(401);
      const ok = await fetch(`${url}${path}`, { headers: { authorization: `Bearer ${TOKEN}` } });
      expect(ok.status).toBe(200);
      expect(ok.headers.get('cache-control')).toBe('no-store');
      const body = await ok.text();
      expect(body).not.toContain('never-shown-pw');
      if (path.endsWith('state')) expect(JSON.parse(body).proxies[0].key).toBe('crawl/a');
      // The document lists these answers with their schemas: they must hold.
      const schema = path.endsWith('state') ? DashboardStateBody : LatencyHistoryBody;
      expect([...Value.Errors(schema, JSON.parse(body))]).toEqual([]);
    }
  });

  it('refuses an `after` that is not a non-negative integer, naming it', async () => {
    const url = await start(TOKEN);
    const headers = { authorization: `Bearer ${TOKEN}` };
    const bad = await fetch(`${url}/v1/dashboard/state?after=-1`, { headers });
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ error: { code: 'bad_request', field: 'after' } });
    const ok = await fetch(`${url}/v1/dashboard/state?after=3`, { headers });
    expect(ok.status).toBe(200);
    for (const [query, field] of [
      ['since=-1', 'since'],
      ['limit=0', 'limit'],
      ['limit=2.5', 'limit'],
      [`from=${'x'.repeat(513)}`, 'from'],
    ]) {
      const res = await fetch(`${url}/v1/dashboard/state?${query}`, { headers });
      expect(res.status, query).toBe(400);
      expect(await res.json()).toMatchObject({ error: { code: 'bad_request', field } });
    }
    const history = await fetch(`${url}/v1/dashboard/history?proxies=${'x'.repeat(8193)}`, { headers });
    expect(history.status).toBe(400);
    expect(await history.json()).toMatchObject({ error: { field: 'proxies' } });
  });

  it('pages the fleet and then sends what changed since the revision held, over HTTP', async () => {
    const url = await start(TOKEN);
    const headers = { authorization: `Bearer ${TOKEN}` };
    const get = async (query: string) => {
      const res = await fetch(`${url}/v1/dashboard/state?${query}`, { headers });
      expect(res.status, query).toBe(200);
      const body = await res.json();
      expect([...Value.Errors(DashboardStateBody, body)]).toEqual([]);
      return body as { revision: number; full: boolean; proxies: { key: string }[]; next: string | null };
    };
    const first = await get('limit=1');
    expect(first).toMatchObject({ full: true, next: null, proxies: [{ key: 'crawl/a' }] });
    const again = await get(`since=${first.revision}`);
    expect(again).toMatchObject({ full: false, proxies: [] });
    const history = await fetch(`${url}/v1/dashboard/history?proxies=crawl%2Fa,crawl%2Fb`, { headers });
    expect(Object.keys((await history.json()).series)).toEqual(['crawl/a']);
  });

  it('without a token, keeps the data behind the Host guard but shows the page to any Host', async () => {
    const url = await start();
    expect(await getWithHost(`${url}/`, 'rebound.example')).toBe(200);
    expect(await getWithHost(`${url}/v1/dashboard/state`, 'rebound.example')).toBe(403);
    expect(await getWithHost(`${url}/v1/dashboard/state`, '127.0.0.1')).toBe(200);
  });
});
