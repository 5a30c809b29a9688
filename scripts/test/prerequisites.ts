/**
 * scripts/test/prerequisites — what `npm test` needs from the machine (system packages, the
 * IPv6 test addresses on lo, and libvirtd + sshd on loopback for the kvm provider), what is
 * missing, and what to do about it.
 * The decision is a pure function (`planPrerequisites`) so it is tested without root; the rest
 * reads the machine. See docs/testing.md.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { missingTestAddresses, sudoAddCommands } from './test-addresses.ts';

export const PACKAGES_FILE = 'scripts/ci/system-packages.txt';
export const INSTALL_SCRIPT = '.ci/install-system-packages.sh';
export const UP_SCRIPT = 'scripts/ci/libvirt-up.sh';
export const DOWN_SCRIPT = 'scripts/ci/libvirt-down.sh';
export const LIBVIRT_CI_DIR = process.env.LIBVIRT_CI_DIR ?? '/var/tmp/egress-proxies-ci/libvirt';

/** The daemons scripts/ci/libvirt-up.sh starts, by the name of their pid file. */
export const DAEMONS = ['virtlogd', 'libvirtd', 'sshd', 'dnsmasq'] as const;
/** Builds (or finds in its cache) the guest image of the KVM end-to-end tier; prints its directory. */
export const GUEST_IMAGE_SCRIPT = 'scripts/ci/build-guest-image.sh';

export interface SystemPackage {
  name: string;
  /** A file the package installs; undefined when only dpkg can tell. */
  probe: string | undefined;
}

export interface MachineFacts {
  missingPackages: string[];
  isRoot: boolean;
  /** apt-get and dpkg are there: packages can be installed the Debian way. */
  isDebian: boolean;
  /** libvirtd, sshd and the bridge's dnsmasq from scripts/ci/libvirt-up.sh are alive. */
  daemonsUp: boolean;
  /**
   * IPv6 test addresses (scripts/test/test-addresses.ts) that `lo` lacks; empty where IPv6 is
   * disabled. As root, npm test adds them itself.
   */
  missingTestAddresses: string[];
}

export type Plan =
  | { ok: true; installPackages: boolean; startDaemons: boolean }
  | { ok: false; message: string };

/** What `npm test` does about the machine it finds: fix it as root, or stop with one message. */
export function planPrerequisites(m: MachineFacts): Plan {
  const needPackages = m.missingPackages.length > 0;
  if (m.isRoot && (!needPackages || m.isDebian)) {
    return { ok: true, installPackages: needPackages, startDaemons: !m.daemonsUp };
  }
  // As root, run.ts adds them itself.
  const needAddresses = !m.isRoot && m.missingTestAddresses.length > 0;
  if (!needPackages && m.daemonsUp && !needAddresses) {
    return { ok: true, installPackages: false, startDaemons: false };
  }

  const lines = ['npm test: this machine is not ready for the test suite, which runs real components.'];
  const commands: string[] = [];
  if (needPackages) {
    lines.push(`Missing system packages: ${m.missingPackages.join(' ')}`);
    if (m.isDebian) commands.push(`sudo bash ${INSTALL_SCRIPT}`);
    else lines.push('Install them (or their equivalents) with your package manager.');
  }
  if (!m.daemonsUp) {
    lines.push("Not running: libvirtd and sshd on loopback, the VMs' bridge (for the kvm provider tests).");
    commands.push(`sudo bash ${UP_SCRIPT}`);
  }
  if (needAddresses) {
    lines.push(
      `Missing on lo: the IPv6 test addresses ${m.missingTestAddresses.join(' ')} (the egress-address tests bind them).`,
    );
    commands.push(...sudoAddCommands(m.missingTestAddresses));
  }
  if (commands.length > 0) lines.push(`Run once: ${commands.join(' && ')}`, 'then npm test again.');
  lines.push('As root on Debian/Ubuntu, npm test does all of this itself (see docs/testing.md).');
  return { ok: false, message: lines.join('\n') };
}

export function parsePackages(text: string): SystemPackage[] {
  const out: SystemPackage[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const [name, probe] = line.split(/\s+/);
    if (!name) continue;
    out.push({ name, probe: probe && probe !== '-' ? probe : undefined });
  }
  return out;
}

