/**
 * End-to-end: a real Scrapy crawl through clients/python's middleware as users install it — the
 * wheel `python -m build` makes, installed into a fresh virtual environment, once with Debian's
 * Scrapy 2.8 (python3-scrapy, `--system-site-packages`) and once with the newest Scrapy from PyPI
 * (2.19.0 and its pinned dependencies, scripts/ci/pytools/scrapy.txt) — leasing from the real
 * standalone operator (local provider), against two loopback origins — a
 * plain one on 127.0.0.2 and a TLS one on 127.0.0.3 — that refuse some pages once (403, or 429
 * with Retry-After) and one page always. With 3 and with 10 proxies: every page is fetched, every
 * `blocked` report the operator receives names the proxy that carried the refused response (the
 * ground truth is a recorder next to Scrapy's downloader), the always-refused page is given up
 * after the retry cap, every lease the crawl took is released by it (a shared lease once its
 * last request is done) and no lease is left at the end. With 3 proxies the operator is also
 * restarted mid-crawl while requests are in flight: no page is lost.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  afterAll,
  afterEach,
  beforeAll,
  describe,
  expect,
  it,
  onTestFailed,
  onTestFinished,
  vi,
} from 'vitest';
import {
  type CliProcess,
  cleanupCli,
  clientFor,
  createWorkspace,
  startStandalone,
  type Workspace,
  waitFor,
  waitForReady,
} from '../../support/cli.ts';
import { testPki } from '../../support/origins.ts';
import {
  buildDist,
  requirePython,
  runPython,
  SCRAPY_ENVS,
  type ScrapyEnv,
  scrapyVenv,
} from '../../support/python.ts';

vi.setConfig({ testTimeout: 300_000, hookTimeout: 60_000 });
afterEach(cleanupCli);

const FIXTURES = join(import.meta.dirname, '../../support/fixtures/clients');
const BLOCKED_RETRIES = 2;

/** Page n: refused once with 403 when n % 10 === 3, once with 429 when n % 10 === 7. */
function firstAnswer(n: number): { status: number; headers?: Record<string, string> } {
  if (n % 10 === 3) return { status: 403 };
  if (n % 10 === 7) return { status: 429, headers: { 'Retry-After': '1' } };
  return { status: 200 };
}

interface CrawlOrigin {
  baseUrl: string;
  host: string;
  /** Requests per path. */
  seen: Map<string, number>;
  /** Requests held until `open()` (pages >= gateFrom). */
  held: number;
  open(): void;
  close(): Promise<void>;
}

async function startCrawlOrigin(host: string, tls: boolean, gateFrom = Number.POSITIVE_INFINITY) {
  let openGate: () => void = () => {};
  const gate = new Promise<void>((ok) => {
    openGate = ok;
  });
  const state = { seen: new Map<string, number>(), held: 0 };
  const handler = async (req: http.IncomingMessage, res: http.ServerResponse) => {
    const path = req.url ?? '/';
    const count = (state.seen.get(path) ?? 0) + 1;
    state.seen.set(path, count);
    const n = Number(/^\/p\/(\d+)$/.exec(path)?.[1] ?? -1);
    if (n >= gateFrom) {
      state.held++;
      await gate;
      state.held--;
    }
    const answer = path === '/always-403' ? { status: 403 } : count === 1 ? firstAnswer(n) : { status: 200 };
    res.writeHead(answer.status, { 'Content-Type': 'text/html', ...answer.headers });
    res.end(`<html><body>${path}</body></html>`);
  };
  const server = tls
    ? https.createServer({ cert: testPki().cert, key: testPki().key }, handler)
    : http.createServer(handler);
  await new Promise<void>((ok, fail) => {
    server.once('error', fail);
    server.listen(0, host, () => ok());
  });
  const port = (server.address() as AddressInfo).port;
  const origin: CrawlOrigin = {
    baseUrl: `${tls ? 'https' : 'http'}://${host}:${port}`,
    host,
    seen: state.seen,
    get held() {
      return state.held;
    },
    open: () => openGate(),
    close: () =>
      new Promise<void>((ok) => {
        openGate();
        server.close(() => ok());
        server.closeAllConnections();
      }),
  };
  return { origin, port };
}

