/**
 * scripts/test/run — `npm test`: check the machine, set it up when root (system packages,
 * IPv6 test addresses on lo, libvirtd + sshd on loopback), type-check, lint, run vitest, and stop the daemons it started —
 * also when interrupted. Arguments after `npm test --` go to vitest. See docs/testing.md.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  DaemonUsers,
  DOWN_SCRIPT,
  daemonsUp,
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
  say('stopping libvirtd and sshd (started by npm test)');
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
    say('starting libvirtd and sshd on loopback for the kvm tests');
    users.markStartedByUs();
    const up = spawnSync('bash', [UP_SCRIPT], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
    if (up.status !== 0) {
      say(`${UP_SCRIPT} failed (exit ${up.status ?? up.signal})`);
      stopDaemonsIfLast(users);
      return 1;
    }
  } else {
    say('reusing the running libvirtd and sshd');
  }
  for (const s of SIGNALS) process.off(s, bailOut);

  try {
    return await runForwardingSignals(join(BIN, 'vitest'), ['run', ...process.argv.slice(2)]);
  } finally {
    const left = stopStragglers(String(process.pid));
    if (left > 0) say(`stopped ${left} process(es) the tests left running`);
    stopDaemonsIfLast(users);
  }
}

process.exitCode = await main();
