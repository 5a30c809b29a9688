/**
 * scripts/test/run — `npm test`: check the machine, set it up when root (system packages,
 * IPv6 test addresses on lo, libvirtd + sshd on loopback, the VMs' bridge), type-check, lint, run
 * the three vitest tiers (vitest.config.ts: unit, integration, e2e), then the real-API-server
 * suite (test/e2e/kube, its control plane built first or taken from the cache) and the KVM suite
 * (test/e2e/kvm, its guest image built first or taken from the cache), and stop the daemons it
 * started — also when interrupted, however often (scripts/test/session.ts). Arguments after
 * `npm test --` go to vitest, and the kube and KVM suites are then left out (it says so).
 * `--tier integration` and `--tier e2e` (npm run test:integration, test:e2e) run one tier, with
 * the same machine set-up but no type-check or lint (scripts/test/tiers.ts). Before the tests it
 * makes (or finds cached) the private Python venvs (schemathesis, moto, pytools; the e2e tier alone: pytools).
 * See docs/testing.md.
 */
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  DOWN_SCRIPT,
  INSTALL_SCRIPT,
  LIBVIRT_CI_DIR,
  planPrerequisites,
  readMachineFacts,
  UP_SCRIPT,
} from './prerequisites.ts';
import { runSession } from './session.ts';
import { ensureTestAddresses } from './test-addresses.ts';
import { parseRunArgs, planRun } from './tiers.ts';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = join(ROOT, 'node_modules', '.bin');

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

async function main(): Promise<number> {
  const parsed = parseRunArgs(process.argv.slice(2));
  if ('error' in parsed) {
    say(parsed.error);
    return 2;
  }
  const run = planRun({ tier: parsed.tier, args: parsed.rest, bin: BIN, isRoot: process.getuid?.() === 0 });
  const facts = readMachineFacts(ROOT);
  // The integration tier uses no libvirtd or sshd: they are neither asked for nor started.
  const plan = planPrerequisites(run.daemons ? facts : { ...facts, daemonsUp: true });
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

  if (run.checks) {
    step('type-check', join(BIN, 'tsc'), ['-p', 'tsconfig.json', '--noEmit']);
    step('lint', join(BIN, 'biome'), ['check', '.']);
  } else {
    say(`the ${run.tier} tier only: no type-check or lint (npm test runs them)`);
  }
  for (const note of run.notes) say(note);
  // Cached after the first run; without root too (it needs a writable cache and PyPI).
  for (const s of run.setup) step(s.what, s.command, s.args);

  // From here on every process this run starts is stopped again, also on Ctrl-C (twice).
  return runSession({
    cwd: ROOT,
    stateDir: LIBVIRT_CI_DIR,
    upScript: UP_SCRIPT,
    downScript: DOWN_SCRIPT,
    mayStartDaemons: plan.startDaemons,
    daemons: run.daemons,
    command: join(BIN, 'vitest'),
    args: run.vitestArgs,
    afterwards: run.afterwards,
    say,
  });
}

process.exitCode = await main();