function commandExists(cmd: string): boolean {
  try {
    execFileSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

function dpkgInstalled(pkgs: string[]): Set<string> {
  let out = '';
  try {
    // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query's own format syntax
    out = execFileSync('dpkg-query', ['-W', '-f=${Package} ${Status}\n', ...pkgs], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    });
  } catch (err) {
    // dpkg-query exits 1 when some package is unknown, and still prints the known ones.
    out = (err as { stdout?: string }).stdout ?? '';
  }
  const installed = new Set<string>();
  for (const line of out.split('\n')) {
    const [name, ...status] = line.split(' ');
    if (name && status.join(' ') === 'install ok installed') installed.add(name.split(':')[0] ?? name);
  }
  return installed;
}

/** Packages from the list that this machine lacks: by dpkg where there is one, else by file. */
export function missingPackages(pkgs: SystemPackage[], isDebian: boolean): string[] {
  if (isDebian) {
    const installed = dpkgInstalled(pkgs.map((p) => p.name));
    return pkgs.filter((p) => !installed.has(p.name)).map((p) => p.name);
  }
  return pkgs.filter((p) => p.probe !== undefined && !existsSync(p.probe)).map((p) => p.name);
}

/** Alive = the pid exists and is not a zombie (PID 1 in containers may reap orphans lazily). */
export function pidAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

function pidFromFile(file: string): number {
  try {
    return Number.parseInt(readFileSync(file, 'utf8').trim(), 10);
  } catch {
    return Number.NaN;
  }
}

/**
 * libvirtd, sshd and the bridge's dnsmasq of scripts/ci/libvirt-up.sh run, and the env file the
 * tests read exists.
 */
export function daemonsUp(dir = LIBVIRT_CI_DIR): boolean {
  return (
    existsSync(join(dir, 'env.json')) &&
    ['libvirtd', 'sshd', 'dnsmasq'].every((d) => pidAlive(pidFromFile(join(dir, 'run', `${d}.pid`))))
  );
}

export function readMachineFacts(root: string): MachineFacts {
  const isDebian = commandExists('apt-get') && commandExists('dpkg-query');
  const pkgs = parsePackages(readFileSync(join(root, PACKAGES_FILE), 'utf8'));
  return {
    missingPackages: missingPackages(pkgs, isDebian),
    isRoot: process.getuid?.() === 0,
    isDebian,
    daemonsUp: daemonsUp(),
    missingTestAddresses: missingTestAddresses(),
  };
}

/**
 * Who uses the daemons `npm test` started. Each run registers its pid; the marker says npm test
 * (not a person running libvirt-up.sh by hand) started them. The last live run stops them, so a
 * second run reuses what the first started and neither pulls the daemons from under the other.
 */
export class DaemonUsers {
  private readonly usersDir: string;
  private readonly marker: string;

  constructor(dir = LIBVIRT_CI_DIR) {
    this.usersDir = join(dir, 'run', 'npm-test-users');
    this.marker = join(dir, 'run', 'started-by-npm-test');
  }

  /** Records that npm test started the daemons (so npm test also stops them). */
  markStartedByUs(): void {
    mkdirSync(join(this.marker, '..'), { recursive: true });
    writeFileSync(this.marker, `${process.pid}\n`);
  }

  startedByUs(): boolean {
    return existsSync(this.marker);
  }

  register(pid = process.pid): void {
    mkdirSync(this.usersDir, { recursive: true });
    writeFileSync(join(this.usersDir, String(pid)), '');
  }

  /** Removes `pid`; true when the daemons are npm test's and no other live run uses them. */
  unregister(pid = process.pid): boolean {
    rmSync(join(this.usersDir, String(pid)), { force: true });
    return this.startedByUs() && this.liveUsers().length === 0;
  }

  liveUsers(): number[] {
    let names: string[] = [];
    try {
      names = readdirSync(this.usersDir);
    } catch {
      return [];
    }
    const live: number[] = [];
    for (const n of names) {
      const pid = Number.parseInt(n, 10);
      if (pidAlive(pid)) live.push(pid);
      else rmSync(join(this.usersDir, n), { force: true });
    }
    return live;
  }

  /** After the daemons are stopped. */
  clear(): void {
    rmSync(this.marker, { force: true });
  }
}

/** Set for vitest and so inherited by every process a test starts (Squid, operator CLIs). */
export const RUN_MARKER = 'EGRESS_PROXIES_TEST_RUN';

/** Processes that carry `RUN_MARKER=<runId>` in their environment, this one excepted. */
export function processesOfRun(runId: string): number[] {
  const needle = `${RUN_MARKER}=${runId}`;
  const out: number[] = [];
  let entries: string[] = [];
  try {
    entries = readdirSync('/proc');
  } catch {
    return out;
  }
  for (const e of entries) {
    const pid = Number.parseInt(e, 10);
    if (!Number.isInteger(pid) || pid === process.pid || String(pid) !== e) continue;
    try {
      if (readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0').includes(needle) && pidAlive(pid))
        out.push(pid);
    } catch {
      // gone, or not ours to read
    }
  }
  return out;
}

/**
 * Stops what the tests of one run left behind (a test process killed mid-test cannot clean up
 * the Squid or operator processes it started, some of which run in their own process group):
 * SIGTERM, then SIGKILL for whatever is still there after `graceMs`. Returns how many it found.
 */
export function stopStragglers(runId: string, graceMs = 3000): number {
  const found = processesOfRun(runId);
  for (const pid of found) signal(pid, 'SIGTERM');
  const deadline = Date.now() + graceMs;
  let left = found;
  while (left.length > 0 && Date.now() < deadline) {
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
    left = left.filter(pidAlive);
  }
  for (const pid of left) signal(pid, 'SIGKILL');
  return found.length;
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}
