/**
 * The Python package (clients/python) held to PyPI's standards by the suite, so `npm test`
 * enforces them: ruff (lint and format) and mypy --strict clean; its pytest suite passing with
 * the newest Scrapy from PyPI (the pytools environment) and with Debian's Scrapy 2.8 (a fresh
 * environment over Debian's packages); `python -m build` making an sdist and a wheel that
 * `twine check --strict` passes (built in isolated environments with no index: the in-tree
 * backend needs nothing), with py.typed, the version of egress_proxies/__init__.py (its one
 * source) equal to the operator's package.json version, and the checkout left as it was.
 * Every tool runs from the private pytools environment (scripts/ci/venv.sh pytools), offline.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REPO_ROOT } from '../../support/cli.ts';
import {
  buildDist,
  type Dist,
  expectOk,
  PYTHON_CLIENT,
  privateVenv,
  runCommand,
  SCRAPY_ENVS,
  scrapyVenv,
} from '../../support/python.ts';

let work = '';
afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

/** What git sees in clients/python, ignored files included (caches and build output too). */
const treeState = () =>
  execFileSync('git', ['status', '--porcelain', '--ignored', '--untracked-files=all', 'clients/python'], {
    cwd: REPO_ROOT,
    encoding: 'utf8',
  });

let tools: string;
let before: string;
beforeAll(() => {
  work = mkdtempSync(join(tmpdir(), 'python-package-'));
  tools = join(privateVenv('pytools'), 'bin');
  before = treeState();
});

/** A tool of the pytools environment run in clients/python, its caches outside the checkout. */
const tool = (name: string, args: string[]) =>
  runCommand(join(tools, name), args, {
    cwd: PYTHON_CLIENT,
    env: { RUFF_CACHE_DIR: join(work, 'ruff-cache'), MYPY_CACHE_DIR: join(work, 'mypy-cache') },
  });

describe('clients/python: lint, types, tests', () => {
  it('ruff check and ruff format --check find nothing', async () => {
    const lint = await tool('ruff', ['check', '.']);
    expect(lint.code, lint.output).toBe(0);
    const format = await tool('ruff', ['format', '--check', '.']);
    expect(format.code, format.output).toBe(0);
    expect(treeState()).toBe(before);
  }, 60_000);

  it('mypy --strict passes on the package, its tests and its build backend', async () => {
    const run = await tool('mypy', ['--strict']);
    expect(run.code, run.output).toBe(0);
    expect(run.output).toMatch(/Success: no issues found in \d+ source files/);
    expect(treeState()).toBe(before);
  }, 180_000);

  for (const env of SCRAPY_ENVS) {
    it(`pytest passes with ${env.name} ${env.scrapy}, nothing skipped`, async () => {
      const python =
        env.scrapy === '2.8.0'
          ? await scrapyVenv(env, join(work, 'debian-venv'), undefined, ['pytest'])
          : join(tools, 'python');
      const version = await runCommand(python, ['-c', 'import scrapy; print(scrapy.__version__)'], {
        cwd: PYTHON_CLIENT,
      });
      expect(version.output.trim()).toBe(env.scrapy);
      const run = await runCommand(python, ['-m', 'pytest', '-q', '-rs'], { cwd: PYTHON_CLIENT });
      expect(run.code, run.output).toBe(0);
      expect(run.output).toMatch(/\b([1-9]\d*) passed\b/);
      expect(run.output).not.toMatch(/skipped|xfail|error/i);
      expect(treeState()).toBe(before);
    }, 180_000);
  }
});

describe('clients/python: python -m build and twine check', () => {
  let dist: Dist;
  beforeAll(async () => {
    dist = await buildDist(join(work, 'dist'));
  }, 180_000);

  it('makes an sdist and a wheel that twine check --strict passes', async () => {
    const run = await runCommand(join(tools, 'twine'), ['check', '--strict', dist.sdist, dist.wheel], {
      cwd: work,
    });
    expect(run.code, run.output).toBe(0);
    expect(run.output.match(/PASSED/g)).toHaveLength(2);
    expect(treeState()).toBe(before);
  }, 60_000);

  it('one version: __init__.py, the built metadata and package.json agree', async () => {
    const pkg = JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as { version: string };
    const init = readFileSync(join(PYTHON_CLIENT, 'egress_proxies/__init__.py'), 'utf8');
    expect(init.match(/^__version__ = "([^"]+)"$/m)?.[1]).toBe(pkg.version);
    expect(readFileSync(join(PYTHON_CLIENT, 'pyproject.toml'), 'utf8')).toMatch(/^dynamic = \["version"\]$/m);
    const metadata = expectOk(
      await runCommand(
        join(tools, 'python'),
        [
          '-c',
          'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); n = [f for f in z.namelist() if f.endswith(".dist-info/METADATA")][0]; print(z.read(n).decode())',
          dist.wheel,
        ],
        { cwd: work },
      ),
      'reading the wheel',
    ).output;
    expect(metadata).toMatch(new RegExp(`^Version: ${pkg.version.replaceAll('.', '\\.')}$`, 'm'));
    expect(metadata).toMatch(/^License-Expression: Apache-2\.0$/m);
    expect(dist.wheel).toContain(`egress_proxies-${pkg.version}-py3-none-any.whl`);
    expect(treeState()).toBe(before);
  }, 60_000);

  it('the wheel carries py.typed; the sdist its build backend and no tests', async () => {
    const list = (file: string, code: string) =>
      runCommand(join(tools, 'python'), ['-c', code, file], { cwd: work });
    const wheel = await list(
      dist.wheel,
      'import sys, zipfile; print("\\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))',
    );
    expect(wheel.output.split('\n')).toContain('egress_proxies/py.typed');
    const sdist = await list(
      dist.sdist,
      'import sys, tarfile; print("\\n".join(tarfile.open(sys.argv[1]).getnames()))',
    );
    const names = sdist.output.split('\n').map((n) => n.replace(/^[^/]+\//, ''));
    expect(names).toContain('_backend/egress_build.py');
    expect(names).toContain('egress_proxies/py.typed');
    expect(names.filter((n) => n.startsWith('tests/'))).toEqual([]);
  }, 60_000);
});
