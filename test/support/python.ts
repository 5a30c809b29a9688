/**
 * test/support/python — runs Debian's Python (the interpreter python3-scrapy installs into, not
 * whatever `python3` a version manager puts first on PATH) with clients/python importable, and
 * fails with the fix when it or a module is missing.
 */
import { execFileSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { REPO_ROOT } from './cli.ts';

export const DEBIAN_PYTHON = '/usr/bin/python3';
export const PYTHON_CLIENT = join(REPO_ROOT, 'clients/python');

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

export interface PythonRun {
  code: number | null;
  output: string;
}

/** Runs Debian's python3 with `args` in `cwd`, clients/python on PYTHONPATH; collects the output. */
export function runPython(
  args: string[],
  opts: { cwd: string; pythonPath?: string[]; onOutput?: (chunk: string) => void },
): Promise<PythonRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(DEBIAN_PYTHON, args, {
      cwd: opts.cwd,
      env: {
        PATH: '/usr/bin:/bin',
        PYTHONPATH: [PYTHON_CLIENT, ...(opts.pythonPath ?? [])].join(':'),
        PYTHONDONTWRITEBYTECODE: '1',
        LANG: 'C.UTF-8',
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
