/**
 * The container image runs what the tests run. No Docker engine runs here, so the Dockerfile is
 * read and carried out by hand on the same files: its build stage's COPY lines into a scratch
 * /app, its `npm run build` there (the RUN line as written; `npm ci` becomes a link to the
 * repository's node_modules, `npm prune --omit=dev` a check that everything dist/ imports is a
 * runtime dependency), its final stage's COPY lines into a second scratch /app, and then its
 * ENTRYPOINT with `--version` and with a standalone start on the bundled example — the way
 * `docker run IMAGE <args>` replaces CMD — from its WORKDIR, with the Node of its base image's
 * major version. The standalone start reaches Ready on every example Proxy and stops cleanly.
 */
import { execFileSync } from 'node:child_process';
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
} from 'node:fs';
import { builtinModules } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { parseCommandLine } from '../../../src/cmd/flags.ts';
import {
  CliProcess,
  cleanupCli,
  createWorkspace,
  NODE,
  REPO_ROOT,
  standaloneArgs,
  waitForReady,
} from '../../support/cli.ts';

vi.setConfig({ testTimeout: 120_000, hookTimeout: 300_000 });
afterEach(cleanupCli);

interface Instruction {
  op: string;
  args: string;
}
interface Stage {
  from: string;
  name?: string;
  steps: Instruction[];
}

