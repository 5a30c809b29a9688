/**
 * The README's quick start, run as a new user runs it: `npm start` in a fresh copy of the
 * repository (package.json, src, examples/standalone; node_modules linked), then every `$`
 * command of the blocks marked `<!-- quickstart -->`, in order, in one bash session, so shell
 * variables carry from one command to the next. Each output is compared with the one the README
 * shows by shape (test/support/readme-quickstart: ids, ports, names, addresses, latencies and
 * times normalised); a difference fails naming the README line. The commands run as written,
 * on the example's own fixed ports (8090, 8081, 8888, 23128–23199): the session and `npm start`
 * live in a private network namespace (`unshare --net`), so other tests and other operators on
 * the machine never meet them. Afterwards the copy's files are as they were: the quick start
 * writes nothing but the operator's `.state/`.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import {
  cpSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { REPO_ROOT } from '../../support/cli.ts';
import { compareOutput, parseQuickstart } from '../../support/readme-quickstart.ts';
import { until } from '../../support/wait.ts';

vi.setConfig({ testTimeout: 180_000 });

/** The example's fleet: three named Proxies and a ProxyPool of two. */
const EXAMPLE_PROXIES = 5;

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

/** The environment of a user's shell: the runner's, minus what npm or the suite set. */
function userEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: '1', npm_config_update_notifier: 'false' };
  for (const k of Object.keys(env)) {
    if (
      (k.startsWith('npm_') && k !== 'npm_config_update_notifier') ||
      k.startsWith('OTEL_') ||
      ['DISCOVERY_TOKEN', 'GATEWAY_TOKEN', 'NODE_OPTIONS', 'LOG_LEVEL', 'INIT_CWD', 'VITEST'].includes(k)
    )
      delete env[k];
  }
  return env;
}

/** A copy of what `npm start` needs from the repository: package.json, src, the example. */
function freshCopy(root: string): string {
  const dir = join(root, 'repo');
  mkdirSync(join(dir, 'examples'), { recursive: true });
  cpSync(join(REPO_ROOT, 'package.json'), join(dir, 'package.json'));
  cpSync(join(REPO_ROOT, 'src'), join(dir, 'src'), { recursive: true });
  cpSync(join(REPO_ROOT, 'examples', 'standalone'), join(dir, 'examples', 'standalone'), { recursive: true });
  symlinkSync(join(REPO_ROOT, 'node_modules'), join(dir, 'node_modules'));
  return dir;
}

/** Every file under `dir` (node_modules and the operator's .state/ left out) → its sha256. */
function snapshot(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string) => {
    for (const name of readdirSync(d)) {
      const path = join(d, name);
      const rel = relative(dir, path);
      if (rel === 'node_modules' || rel === '.state') continue;
      if (statSync(path).isDirectory()) walk(path);
      else out[rel] = createHash('sha256').update(readFileSync(path)).digest('hex');
    }
  };
  walk(dir);
  return out;
}

/** Why a private network namespace cannot be made here, or undefined when it can. */
function netnsUnavailable(): string | undefined {
  const r = spawnSync('unshare', ['--net', '--map-root-user', 'true'], { encoding: 'utf8' });
  if (r.error) return r.error.message;
  return r.status === 0 ? undefined : r.stderr.trim() || `exit ${r.status}`;
}

/** One bash in its own network namespace; commands run one at a time, output and status returned. */
class Session {
  readonly child: ChildProcess;
  private out = '';
  private n = 0;
  private readonly nonce = randomUUID();
  exited = false;

  private readonly scratch: string;

  constructor(scratch: string, cwd: string) {
    this.scratch = scratch;
    this.child = spawn('unshare', ['--net', '--map-root-user', 'bash', '--noprofile', '--norc'], {
      cwd,
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe'],
      env: userEnv(),
    });
    this.child.stdout?.setEncoding('utf8').on('data', (c: string) => {
      this.out += c;
    });
    this.child.stderr?.setEncoding('utf8').on('data', (c: string) => {
      this.out += c;
    });
    this.child.once('exit', () => {
      this.exited = true;
    });
  }

  /**
   * Runs `command` as if typed at the prompt (sourced from a file, stdin from /dev/null, stderr
   * into the output) and returns what it printed and its exit status.
   */
  async run(command: string, timeoutMs = 60_000): Promise<{ output: string; status: number }> {
    const id = `${this.nonce}-${++this.n}`;
    const file = join(this.scratch, `command-${this.n}.sh`);
    writeFileSync(file, `${command}\n`);
    const start = this.out.length;
    const mark = `__quickstart_done_${id}__`;
    this.child.stdin?.write(`. '${file}' </dev/null 2>&1; printf '\\n${mark} %d\\n' $?\n`);
    const re = new RegExp(`\\n${mark} (\\d+)\\n`);
    const m = await until(`\`${command}\` to finish`, () => re.exec(this.out.slice(start)) ?? undefined, {
      timeoutMs,
      failFast: () => (this.exited ? `the shell exited:\n${this.out.slice(-2000)}` : undefined),
    });
    return { output: this.out.slice(start, start + m.index), status: Number(m[1]) };
  }

