/**
 * test/support/gateway/inspect-clients — the real clients of the HTTPS-inspection tests, each
 * given a proxy URL and the inspecting proxy's CA file and trusting that CA the way
 * docs/gateway.md ("Trusting the gateway's CA") tells users to: curl `--cacert`, Debian's
 * python3-requests `verify=`, Debian's python3-scrapy with a verifying context factory
 * (fixtures/inspect/trust_ca.py), and headless Chromium (playwright-core) with the CA in the NSS
 * database of its HOME (certutil), Node's fetch with NODE_EXTRA_CA_CERTS and NODE_USE_ENV_PROXY —
 * never by switching verification off. Each fetches a list
 * of URLs without retrying and returns one answer (or error) per URL.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Page } from 'playwright-core';
import { launchChromium } from '../browser.ts';
import { NODE } from '../cli.ts';
import { DEBIAN_PYTHON } from '../python.ts';
import { run } from './world.ts';

export const INSPECT_FIXTURES = join(import.meta.dirname, '../fixtures/inspect');

export type ClientName = 'curl' | 'requests' | 'scrapy' | 'node' | 'chromium';
export const CLIENTS: ClientName[] = ['curl', 'requests', 'scrapy', 'node', 'chromium'];

export interface Answer {
  url: string;
  status?: number;
  /** The start of the body. */
  body?: string;
  /** Why there was no answer (a TLS verification failure, a refused tunnel…). */
  error?: string;
}

const proxyEnv = (proxyUrl: string) => ({
  HTTP_PROXY: proxyUrl,
  HTTPS_PROXY: proxyUrl,
  http_proxy: proxyUrl,
  https_proxy: proxyUrl,
  LANG: 'C.UTF-8',
  PYTHONDONTWRITEBYTECODE: '1',
  PYTHONPATH: INSPECT_FIXTURES,
});

const MARK = '@@answer';

/** curl, one process for all URLs (one connection to the proxy where it can). */
export async function curlFetch(proxyUrl: string, caFile: string, urls: string[]): Promise<Answer[]> {
  const r = await run('curl', [
    '-sS',
    '--cacert',
    caFile,
    '-x',
    proxyUrl,
    '--max-time',
    '30',
    '-w',
    `\\n${MARK} %{http_code} %{url_effective}\\n`,
    ...urls,
  ]);
  const answers: Answer[] = [];
  let body = '';
  for (const line of r.stdout.split('\n')) {
    const m = new RegExp(`^${MARK} (\\d{3}) (\\S+)$`).exec(line);
    if (!m) {
      body += `${line}\n`;
      continue;
    }
    const status = Number(m[1]);
    answers.push(
      status === 0
        ? { url: m[2] as string, error: r.stderr.trim() || 'no answer' }
        : { url: m[2] as string, status, body },
    );
    body = '';
  }
  return answers.length > 0
    ? answers
    : urls.map((url) => ({ url, error: r.stderr.trim() || `exit ${r.code}` }));
}

function jsonLines(stdout: string): Answer[] {
  return stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Answer);
}

export async function requestsFetch(proxyUrl: string, caFile: string, urls: string[]): Promise<Answer[]> {
  const r = await run(
    DEBIAN_PYTHON,
    [join(INSPECT_FIXTURES, 'requests_crawl.py'), caFile, ...urls],
    proxyEnv(proxyUrl),
  );
  if (r.code !== 0) throw new Error(`requests_crawl.py exited ${r.code}: ${r.stderr.slice(-2000)}`);
  return jsonLines(r.stdout);
}

export async function scrapyFetch(proxyUrl: string, caFile: string, urls: string[]): Promise<Answer[]> {
  const r = await run(
    DEBIAN_PYTHON,
    [join(INSPECT_FIXTURES, 'scrapy_crawl.py'), caFile, ...urls],
    proxyEnv(proxyUrl),
  );
  if (r.code !== 0) throw new Error(`scrapy_crawl.py exited ${r.code}: ${r.stderr.slice(-2000)}`);
  return jsonLines(r.stdout);
}

/** Node's own fetch: the proxy from the environment (NODE_USE_ENV_PROXY=1), the CA from NODE_EXTRA_CA_CERTS. */
export async function nodeFetch(proxyUrl: string, caFile: string, urls: string[]): Promise<Answer[]> {
  const r = await run(NODE, [join(INSPECT_FIXTURES, 'node_fetch.mjs'), ...urls], {
    HTTPS_PROXY: proxyUrl,
    NODE_USE_ENV_PROXY: '1',
    NODE_EXTRA_CA_CERTS: caFile,
  });
  if (r.code !== 0) throw new Error(`node_fetch.mjs exited ${r.code}: ${r.stderr.slice(-2000)}`);
  return jsonLines(r.stdout);
}

