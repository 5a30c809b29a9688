/**
 * test/support/python — runs Debian's Python (the interpreter python3-scrapy installs into, not
 * whatever `python3` a version manager puts first on PATH) with clients/python importable, and
 * fails with the fix when it or a module is missing. Also the Python package as users get it:
 * the private tool environments scripts/ci/venv.sh makes (pytools: mypy, ruff, pytest, build,
 * twine and a wheelhouse of Scrapy from PyPI), `python -m build` of clients/python, and fresh
 * virtual environments with the built wheel and one Scrapy or the other, made without a network,
 * and a package index on loopback serving them.
 */
import { execFileSync, spawn } from 'node:child_process';
import { createReadStream, existsSync, readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { VENV_SCRIPT } from '../../scripts/test/tiers.ts';
import { REPO_ROOT } from './cli.ts';

export const DEBIAN_PYTHON = '/usr/bin/python3';
export const PYTHON_CLIENT = join(REPO_ROOT, 'clients/python');
/** Scrapy 2.19.0 and its dependencies, pinned: what the PyPI environment of the matrix installs. */
export const PYPI_SCRAPY_PINS = join(REPO_ROOT, 'scripts/ci/pytools/scrapy.txt');

/** Throws, naming the fix, unless Debian's python3 imports every module. */
export function requirePython(modules: string[] = []): void {
  const fix = 'install the system packages: bash .ci/install-system-packages.sh (as root)';
  if (!existsSync(DEBIAN_PYTHON)) throw new Error(`${DEBIAN_PYTHON} is missing; ${fix}`);
  for (const m of modules) {
    try {
      execFileSync(DEBIAN_PYTHON, ['-c', `import ${m}`], { stdio: 'pipe' });
    } catch {
      throw new Error(`${DEBIAN_PYTHON} cannot import ${m}; ${fix}`);
    }
  }
}

/**
 * The directory of a private tool environment (scripts/ci/venv.sh); throws with the command that
 * makes it (npm test runs it before the tests).
 */
export function privateVenv(name: 'pytools' | 'moto' | 'schemathesis'): string {
  try {
    const out = execFileSync('bash', [VENV_SCRIPT, name, '--check'], {
      cwd: REPO_ROOT,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    return out.trim().split('\n').pop() ?? '';
  } catch (err) {
    const stderr = String((err as { stderr?: unknown }).stderr ?? '').trim();
    throw new Error(`${name} is not set up: ${stderr || (err as Error).message}`);
  }
}

export interface PythonRun {
  code: number | null;
  output: string;
}

/**
 * Runs `command` with a minimal environment (Debian's PATH, no proxies, no bytecode written);
 * collects stdout and stderr together.
 */
export function runCommand(
  command: string,
  args: string[],
  opts: { cwd: string; env?: Record<string, string>; onOutput?: (chunk: string) => void },
): Promise<PythonRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, {
      cwd: opts.cwd,
      env: {
        PATH: '/usr/bin:/bin',
        PYTHONDONTWRITEBYTECODE: '1',
        LANG: 'C.UTF-8',
        PIP_DISABLE_PIP_VERSION_CHECK: '1',
        ...opts.env,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    const take = (chunk: Buffer) => {
      output += chunk.toString('utf8');
      opts.onOutput?.(chunk.toString('utf8'));
    };
    child.stdout.on('data', take);
    child.stderr.on('data', take);
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, output }));
  });
}

/**
 * Runs Python with `args` in `cwd`: Debian's python3 with clients/python on PYTHONPATH, or
 * `python` (a virtual environment's, which has the package installed) with `pythonPath` alone.
 */
export function runPython(
  args: string[],
  opts: { cwd: string; python?: string; pythonPath?: string[]; onOutput?: (chunk: string) => void },
): Promise<PythonRun> {
  const fromCheckout = opts.python === undefined ? [PYTHON_CLIENT] : [];
  return runCommand(opts.python ?? DEBIAN_PYTHON, args, {
    cwd: opts.cwd,
    env: { PYTHONPATH: [...fromCheckout, ...(opts.pythonPath ?? [])].join(':') },
    ...(opts.onOutput ? { onOutput: opts.onOutput } : {}),
  });
}

/** Throws with the output unless the run exited 0. */
export function expectOk(run: PythonRun, what: string): PythonRun {
  if (run.code !== 0) throw new Error(`${what} exited ${String(run.code)}:\n${run.output.slice(-4000)}`);
  return run;
}

export interface Dist {
  wheel: string;
  sdist: string;
}

/**
 * clients/python built the standard way, `python -m build` (sdist, then the wheel from it, each
 * in an isolated environment) into `outDir`: its backend needs nothing from an index, so this runs
 * without a network.
 */
