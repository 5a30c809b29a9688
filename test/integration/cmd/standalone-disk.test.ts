/**
 * End-to-end: the real `standalone` CLI with its state directory on a small tmpfs that fills up
 * or is remounted read-only while it runs. It keeps granting leases and applying manifests from
 * memory, /readyz fails naming the files and the error, each failure is logged once, no state
 * file is ever left torn or with temporary files beside it; once the disk takes writes again it
 * is ready again, the files hold every change, and a restart finds them all. Mounting needs
 * root: without it these tests fail (test/support/mount), they never skip.
 */
import { readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { LeaseGrant } from '../../../src/discovery/client.ts';
import { readState } from '../../../src/runtime/embedded/journal.ts';
import type { StoredObject } from '../../../src/runtime/objects/types.ts';
import {
  type CliProcess,
  cleanupCli,
  clientFor,
  createWorkspace,
  startStandalone,
  type Workspace,
  waitFor,
  waitForReady,
} from '../../support/cli.ts';
import { fillUp, mountTmpfs, remount, unmountAll } from '../../support/mount.ts';

// Real child processes on a possibly loaded 2-core machine: generous, one-sided limits.
vi.setConfig({ testTimeout: 180_000, hookTimeout: 90_000 });

const NAMES = ['local-1', 'local-2', 'local-3'];
const ARGS = ['--lease-checkpoint-interval', '200ms', '--gc-interval', '0'];
const STATE_FILES = ['state.json', 'state.json.installation-id', 'state.json.leases', 'state.json.lock'];

afterEach(async () => {
  await cleanupCli(); // the processes first: a mount in use cannot be unmounted
  unmountAll();
});

async function readyz(ws: Workspace): Promise<{ status: number; body: string }> {
  const res = await fetch(`${ws.healthUrl}/readyz`);
  return { status: res.status, body: await res.text() };
}

/** A workspace whose state lives on a fresh tmpfs of `size`. */
async function workspaceOnTmpfs(size: string): Promise<{ ws: Workspace; dir: string }> {
  const dir = mountTmpfs(size);
  const ws = { ...(await createWorkspace()), statePath: join(dir, 'state.json') };
  return { ws, dir };
}

/** Started, all Ready, /readyz 200, and a first lease checkpointed. */
async function startServing(ws: Workspace): Promise<{ proc: CliProcess; first: LeaseGrant }> {
  const proc = startStandalone(ws, ARGS);
  await waitForReady(ws, proc, NAMES, 40_000);
  await waitFor(async () => (await readyz(ws)).status === 200, '/readyz 200', 30_000, proc);
  const first = await clientFor(ws).lease({ target: 'before.example', ttlSeconds: 3600 });
  await waitFor(() => checkpointHolds(ws, first.id), 'the first lease checkpointed', 15_000, proc);
  return { proc, first };
}

function checkpointHolds(ws: Workspace, ...ids: string[]): boolean {
  try {
    const text = readFileSync(`${ws.statePath}.leases`, 'utf8');
    JSON.parse(text);
    return ids.every((id) => text.includes(id));
  } catch {
    return false;
  }
}

/** Changes that must be written: a lease, a new Proxy manifest and a label edit. */
async function makeChanges(ws: Workspace): Promise<LeaseGrant> {
  const lease = await clientFor(ws).lease({ target: 'during.example', ttlSeconds: 3600 });
  const local1 = readFileSync(join(ws.proxiesDir, 'local-1.yaml'), 'utf8');
  writeFileSync(join(ws.proxiesDir, 'local-4.yaml'), local1.replace('name: local-1', 'name: local-4'));
  writeFileSync(join(ws.proxiesDir, 'local-1.yaml'), local1.replace('{pool: eu}', '{pool: asia}'));
  return lease;
}

/** Every line of the state file is complete JSON, and nothing temporary lies beside it. */
async function expectIntact(ws: Workspace, dir: string, extra: string[] = []): Promise<void> {
  const text = readFileSync(ws.statePath, 'utf8');
  expect(text.endsWith('\n')).toBe(true);
  for (const line of text.split('\n').filter((l) => l !== '')) expect(() => JSON.parse(line)).not.toThrow();
  expect((await readState(ws.statePath))?.tornTail).toBe(false);
  JSON.parse(readFileSync(`${ws.statePath}.leases`, 'utf8'));
  expect(readdirSync(dir).sort()).toEqual([...STATE_FILES, ...extra].sort());
}

/** The stored Proxy `name`, read from the state file as a restart would. */
async function storedProxy(ws: Workspace, name: string): Promise<StoredObject | undefined> {
  const state = (await readState(ws.statePath))?.state;
  return Object.values(state?.engine.objects ?? {})
    .flat()
    .find((o) => o.kind === 'Proxy' && o.metadata.name === name);
}

/** The label edit is in effect: local-1 alone is in pool asia. */
async function expectAsia(ws: Workspace, proc: CliProcess): Promise<void> {
  await waitFor(
    async () =>
      (await clientFor(ws).listProxies({ selector: 'pool=asia' })).map((p) => p.name).join() === 'local-1',
    'local-1 relabelled pool=asia',
    20_000,
    proc,
  );
}

/** While the disk refuses writes: still serving, not ready with the reason, each error logged once. */
async function expectDegraded(ws: Workspace, proc: CliProcess, code: string): Promise<void> {
  const notReady = await waitFor(
    async () => {
      const r = await readyz(ws);
      return (
        r.status === 500 &&
        r.body.includes(`state file ${ws.statePath} cannot be written`) &&
        r.body.includes(`lease checkpoint ${ws.statePath}.leases cannot be written`) &&
        r
      );
    },
    `/readyz failing for the state file and the lease checkpoint (${code})`,
    40_000,
    proc,
  );
  expect(notReady.body).toContain(code);
  expect(notReady.body).toMatch(/\[-\]state failed: .*serving from memory, retrying/);

  // Still serving: the new Proxy comes up from memory, and leases are granted.
  await waitForReady(ws, proc, [...NAMES, 'local-4'], 40_000);
  await expectAsia(ws, proc);
  const more = await clientFor(ws).lease({ target: 'still.example', ttlSeconds: 60 });
  expect(more.proxy.name).toMatch(/^local-/);

  const failures = (msg: RegExp) => proc.logs.filter((l) => l.level >= 50 && msg.test(l.msg));
  expect(failures(/^writing the state file failed/)).toHaveLength(1);
  expect(failures(/^writing the state file failed/)[0]).toMatchObject({ code });
  expect(failures(/^writing the lease checkpoint failed/)).toHaveLength(1);
  expect(proc.logs.filter((l) => /^saving the lease checkpoint failed/.test(l.msg))).toHaveLength(1);
}

/** Ready again, every change on disk, and a restart finds them. */
async function expectRecovered(ws: Workspace, dir: string, proc: CliProcess, during: LeaseGrant) {
  await waitFor(async () => (await readyz(ws)).status === 200, '/readyz 200 again', 40_000, proc);
  await proc.waitForLog((l) => /^the state file is written again/.test(l.msg), 'state file recovery', 5_000);
  await waitFor(() => checkpointHolds(ws, during.id), 'the lease checkpoint holds the lease', 15_000, proc);
  await expectIntact(ws, dir);
  const local4 = await storedProxy(ws, 'local-4');
  expect(local4?.metadata.uid).toBeTruthy();
  expect((await storedProxy(ws, 'local-1'))?.metadata.labels).toMatchObject({ pool: 'asia' });

  const before = Object.fromEntries((await clientFor(ws).listProxies()).map((p) => [p.name, p.port]));
  proc.signal('SIGTERM');
  const exit = await waitFor(() => proc.hasExited && proc.exited, 'exit after SIGTERM', 30_000);
  expect(exit.code).toBe(0);

  const again = startStandalone(ws, ARGS);
  const snaps = await waitForReady(ws, again, [...NAMES, 'local-4'], 40_000);
  expect(Object.fromEntries(snaps.map((p) => [p.name, p.port]))).toEqual(before);
  await expectAsia(ws, again);
  expect((await clientFor(ws).renew(during.id, 60)).id).toBe(during.id);
  expect(again.logs.filter((l) => l.level >= 40 && /partial last record/.test(l.msg))).toEqual([]);
}

describe('standalone CLI: a state directory that stops taking writes', () => {
  it('full disk: serves from memory, not ready with the reason, nothing torn; recovers all once space is back', async () => {
    const { ws, dir } = await workspaceOnTmpfs('2m');
    const { proc } = await startServing(ws);

    const filler = join(dir, 'filler');
    expect(fillUp(filler)).toBeGreaterThan(1024 * 1024);
    const during = await makeChanges(ws);
    await expectDegraded(ws, proc, 'ENOSPC');
    await expectIntact(ws, dir, ['filler']);

    rmSync(filler);
    await expectRecovered(ws, dir, proc, during);
  });

  it('read-only remount: serves from memory, not ready with the reason, file untouched; recovers all once writable', async () => {
    const { ws, dir } = await workspaceOnTmpfs('2m');
    const { proc } = await startServing(ws);

    // No descriptor stays open for writing, so the remount succeeds between two writes.
    await waitFor(
      () => {
        remount(dir, 'ro');
        return true;
      },
      'mount -o remount,ro',
      15_000,
      proc,
    );
    const frozen = readFileSync(ws.statePath, 'utf8');
    const during = await makeChanges(ws);
    await expectDegraded(ws, proc, 'EROFS');
    expect(readFileSync(ws.statePath, 'utf8')).toBe(frozen);
    await expectIntact(ws, dir);

    remount(dir, 'rw');
    await expectRecovered(ws, dir, proc, during);
  });
});
