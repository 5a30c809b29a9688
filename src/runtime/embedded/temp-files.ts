/**
 * runtime/embedded/temp-files — what a stop must not leave half-done beside the state file.
 * Every temporary file (an atomic replace's `<file>.tmp-<pid>`, the lock's own) is named by the
 * process writing it, so a start can tell a dead writer's leftovers from a live one's and
 * remove them. This process removes its own on any exit, also `process.exit` after a second
 * Ctrl-C (the 'exit' event still runs synchronous code; only kill -9 or a power cut skips it).
 * It also counts the state writes under way, so the lock's exit hook can tell whether the files
 * on disk are what the last finished write left (runtime/embedded/lock).
 */
import { readdirSync, unlinkSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';

/** Temporary files created and not yet renamed into place or removed. */
const pending = new Set<string>();
/** Writes in place (journal appends) under way. */
let appending = 0;
let exitHookInstalled = false;

function removeQuietly(path: string): boolean {
  try {
    unlinkSync(path);
    return true;
  } catch {
    return false; // renamed already, or never created
  }
}

/**
 * The temporary path for an atomic replace of `path`, removed on exit unless `settled` first.
 * One at a time per target and process: every replace of a file is awaited before the next.
 */
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

/** Runs a write into a state file in place (an append); counted as under way until it settles. */
export async function writingInPlace<T>(write: () => Promise<T>): Promise<T> {
  appending++;
  try {
    return await write();
  } finally {
    appending--;
  }
}

/**
 * Whether a state write of this process is under way: a temporary file not yet renamed, or an
 * append not yet synced. Then the files on disk may be the old ones or a half of the new.
 */
export function stateWriteUnderWay(): boolean {
  return pending.size > 0 || appending > 0;
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
 * Removes the temporary files beside `statePath` (`<state>*.tmp-<pid>`) whose writer is not
 * running; called at a start, under the lock, before this process writes anything. A file
 * naming this process's own pid is stale too (a container's PID 1 after a restart has its
 * predecessor's pid). Returns the removed paths.
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
