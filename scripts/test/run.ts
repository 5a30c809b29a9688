/**
 * scripts/test/run — `npm test`: check the machine, set it up when root (system packages,
 * IPv6 test addresses on lo, libvirtd + sshd on loopback, the VMs' bridge), type-check, lint, run
 * vitest, then the real-API-server tier (test/e2e-kube, its control plane built first or taken
 * from the cache) and the KVM end-to-end tier (test/e2e-kvm, its guest image built first or taken
 * from the cache), and stop the daemons it started — also when interrupted, however often
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
const KUBE_TIER_CONFIG = 'test/e2e-kube/vitest.config.ts';
const CONTROL_PLANE_BUILD = 'test/e2e-kube/control-plane/build.sh';

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
 * The real-API-server tier, after the main suite: the control plane is built from its Go module
 * first (minutes, once per version; cached outside the repository), then the tier runs on it.
 */
function kubeTier(args: string[]): FollowUp[] {
  if (args.length > 0) {
    say(
      'real-API-server tier (test/e2e-kube) left out: vitest arguments were given; run it with npm run test:kube',
    );
    return [];
  }
  return [
    {
      name: `control plane for the real-API-server tier (${CONTROL_PLANE_BUILD}, cached after the first build)`,
      command: 'bash',
      args: [CONTROL_PLANE_BUILD],
      gate: true,
      tier: 'kube',
    },
    {
      name: 'real-API-server tier (test/e2e-kube): kube-apiserver, etcd and the operator as its ServiceAccount',
      command: join(BIN, 'vitest'),
      args: ['run', '--config', KUBE_TIER_CONFIG],
      tier: 'kube',
    },
  ];
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
            tier: 'kvm',
          },
        ]
      : [];
  return [
    ...build,
    {
      name: 'KVM end-to-end tier (test/e2e-kvm): a Debian guest on TCG',
      command: join(BIN, 'vitest'),
      args: ['run', '--config', KVM_TIER_CONFIG],
      tier: 'kvm',
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
    afterwards: [...kubeTier(process.argv.slice(2)), ...kvmTier(process.argv.slice(2))],
    say,
  });
}

process.exitCode = await main();
