/**
 * Temporary files beside the state file never pile up: a start removes those whose writer (the
 * pid in the name) is no longer running — also one naming this process's own pid, left by an
 * earlier process that had it — and keeps those of a running process and of other files. The
 * atomic replaces of this process leave none behind when they finish.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it, onTestFinished } from 'vitest';
import { FileCheckpoint } from '../../../src/runtime/embedded/lease-checkpoint.ts';
import { createEmbeddedStore } from '../../../src/runtime/embedded/store.ts';
import { stateWriteUnderWay } from '../../../src/runtime/embedded/temp-files.ts';
import { captureLog } from '../../support/log.ts';

function scratch(): string {
  const dir = mkdtempSync(join(tmpdir(), 'temp-files-'));
  onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A pid no process can have: above the kernel's largest. */
function deadPid(): number {
  return Number(readFileSync('/proc/sys/kernel/pid_max', 'utf8').trim()) + 1;
}

describe('temporary files beside the state file', () => {
  it('a start removes those of processes that are gone and keeps those of a running one', async () => {
    const dir = scratch();
    const statePath = join(dir, 'state.json');
    const dead = deadPid();
    const stale = [
      `state.json.tmp-${dead}`,
      `state.json.leases.tmp-${dead}`,
      `state.json.installation-id.tmp-${dead}`,
      `state.json.lock.tmp-${dead}`,
      `state.json.lock.stale.tmp-${dead}`,
      // This pid, but not a write of this process: a container's PID 1 before its restart.
      `state.json.leases.tmp-${process.pid}`,
    ];
    // pid 1 always runs; another state's files are not this state's to clean.
    const kept = ['state.json.tmp-1', `other.json.tmp-${dead}`, 'state.json.tmp-x'];
    for (const name of [...stale, ...kept]) writeFileSync(join(dir, name), 'partial');

    const { log, lines } = captureLog();
    const store = await createEmbeddedStore({ statePath, rescanIntervalMs: 0, log });
    const leases = new FileCheckpoint(`${statePath}.leases`);
    await leases.save('{}');
    await store.stop();

    expect(readdirSync(dir).sort()).toEqual(
      ['state.json', 'state.json.installation-id', 'state.json.leases', ...kept].sort(),
    );
    const line = lines.find((l) => l.msg === 'removed temporary files of stopped processes');
    expect([...((line?.removed as string[] | undefined) ?? [])].sort()).toEqual(
      stale.map((n) => join(dir, n)).sort(),
    );
    expect(stateWriteUnderWay()).toBe(false);
  });

  it('a start with nothing to clean says nothing about it', async () => {
    const dir = scratch();
    const { log, lines } = captureLog();
    const store = await createEmbeddedStore({ statePath: join(dir, 'state.json'), rescanIntervalMs: 0, log });
    await store.stop();
    expect(lines.map((l) => l.msg)).not.toContain('removed temporary files of stopped processes');
  });
});
