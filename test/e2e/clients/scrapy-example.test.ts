/**
 * examples/scrapy/spider.py run as docs/scrapy.md shows it — `scrapy runspider` from the
 * repository root with clients/python on PYTHONPATH (Debian's python3-scrapy) — against the real
 * standalone operator, only the lease API URL and the start page changed on the command line. A
 * loopback site of linked pages, one of which refuses its first request with 403: every page on
 * the site is fetched once with 200 (the refused one again through another proxy, the refusal
 * reported `blocked` naming the proxy that carried it), the link off the site is not followed,
 * each item names the proxy that carried it, and no lease is left when the crawl ends.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import {
  cleanupCli,
  clientFor,
  createWorkspace,
  REPO_ROOT,
  startStandalone,
  waitForReady,
} from '../../support/cli.ts';
import { requirePython, runPython } from '../../support/python.ts';

vi.setConfig({ testTimeout: 180_000, hookTimeout: 60_000 });
afterEach(cleanupCli);

const PAGES = 6;
const REFUSED_ONCE = '/p/3';

/** A site on 127.0.0.1: `/` links to /p/1…/p/PAGES and off the site; REFUSED_ONCE answers 403 first. */
async function startSite(): Promise<{
  url: string;
  port: number;
  seen: Map<string, number>;
  close(): Promise<void>;
}> {
  const seen = new Map<string, number>();
  const server = http.createServer((req, res) => {
    const path = req.url ?? '/';
    const count = (seen.get(path) ?? 0) + 1;
    seen.set(path, count);
    const links = Array.from({ length: PAGES }, (_, i) => `<a href="/p/${i + 1}">page ${i + 1}</a>`);
    links.push('<a href="http://127.0.0.2:9/elsewhere">another site</a>', '<a href="/#top">home</a>');
    const known = path === '/' || /^\/p\/[1-9]\d*$/.test(path);
    const status = !known ? 404 : path === REFUSED_ONCE && count === 1 ? 403 : 200;
    res.writeHead(status, { 'Content-Type': 'text/html' });
    res.end(`<html><head><title>${path}</title></head><body>${links.join(' ')}</body></html>`);
  });
  await new Promise<void>((ok, fail) => {
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => ok());
  });
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}/`,
    port,
    seen,
    close: () =>
      new Promise<void>((ok) => {
        server.close(() => ok());
        server.closeAllConnections();
      }),
  };
}

interface Item {
  url: string;
  status: number;
  title: string;
  proxy: string | null;
}

describe('examples/scrapy/spider.py with scrapy runspider, real operator', () => {
  it('fetches the whole site through leased proxies, reports the refusal, leaves no lease', async () => {
    requirePython(['scrapy', 'twisted']);
    const docs = readFileSync(join(REPO_ROOT, 'docs/scrapy.md'), 'utf8');
    // The command docs/scrapy.md shows, which this test runs with its own URLs.
    expect(docs).toContain('PYTHONPATH=clients/python scrapy runspider examples/scrapy/spider.py');

    const site = await startSite();
    onTestFinished(() => site.close());
    const ws = await createWorkspace({ openPorts: [site.port] });
    const proc = startStandalone(ws);
    const names = ['local-1', 'local-2', 'local-3'];
    await waitForReady(ws, proc, names, 90_000);

    const out = join(mkdtempSync(join(tmpdir(), 'scrapy-example-')), 'pages.jsonl');
    const run = await runPython(
      [
        '-m',
        'scrapy',
        'runspider',
        'examples/scrapy/spider.py',
        '-a',
        `url=${site.url}`,
        '-s',
        `EGRESS_API_URL=${ws.discoveryUrl}`,
        '-O',
        out,
      ],
      { cwd: REPO_ROOT },
    );
    expect(run.code, run.output.slice(-4000)).toBe(0);
    const items = readFileSync(out, 'utf8')
      .split('\n')
      .filter((l) => l.trim())
      .map((l) => JSON.parse(l) as Item);

    // Every page of the site once, each with 200 and a proxy of the fleet; nothing off the site.
    const base = site.url.replace(/\/$/, '');
    const want = ['/', ...Array.from({ length: PAGES }, (_, i) => `/p/${i + 1}`)];
    expect(items.map((i) => i.url).sort(), run.output.slice(-3000)).toEqual(want.map((p) => base + p).sort());
    for (const item of items) {
      expect(item.status).toBe(200);
      expect(item.title).toBe(new URL(item.url).pathname);
      expect(names.map((n) => `crawl/${n}`)).toContain(item.proxy);
    }
    expect(site.seen.get('/elsewhere')).toBeUndefined();
    expect(site.seen.get(REFUSED_ONCE)).toBe(2);

    // The 403 was reported as a block of this site, naming a proxy of the fleet.
    const reports = proc.logs.filter((l) => l.msg === 'proxy reported');
    expect(reports.map((l) => [l.result, l.target])).toEqual([['blocked', '127.0.0.1']]);
    expect(names.map((n) => `crawl/${n}`)).toContain(String(reports[0]?.proxy));
    // The refused page came through another proxy than the one that was refused.
    const refusedItem = items.find((i) => i.url === base + REFUSED_ONCE);
    expect(refusedItem?.proxy).not.toBe(String(reports[0]?.proxy));

    // Every lease the crawl took was released by it.
    const stat = (name: string) => Number(new RegExp(`'egress/${name}': (\\d+)`).exec(run.output)?.[1] ?? 0);
    expect(stat('lease'), run.output.slice(-3000)).toBeGreaterThanOrEqual(2);
    expect(stat('release')).toBe(stat('lease'));
    const after = await clientFor(ws).listProxies();
    expect(after.map((p) => p.activeLeases)).toEqual(after.map(() => 0));
  });
});
