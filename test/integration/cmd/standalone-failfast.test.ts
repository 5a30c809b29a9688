/**
 * End-to-end: the real CLI refuses bad flags and a bad providers config at once — exit code 2,
 * a precise message on stderr naming the flag or field, and nothing started or written.
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { accepts, cleanupCli, createWorkspace, runCli, standaloneArgs } from '../../support/cli.ts';

// Real child processes on a possibly loaded 2-core machine: generous, one-sided limits.
vi.setConfig({ testTimeout: 120_000, hookTimeout: 90_000 });

afterEach(cleanupCli);

describe('standalone CLI: fail fast', () => {
  it('rejects an unknown flag with one line and exit code 2', async () => {
    const ws = await createWorkspace();
    const res = await runCli(standaloneArgs(ws, ['--no-such-flag']), ws.dir);
    expect(res.code).toBe(2);
    expect(res.stderr.trim().split('\n')).toEqual([expect.stringContaining('--no-such-flag')]);
    expect(res.stdout).toBe('');
    expect(existsSync(ws.statePath)).toBe(false);
    expect(await accepts(ws.discoveryPort)).toBe(false);
  });

  it('requires --config', async () => {
    const ws = await createWorkspace();
    const res = await runCli(['standalone', '--state', ws.statePath], ws.dir);
    expect(res.code).toBe(2);
    expect(res.stderr.trim().split('\n')).toEqual([expect.stringContaining('--config is required')]);
    expect(existsSync(ws.statePath)).toBe(false);
  });

  it('rejects a malformed flag value, naming the flag', async () => {
    const ws = await createWorkspace();
    const res = await runCli(standaloneArgs(ws, ['--shutdown-grace-period', 'soon']), ws.dir);
    expect(res.code).toBe(2);
    expect(res.stderr.trim().split('\n')).toEqual([expect.stringContaining('--shutdown-grace-period')]);
  });

  it('rejects a providers config with an unknown key, naming its path, before anything starts', async () => {
    const ws = await createWorkspace();
    const text = readFileSync(ws.providersFile, 'utf8');
    writeFileSync(ws.providersFile, text.replace('portRange:', 'portRnge:'));
    const res = await runCli(standaloneArgs(ws), ws.dir);
    expect(res.code).toBe(2);
    // Documented format (docs/configuration.md): a header naming the file, then one line per problem.
    const lines = res.stderr.trim().split('\n');
    expect(lines).toHaveLength(2);
    expect(lines[0]).toContain(`invalid providers config ${ws.providersFile}`);
    expect(lines[1]).toMatch(/providers\[0\] \(local\): local\.portRnge .*not a known field/);
    expect(res.stdout).toBe('');
    expect(existsSync(ws.statePath)).toBe(false);
    expect(existsSync(`${ws.statePath}.lock`)).toBe(false);
    expect(await accepts(ws.discoveryPort)).toBe(false);
  });

  it('rejects a --config directory without providers.yaml', async () => {
    const ws = await createWorkspace();
    const res = await runCli(
      standaloneArgs(ws).map((a) => (a === ws.dir ? join(ws.dir, 'proxies') : a)),
      ws.dir,
    );
    expect(res.code).toBe(2);
    expect(res.stderr.trim().split('\n')).toEqual([expect.stringContaining('providers.yaml')]);
    expect(existsSync(ws.statePath)).toBe(false);
  });

  it('refuses a corrupt state file, naming file and line, and leaves it untouched', async () => {
    const ws = await createWorkspace();
    const corrupt = 'not a snapshot\n{"also":"ignored"}\n';
    writeFileSync(ws.statePath, corrupt);
    const res = await runCli(standaloneArgs(ws), ws.dir);
    expect(res.code).toBe(2);
    expect(res.stderr.trim().split('\n')).toEqual([
      expect.stringMatching(new RegExp(`${ws.statePath.replaceAll('.', '\\.')}.*line 1`)),
    ]);
    expect(readFileSync(ws.statePath, 'utf8')).toBe(corrupt);
    expect(existsSync(`${ws.statePath}.lock`)).toBe(false);
  });
});
