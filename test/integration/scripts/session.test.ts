/**
 * scripts/test/session — the process-owning part of `npm test` — run for real in child
 * processes, with stub up/down scripts (sleeping "daemons" with pid files under a temporary
 * LIBVIRT_CI_DIR) and a stub test command that leaves a process of its own group behind, as a
 * Squid started by a test would. No libvirtd, nothing but local processes and files.
 *
 * A Ctrl-C is played as the terminal sends it: SIGINT to the run's whole process group.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { DAEMONS, pidAlive } from '../../../scripts/test/prerequisites.ts';
import { until } from '../../support/wait.ts';

const UP = `set -eu
mkdir -p "$LIBVIRT_CI_DIR/run"
echo up >> "$LIBVIRT_CI_DIR/log"
if [ -e "$LIBVIRT_CI_DIR/hold-up" ]; then
  for i in $(seq 1 500); do [ -e "$LIBVIRT_CI_DIR/release-up" ] && break; sleep 0.02; done
fi
for d in ${DAEMONS.join(' ')}; do
  sleep 300 </dev/null >/dev/null 2>&1 &
  echo $! > "$LIBVIRT_CI_DIR/run/$d.pid"
done
echo '{}' > "$LIBVIRT_CI_DIR/env.json"
`;

/** Holds until the test creates "release" (at most 10 s), so signals can arrive meanwhile. */
const DOWN = `set -u
echo down-start >> "$LIBVIRT_CI_DIR/log"
for i in $(seq 1 500); do [ -e "$LIBVIRT_CI_DIR/release" ] && break; sleep 0.02; done
for d in ${DAEMONS.join(' ')}; do kill "$(cat "$LIBVIRT_CI_DIR/run/$d.pid")" 2>/dev/null || true; done
rm -f "$LIBVIRT_CI_DIR/env.json"
echo down-end >> "$LIBVIRT_CI_DIR/log"
`;

/** The "test suite": leaves a process in its own group, then runs until "<name>.finish" appears. */
const TESTS = `import { spawn } from 'node:child_process';
import { existsSync, writeFileSync } from 'node:fs';
const [name, work] = process.argv.slice(2);
const left = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { detached: true, stdio: 'ignore' });
left.unref();
writeFileSync(\`\${work}/\${name}.straggler\`, String(left.pid));
process.on('SIGINT', () => process.exit(130));
process.on('SIGTERM', () => process.exit(143));
writeFileSync(\`\${work}/\${name}.started\`, '');
setInterval(() => existsSync(\`\${work}/\${name}.finish\`) && process.exit(0), 20);
`;

const DRIVER = `import { runSession } from ${JSON.stringify(pathToFileURL(resolve('scripts/test/session.ts')).href)};
const [stateDir, name, work] = process.argv.slice(2);
process.exitCode = await runSession({
  cwd: work,
  stateDir,
  upScript: \`\${work}/up.sh\`,
  downScript: \`\${work}/down.sh\`,
  mayStartDaemons: true,
  command: process.execPath,
  args: [\`\${work}/tests.mjs\`, name, work],
  stragglerGraceMs: 2000,
  say: (m) => process.stderr.write(\`[\${name}] \${m}\\n\`),
});
`;

interface Run {
  child: ChildProcess;
  stderr: () => string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** What a terminal's Ctrl-C does: SIGINT to the whole foreground process group. */
  ctrlC: () => void;
}

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

