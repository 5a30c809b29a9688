/**
 * scripts/test/session — the commands `npm test` runs after the main suite (the real-API-server
 * and KVM tiers: each a build, then its vitest): in order, with the run's marker, the worst exit
 * code wins, and a failed gate stops the rest of its own tier only; a run that uses no daemons
 * (the integration tier) neither starts them nor counts as their user. Stub commands only; no
 * daemons are started.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { RUN_MARKER } from '../../../scripts/test/prerequisites.ts';
import { runSession } from '../../../scripts/test/session.ts';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A command that appends `name` and the run marker to `log`, then exits with `code`. */
const step = (log: string, name: string, code: number) => ({
  command: process.execPath,
  args: [
    '-e',
    `require('node:fs').appendFileSync(${JSON.stringify(log)}, ${JSON.stringify(name)} + ' ' + process.env.${RUN_MARKER} + '\\n'); process.exit(${code})`,
  ],
});

function run(afterwards: Parameters<typeof runSession>[0]['afterwards'], main = 0) {
  const work = mkdtempSync(join(tmpdir(), 'npm-test-afterwards-'));
  dirs.push(work);
  const log = join(work, 'log');
  const said: string[] = [];
  const done = runSession({
    cwd: work,
    stateDir: join(work, 'state'),
    upScript: join(work, 'up.sh'),
    downScript: join(work, 'down.sh'),
    mayStartDaemons: false,
    ...step(log, 'main', main),
    afterwards: afterwards?.map((f) => ({ ...f, ...step(log, f.command, Number(f.args[0])) })),
    runId: 'run-1',
    say: (m) => said.push(m),
  });
  return { done, log: () => readFileSync(log, 'utf8'), said };
}

describe('npm test follow-ups', () => {
  it('run in order after the suite, with the marker; the worst exit code wins', async () => {
    const r = run(
      [
        { name: 'build', command: 'build', args: ['0'], gate: true },
        { name: 'tier', command: 'tier', args: ['1'] },
      ],
      0,
    );
    expect(await r.done).toBe(1);
    expect(r.log()).toBe('main run-1\nbuild run-1\ntier run-1\n');
    expect(r.said).toContain('build');
    expect(r.said.some((m) => /^tier: exit 1 after \d+ s$/.test(m))).toBe(true);
  });

  it('still run when the suite failed, and a failed gate stops the rest', async () => {
    const r = run(
      [
        { name: 'build', command: 'build', args: ['3'], gate: true },
        { name: 'tier', command: 'tier', args: ['0'] },
      ],
      2,
    );
    expect(await r.done).toBe(3);
    expect(r.log()).toBe('main run-1\nbuild run-1\n');
    expect(r.said).toContain('not running the rest of the run: build failed');
  });

  it('a failed build stops its own tier, not the next one', async () => {
    const r = run(
      [
        { name: 'kube build', command: 'kbuild', args: ['4'], gate: true, tier: 'kube' },
        { name: 'kube tier', command: 'ktier', args: ['0'], tier: 'kube' },
        { name: 'kvm build', command: 'vbuild', args: ['0'], gate: true, tier: 'kvm' },
        { name: 'kvm tier', command: 'vtier', args: ['0'], tier: 'kvm' },
      ],
      0,
    );
    expect(await r.done).toBe(4);
    expect(r.log()).toBe('main run-1\nkbuild run-1\nvbuild run-1\nvtier run-1\n');
    expect(r.said).toContain('not running the rest of kube: kube build failed');
  });
});

describe('a run without the daemons (the integration tier)', () => {
  it('neither starts them nor registers as their user, even when it may start them', async () => {
    const work = mkdtempSync(join(tmpdir(), 'npm-test-nodaemons-'));
    dirs.push(work);
    const log = join(work, 'log');
    const up = join(work, 'up.sh');
    writeFileSync(up, `echo up >> ${JSON.stringify(log)}\n`);
    const said: string[] = [];
    const code = await runSession({
      cwd: work,
      stateDir: join(work, 'state'),
      upScript: up,
      downScript: up,
      mayStartDaemons: true,
      daemons: false,
      ...step(log, 'main', 0),
      runId: 'run-2',
      say: (m) => said.push(m),
    });
    expect(code).toBe(0);
    expect(readFileSync(log, 'utf8')).toBe('main run-2\n');
    expect(existsSync(join(work, 'state', 'run', 'npm-test-users'))).toBe(false);
    expect(said.filter((m) => /libvirtd|sshd/.test(m))).toEqual([]);
  });
});
