import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import {
  DaemonUsers,
  INSTALL_SCRIPT,
  missingPackages,
  PACKAGES_FILE,
  parsePackages,
  planPrerequisites,
  processesOfRun,
  RUN_MARKER,
  stopStragglers,
  UP_SCRIPT,
} from '../../scripts/test/prerequisites.ts';
import { TEST_IPV6_ADDRESSES } from '../../scripts/test/test-addresses.ts';

const ready = { missingPackages: [], isRoot: false, isDebian: true, daemonsUp: true };

describe('planPrerequisites', () => {
  it('runs at once on a ready machine, root or not', () => {
    expect(planPrerequisites(ready)).toEqual({ ok: true, installPackages: false, startDaemons: false });
    expect(planPrerequisites({ ...ready, isRoot: true })).toEqual({
      ok: true,
      installPackages: false,
      startDaemons: false,
    });
  });

  it('as root on Debian installs what is missing and starts the daemons', () => {
    const plan = planPrerequisites({
      missingPackages: ['squid'],
      isRoot: true,
      isDebian: true,
      daemonsUp: false,
    });
    expect(plan).toEqual({ ok: true, installPackages: true, startDaemons: true });
  });

  it('not root: one message naming exactly what is missing and the one command that fixes it', () => {
    const plan = planPrerequisites({ ...ready, missingPackages: ['squid', 'xorriso'], daemonsUp: false });
    expect(plan.ok).toBe(false);
    if (plan.ok) return;
    expect(plan.message).toContain('Missing system packages: squid xorriso');
    expect(plan.message).toContain('libvirtd and sshd');
    expect(plan.message).toContain(`Run once: sudo bash ${INSTALL_SCRIPT} && sudo bash ${UP_SCRIPT}`);
  });

  it('not root, packages there but daemons down: only the daemon command', () => {
    const plan = planPrerequisites({ ...ready, daemonsUp: false });
    expect(plan.ok).toBe(false);
    if (plan.ok) return;
    expect(plan.message).not.toContain('Missing system packages');
    expect(plan.message).toContain(`Run once: sudo bash ${UP_SCRIPT}\n`);
  });

  it('root without apt cannot install: it says what to install instead of trying', () => {
    const plan = planPrerequisites({
      missingPackages: ['squid'],
      isRoot: true,
      isDebian: false,
      daemonsUp: true,
    });
    expect(plan.ok).toBe(false);
    if (plan.ok) return;
    expect(plan.message).toContain('Missing system packages: squid');
    expect(plan.message).toContain('your package manager');
    expect(plan.message).not.toContain(INSTALL_SCRIPT);
  });
});

describe('the package list', () => {
  it('is the one the install script reads, and every line names a package', () => {
    const pkgs = parsePackages(readFileSync(PACKAGES_FILE, 'utf8'));
    expect(pkgs.map((p) => p.name)).toEqual(
      expect.arrayContaining(['squid', 'libvirt-daemon', 'openssh-server']),
    );
    expect(readFileSync(INSTALL_SCRIPT, 'utf8')).toContain(PACKAGES_FILE);
  });

  it('the README names every package of the list, and the IPv6 test addresses', () => {
    const readme = readFileSync('README.md', 'utf8');
    const missing = parsePackages(readFileSync(PACKAGES_FILE, 'utf8'))
      .map((p) => p.name)
      .filter((name) => !readme.includes(`\`${name}\``));
    expect(missing, `README.md does not name these packages of ${PACKAGES_FILE}`).toEqual([]);
    expect(readme).toContain(`\`${TEST_IPV6_ADDRESSES[0]}\`–\`::${TEST_IPV6_ADDRESSES.length}\``);
  });

  it('without dpkg, a package is missing when the file it installs is', () => {
    const dir = mkdtempSync(join(tmpdir(), 'prereq-'));
    try {
      writeFileSync(join(dir, 'squid'), '');
      const pkgs = parsePackages(
        `# comment\nsquid ${dir}/squid\nxorriso ${dir}/xorriso\nlibvirt-daemon-driver-qemu -\n`,
      );
      expect(missingPackages(pkgs, false)).toEqual(['xorriso']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('DaemonUsers', () => {
  const dirs: string[] = [];
  afterEach(() => {
    for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  });
  const users = () => {
    const dir = mkdtempSync(join(tmpdir(), 'daemon-users-'));
    dirs.push(dir);
    return new DaemonUsers(dir);
  };

  it('never stops daemons that npm test did not start', () => {
    const u = users();
    u.register();
    expect(u.unregister()).toBe(false);
  });

  it('the last live run stops what npm test started; an earlier one leaves them to it', async () => {
    const u = users();
    u.markStartedByUs();
    u.register();
    const other = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 60000)']);
    try {
      u.register(other.pid);
      expect(u.unregister()).toBe(false);
    } finally {
      other.kill('SIGKILL');
      await new Promise((r) => other.once('exit', r));
    }
    // The other run died without unregistering (kill -9): it no longer counts.
    expect(u.liveUsers()).toEqual([]);
    u.register();
    expect(u.unregister()).toBe(true);
    u.clear();
    expect(u.startedByUs()).toBe(false);
  });
});

describe('stopStragglers', () => {
  it('stops the processes of one run, including ones in their own process group, and no others', async () => {
    const runId = `t${process.pid}-${Date.now()}`;
    const sleeper = (env: NodeJS.ProcessEnv) =>
      spawn(
        process.execPath,
        ['-e', 'process.on("SIGTERM", () => {}); setInterval(() => {}, 1000); console.log("ready")'],
        { env, detached: true, stdio: ['ignore', 'pipe', 'ignore'] },
      );
    const ready = (c: ReturnType<typeof sleeper>) => new Promise((r) => c.stdout?.once('data', r));
    const ours = sleeper({ ...process.env, [RUN_MARKER]: runId });
    const theirs = sleeper({ ...process.env, [RUN_MARKER]: `${runId}-other` });
    const oursExit = new Promise((r) => ours.once('exit', (_c, s) => r(s)));
    try {
      await Promise.all([ready(ours), ready(theirs)]);
      expect(processesOfRun(runId)).toEqual([ours.pid]);
      // It ignores SIGTERM, so only the SIGKILL after the grace period ends it.
      expect(stopStragglers(runId, 200)).toBe(1);
      expect(await oursExit).toBe('SIGKILL');
      expect(theirs.exitCode).toBeNull();
      expect(processesOfRun(runId)).toEqual([]);
    } finally {
      theirs.kill('SIGKILL');
      ours.kill('SIGKILL');
    }
  });
});