/** A workspace whose proxies may reach 127.0.0.0/29 on the origins' ports, with `count` proxies. */
async function workspaceFor(ports: number[], count: number): Promise<{ ws: Workspace; names: string[] }> {
  const ws = await createWorkspace({ openPorts: ports });
  const providers = readFileSync(ws.providersFile, 'utf8');
  writeFileSync(
    ws.providersFile,
    providers.replace(/^(\s+egressPolicy: \{allowCIDRs: )\["127\.0\.0\.1\/32"\]/m, '$1["127.0.0.0/29"]'),
  );
  const names = ['local-1', 'local-2', 'local-3'];
  const template = readFileSync(join(ws.proxiesDir, 'local-1.yaml'), 'utf8');
  for (let i = 4; i <= count; i++) {
    names.push(`local-${i}`);
    writeFileSync(
      join(ws.proxiesDir, `local-${i}.yaml`),
      template.replace('name: local-1', `name: local-${i}`),
    );
  }
  return { ws, names };
}

interface CrawlRun {
  done: Promise<{ code: number | null; output: string }>;
  carriedPath: string;
  resultPath: string;
}

function startCrawl(ws: Workspace, urls: string[], python: string): CrawlRun {
  const dir = mkdtempSync(join(tmpdir(), 'scrapy-crawl-'));
  const cfg = {
    urls,
    carried: join(dir, 'carried.jsonl'),
    result: join(dir, 'result.json'),
    settings: {
      EGRESS_API_URL: ws.discoveryUrl,
      EGRESS_BLOCKED_COOLDOWN: 2,
      EGRESS_BLOCKED_RETRIES: BLOCKED_RETRIES,
      EGRESS_FAILED_COOLDOWN: 2,
      EGRESS_LEASE_TTL: 60,
      EGRESS_MAX_WAIT: 120,
      EGRESS_POLL_INTERVAL: 1,
      EGRESS_API_RETRY_FOR: 120,
      CONCURRENT_REQUESTS: 16,
      CONCURRENT_REQUESTS_PER_DOMAIN: 8,
      RETRY_TIMES: 5,
      DOWNLOAD_TIMEOUT: 60,
    },
  };
  writeFileSync(join(dir, 'crawl.json'), JSON.stringify(cfg));
  writeFileSync(join(dir, 'carried.jsonl'), '');
  const done = runPython([join(FIXTURES, 'crawl.py'), join(dir, 'crawl.json')], {
    cwd: dir,
    python,
    pythonPath: [FIXTURES],
  });
  return { done, carriedPath: cfg.carried, resultPath: cfg.result };
}

interface Carried {
  url: string;
  status: number;
  proxy: string;
}

const carried = (run: CrawlRun): Carried[] =>
  readFileSync(run.carriedPath, 'utf8')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as Carried);

/** proxy port → name, from what the operator lists. */
async function portsToNames(ws: Workspace, into: Map<number, string>): Promise<void> {
  for (const p of await clientFor(ws).listProxies()) if (p.port) into.set(p.port, p.name);
}

/** (proxy name, target) of every `blocked` report the operator logged, and the count of `failed` ones. */
function reportsLogged(procs: CliProcess[]): { blocked: string[]; failed: number } {
  const lines = procs.flatMap((p) => p.logs).filter((l) => l.msg === 'proxy reported');
  return {
    blocked: lines
      .filter((l) => l.result === 'blocked')
      .map((l) => `${String(l.proxy).split('/')[1]} ${String(l.target)}`),
    failed: lines.filter((l) => l.result === 'failed').length,
  };
}

