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
} from '../../../scripts/test/prerequisites.ts';
import {
  ipv6Hex,
  missingTestAddresses,
  sudoAddCommands,
  TEST_IPV6_ADDRESSES,
  testAddressesMissingIn,
} from '../../../scripts/test/test-addresses.ts';

const ready = {
  missingPackages: [],
  isRoot: false,
  isDebian: true,
  daemonsUp: true,
  missingTestAddresses: [],
};

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
      // run.ts adds them itself as root
      missingTestAddresses: [...TEST_IPV6_ADDRESSES],
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

  it('not root, IPv6 test addresses missing on lo: named, with the exact sudo ip commands', () => {
    const [a1, , a3] = TEST_IPV6_ADDRESSES;
    const plan = planPrerequisites({ ...ready, missingTestAddresses: [a1!, a3!] });
    expect(plan.ok).toBe(false);
    if (plan.ok) return;
    expect(plan.message).toContain(`Missing on lo: the IPv6 test addresses ${a1} ${a3} `);
    expect(plan.message).toContain(
      `Run once: sudo ip -6 addr add ${a1}/128 dev lo && sudo ip -6 addr add ${a3}/128 dev lo\n`,
    );
    expect(plan.message).not.toContain('Missing system packages');
    expect(plan.message).not.toContain('libvirtd');
  });

  it('not root with everything missing: one message, one command line, addresses last', () => {
    const plan = planPrerequisites({
      ...ready,
      missingPackages: ['squid', 'xorriso'],
      daemonsUp: false,
      missingTestAddresses: [...TEST_IPV6_ADDRESSES],
    });
    expect(plan.ok).toBe(false);
    if (plan.ok) return;
    expect(plan.message.match(/Run once:/g)).toHaveLength(1);
    expect(plan.message).toContain(
      `Run once: sudo bash ${INSTALL_SCRIPT} && sudo bash ${UP_SCRIPT} && ${sudoAddCommands(TEST_IPV6_ADDRESSES).join(' && ')}\n`,
    );
    // docs/testing.md shows this very message.
    expect(readFileSync('docs/testing.md', 'utf8')).toContain(
      `\n     ${plan.message.replace(/\n/g, '\n     ')}\n`,
    );
  });

  it('root without apt cannot install: it says what to install instead of trying', () => {
    const plan = planPrerequisites({
      missingPackages: ['squid'],
      isRoot: true,
      isDebian: false,
      daemonsUp: true,
      missingTestAddresses: [],
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

describe('the IPv6 test addresses on lo', () => {
  it('are read from /proc/net/if_inet6: only those on lo count', () => {
    expect(ipv6Hex('fd7e:57e9:e55::1')).toBe('fd7e57e90e5500000000000000000001');
    expect(ipv6Hex('::1')).toBe('00000000000000000000000000000001');
    const text = [
      '00000000000000000000000000000001 01 80 10 80       lo',
      `${ipv6Hex(TEST_IPV6_ADDRESSES[0]!)} 01 80 00 80       lo`,
      `${ipv6Hex(TEST_IPV6_ADDRESSES[2]!)} 01 80 00 80       lo`,
      // On another device it does not help: the tests bind on lo.
      `${ipv6Hex(TEST_IPV6_ADDRESSES[1]!)} 04 80 00 80     eth0`,
      '',
    ].join('\n');
    expect(testAddressesMissingIn(text)).toEqual([TEST_IPV6_ADDRESSES[1], TEST_IPV6_ADDRESSES[3]]);
    expect(testAddressesMissingIn('')).toEqual([...TEST_IPV6_ADDRESSES]);
  });

  it('where IPv6 is disabled none are asked for (the IPv6 test skips and says so instead)', () => {
    const unread = () => {
      throw new Error('not read where IPv6 is disabled');
    };
    expect(missingTestAddresses('IPv6 is disabled on this host', unread)).toEqual([]);
    expect(missingTestAddresses(undefined, () => '')).toEqual([...TEST_IPV6_ADDRESSES]);
    expect(
      planPrerequisites({ ...ready, missingTestAddresses: missingTestAddresses('off', unread) }),
    ).toEqual({
      ok: true,
      installPackages: false,
      startDaemons: false,
    });
  });

  it('docs/testing.md "Machines where you are not root" adds them with the exact commands', () => {
    const doc = readFileSync('docs/testing.md', 'utf8');
    const section = doc.slice(
      doc.indexOf('## Machines where you are not root'),
      doc.indexOf('## Running vitest'),
    );
    for (const cmd of sudoAddCommands(TEST_IPV6_ADDRESSES)) expect(section).toContain(cmd);
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
