/**
 * End-to-end: the real `standalone` CLI against careless-operator mistakes — an emptied state
 * file, a lock left behind by an earlier boot, Go-style boolean flags, and every manifest
 * removed at once while proxies are serving.
 */
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it, vi } from 'vitest';
import {
  cleanupCli,
  clientFor,
  createWorkspace,
  runCli,
  standaloneArgs,
  startStandalone,
  waitForReady,
} from '../../support/cli.ts';

vi.setConfig({ testTimeout: 120_000, hookTimeout: 90_000 });
afterAll(cleanupCli);

const NAMES = ['local-1', 'local-2', 'local-3'];

describe('standalone CLI: refuses to start a fresh fleet by accident', () => {
  it('refuses an empty state file, naming it and how to start fresh, and leaves it untouched', async () => {
    const ws = await createWorkspace();
    writeFileSync(ws.statePath, '\n  \n');
    const res = await runCli(standaloneArgs(ws), ws.dir);
    expect(res.code).toBe(2);
    const lines = res.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain(ws.statePath);
    expect(lines[0]).toMatch(/empty.*delete the file/);
    expect(readFileSync(ws.statePath, 'utf8')).toBe('\n  \n');
    expect(existsSync(`${ws.statePath}.lock`)).toBe(false);
  });

  it('rejects a boolean flag with a value other than true or false', async () => {
    const ws = await createWorkspace();
    const res = await runCli(standaloneArgs(ws, ['--trace-health-probes=yes']), ws.dir);
    expect(res.code).toBe(2);
    expect(res.stderr.trim()).toBe(
      'egress-proxies-operator: --trace-health-probes: "yes" is not a boolean (use true or false)',
    );
  });
});

describe('standalone CLI: removing every manifest at once', () => {
  it('takes over a lock from an earlier boot, accepts --flag=false, and deletes nothing when all manifests go', async () => {
    const ws = await createWorkspace();
    // A lock naming a live process (this test runner) but written during another boot.
    writeFileSync(
      `${ws.statePath}.lock`,
      JSON.stringify({ pid: process.pid, bootId: 'an-earlier-boot', startTime: '1' }),
    );
    const proc = startStandalone(ws, ['--trace-health-probes=false', '--gc-interval', '0']);
    const before = await waitForReady(ws, proc, NAMES, 40_000);

    // `mv proxies proxies.bak && mkdir proxies`: the directory now holds no Proxy.
    renameSync(ws.proxiesDir, `${ws.proxiesDir}.bak`);
    mkdirSync(ws.proxiesDir);
    const warning = await proc.waitForLog(
      (l) => l.level >= 40 && /--allow-empty-manifests/.test(l.msg),
      'the emptied-manifests warning',
    );
    expect(warning).toMatchObject({ proxiesBefore: 3, proxiesAfter: 0 });
    const after = await clientFor(ws).listProxies();
    expect(after.map((p) => [p.name, p.phase, p.port])).toEqual(before.map((p) => [p.name, p.phase, p.port]));
    expect(proc.logs.filter((l) => l.msg === 'manifest removed: deleting the object')).toEqual([]);

    // Putting the files back into the re-created directory is seen at once; nothing restarted.
    for (const p of before) {
      const f = `${p.name}.yaml`;
      writeFileSync(join(ws.proxiesDir, f), readFileSync(join(`${ws.proxiesDir}.bak`, f), 'utf8'));
    }
    await proc.waitForLog((l) => /manifests restored/.test(l.msg), 'the all-clear', 15_000);
    expect(proc.logs.filter((l) => l.msg === 'local proxy stopped')).toEqual([]);
  });
});