  kill(): void {
    try {
      if (this.child.pid) process.kill(-this.child.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}

interface ProxyRow {
  name: string;
  phase: string;
  healthy: boolean;
  leasable: boolean;
  latencyMillis: number | null;
  activeLeases: number;
}

describe('README quick start', () => {
  it('runs as written, top to bottom, and prints what the README shows', async () => {
    const readme = readFileSync(join(REPO_ROOT, 'README.md'), 'utf8');
    const steps = parseQuickstart(readme);
    expect(steps.length).toBeGreaterThan(5);
    // The quick start's first block is what the test starts: `npm start`.
    expect(readme).toMatch(/## Quick start[\s\S]*?```sh\nnpm ci\nnpm start\n```/);

    const why = netnsUnavailable();
    if (why)
      throw new Error(
        `the quick start runs on its fixed ports in a private network namespace, but \`unshare --net --map-root-user\` fails here (${why}): run as root, or allow unprivileged user namespaces`,
      );

    const root = mkdtempSync(join(tmpdir(), 'readme-quickstart-'));
    cleanups.push(() => rmSync(root, { recursive: true, force: true }));
    const dir = freshCopy(root);
    const before = snapshot(dir);
    const log = join(root, 'npm-start.log');

    const sh = new Session(root, dir);
    cleanups.push(() => sh.kill());
    const setup = await sh.run(`ip link set lo up\nnpm start >'${log}' 2>&1 &\nNPM_START=$!`);
    expect(setup, setup.output).toMatchObject({ status: 0 });

    // A user waits for the fleet (the README: until status shows every proxy Ready).
    await until(
      `the example's ${EXAMPLE_PROXIES} proxies Ready, healthy, probed and leasable`,
      async () => {
        const r = await sh.run('curl -s http://127.0.0.1:8090/v1/proxies');
        const rows = (JSON.parse(r.output) as { proxies: ProxyRow[] }).proxies;
        return (
          rows.length === EXAMPLE_PROXIES &&
          rows.every((p) => p.phase === 'Ready' && p.healthy && p.leasable && p.latencyMillis !== null)
        );
      },
      {
        timeoutMs: 90_000,
        intervalMs: 250,
        failFast: () => (sh.exited ? 'the shell exited' : undefined),
      },
    ).catch((err: Error) => {
      throw new Error(`${err.message}\nnpm start:\n${readFileSync(log, 'utf8').slice(-3000)}`);
    });

    const failures: string[] = [];
    for (const step of steps) {
      const { output, status } = await sh.run(step.command);
      const where = `README.md:${step.line}: $ ${step.command}`;
      if (status !== 0) failures.push(`${where}\n  exit status ${status}\n${indent(output)}`);
      const diff = compareOutput(step.output, output, step.outputLine);
      if (diff.length > 0)
        failures.push(
          `${where}\n${diff
            .map((d) => `  README.md:${d.line}\n    README:  ${d.expected}\n    printed: ${d.actual}`)
            .join('\n')}\n  the whole output:\n${indent(output)}`,
        );
    }
    expect(
      failures.length,
      `the quick start's outputs differ in shape from the README's:\n\n${failures.join('\n\n')}\n`,
    ).toBe(0);

    // Every lease the quick start took, it gave back: none is left held.
    const after = await sh.run('curl -s http://127.0.0.1:8090/v1/proxies');
    const held = (JSON.parse(after.output) as { proxies: ProxyRow[] }).proxies.filter(
      (p) => p.activeLeases > 0,
    );
    expect(
      held.map((p) => `${p.name}: ${p.activeLeases} lease(s)`),
      'leases still held',
    ).toEqual([]);

    // Ends as a supervisor or Ctrl-C ends it; the copy holds nothing the quick start wrote.
    const stop = await sh.run('kill -TERM $NPM_START; wait $NPM_START');
    expect(stop.status, readFileSync(log, 'utf8').slice(-3000)).toBe(0);
    expect(snapshot(dir), 'files the quick start wrote or changed in the repository').toEqual(before);
  });
});

function indent(text: string): string {
  return text
    .replace(/\n+$/, '')
    .split('\n')
    .map((l) => `    | ${l}`)
    .join('\n');
}
