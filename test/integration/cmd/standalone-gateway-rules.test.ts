/**
 * The real `standalone` CLI with `--gateway-inspect` refuses a providers config whose gateway
 * rules are wrong — a body pattern that does not compile, an unknown action, a duplicate name —
 * at once: exit code 2, one line per problem naming `gateway.rules[i].<field>`, nothing started
 * (no listener, no state, no CA made).
 */
import { appendFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { accepts, cleanupCli, createWorkspace, runCli, standaloneArgs } from '../../support/cli.ts';

vi.setConfig({ testTimeout: 120_000 });
afterEach(cleanupCli);

async function refusal(rules: string[]) {
  const ws = await createWorkspace();
  appendFileSync(
    ws.providersFile,
    ['', 'gateway:', '  rules:', ...rules.map((r) => `    - ${r}`), ''].join('\n'),
  );
  const res = await runCli(standaloneArgs(ws, ['--gateway-inspect']), ws.dir);
  expect(res.code, res.stderr).toBe(2);
  expect(res.stderr).toContain(`invalid providers config ${ws.providersFile}`);
  expect(res.stdout).toBe('');
  expect(existsSync(ws.statePath)).toBe(false);
  expect(existsSync(join(ws.dir, 'gateway-ca'))).toBe(false);
  expect(await accepts(ws.discoveryPort)).toBe(false);
  return res.stderr;
}

describe('standalone CLI: gateway rules', () => {
  it('refuses a pattern that does not compile and a duplicate name, naming each field', async () => {
    const stderr = await refusal([
      '{name: captcha, body: "verify (you", actions: [block, retry]}',
      '{name: captcha, status: [403], actions: [block]}',
    ]);
    expect(stderr).toMatch(/gateway\.rules\[0\]\.body\b.*regular expression/);
    expect(stderr).toMatch(/gateway\.rules\[1\]\.name\b.*duplicate/);
  });

  it('refuses an unknown action, naming the field', async () => {
    const stderr = await refusal(['{name: slow, timeToFirstByteMs: 5000, actions: [ban]}']);
    expect(stderr).toMatch(/gateway\.rules\[0\]\.actions(\[0\])?\b/);
  });
});