/** The Dockerfile's stages and instructions (continuation lines joined, comments dropped). */
function parseDockerfile(text: string): Stage[] {
  const lines: string[] = [];
  let pending = '';
  for (const raw of text.split('\n')) {
    if (/^\s*#/.test(raw)) continue;
    const line = raw.trimEnd();
    if (line.endsWith('\\')) {
      pending += `${line.slice(0, -1).trim()} `;
      continue;
    }
    const full = `${pending}${line.trim()}`.trim();
    pending = '';
    if (full) lines.push(full);
  }
  const stages: Stage[] = [];
  for (const l of lines) {
    const m = /^(\w+)\s+(.*)$/.exec(l);
    if (!m) throw new Error(`Dockerfile: cannot read ${l}`);
    const op = (m[1] as string).toUpperCase();
    const args = m[2] as string;
    if (op === 'FROM') {
      const f = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(args);
      stages.push({ from: f?.[1] as string, ...(f?.[2] ? { name: f[2] } : {}), steps: [] });
    } else {
      const stage = stages.at(-1);
      if (!stage) throw new Error(`Dockerfile: ${op} before FROM`);
      stage.steps.push({ op, args });
    }
  }
  return stages;
}

/** Where a container path lands in this stage's scratch root. */
function inRoot(root: string, workdir: string, path: string): string {
  const abs = path.startsWith('/') ? path : join(workdir, path);
  return join(root, abs);
}

const dockerfile = parseDockerfile(readFileSync(join(REPO_ROOT, 'Dockerfile'), 'utf8'));
const [buildStage, finalStage] = dockerfile;
let scratch: string;
let buildRoot: string;
let imageRoot: string;

/** The final stage's ENTRYPOINT and WORKDIR, mapped into the scratch image root. */
function entrypoint(): { command: string[]; cwd: string } {
  const steps = finalStage?.steps ?? [];
  const workdir = steps.filter((s) => s.op === 'WORKDIR').at(-1)?.args ?? '/';
  const entry = JSON.parse(steps.find((s) => s.op === 'ENTRYPOINT')?.args ?? '[]') as string[];
  const [program, ...rest] = entry;
  // The base image's `node` is Node 24 (checked below); here the repository's Node 24 runs.
  expect(program).toBe('node');
  return {
    command: [NODE, ...rest.map((a) => (a.startsWith('/') ? join(imageRoot, a) : a))],
    cwd: inRoot(imageRoot, '/', workdir),
  };
}

beforeAll(() => {
  scratch = mkdtempSync(join(tmpdir(), 'image-'));
  buildRoot = join(scratch, 'build');
  imageRoot = join(scratch, 'image');
  // Stage 1, as written: WORKDIR, COPY from the build context, RUN.
  let workdir = '/';
  for (const step of buildStage?.steps ?? []) {
    if (step.op === 'WORKDIR') {
      workdir = step.args;
      mkdirSync(inRoot(buildRoot, '/', workdir), { recursive: true });
    } else if (step.op === 'COPY') {
      const parts = step.args.split(/\s+/);
      const dest = parts.pop() as string;
      for (const src of parts) {
        const target = dest.endsWith('/')
          ? join(inRoot(buildRoot, workdir, dest), src)
          : inRoot(buildRoot, workdir, dest);
        cpSync(join(REPO_ROOT, src), target, { recursive: true });
      }
    } else if (step.op === 'RUN') {
      const commands = step.args.split('&&').map((c) => c.trim());
      for (const c of commands) {
        const cwd = inRoot(buildRoot, '/', workdir);
        if (c.startsWith('npm ci ')) symlinkSync(join(REPO_ROOT, 'node_modules'), join(cwd, 'node_modules'));
        else if (c === 'npm run build')
          execFileSync('npm', ['run', 'build'], {
            cwd,
            stdio: 'pipe',
            env: {
              ...process.env,
              PATH: `${join(REPO_ROOT, 'node_modules/.bin')}:${process.env.PATH ?? ''}`,
            },
          });
        else if (!c.startsWith('npm prune --omit=dev '))
          throw new Error(`Dockerfile: RUN ${c} is not known here`);
      }
    } else if (step.op !== 'ENV') throw new Error(`Dockerfile build stage: ${step.op} is not known here`);
  }
  // Stage 2: COPY --from=build and from the context, into the image's root.
  workdir = '/';
  for (const step of finalStage?.steps ?? []) {
    if (step.op === 'WORKDIR') {
      workdir = step.args;
      mkdirSync(inRoot(imageRoot, '/', workdir), { recursive: true });
    } else if (step.op === 'COPY') {
      const from = /^--from=(\S+)\s+(.*)$/.exec(step.args);
      const [src, dest] = (from ? (from[2] as string) : step.args).split(/\s+/) as [string, string];
      if (from) expect(from[1]).toBe(buildStage?.name);
      const target = inRoot(imageRoot, workdir, dest);
      const source = from ? inRoot(buildRoot, '/', src) : join(REPO_ROOT, src);
      // node_modules: the link stands for the pruned copy (see the dependency check below).
      if (src.endsWith('/node_modules')) symlinkSync(join(REPO_ROOT, 'node_modules'), target);
      else cpSync(source, target, { recursive: true });
    }
  }
});

afterAll(() => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('the Dockerfile', () => {
  it('builds on node:24-slim, the major version of the Node the tests run', () => {
    expect(dockerfile.map((s) => s.from)).toEqual(['node:24-slim', 'node:24-slim']);
    const major = execFileSync(NODE, ['-p', 'process.versions.node'], { encoding: 'utf8' }).split('.')[0];
    expect(`node:${major}-slim`).toBe(finalStage?.from);
  });

  it('ships in dist/ every module the entrypoint loads, importing only runtime dependencies', () => {
    const dist = join(imageRoot, 'app/dist');
    expect(existsSync(join(dist, 'cmd/main.js'))).toBe(true);
    // The dashboard's page script: compiled .js beside its loader.
    expect(readdirSync(join(dist, 'dashboard/web')).some((f) => f === 'app.js')).toBe(true);
    const pkg = JSON.parse(readFileSync(join(imageRoot, 'app/package.json'), 'utf8')) as {
      dependencies: Record<string, string>;
    };
    const runtime = new Set(Object.keys(pkg.dependencies));
    const builtins = new Set(builtinModules);
    const imported = new Set<string>();
    const walk = (dir: string): void => {
      for (const e of readdirSync(dir, { withFileTypes: true })) {
        const p = join(dir, e.name);
        if (e.isDirectory()) walk(p);
        else if (e.name.endsWith('.js')) {
          const code = readFileSync(p, 'utf8');
          const specs = [
            ...code.matchAll(/^\s*(?:import|export)\s[^'"]*?from\s*['"]([^'"]+)['"]/gm),
            ...code.matchAll(/^\s*import\s*['"]([^'"]+)['"]/gm),
            ...code.matchAll(/\bimport\(\s*['"]([^'"]+)['"]\s*\)/g),
          ].map((m) => m[1] as string);
          for (const spec of specs) {
            if (spec.startsWith('.') || spec.startsWith('node:') || builtins.has(spec)) continue;
            imported.add(
              spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : (spec.split('/')[0] as string),
            );
          }
        }
      }
    };
    walk(dist);
    expect(imported.size).toBeGreaterThan(3);
    expect([...imported].filter((m) => !runtime.has(m))).toEqual([]);
  });

  it('its default CMD is the operator command the Deployment runs', () => {
    const cmd = JSON.parse(finalStage?.steps.find((s) => s.op === 'CMD')?.args ?? '[]') as string[];
    const parsed = parseCommandLine(cmd);
    expect(parsed.command).toBe('operator');
  });

  it('runs its ENTRYPOINT from dist/: --version', () => {
    const { command, cwd } = entrypoint();
    const [program, ...args] = command as [string, ...string[]];
    const out = execFileSync(program, [...args, '--version'], { cwd, encoding: 'utf8' });
    const { version } = JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as {
      version: string;
    };
    expect(out.trim()).toBe(`egress-proxies-operator ${version}`);
  });

  it('runs its ENTRYPOINT from dist/: standalone on the bundled example reaches Ready, then stops', async () => {
    const ws = await createWorkspace();
    const { command, cwd } = entrypoint();
    const proc = new CliProcess(standaloneArgs(ws), cwd, { command });
    await waitForReady(ws, proc, ['local-1', 'local-2', 'local-3'], 60_000);
    proc.signal('SIGTERM');
    const exit = await proc.exited;
    expect(exit).toEqual({ code: 0, signal: null });
  });
});
