/**
 * scripts/test/run — `npm test`: check the machine, set it up when root (system packages,
 * IPv6 test addresses on lo, libvirtd + sshd on loopback, the VMs' bridge), type-check, lint, run
 * vitest, then the KVM end-to-end tier (test/e2e-kvm, its guest image built first or taken from
 * the cache), and stop the daemons it started — also when interrupted, however often
 * (scripts/test/session.ts). Arguments after `npm test --` go to vitest, and the KVM tier is then
 * left out (it says so). See docs/testing.md.
 */
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  DOWN_SCRIPT,
  GUEST_IMAGE_SCRIPT,
  INSTALL_SCRIPT,
  LIBVIRT_CI_DIR,
  planPrerequisites,
  readMachineFacts,
  UP_SCRIPT,
} from './prerequisites.ts';
import { type FollowUp, runSession } from './session.ts';
import { ensureTestAddresses } from './test-addresses.ts';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = join(ROOT, 'node_modules', '.bin');
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

/**
 * The KVM end-to-end tier, after the main suite: a Debian guest on TCG (minutes). As root its
 * image is built first when none is cached; otherwise the test names the command to run.
 */
function kvmTier(args: string[]): FollowUp[] {
  if (args.length > 0) {
    say(
      'KVM end-to-end tier (test/e2e-kvm) left out: vitest arguments were given; run it with npm run test:kvm',
    );
    return [];
  }
  const build: FollowUp[] =
    process.getuid?.() === 0
      ? [
          {
            name: `guest image for the KVM tier (${GUEST_IMAGE_SCRIPT}, cached after the first build)`,
            command: 'bash',
            args: [GUEST_IMAGE_SCRIPT],
            gate: true,
          },
        ]
      : [];
  return [
    ...build,
    {
      name: 'KVM end-to-end tier (test/e2e-kvm): a Debian guest on TCG',
      command: join(BIN, 'vitest'),
      args: ['run', '--config', KVM_TIER_CONFIG],
    },
  ];
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

  // From here on every process this run starts is stopped again, also on Ctrl-C (twice).
  return runSession({
    cwd: ROOT,
    stateDir: LIBVIRT_CI_DIR,
    upScript: UP_SCRIPT,
    downScript: DOWN_SCRIPT,
    mayStartDaemons: plan.startDaemons,
    command: join(BIN, 'vitest'),
    args: ['run', ...process.argv.slice(2)],
    afterwards: kvmTier(process.argv.slice(2)),
    say,
  });
}

process.exitCode = await main();
