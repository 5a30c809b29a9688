/**
 * scripts/test/run — `npm test`: check the machine, set it up when root (system packages,
 * IPv6 test addresses on lo, libvirtd + sshd on loopback, the VMs' bridge), type-check, lint, run
 * vitest, then the KVM end-to-end tier (test/e2e-kvm, with its guest image built or taken from the
 * cache), and stop the daemons it started — also when interrupted. Arguments after `npm test --`
 * go to vitest, and the KVM tier is then left out (it says so). See docs/testing.md.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  DaemonUsers,
  DOWN_SCRIPT,
  daemonsUp,
  GUEST_IMAGE_SCRIPT,
  INSTALL_SCRIPT,
  planPrerequisites,
  RUN_MARKER,
  readMachineFacts,
  stopStragglers,
  UP_SCRIPT,
} from './prerequisites.ts';
import { ensureTestAddresses } from './test-addresses.ts';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = join(ROOT, 'node_modules', '.bin');
const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;
const KVM_TIER_CONFIG = 'test/e2e-kvm/vitest.config.ts';

function say(msg: string): void {
  process.stderr.write(`[npm test] ${msg}\n`);
}

/** Runs a setup step to its end; a failure ends npm test with that step's exit code. */
function step(what: string, cmd: string, args: string[]): void {
  const r = spawnSync(cmd, args, { cwd: ROOT, stdio: 'inherit' });
  if (r.status !== 0) {
    say(`${what} failed (exit ${r.status ?? r.signal})`);
    process.exit(r.status ?? 1);
  }
}

function stopDaemonsIfLast(users: DaemonUsers): void {
  if (!users.unregister()) return;
  say('stopping libvirtd, sshd and the bridge (started by npm test)');
  spawnSync('bash', [DOWN_SCRIPT], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
  users.clear();
}

/** Runs `cmd`; on a signal, passes it on (a terminal's Ctrl-C already reached the child). */
function runForwardingSignals(cmd: string, args: string[]): Promise<number> {
  return new Promise((resolve) => {
    const child: ChildProcess = spawn(cmd, args, {
      cwd: ROOT,
      stdio: 'inherit',
      env: { ...process.env, [RUN_MARKER]: String(process.pid) },
    });
    let interrupted: NodeJS.Signals | undefined;
    const onSignal = (sig: NodeJS.Signals) => {
      interrupted = sig;
      // A signal sent to this process alone must still stop the tests; give the child a moment
      // to act on the one the terminal sent it, then insist.
      setTimeout(() => child.exitCode === null && child.kill(sig), 1000).unref();
      setTimeout(() => child.exitCode === null && child.kill('SIGKILL'), 30_000).unref();
    };
    for (const s of SIGNALS) process.on(s, onSignal);
    child.on('exit', (code, signal) => {
      for (const s of SIGNALS) process.off(s, onSignal);
      if (interrupted) say(`interrupted (${interrupted})`);
      resolve(code ?? (signal === 'SIGINT' ? 130 : 1));
    });
  });
}

/**
 * The KVM end-to-end tier: a real Debian guest on TCG (minutes). Its image is built first when
 * this machine has none cached (root only; the test says what to run otherwise).
 */
async function runKvmTier(): Promise<number> {
  const started = Date.now();
  if (process.getuid?.() === 0) {
    say(`guest image for the KVM tier: ${GUEST_IMAGE_SCRIPT} (cached after the first build)`);
    const built = spawnSync('bash', [GUEST_IMAGE_SCRIPT], {
      cwd: ROOT,
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    if (built.status !== 0) {
      say(`${GUEST_IMAGE_SCRIPT} failed (exit ${built.status ?? built.signal}): the KVM tier cannot run`);
      return 1;
    }
  }
  say('KVM end-to-end tier (test/e2e-kvm): a Debian guest on TCG, a few minutes');
  const code = await runForwardingSignals(join(BIN, 'vitest'), ['run', '--config', KVM_TIER_CONFIG]);
  say(`KVM end-to-end tier finished in ${Math.round((Date.now() - started) / 1000)} s (exit ${code})`);
  return code;
}

async function main(): Promise<number> {
  const plan = planPrerequisites(readMachineFacts(ROOT));
  if (!plan.ok) {
    process.stderr.write(`${plan.message}\n`);
    return 1;
  }
  if (plan.installPackages) step('installing system packages', 'bash', [INSTALL_SCRIPT]);
  if (process.getuid?.() === 0) {
    // The egress-address tests bind IPv6 source addresses loopback does not have by default.
    const problem = ensureTestAddresses();
    if (problem) say(`IPv6 test addresses: ${problem} (the egress-address tests will fail)`);
  }

  step('type-check', join(BIN, 'tsc'), ['-p', 'tsconfig.json', '--noEmit']);
  step('lint', join(BIN, 'biome'), ['check', '.']);

  const users = new DaemonUsers();
  users.register();
  // From here on the daemons are ours to stop, whatever happens.
  const bailOut = (sig: NodeJS.Signals) => {
    stopDaemonsIfLast(users);
    process.exit(sig === 'SIGINT' ? 130 : 143);
  };
  for (const s of SIGNALS) process.once(s, bailOut);
  if (plan.startDaemons && !daemonsUp()) {
    say("starting libvirtd and sshd on loopback and the VMs' bridge for the kvm tests");
    users.markStartedByUs();
    const up = spawnSync('bash', [UP_SCRIPT], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
    if (up.status !== 0) {
      say(`${UP_SCRIPT} failed (exit ${up.status ?? up.signal})`);
      stopDaemonsIfLast(users);
      return 1;
    }
  } else {
    say('reusing the running libvirtd, sshd and bridge');
  }
  for (const s of SIGNALS) process.off(s, bailOut);

  try {
    const args = process.argv.slice(2);
    const code = await runForwardingSignals(join(BIN, 'vitest'), ['run', ...args]);
    if (code === 130 || code === 143) return code;
    if (args.length > 0) {
      say(
        'KVM end-to-end tier (test/e2e-kvm) not run: vitest arguments were given; run it with npm run test:kvm',
      );
      return code;
    }
    return Math.max(code, await runKvmTier());
  } finally {
    const left = stopStragglers(String(process.pid));
    if (left > 0) say(`stopped ${left} process(es) the tests left running`);
    stopDaemonsIfLast(users);
  }
}

process.exitCode = await main();
