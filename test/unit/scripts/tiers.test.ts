/**
 * scripts/test/tiers — what `npm test`, `npm run test:integration` and `npm run test:e2e` run: the
 * set-up before the tests (the private Python venvs), the vitest projects, the kube and KVM suites
 * after them (each behind its build, the guest image built only as root), and what arguments
 * after `--` leave out; and that every test file is in
 * the directory of a tier, which is what puts it in a vitest project.
 */
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseRunArgs, planRun, VENV_SCRIPT } from '../../../scripts/test/tiers.ts';

const BIN = '/repo/node_modules/.bin';
const plan = (argv: string[], isRoot = true) => {
  const parsed = parseRunArgs(argv);
  if ('error' in parsed) throw new Error(parsed.error);
  return planRun({ tier: parsed.tier, args: parsed.rest, bin: BIN, isRoot });
};
const steps = (p: ReturnType<typeof plan>) =>
  p.afterwards.map((f) => [f.tier, f.gate ?? false, f.command, ...f.args]);

describe('npm test', () => {
  it('type-checks and lints, runs all three vitest tiers, then the kube and KVM suites behind their builds', () => {
    const p = plan([]);
    expect(p.checks).toBe(true);
    expect(p.daemons).toBe(true);
    expect(p.vitestArgs).toEqual(['run']);
    expect(steps(p)).toEqual([
      ['kube', true, 'bash', 'test/e2e/kube/control-plane/build.sh'],
      ['kube', false, `${BIN}/vitest`, 'run', '--config', 'test/e2e/kube/vitest.config.ts'],
      ['kvm', true, 'bash', 'scripts/ci/build-guest-image.sh'],
      ['kvm', false, `${BIN}/vitest`, 'run', '--config', 'test/e2e/kvm/vitest.config.ts'],
    ]);
    expect(p.notes).toEqual([]);
  });

  it('makes the schemathesis, moto and pytools venvs first; the e2e tier alone only pytools', () => {
    const pytools = {
      what: 'the pytools virtual environment',
      command: 'bash',
      args: [VENV_SCRIPT, 'pytools'],
    };
    const venv = [
      { what: 'the schemathesis virtual environment', command: 'bash', args: [VENV_SCRIPT, 'schemathesis'] },
      { what: 'the moto virtual environment', command: 'bash', args: [VENV_SCRIPT, 'moto'] },
      pytools,
    ];
    expect(plan([]).setup).toEqual(venv);
    expect(plan(['test/unit/lease']).setup).toEqual(venv);
    expect(plan(['--tier', 'integration']).setup).toEqual(venv);
    expect(plan(['--tier', 'e2e']).setup).toEqual([pytools]);
  });

  it('builds no guest image when not root (the KVM test then names the command)', () => {
    expect(steps(plan([], false)).map((s) => s.slice(0, 2))).toEqual([
      ['kube', true],
      ['kube', false],
      ['kvm', false],
    ]);
  });

  it('passes arguments after -- to vitest and says that the kube and KVM suites are left out', () => {
    const p = plan(['test/unit/lease', '-t', 'grant']);
    expect(p.vitestArgs).toEqual(['run', 'test/unit/lease', '-t', 'grant']);
    expect(p.afterwards).toEqual([]);
    expect(p.notes).toEqual([
      'real-API-server tier (test/e2e/kube) left out: vitest arguments were given; run it with npm run test:kube',
      'KVM end-to-end tier (test/e2e/kvm) left out: vitest arguments were given; run it with npm run test:kvm',
    ]);
  });
});

describe('one tier', () => {
  it('test:integration runs the integration project alone, without checks, suites or daemons', () => {
    for (const argv of [['--tier', 'integration'], ['--tier=integration']]) {
      const p = plan(argv);
      expect(p).toMatchObject({
        tier: 'integration',
        checks: false,
        daemons: false,
        afterwards: [],
        notes: [],
      });
      expect(p.vitestArgs).toEqual(['run', '--project', 'integration']);
    }
    expect(plan(['--tier', 'integration', 'test/integration/cmd']).vitestArgs).toEqual([
      'run',
      '--project',
      'integration',
      'test/integration/cmd',
    ]);
  });

  it('test:e2e runs the e2e project, then the kube and KVM suites, with the daemons', () => {
    const p = plan(['--tier', 'e2e']);
    expect(p).toMatchObject({ tier: 'e2e', checks: false, daemons: true });
    expect(p.vitestArgs).toEqual(['run', '--project', 'e2e']);
    expect(steps(p)).toEqual(steps(plan([])));
    const some = plan(['--tier', 'e2e', 'test/e2e/health']);
    expect(some.vitestArgs).toEqual(['run', '--project', 'e2e', 'test/e2e/health']);
    expect(some.afterwards).toEqual([]);
    expect(some.notes).toHaveLength(2);
  });

  it('refuses an unknown tier, and the unit tier (plain vitest, npm run test:unit)', () => {
    expect(parseRunArgs(['--tier', 'smoke'])).toEqual({
      error: '--tier smoke: expected one of integration, e2e (the unit tier is npm run test:unit)',
    });
    expect(parseRunArgs(['--tier=unit'])).toHaveProperty('error');
    expect(parseRunArgs(['--tier'])).toHaveProperty('error');
  });
});

describe('the test tree', () => {
  it('has every test file in a tier directory, so no vitest project leaves one out', () => {
    const testDir = join(import.meta.dirname, '..', '..');
    const outside = readdirSync(testDir, { recursive: true, encoding: 'utf8' })
      .filter((f) => f.endsWith('.test.ts'))
      .map((f) => f.split('\\').join('/'))
      .filter((f) => !/^(unit|integration|e2e)\//.test(f));
    expect(outside, 'move these into test/unit/, test/integration/ or test/e2e/ (docs/testing.md)').toEqual(
      [],
    );
  });
});
