/**
 * Temporary files of atomic replaces beside the state file (`<file>.tmp-<pid>`). A process that
 * is stopped between writing one and renaming it leaves it behind; nothing would ever read or
 * remove it. So this process removes its own on every exit (also `process.exit` after a second
 * signal: the 'exit' event still runs synchronous code), and a start removes those of processes
 * that are gone.
 */
import { readdirSync, unlinkSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';

const pending = new Set<string>();
let exitHookInstalled = false;

function removeQuietly(path: string): boolean {
  try {
    unlinkSync(path);
    return true;
  } catch {
    return false; // renamed already, or never created
  }
}

/** The temporary path for an atomic replace of `path`, removed on exit unless `settled` first. */
export function tempPathFor(path: string): string {
  const tmp = `${path}.tmp-${process.pid}`;
  pending.add(tmp);
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.on('exit', () => {
      for (const p of pending) removeQuietly(p);
    });
  }
  return tmp;
}

/** The temporary file was renamed into place or removed: nothing left to clean on exit. */
export function settled(tmp: string): void {
  pending.delete(tmp);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    // EPERM: the pid exists but belongs to another user, so it is alive.
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Removes `<statePath>*.tmp-<pid>` files whose writer is not running. A file naming this
 * process's own pid is stale too unless this process is writing it (a container's PID 1 after a
 * restart has the pid its predecessor had). Returns the removed paths.
 */
export function removeStaleTempFiles(statePath: string): string[] {
  const dir = dirname(statePath);
  const prefix = basename(statePath);
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  const removed: string[] = [];
  for (const name of names) {
    if (!name.startsWith(prefix)) continue;
    const m = /\.tmp-(\d+)$/.exec(name);
    if (!m) continue;
    const pid = Number(m[1]);
    const path = join(dir, name);
    const stale = pid === process.pid ? !pending.has(path) : !alive(pid);
    if (stale && removeQuietly(path)) removed.push(path);
  }
  return removed;
}
