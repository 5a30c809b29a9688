/**
 * A forced exit (`process.exit` after a second Ctrl-C) beside the standalone state: a child
 * process holds the store and exits at once. Its temporary files never survive it. The lock
 * goes with it when no state write is under way; in the middle of one it stays, naming the dead
 * process, so nobody reads the state while the write might still land — and the next start
 * takes it over and finds the state as the last finished write left it.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, it, onTestFinished } from 'vitest';
import { createEmbeddedStore } from '../../../src/runtime/embedded/index.ts';

const NODE = resolve('node_modules/.bin/node');
const STORE = pathToFileURL(resolve('src/runtime/embedded/store.ts')).href;
const TEMP = pathToFileURL(resolve('src/runtime/embedded/temp-files.ts')).href;

function scratch(): string {
  const dir = mkdtempSync(join(tmpdir(), 'forced-exit-'));
  onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Runs `body` in a child holding the store on `statePath`; `body` ends with process.exit. */
function child(statePath: string, body: string): { pid: number; status: number | null; stdout: string } {
  const script = `
    import { writeFileSync } from 'node:fs';
    import { createEmbeddedStore } from ${JSON.stringify(STORE)};
    import { tempPathFor } from ${JSON.stringify(TEMP)};
    const statePath = process.argv[1];
    const store = await createEmbeddedStore({ statePath, rescanIntervalMs: 0 });
    await store.secrets.create({ metadata: { name: 'kept', namespace: 'd' }, data: {} });
    ${body}
  `;
  const r = spawnSync(NODE, ['--input-type=module', '-e', script, statePath], { encoding: 'utf8' });
  expect(r.stderr).toBe('');
  return { pid: r.pid as number, status: r.status, stdout: r.stdout };
}

const temporary = (dir: string) => readdirSync(dir).filter((n) => n.includes('.tmp-'));

describe('a forced exit beside the standalone state', () => {
  it('between writes leaves neither a temporary file nor the lock', () => {
    const dir = scratch();
    const statePath = join(dir, 'state.json');
    const r = child(statePath, "process.stdout.write('exiting\\n'); process.exit(1);");
    expect(r).toMatchObject({ status: 1, stdout: 'exiting\n' });
    expect(temporary(dir)).toEqual([]);
    expect(existsSync(`${statePath}.lock`)).toBe(false);
  });

  it('in the middle of a replace removes its temporary file, keeps the lock, and the next start takes it over', async () => {
    const dir = scratch();
    const statePath = join(dir, 'state.json');
    // What a second Ctrl-C does while the lease checkpoint is being written.
    const r = child(
      statePath,
      `writeFileSync(tempPathFor(statePath + '.leases'), '{"half":');
       process.stdout.write('written\\n');
       process.exit(1);`,
    );
    expect(r).toMatchObject({ status: 1, stdout: 'written\n' });
    expect(temporary(dir)).toEqual([]);
    expect(JSON.parse(readFileSync(`${statePath}.lock`, 'utf8')).pid).toBe(r.pid);

    const store = await createEmbeddedStore({ statePath, rescanIntervalMs: 0 });
    expect((await store.secrets.read({ namespace: 'd', name: 'kept' })).metadata?.name).toBe('kept');
    await store.stop();
    expect(existsSync(`${statePath}.lock`)).toBe(false);
  });
});
