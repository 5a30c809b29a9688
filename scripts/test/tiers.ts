/**
 * scripts/test/tiers — what a run of scripts/test/run.ts runs, as data: `npm test` runs the three
 * vitest projects of vitest.config.ts (unit, integration, e2e), then the real-API-server suite
 * (test/e2e/kube, its control plane and helm built first) and the KVM suite (test/e2e/kvm, its guest
 * image built first as root); `npm run test:integration` and `npm run test:e2e` run one tier
 * (`--tier <name>`). Arguments after `--` go to vitest and leave the kube and KVM suites out.
 * Before the tests, the private Python virtual environments are made (or found cached):
 * schemathesis (API fuzzing) and moto (the aws provider tests) for the integration tier, pytools
 * (the Python package's tools and the Scrapy wheelhouse of its test matrix) for both the
 * integration and the e2e tier. See docs/testing.md.
 */
import { join } from 'node:path';
import { GUEST_IMAGE_SCRIPT } from './prerequisites.ts';
import type { FollowUp } from './session.ts';

export const KUBE_TIER_CONFIG = 'test/e2e/kube/vitest.config.ts';
export const KVM_TIER_CONFIG = 'test/e2e/kvm/vitest.config.ts';
export const CONTROL_PLANE_BUILD = 'test/e2e/kube/control-plane/build.sh';
/** Creates (or finds cached) a private venv: `bash VENV_SCRIPT <name>` (scripts/ci/<name>/requirements.txt). */
export const VENV_SCRIPT = 'scripts/ci/venv.sh';
/**
 * The venvs of the integration tier: schemathesis (test/integration/discovery/openapi-fuzz.test.ts)
 * and moto's server (test/support/moto.ts, the aws provider tests).
 */
export const INTEGRATION_VENVS = ['schemathesis', 'moto', 'pytools'] as const;
/**
 * The venvs of the e2e tier: pytools (the wheel test/e2e/clients/scrapy-crawl.test.ts builds,
 * and the Scrapy from PyPI it installs next to it).
 */
export const E2E_VENVS = ['pytools'] as const;

/** The tiers run.ts can run alone; `unit` needs no machine set-up and runs as plain vitest. */
export const RUN_TIERS = ['integration', 'e2e'] as const;
export type RunTier = (typeof RUN_TIERS)[number];

export interface RunPlan {
  /** undefined: every tier (`npm test`). */
  tier: RunTier | undefined;
  /** Type-check and lint first: `npm test` only. */
  checks: boolean;
  /** libvirtd + sshd are needed (the kvm provider tests and the KVM suite are e2e). */
  daemons: boolean;
  /**
   * Run to their end before the tests; a failure stops the run with that step's exit code (a
   * set-up that fails fails loudly, never a test that skips).
   */
  setup: SetupStep[];
  /** Arguments of the main vitest run. */
  vitestArgs: string[];
  /** After it: the kube and KVM suites, each behind its build. */
  afterwards: FollowUp[];
  /** What the run says before it starts (suites left out, and why). */
  notes: string[];
}

export interface SetupStep {
  /** Said when it fails. */
  what: string;
  command: string;
  args: string[];
}

/** Reads run.ts's arguments: an optional leading `--tier <name>` (or `--tier=<name>`), then vitest's. */
export function parseRunArgs(
  argv: string[],
): { tier: RunTier | undefined; rest: string[] } | { error: string } {
  const [first, second] = argv;
  let name: string | undefined;
  let rest = argv;
  if (first === '--tier') {
    name = second;
    rest = argv.slice(2);
  } else if (first?.startsWith('--tier=')) {
    name = first.slice('--tier='.length);
    rest = argv.slice(1);
  } else {
    return { tier: undefined, rest };
  }
  if (!RUN_TIERS.includes(name as RunTier)) {
    return {
      error: `--tier ${name ?? ''}: expected one of ${RUN_TIERS.join(', ')} (the unit tier is npm run test:unit)`,
    };
  }
  return { tier: name as RunTier, rest };
}

function kubeSuite(vitest: string): FollowUp[] {
  return [
    {
      name: `control plane and helm for the real-API-server tier (${CONTROL_PLANE_BUILD}, cached after the first build)`,
      command: 'bash',
      args: [CONTROL_PLANE_BUILD],
      gate: true,
      tier: 'kube',
    },
    {
      name: 'real-API-server tier (test/e2e/kube): kube-apiserver, etcd and the operator as its ServiceAccount',
      command: vitest,
      args: ['run', '--config', KUBE_TIER_CONFIG],
      tier: 'kube',
    },
  ];
}

/** As root the guest image is built first when none is cached; otherwise the test names the command. */
function kvmSuite(vitest: string, isRoot: boolean): FollowUp[] {
  const build: FollowUp[] = isRoot
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
      name: 'KVM end-to-end tier (test/e2e/kvm): a Debian guest on TCG',
      command: vitest,
      args: ['run', '--config', KVM_TIER_CONFIG],
      tier: 'kvm',
    },
  ];
}

export function planRun(o: {
  tier: RunTier | undefined;
  args: string[];
  bin: string;
  isRoot: boolean;
}): RunPlan {
  const vitest = join(o.bin, 'vitest');
  const withSuites = o.tier !== 'integration';
  const notes: string[] = [];
  let afterwards: FollowUp[] = [];
  if (withSuites && o.args.length > 0) {
    notes.push(
      'real-API-server tier (test/e2e/kube) left out: vitest arguments were given; run it with npm run test:kube',
      'KVM end-to-end tier (test/e2e/kvm) left out: vitest arguments were given; run it with npm run test:kvm',
    );
  } else if (withSuites) {
    afterwards = [...kubeSuite(vitest), ...kvmSuite(vitest, o.isRoot)];
  }
  // The e2e tier alone needs only its own; every other run, the integration tier's (a superset).
  const setup: SetupStep[] = (o.tier === 'e2e' ? E2E_VENVS : INTEGRATION_VENVS).map((name) => ({
    what: `the ${name} virtual environment`,
    command: 'bash',
    args: [VENV_SCRIPT, name],
  }));
  return {
    tier: o.tier,
    checks: o.tier === undefined,
    daemons: withSuites,
    setup,
    vitestArgs: ['run', ...(o.tier ? ['--project', o.tier] : []), ...o.args],
    afterwards,
    notes,
  };
}