async function crawlAndCheck(opts: {
  python: string;
  env: ScrapyEnv;
  proxies: number;
  pages: number;
  restart: boolean;
}): Promise<void> {
  const gateFrom = opts.restart ? Math.floor(opts.pages / 3) : Number.POSITIVE_INFINITY;
  const plain = await startCrawlOrigin('127.0.0.2', false, gateFrom);
  const secure = await startCrawlOrigin('127.0.0.3', true, gateFrom);
  onTestFinished(async () => {
    await plain.origin.close();
    await secure.origin.close();
  });
  const { ws, names } = await workspaceFor([plain.port, secure.port], opts.proxies);
  const procs = [startStandalone(ws, ['--lease-checkpoint-interval', '500ms'])];
  onTestFailed(() => {
    // What the operator refused and what it still holds say whose side a failure was on.
    const logs = procs.flatMap((p, i) => p.logs.map((l) => ({ process: i, ...l })));
    const denied = logs.filter((l) => l.msg === 'egress denied').slice(0, 5);
    const ports = logs.filter((l) => /listening|listen/.test(String(l.msg))).slice(0, 12);
    console.error(JSON.stringify({ origins: [plain.port, secure.port], denied, ports }, null, 1));
  });
  await waitForReady(ws, procs[0] as CliProcess, names, 90_000);
  const ports = new Map<number, string>();
  await portsToNames(ws, ports);

  const origins = [plain.origin, secure.origin];
  const pages = origins.flatMap((o) => Array.from({ length: opts.pages }, (_, n) => `${o.baseUrl}/p/${n}`));
  const run = startCrawl(ws, [...pages, `${plain.origin.baseUrl}/always-403`], opts.python);

  if (opts.restart) {
    // Restart while requests are in flight through the proxies (held at the origins).
    await waitFor(
      () => plain.origin.held + secure.origin.held >= 4,
      'requests in flight at the origins',
      120_000,
    );
    const first = procs[0] as CliProcess;
    first.signal('SIGTERM');
    expect((await waitFor(() => first.hasExited && first.exited, 'exit after SIGTERM', 60_000)).code).toBe(0);
    const second = startStandalone(ws, ['--lease-checkpoint-interval', '500ms']);
    procs.push(second);
    await waitForReady(ws, second, names, 90_000);
    await portsToNames(ws, ports);
    for (const o of origins) o.open();
  }

  const { code, output } = await run.done;
  expect(code, output.slice(-4000)).toBe(0);
  const result = JSON.parse(readFileSync(run.resultPath, 'utf8')) as {
    fetched: string[];
    stats: Record<string, number>;
    scrapy: string;
    package: string;
  };
  // The Scrapy of the environment, and the package installed in it (not the checkout's).
  expect(result.scrapy).toBe(opts.env.scrapy);
  expect(result.package.startsWith(join(opts.python, '../../lib/'))).toBe(true);

  // Every page fetched, each once.
  expect([...result.fetched].sort(), output.slice(-3000)).toEqual([...pages].sort());
  // Every refusal the crawl met was reported, naming the proxy that carried it, and nothing else was.
  const refused = carried(run).filter((c) => c.status === 403 || c.status === 429);
  const truth = refused.map((c) => `${ports.get(Number(new URL(c.proxy).port))} ${new URL(c.url).hostname}`);
  expect(truth.every((t) => !t.startsWith('undefined'))).toBe(true);
  const reports = reportsLogged(procs);
  expect(reports.blocked.length).toBeGreaterThanOrEqual(truth.length);
  expect(new Set(reports.blocked)).toEqual(new Set(truth));
  expect(result.stats['egress/blocked']).toBe(refused.length);
  expect(result.stats['egress/blocked_gave_up']).toBe(1);
  if (!opts.restart) {
    // Pages n % 10 in {3, 7} once each, and the always-refused page every time.
    expect(refused.length).toBe(origins.length * (opts.pages / 5) + BLOCKED_RETRIES + 1);
    // The always-refused page: the first try and BLOCKED_RETRIES more, each through another proxy.
    expect(plain.origin.seen.get('/always-403')).toBe(BLOCKED_RETRIES + 1);
    // Nothing here is a proxy's fault.
    expect(reports.failed).toBe(0);
    // A slot's shared lease is released by the middleware once its last request is done, never
    // while siblings still use it (a sibling would meet a 407), never left to expire: every
    // lease taken was released by the crawl itself.
    expect(result.stats['egress/lease_ended'] ?? 0, output.slice(-3000)).toBe(0);
    expect(result.stats['egress/release']).toBe(result.stats['egress/lease']);
    expect(result.stats['egress/lease']).toBeGreaterThan(1);
  }
  // No lease left behind.
  const after = await clientFor(ws).listProxies();
  expect(after.map((p) => p.activeLeases)).toEqual(after.map(() => 0));
}

// One wheel, built once; one fresh environment per Scrapy.
let work = '';
afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});
let wheel: string;
beforeAll(async () => {
  requirePython(['scrapy', 'twisted']);
  work = mkdtempSync(join(tmpdir(), 'scrapy-crawl-envs-'));
  wheel = (await buildDist(join(work, 'dist'))).wheel;
}, 180_000);

for (const env of SCRAPY_ENVS) {
  describe(`Scrapy through the installed egress_proxies middleware, real operator: ${env.name} ${env.scrapy}`, () => {
    let python: string;
    beforeAll(async () => {
      python = await scrapyVenv(env, join(work, env.scrapy), wheel);
    }, 180_000);

    it('3 proxies, operator restarted mid-crawl: every page, blocked reports name the right proxy', async () => {
      await crawlAndCheck({ python, env, proxies: 3, pages: 60, restart: true });
    });

    it('10 proxies: every page, blocked reports name the right proxy, retry cap holds', async () => {
      await crawlAndCheck({ python, env, proxies: 10, pages: 100, restart: false });
    });
  });
}
