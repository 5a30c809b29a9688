/**
 * The instance-lifecycle flags (docs/configuration.md): `--drain-timeout` and
 * `--max-concurrent-replacements`, their defaults, and one precise error for a bad value.
 */
import { describe, expect, it } from 'vitest';
import { FlagError, parseCommandLine } from '../../../src/cmd/flags.ts';

function flagsOf(args: string[]) {
  const parsed = parseCommandLine(['standalone', '-c', 'x', ...args]);
  if (parsed.command !== 'standalone') throw new Error('wrong command');
  return parsed.flags;
}

function fails(args: string[]): string {
  try {
    parseCommandLine(['operator', '--providers-config', 'p.yaml', ...args]);
  } catch (err) {
    expect(err).toBeInstanceOf(FlagError);
    return (err as Error).message;
  }
  throw new Error('did not fail');
}

describe('lifecycle flags', () => {
  it('default to a 10 minute drain and 10 % of each provider', () => {
    expect(flagsOf([])).toMatchObject({
      leases: { drainTimeoutMs: 600_000 },
      maxConcurrentReplacements: { percent: 10 },
    });
  });

  it('take a duration, and a count or a percentage', () => {
    expect(flagsOf(['--drain-timeout', '90s', '--max-concurrent-replacements', '3'])).toMatchObject({
      leases: { drainTimeoutMs: 90_000 },
      maxConcurrentReplacements: { count: 3 },
    });
    expect(flagsOf(['--max-concurrent-replacements=25%']).maxConcurrentReplacements).toEqual({ percent: 25 });
    expect(flagsOf(['--drain-timeout', '0']).leases.drainTimeoutMs).toBe(0);
  });

  it('refuse a bad value naming the flag', () => {
    expect(fails(['--drain-timeout', 'soon'])).toMatch(/--drain-timeout: "soon" is not a duration/);
    for (const bad of ['0', '-1', '0%', '150%', 'many', '1.5']) {
      expect(fails([`--max-concurrent-replacements=${bad}`])).toMatch(
        new RegExp(
          `--max-concurrent-replacements: must be a positive integer or a percentage .* got "${bad.replace('.', '\\.')}"`,
        ),
      );
    }
  });
});