/**
 * A HOME whose NSS database (~/.pki/nssdb, what Chromium on Linux reads user-added roots from)
 * trusts `caFile` to identify web sites; the caller removes it.
 */
export function nssHomeTrusting(caFile: string): string {
  const home = mkdtempSync(join(tmpdir(), 'chromium-home-'));
  const db = join(home, '.pki', 'nssdb');
  mkdirSync(db, { recursive: true });
  execFileSync('certutil', ['-d', `sql:${db}`, '-N', '--empty-password'], { stdio: 'pipe' });
  execFileSync('certutil', ['-d', `sql:${db}`, '-A', '-t', 'C,,', '-n', 'egress-gateway-ca', '-i', caFile], {
    stdio: 'pipe',
  });
  return home;
}

/**
 * Headless Chromium through the proxy, trusting `caFile` through its NSS database, given one page
 * to use; closed (and its HOME removed) once `use` settles.
 */
async function withChromium<T>(
  proxyUrl: string,
  caFile: string,
  use: (page: Page) => Promise<T>,
): Promise<T> {
  const proxy = new URL(proxyUrl);
  const home = nssHomeTrusting(caFile);
  const browser = await launchChromium(undefined, {
    proxy: {
      server: `http://${proxy.host}`,
      username: decodeURIComponent(proxy.username),
      password: decodeURIComponent(proxy.password),
    },
    env: { HOME: home },
  });
  try {
    return await use(await browser.context.newPage());
  } finally {
    await browser.close();
    rmSync(home, { recursive: true, force: true });
  }
}

/** Headless Chromium through the proxy, trusting `caFile` through its NSS database; one page at a time. */
export function chromiumFetch(proxyUrl: string, caFile: string, urls: string[]): Promise<Answer[]> {
  return withChromium(proxyUrl, caFile, async (page) => {
    const answers: Answer[] = [];
    for (const url of urls) {
      try {
        const res = await page.goto(url, { timeout: 30_000 });
        answers.push({ url, status: res?.status() ?? 0, body: (await page.content()).slice(0, 300) });
      } catch (err) {
        answers.push({ url, error: (err as Error).message.split('\n')[0] ?? 'error' });
      }
    }
    return answers;
  });
}

/**
 * Headless Chromium through the proxy loads `pageUrl`, and from that page opens a WebSocket to
 * each of `urls` in turn (`ws://` or `wss://`, trusting `caFile`), sends `message` and gives back
 * the first message it receives, or why the socket failed. The page comes first as on any site:
 * Chromium answers the proxy's credential challenge for a page load and then sends the
 * credentials it learned with its WebSockets too (it does not ask for them on a WebSocket).
 */
export function chromiumWebSockets(
  proxyUrl: string,
  caFile: string,
  pageUrl: string,
  urls: string[],
  message: string,
): Promise<Answer[]> {
  return withChromium(proxyUrl, caFile, async (page) => {
    await page.goto(pageUrl, { timeout: 30_000 });
    const answers: Answer[] = [];
    // Chromium says why a WebSocket failed on the console only.
    const console: string[] = [];
    page.on('console', (m) => console.push(m.text()));
    for (const url of urls) {
      console.length = 0;
      const got = await page.evaluate(
        ([u, m]) =>
          new Promise<{ body?: string; error?: string }>((resolve) => {
            const ws = new WebSocket(u as string);
            const timer = setTimeout(() => resolve({ error: 'no answer within 30 s' }), 30_000);
            ws.onopen = () => ws.send(m as string);
            ws.onmessage = (e) => {
              clearTimeout(timer);
              resolve({ body: String(e.data) });
              ws.close();
            };
            ws.onerror = () => {
              clearTimeout(timer);
              resolve({ error: 'the WebSocket failed' });
            };
          }),
        [url, message],
      );
      const why = console.find((l) => l.includes(url));
      answers.push({ url, ...got, ...(got.error && why ? { error: `${got.error}: ${why}` } : {}) });
    }
    return answers;
  });
}

export function fetchWith(
  client: ClientName,
  proxyUrl: string,
  caFile: string,
  urls: string[],
): Promise<Answer[]> {
  switch (client) {
    case 'curl':
      return curlFetch(proxyUrl, caFile, urls);
    case 'requests':
      return requestsFetch(proxyUrl, caFile, urls);
    case 'scrapy':
      return scrapyFetch(proxyUrl, caFile, urls);
    case 'node':
      return nodeFetch(proxyUrl, caFile, urls);
    case 'chromium':
      return chromiumFetch(proxyUrl, caFile, urls);
  }
}
