/**
 * Temporary files of atomic replaces beside the state file never pile up: a process stopped
 * between writing one and renaming it removes its own on exit (also a forced `process.exit`),
 * and a start removes those of processes that are gone, never those of a running writer.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, it, onTestFinished } from 'vitest';
import { createEmbeddedStore } from '../../src/runtime/embedded/index.ts';

const NODE = resolve('node_modules/.bin/node');

function scratch(): string {
  const dir = mkdtempSync(join(tmpdir(), 'temp-files-'));
  onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** The pid of a process that has exited. */
function deadPid(): number {
  const r = spawnSync(NODE, ['-e', '']);
  if (r.pid === undefined) throw new Error('could not start node');
  return r.pid;
}

function runningProcess(): ChildProcess {
  const child = spawn(NODE, ['-e', 'setInterval(() => {}, 60_000)'], { stdio: 'ignore' });
  onTestFinished(() => {
    child.kill('SIGKILL');
  });
  return child;
}

describe('temporary files beside the state file', () => {
  it('a start removes those of processes that are gone and keeps those of a running one', async () => {
    const dir = scratch();
    const statePath = join(dir, 'state.json');
    const dead = deadPid();
    const live = runningProcess().pid as number;
    const stale = [
      `state.json.tmp-${dead}`,
      `state.json.leases.tmp-${dead}`,
      `state.json.installation-id.tmp-${dead}`,
    ];
    const kept = [`state.json.tmp-${live}`, `other.json.tmp-${dead}`];
    for (const name of [...stale, ...kept]) writeFileSync(join(dir, name), 'partial');

    const store = await createEmbeddedStore({ statePath, rescanIntervalMs: 0 });
    await store.stop();

    const left = readdirSync(dir);
    for (const name of stale) expect(left).not.toContain(name);
    for (const name of kept) expect(left).toContain(name);
  });

  it('a forced exit in the middle of a replace leaves neither the temporary file nor the lock', () => {
    const dir = scratch();
    const statePath = join(dir, 'state.json');
    const store = pathToFileURL(resolve('src/runtime/embedded/store.ts')).href;
    const temp = pathToFileURL(resolve('src/runtime/embedded/temp-files.ts')).href;
    // What a second Ctrl-C does while the lease checkpoint is being written.
    const child = `
      import { writeFileSync } from 'node:fs';
      import { createEmbeddedStore } from ${JSON.stringify(store)};
      import { tempPathFor } from ${JSON.stringify(temp)};
      const statePath = process.argv[1];
      await createEmbeddedStore({ statePath, rescanIntervalMs: 0 });
      writeFileSync(tempPathFor(statePath + '.leases'), '{"half":');
      process.stdout.write('written\\n');
      process.exit(1);
    `;
    const r = spawnSync(NODE, ['--input-type=module', '-e', child, statePath], { encoding: 'utf8' });
    expect(r.stdout, r.stderr).toBe('written\n');
    expect(r.status).toBe(1);
    expect(readdirSync(dir).filter((n) => n.includes('.tmp-'))).toEqual([]);
    expect(existsSync(`${statePath}.lock`)).toBe(false);
    expect(existsSync(statePath)).toBe(true);
  });
});
