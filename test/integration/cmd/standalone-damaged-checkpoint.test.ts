/**
 * End-to-end: a damaged lease checkpoint (one byte appended to `<state>.leases`) stops the real
 * `standalone` CLI with an error naming the file, and leaves the file as it was — never a
 * silent start without every cooldown; `--discard-lease-state` starts anyway, warning and
 * keeping the damaged copy aside as `<state>.leases.damaged-<stamp>`.
 */
import { appendFileSync, readdirSync, readFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  cleanupCli,
  clientFor,
  createWorkspace,
  runCli,
  standaloneArgs,
  startStandalone,
  waitFor,
  waitForReady,
} from '../../support/cli.ts';

vi.setConfig({ testTimeout: 150_000, hookTimeout: 90_000 });

const NAMES = ['local-1', 'local-2', 'local-3'];
const ARGS = ['--lease-checkpoint-interval', '300ms'];

afterEach(cleanupCli);

describe('standalone CLI: a damaged lease checkpoint', () => {
  it('stops start-up naming the file, keeps it, and --discard-lease-state starts loudly', async () => {
    const ws = await createWorkspace();
    const checkpoint = `${ws.statePath}.leases`;
    const first = startStandalone(ws, ARGS);
    await waitForReady(ws, first, NAMES, 40_000);
    const client = clientFor(ws);
    const g = await client.lease({ target: 'shop.example' });
    await client.report(g.id, { result: 'failed', cooldownSeconds: 3600 });
    first.signal('SIGTERM');
    expect((await waitFor(() => first.hasExited && first.exited, 'exit after SIGTERM', 30_000)).code).toBe(0);
    expect(readFileSync(checkpoint, 'utf8')).toContain(g.id);

    appendFileSync(checkpoint, 'x');
    const damaged = readFileSync(checkpoint);
    const refused = await runCli(standaloneArgs(ws, ARGS), ws.dir);
    expect(refused.code).toBe(1);
    const logs = refused.stdout
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { level: number; msg: string; err?: { message?: string } });
    const error = logs.find((l) => l.level >= 50 && l.err?.message?.includes('is damaged'));
    expect(error?.err?.message).toContain(`lease checkpoint ${checkpoint} is damaged (not valid JSON)`);
    expect(error?.err?.message).toContain('--discard-lease-state');
    // Nothing decided, nothing saved: the damaged file is exactly as it was.
    expect(logs.some((l) => l.msg === 'deciding leases')).toBe(false);
    expect(readFileSync(checkpoint).equals(damaged)).toBe(true);

    const third = startStandalone(ws, [...ARGS, '--discard-lease-state']);
    const warn = await third.waitForLog(
      (l) => l.level === 40 && String(l.msg).includes('--discard-lease-state'),
      'the discard warning',
    );
    expect(warn.where).toBe(checkpoint);
    const keptAt = String(warn.keptAt);
    expect(keptAt).toMatch(new RegExp(`^${checkpoint.replaceAll('.', '\\.')}\\.damaged-\\d{8}t\\d{6}z$`));
    expect(readdirSync(dirname(checkpoint))).toContain(basename(keptAt));
    expect(readFileSync(join(dirname(checkpoint), basename(keptAt))).equals(damaged)).toBe(true);
    await waitForReady(ws, third, NAMES, 40_000);
    // Started without the checkpoint: the cooldown is gone, as the warning said.
    const snap = await clientFor(ws).listProxies();
    expect(snap.find((p) => p.name === g.proxy.name)?.cooldownUntil).toBeNull();
  });
});
