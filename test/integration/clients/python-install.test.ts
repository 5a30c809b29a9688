/**
 * clients/python/README.md as written: its install commands run offline (pip reaches no index,
 * every proxy variable points at a closed port) with Debian's python3, in a fresh home directory —
 * into a new virtual environment that sees Debian's packages, with nothing but PYTHONPATH, and
 * into Debian's own Python, which refuses a plain `pip install` (PEP 668) and takes the last-resort
 * `--user --break-system-packages` one — and each leaves clients/python as it was (no `build/`,
 * no `*.egg-info`). Its install from an index runs against a package index on loopback serving
 * the wheel `python -m build` makes and Scrapy 2.19 with its pinned dependencies (PIP_INDEX_URL):
 * the newest Scrapy comes with the `scrapy` extra. Its usage example then fetches a page through
 * a proxy leased from the real standalone operator and releases the lease.
 */
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import {
  cleanupCli,
  clientFor,
  createWorkspace,
  REPO_ROOT,
  startStandalone,
  waitForReady,
} from '../../support/cli.ts';
import { closedPort, startHttpOrigin } from '../../support/origins.ts';
import {
  buildDist,
  PYTHON_CLIENT,
  privateVenv,
  requirePython,
  runPython,
  startPackageIndex,
} from '../../support/python.ts';

vi.setConfig({ testTimeout: 180_000 });
afterEach(cleanupCli);

const README = readFileSync(join(PYTHON_CLIENT, 'README.md'), 'utf8');

/** The README's fenced blocks of one language, in order. */
function blocks(lang: string): string[] {
  return [...README.matchAll(new RegExp(`\`\`\`${lang}\\n([\\s\\S]*?)\`\`\``, 'g'))].map(
    (m) => m[1] as string,
  );
}

/** The one shell block of the README that contains `marker`. */
function shellBlock(marker: string): string {
  const found = blocks('sh').filter((b) => b.includes(marker));
  expect(found, `one sh block with ${marker} in clients/python/README.md`).toHaveLength(1);
  return found[0] as string;
}

const homes: string[] = [];
afterAll(() => {
  for (const h of homes) rmSync(h, { recursive: true, force: true });
});

/** A fresh home directory: `~` in the README's commands, pip's config and cache, the user site. */
function freshHome(): string {
  const home = mkdtempSync(join(tmpdir(), 'py-install-home-'));
  homes.push(home);
  return home;
}

/**
 * Runs a README shell block with bash (`set -eu`) from the repository root, Debian's python3 first
 * on PATH, HOME at `home`, and no network for pip: every proxy variable points at a closed port.
 */
async function runBlock(
  block: string,
  home: string,
  cwd = REPO_ROOT,
  extraEnv: Record<string, string> = {},
): Promise<{ code: number | null; output: string }> {
  const nowhere = `http://127.0.0.1:${await closedPort()}`;
  return new Promise((resolve, reject) => {
    const child = spawn('bash', ['-euc', block], {
      cwd,
      env: {
        PATH: '/usr/bin:/bin',
        HOME: home,
        LANG: 'C.UTF-8',
        PYTHONDONTWRITEBYTECODE: '1',
        PIP_DISABLE_PIP_VERSION_CHECK: '1',
        HTTP_PROXY: nowhere,
        HTTPS_PROXY: nowhere,
        http_proxy: nowhere,
        https_proxy: nowhere,
        ...extraEnv,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (c: Buffer) => {
      output += c.toString('utf8');
    });
    child.stderr.on('data', (c: Buffer) => {
      output += c.toString('utf8');
    });
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, output }));
  });
}

/** What git sees in clients/python, ignored files included. */
function treeState(): string {
  return execFileSync(
    'git',
    ['status', '--porcelain', '--ignored', '--untracked-files=all', 'clients/python'],
    {
      cwd: REPO_ROOT,
      encoding: 'utf8',
    },
  );
}

function expectNoLeftovers(before: string): void {
  expect(treeState()).toBe(before);
  const names = readdirSync(PYTHON_CLIENT);
  expect(names.filter((n) => n === 'build' || n === 'dist' || n.endsWith('.egg-info'))).toEqual([]);
}

