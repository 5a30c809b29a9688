/**
 * The TypeScript example of docs/lease-api.md, run as written (only the module specifiers and the API
 * URL changed) against the real standalone operator without a token, through its `pool=eu`
 * proxies, to loopback origins: a page that loads, one that answers 403, a 429 with
 * Retry-After, and a dead origin (plain HTTP: the proxy's 502 with X-Proxy-Error; HTTPS: a 502
 * to the CONNECT). Only the refusals are reported
 * (`blocked`, the 429 for its Retry-After); the dead origin is not the proxy's fault, nothing is
 * reported `failed`; every lease ends, also when the example threw.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import {
  cleanupCli,
  clientFor,
  createWorkspace,
  REPO_ROOT,
  startStandalone,
  waitForReady,
} from '../../support/cli.ts';
import { closedPort } from '../../support/origins.ts';

vi.setConfig({ testTimeout: 120_000 });
afterEach(cleanupCli);

const EXAMPLE_API = "'http://discovery.crawl:8090'";

/** The example's code block, pointed at this repository's modules and at `api`. */
function exampleModule(api: string): string {
  const doc = readFileSync(join(REPO_ROOT, 'docs', 'lease-api.md'), 'utf8');
  const section = doc.split('\n## TypeScript\n')[1] ?? '';
  const code = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
  if (!code) throw new Error('docs/lease-api.md: no TypeScript example under "## TypeScript"');
  for (const needle of [EXAMPLE_API, "from 'egress-proxies-operator'", "from 'undici'"])
    if (!code.includes(needle))
      throw new Error(`docs/lease-api.md's TypeScript example no longer has ${needle}`);
  const client = pathToFileURL(join(REPO_ROOT, 'src/crawler/index.ts')).href;
  return `${code
    .replace(EXAMPLE_API, JSON.stringify(api))
    .replace("from 'egress-proxies-operator'", `from ${JSON.stringify(client)}`)
    .replace("from 'undici'", `from ${JSON.stringify(import.meta.resolve('undici'))}`)}\nexport { crawl };\n`;
}

/** An origin: `/page` 200, `/refused` 403, `/slow-down` 429 with Retry-After: 7. */
async function origin(): Promise<{ port: number; close(): Promise<void> }> {
  const server = http.createServer((req, res) => {
    if (req.url === '/refused') res.writeHead(403).end('no');
    else if (req.url === '/slow-down') res.writeHead(429, { 'Retry-After': '7' }).end('later');
    else res.writeHead(200, { 'Content-Type': 'text/plain' }).end('the page');
  });
  await new Promise<void>((ok) => server.listen(0, '127.0.0.1', () => ok()));
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((ok) => {
        server.close(() => ok());
        server.closeAllConnections();
      }),
  };
}

describe('docs/lease-api.md: the TypeScript example', () => {
  it('reports only what the table says and always ends the lease', async () => {
    const site = await origin();
    onTestFinished(() => site.close());
    const dead = await closedPort();
    const ws = await createWorkspace({ openPorts: [site.port, dead] });
    const proc = startStandalone(ws);
    await waitForReady(ws, proc, ['local-1', 'local-2', 'local-3'], 60_000);

    const dir = mkdtempSync(join(tmpdir(), 'api-ts-example-'));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    const file = join(dir, 'example.ts');
    writeFileSync(file, exampleModule(ws.discoveryUrl));
    const { crawl } = (await import(/* @vite-ignore */ pathToFileURL(file).href)) as {
      crawl(url: string): Promise<string | undefined>;
    };

    const base = `http://127.0.0.1:${site.port}`;
    expect(await crawl(`${base}/page`)).toBe('the page');
    // The origin is down. Plain HTTP: the proxy answers 502 with X-Proxy-Error, nothing to return.
    expect(await crawl(`http://127.0.0.1:${dead}/page`)).toBeUndefined();
    // HTTPS: the proxy answers the CONNECT with a 502, the example throws.
    await expect(crawl(`https://127.0.0.1:${dead}/page`)).rejects.toThrow();
    // Each refusal cools the pool's proxy down for the site (two proxies match pool=eu).
    expect(await crawl(`${base}/refused`)).toBeUndefined();
    expect(await crawl(`${base}/slow-down`)).toBeUndefined();

    // The operator's log lines arrive through a pipe: wait until both reports are read.
    const reported = () =>
      proc.logs.filter((l) => l.msg === 'proxy reported').map((l) => [l.result, l.target]);
    await expect.poll(reported, { timeout: 10_000 }).toHaveLength(2);
    expect(reported()).toEqual([
      ['blocked', '127.0.0.1'],
      ['blocked', '127.0.0.1'],
    ]);
    const proxies = await clientFor(ws).listProxies();
    // Released every time, also after the throw.
    expect(proxies.map((p) => [p.name, p.activeLeases])).toEqual(proxies.map((p) => [p.name, 0]));
    // Both pool=eu proxies cool down for the site: the 403 with the default, the 429 for about 7 s.
    const untilOf = (name: string) =>
      Date.parse(proxies.find((p) => p.name === name)?.targetCooldowns[0]?.until ?? '') - Date.now();
    const lefts = ['local-1', 'local-2'].map(untilOf).sort((a, b) => a - b);
    expect(lefts[0]).toBeLessThanOrEqual(7_000);
    expect(lefts[1]).toBeGreaterThan(60_000);
  });
});