function setup() {
  const work = mkdtempSync(join(tmpdir(), 'npm-test-session-'));
  const stateDir = join(work, 'state');
  mkdirSync(stateDir);
  writeFileSync(join(work, 'up.sh'), UP);
  writeFileSync(join(work, 'down.sh'), DOWN);
  writeFileSync(join(work, 'tests.mjs'), TESTS);
  writeFileSync(join(work, 'driver.mjs'), DRIVER);
  const runs: Run[] = [];
  const pidsIn = (dir: string, suffix: string) => {
    try {
      return readdirSync(dir)
        .filter((f) => f.endsWith(suffix))
        .map((f) => Number(readFileSync(join(dir, f), 'utf8').trim()));
    } catch {
      return [];
    }
  };
  const daemons = () => DAEMONS.map((d) => Number(readFileSync(join(stateDir, 'run', `${d}.pid`), 'utf8')));
  const straggler = (name: string) => Number(readFileSync(join(work, `${name}.straggler`), 'utf8'));
  cleanups.push(() => {
    for (const r of runs) if (r.child.exitCode === null) r.child.kill('SIGKILL');
    for (const pid of [...pidsIn(join(stateDir, 'run'), '.pid'), ...pidsIn(work, '.straggler')]) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    rmSync(work, { recursive: true, force: true });
  });

  const spawnRun = (name: string): Run => {
    const child = spawn(process.execPath, [join(work, 'driver.mjs'), stateDir, name, work], {
      // Its own process group, like a shell job: the "terminal" below signals that group only.
      detached: true,
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let err = '';
    child.stderr?.setEncoding('utf8').on('data', (c: string) => {
      err += c;
    });
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
      child.once('exit', (code, signal) => r({ code, signal })),
    );
    const run: Run = {
      child,
      stderr: () => err,
      exited,
      ctrlC: () => process.kill(-(child.pid as number), 'SIGINT'),
    };
    runs.push(run);
    return run;
  };
  const start = async (name: string): Promise<Run> => {
    const run = spawnRun(name);
    await until(`run ${name} to start its tests`, () => existsSync(join(work, `${name}.started`)), {
      failFast: () => (run.child.exitCode !== null ? `run ${name} exited: ${run.stderr()}` : undefined),
    });
    return run;
  };

  return {
    work,
    stateDir,
    start,
    spawnRun,
    daemons,
    straggler,
    /** The down script sent them SIGTERM; a process dies a moment after kill() returns. */
    daemonsGone: (pids: number[]) =>
      until('the stub daemons to exit', () => pids.filter(pidAlive).length === 0, 5_000),
    log: () =>
      existsSync(join(stateDir, 'log')) ? readFileSync(join(stateDir, 'log'), 'utf8').trim().split('\n') : [],
    release: () => writeFileSync(join(stateDir, 'release'), ''),
    hold: (what: 'up') => writeFileSync(join(stateDir, `hold-${what}`), ''),
    releaseUp: () => writeFileSync(join(stateDir, 'release-up'), ''),
    finish: (name: string) => writeFileSync(join(work, `${name}.finish`), ''),
    users: () => readdirSync(join(stateDir, 'run', 'npm-test-users')),
    markedOurs: () => existsSync(join(stateDir, 'run', 'started-by-npm-test')),
  };
}

describe('npm test session: what a run starts, it stops', () => {
  it('Ctrl-C during the tests stops the left-over process and the daemons; more Ctrl-C while it stops do not cut that short', async () => {
    const s = setup();
    const a = await s.start('a');
    expect(s.log()).toEqual(['up']);
    const daemons = s.daemons();
    const left = s.straggler('a');
    expect([...daemons, left].every(pidAlive)).toBe(true);

    a.ctrlC();
    // Teardown has begun: the left-over process is gone and the down script holds for "release".
    await until('the down script to start', () => s.log().includes('down-start'));
    expect(pidAlive(left)).toBe(false);
    // Impatience: a second Ctrl-C at the terminal, and a SIGTERM to the run itself.
    a.ctrlC();
    process.kill(a.child.pid as number, 'SIGTERM');
    await until(
      'the run to answer the extra signals',
      () => (a.stderr().match(/still stopping/g) ?? []).length >= 2,
      {
        failFast: () =>
          a.child.exitCode !== null || a.child.signalCode !== null ? 'the run ended' : undefined,
      },
    );
    expect(a.child.exitCode).toBeNull();
    s.release();

    expect(await a.exited).toEqual({ code: 130, signal: null });
    expect(s.log()).toEqual(['up', 'down-start', 'down-end']);
    await s.daemonsGone(daemons);
    expect(s.markedOurs()).toBe(false);
    expect(s.users()).toEqual([]);
    expect(a.stderr()).toContain('interrupted (SIGINT)');
  });

  it('a second run at the same time reuses the daemons; only the last one to end stops them', async () => {
    const s = setup();
    s.release(); // the down script need not hold here
    const a = await s.start('a');
    const b = await s.start('b');
    expect(b.stderr()).toContain('reusing the running libvirtd and sshd');
    expect(s.log()).toEqual(['up']);
    const daemons = s.daemons();

    // The first run ends normally while the second still tests: the daemons stay.
    s.finish('a');
    expect(await a.exited).toEqual({ code: 0, signal: null });
    expect(s.log()).toEqual(['up']);
    expect(daemons.every(pidAlive)).toBe(true);
    expect(pidAlive(s.straggler('a'))).toBe(false);
    expect(pidAlive(s.straggler('b'))).toBe(true); // another run's process is not ours to stop

    // The last run is interrupted: it stops its own left-over process and the daemons.
    b.ctrlC();
    expect(await b.exited).toEqual({ code: 130, signal: null });
    expect(s.log()).toEqual(['up', 'down-start', 'down-end']);
    await s.daemonsGone(daemons);
    expect(pidAlive(s.straggler('b'))).toBe(false);
    expect(s.markedOurs()).toBe(false);
  });

  it('Ctrl-C while the daemons start: the up script finishes, no test runs, and the daemons are stopped', async () => {
    const s = setup();
    s.release();
    s.hold('up');
    const a = s.spawnRun('a');
    await until('the up script to start', () => s.log().includes('up'));
    a.ctrlC();
    await until('the run to say it stops after the up script', () => a.stderr().includes('stopping once'), {
      failFast: () => (a.child.exitCode !== null ? `the run ended: ${a.stderr()}` : undefined),
    });
    s.releaseUp();
    expect(await a.exited).toEqual({ code: 130, signal: null });
    expect(existsSync(join(s.work, 'a.started'))).toBe(false);
    expect(s.log()).toEqual(['up', 'down-start', 'down-end']);
    await s.daemonsGone(s.daemons());
    expect(s.markedOurs()).toBe(false);
  });
});
