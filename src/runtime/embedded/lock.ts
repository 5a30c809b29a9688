/**
 * runtime/embedded/lock — one standalone process per state file. The lock file is created with
 * O_EXCL and holds the owner's pid; a lock whose pid is no longer alive (the owner was killed)
 * is stale and taken over, so a crash never needs manual cleanup.
 */
import { closeSync, openSync, readFileSync, unlinkSync, writeSync } from 'node:fs';

export class StateLockedError extends Error {
  readonly pid: number;
  readonly lockPath: string;
  constructor(lockPath: string, pid: number) {
    super(
      `state is in use by another standalone process (pid ${pid}); lock file ${lockPath}. ` +
        'Stop that process, or point this one at a different state file.',
    );
    this.name = 'StateLockedError';
    this.pid = pid;
    this.lockPath = lockPath;
  }
}

function alive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    // EPERM: the process exists but belongs to someone else — still alive.
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

export interface Lock {
  readonly path: string;
  release(): void;
}

/** Takes the lock or throws StateLockedError naming the holder. */
export function acquireLock(lockPath: string): Lock {
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const fd = openSync(lockPath, 'wx', 0o600);
      writeSync(fd, `${process.pid}\n`);
      closeSync(fd);
      let released = false;
      return {
        path: lockPath,
        release() {
          if (released) return;
          released = true;
          try {
            if (readFileSync(lockPath, 'utf8').trim() === String(process.pid)) unlinkSync(lockPath);
          } catch {
            // already gone
          }
        },
      };
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
    let holder = Number.NaN;
    try {
      holder = Number.parseInt(readFileSync(lockPath, 'utf8').trim(), 10);
    } catch {
      continue; // removed meanwhile: retry
    }
    if (holder === process.pid || alive(holder)) throw new StateLockedError(lockPath, holder);
    try {
      unlinkSync(lockPath); // stale: its owner is gone
    } catch {
      // someone else removed it first
    }
  }
  throw new Error(`could not acquire lock ${lockPath}`);
}