describe('clients/python/README.md: install, as written, offline', () => {
  it('into a new virtual environment with Debian packages: imports the middleware, leaves no build files', async () => {
    requirePython(['scrapy']);
    const block = shellBlock('--system-site-packages');
    const before = treeState();
    const home = freshHome();
    const run = await runBlock(block, home);
    expect(run.code, run.output).toBe(0);
    expect(run.output).toContain('Successfully installed egress-proxies');
    // The package comes from the environment, not from the checkout.
    const venvPython = join(home, '.venvs/crawler/bin/python');
    const where = await runBlock(
      `${venvPython} -c 'import egress_proxies.scrapy_middleware as m; print(m.__file__)'`,
      home,
      home,
    );
    expect(where.code, where.output).toBe(0);
    expect(realpathSync(where.output.trim())).toContain(join(realpathSync(home), '.venvs/crawler/lib/'));
    expectNoLeftovers(before);
  });

  it('without installing: PYTHONPATH=clients/python', async () => {
    requirePython();
    const run = await runBlock(shellBlock('PYTHONPATH=clients/python'), freshHome());
    expect(run.code, run.output).toBe(0);
  });

  it("into Debian's Python: a plain install is refused, the last resort installs for the user only", async () => {
    requirePython();
    const block = shellBlock('--break-system-packages');
    const before = treeState();
    const home = freshHome();
    // What the README says a plain install does (a dry run: nothing would be installed anyway).
    const plain = await runBlock(block.replace(/--user --break-system-packages /, '--dry-run '), home);
    expect(plain.code).not.toBe(0);
    expect(plain.output).toContain('externally-managed-environment');
    const run = await runBlock(block, home);
    expect(run.code, run.output).toBe(0);
    const where = await runBlock(
      `python3 -c 'import egress_proxies; print(egress_proxies.__file__)'`,
      home,
      home,
    );
    expect(where.code, where.output).toBe(0);
    expect(realpathSync(where.output.trim())).toContain(join(realpathSync(home), '.local/lib/'));
    expectNoLeftovers(before);
  });
});

describe('clients/python/README.md: install from an index, as written', () => {
  it("installs the wheel and the newest Scrapy through the 'scrapy' extra into a plain virtual environment", async () => {
    requirePython();
    const home = freshHome();
    const dist = await buildDist(join(home, 'dist'));
    const index = await startPackageIndex([join(home, 'dist'), join(privateVenv('pytools'), 'wheelhouse')]);
    onTestFinished(() => index.close());
    const block = shellBlock("'egress-proxies[scrapy]'");
    expect(block).not.toContain('--system-site-packages');
    const before = treeState();
    const run = await runBlock(block, home, REPO_ROOT, {
      PIP_INDEX_URL: index.url,
      NO_PROXY: '127.0.0.1',
      no_proxy: '127.0.0.1',
    });
    expect(run.code, run.output).toBe(0);
    expect(index.asked).toContain('egress-proxies');
    expect(index.asked).toContain('scrapy');
    const venvPython = join(home, '.venvs/crawler/bin/python');
    const where = await runBlock(
      `${venvPython} -c 'import egress_proxies, scrapy; print(egress_proxies.__file__, scrapy.__version__)'`,
      home,
      home,
    );
    expect(where.code, where.output).toBe(0);
    const [file, scrapy] = where.output.trim().split(' ');
    expect(realpathSync(file as string)).toContain(join(realpathSync(home), '.venvs/crawler/lib/'));
    expect(scrapy).toBe('2.19.0');
    expect(dist.wheel).toMatch(/egress_proxies-[\d.]+-py3-none-any\.whl$/);
    expectNoLeftovers(before);
  });
});

describe('clients/python/README.md: the usage example, as written', () => {
  it('fetches a page through a leased proxy and releases the lease', async () => {
    requirePython();
    const code = blocks('python').find((b) => b.includes('LeaseClient('));
    expect(code, 'a python block with LeaseClient(').toBeDefined();
    const origin = await startHttpOrigin({ defaultStatus: 200 });
    onTestFinished(() => origin.close());
    const ws = await createWorkspace({ openPorts: [origin.port] });
    const proc = startStandalone(ws);
    await waitForReady(ws, proc, ['local-1', 'local-2', 'local-3'], 60_000);

    // Only the API and the page change: the example's are the standalone default and a public site.
    const api = '"http://127.0.0.1:8090"';
    const page = '"https://example.com/"';
    expect(code).toContain(api);
    expect(code).toContain(page);
    const run = await runPython(
      [
        '-c',
        (code as string)
          .replace(api, JSON.stringify(ws.discoveryUrl))
          .replace(page, JSON.stringify(`${origin.baseUrl}/page`)),
      ],
      { cwd: ws.dir },
    );
    expect(run.code, run.output).toBe(0);
    expect(run.output.trim()).toMatch(/^200 via crawl\/local-[123]$/);
    expect(origin.requests).toBe(1);
    const proxies = await clientFor(ws).listProxies();
    expect(proxies.map((p) => p.activeLeases)).toEqual([0, 0, 0]);
  });
});