export async function buildDist(outDir: string): Promise<Dist> {
  const tools = privateVenv('pytools');
  expectOk(
    await runCommand(
      join(tools, 'bin/python'),
      ['-m', 'build', '--outdir', outDir, PYTHON_CLIENT],
      // Nothing may come from an index.
      { cwd: REPO_ROOT, env: { PIP_NO_INDEX: '1' } },
    ),
    'python -m build',
  );
  const files = readdirSync(outDir);
  const wheel = files.find((f) => f.endsWith('.whl'));
  const sdist = files.find((f) => f.endsWith('.tar.gz'));
  if (!wheel || !sdist) throw new Error(`python -m build left ${files.join(', ')} in ${outDir}`);
  return { wheel: join(outDir, wheel), sdist: join(outDir, sdist) };
}

/** `name==version` as scripts/ci/pytools/requirements.txt pins it. */
function pinned(name: string): string {
  const pins = readFileSync(join(REPO_ROOT, 'scripts/ci/pytools/requirements.txt'), 'utf8');
  const line = pins.split('\n').find((l) => l.toLowerCase().startsWith(`${name.toLowerCase()}==`));
  if (!line) throw new Error(`scripts/ci/pytools/requirements.txt pins no ${name}`);
  return line.trim();
}

/** The two Scrapy releases the package is tested with. */
export const SCRAPY_ENVS = [
  { name: 'Debian python3-scrapy', scrapy: '2.8.0' },
  { name: 'PyPI Scrapy', scrapy: '2.19.0' },
] as const;
export type ScrapyEnv = (typeof SCRAPY_ENVS)[number];

/**
 * A fresh virtual environment in `dir` with `wheel` (if given) and `env`'s Scrapy, made offline:
 * Debian's sees Debian's packages (`--system-site-packages`); PyPI's installs Scrapy and its
 * pinned dependencies from the pytools wheelhouse, `extra` (e.g. pytest) too. Returns its python.
 */
export async function scrapyVenv(
  env: ScrapyEnv,
  dir: string,
  wheel: string | undefined,
  extra: string[] = [],
): Promise<string> {
  const debian = env.scrapy === '2.8.0';
  expectOk(
    await runCommand(DEBIAN_PYTHON, ['-m', 'venv', ...(debian ? ['--system-site-packages'] : []), dir], {
      cwd: REPO_ROOT,
    }),
    'python3 -m venv',
  );
  const python = join(dir, 'bin/python');
  const wheelhouse = join(privateVenv('pytools'), 'wheelhouse');
  const pip = async (args: string[]) =>
    expectOk(
      await runCommand(
        python,
        ['-m', 'pip', 'install', '--quiet', '--no-index', '--find-links', wheelhouse, ...args],
        { cwd: REPO_ROOT },
      ),
      `pip install ${args.join(' ')}`,
    );
  const pkg = wheel === undefined ? [] : [wheel];
  if (!debian) await pip(['-r', PYPI_SCRAPY_PINS, ...pkg]);
  else if (wheel !== undefined) await pip(['--no-deps', wheel]);
  // At the pytools pins; the wheelhouse holds one version of everything they pull in.
  if (extra.length > 0) await pip(extra.map(pinned));
  const version = expectOk(
    await runCommand(python, ['-c', 'import scrapy; print(scrapy.__version__)'], { cwd: dir }),
    'import scrapy',
  ).output.trim();
  if (version !== env.scrapy)
    throw new Error(`${env.name}: the environment has Scrapy ${version}, not ${env.scrapy}`);
  return python;
}

export interface PackageIndex {
  /** The simple index URL (PEP 503), for `--index-url` or PIP_INDEX_URL. */
  url: string;
  /** Project names pip asked for. */
  asked: Set<string>;
  close(): Promise<void>;
}

/** A project name as the simple index spells it (PEP 503). */
const normalize = (name: string) => name.replace(/[-_.]+/g, '-').toLowerCase();

/**
 * A package index on loopback (the simple repository API, PEP 503) serving the wheels and sdists
 * of `dirs`: what `pip install <name>` meets at PyPI, without a network.
 */
export async function startPackageIndex(dirs: string[]): Promise<PackageIndex> {
  const files = new Map<string, string>();
  for (const dir of dirs) {
    for (const f of readdirSync(dir)) if (/\.(whl|tar\.gz)$/.test(f)) files.set(f, join(dir, f));
  }
  const asked = new Set<string>();
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url ?? '/', 'http://index').pathname);
    const project = /^\/simple\/([^/]+)\/$/.exec(path)?.[1];
    if (project) {
      asked.add(project);
      const links = [...files.keys()]
        .filter((f) => normalize(f.split('-')[0] as string) === normalize(project))
        .map((f) => `<a href="/files/${encodeURIComponent(f)}">${f}</a>`);
      res.writeHead(links.length > 0 ? 200 : 404, { 'Content-Type': 'text/html' });
      res.end(`<!DOCTYPE html><html><body>${links.join('\n')}</body></html>`);
      return;
    }
    const file = files.get(path.replace(/^\/files\//, ''));
    if (!path.startsWith('/files/') || !file) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { 'Content-Type': 'application/octet-stream' });
    createReadStream(file).pipe(res);
  });
  await new Promise<void>((ok, fail) => {
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => ok());
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/simple/`,
    asked,
    close: () =>
      new Promise<void>((ok) => {
        server.close(() => ok());
        server.closeAllConnections();
      }),
  };
}
