/**
 * runtime/embedded/lock — one standalone process per state file. The lock file names its holder
 * by pid, boot id and process start time, so a lock left by a killed process is recognised as
 * stale even when its pid now belongs to someone else (after a reboot, or PID 1 in a restarted
 * container) and taken over without manual cleanup — atomically, never from a live holder.
 * A process that exits without releasing it (a second Ctrl-C forces `process.exit`) removes it
 * on the way out only when no state write is under way: then the files on disk are what the last
 * finished write left. Mid-write it stays, naming this process, and the next start takes it
 * over once this process is gone — so no one reads the state while our last write may still land.
 */
import { randomBytes } from 'node:crypto';
import { linkSync, readFileSync, renameSync, unlinkSync, writeFileSync } from 'node:fs';
import { settled, stateWriteUnderWay, tempPathFor } from './temp-files.ts';

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

/** Who holds a lock. Older builds wrote only the pid; the other fields are then absent. */
interface Holder {
  pid: number;
  /** /proc/sys/kernel/random/boot_id: changes on every boot. */
  bootId?: string;
  /** Field 22 of /proc/<pid>/stat (clock ticks since boot): tells a reused pid apart. */
  startTime?: string;
  /** Makes every lock's content unique, so a takeover can tell which file it moved. */
  nonce?: string;
}

/** Lock paths this process holds: a lock naming our own pid is ours only if listed here. */
const heldHere = new Set<string>();

function readOr(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
}

const bootId = (): string | undefined => readOr('/proc/sys/kernel/random/boot_id')?.trim() || undefined;

/** The start time of `pid`, or undefined where /proc is unavailable (or the process is gone). */
export function processStartTime(pid: number): string | undefined {
  const stat = readOr(`/proc/${pid}/stat`);
  // The command name (field 2) may hold spaces and parentheses: count fields after the last ')'.
  const after = stat?.slice(stat.lastIndexOf(')') + 2).split(' ');
  return after?.[19];
}

function parseHolder(text: string): Holder | undefined {
  const trimmed = text.trim();
  if (/^\d+$/.test(trimmed)) return { pid: Number(trimmed) };
  try {
    const v = JSON.parse(trimmed) as Holder;
    return Number.isInteger(v?.pid) ? v : undefined;
  } catch {
    return undefined;
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

/** Whether the holder may still be running; any doubt counts as live. */
function holderLive(lockPath: string, h: Holder): boolean {
  const boot = bootId();
  if (h.bootId && boot && h.bootId !== boot) return false; // written before a reboot
  if (h.pid === process.pid) return heldHere.has(lockPath); // a previous incarnation with our pid
  if (!alive(h.pid)) return false;
  const start = h.startTime ? processStartTime(h.pid) : undefined;
  if (start && start !== h.startTime) return false; // the pid was reused by another process
  return true;
}

export interface Lock {
  readonly path: string;
  release(): void;
}

/**
 * Removes the stale lock whose content was `seen`: it is renamed aside first (atomic), and if
 * what moved is not what was judged stale — another starter took over in between — it is put
 * back with link(), which fails rather than overwrite a lock created meanwhile.
 */
function removeStale(lockPath: string, seen: string): void {
  const aside = tempPathFor(`${lockPath}.stale`);
  try {
    try {
      renameSync(lockPath, aside);
    } catch {
      return; // gone already: the next attempt sees what is there now
    }
    if (readOr(aside) !== seen) {
      try {
        linkSync(aside, lockPath);
      } catch {
        // a newer lock exists; that one wins
      }
    }
    try {
      unlinkSync(aside);
    } catch {
      // nothing to clean
    }
  } finally {
    settled(aside);
  }
}

/** Takes the lock or throws StateLockedError naming the holder. */
export function acquireLock(lockPath: string): Lock {
  const me: Holder = {
    pid: process.pid,
    bootId: bootId(),
    startTime: processStartTime(process.pid),
    nonce: randomBytes(8).toString('hex'),
  };
  const content = `${JSON.stringify(me)}\n`;
  // The lock appears with its full content at once (link of a finished file), so a reader never
  // sees a half-written lock and mistakes it for a stale one.
  const tmp = tempPathFor(lockPath);
  try {
    writeFileSync(tmp, content, { mode: 0o600 });
    for (let attempt = 0; attempt < 5; attempt++) {
      try {
        linkSync(tmp, lockPath);
        heldHere.add(lockPath);
        return ownLock(lockPath, content);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      }
      const seen = readOr(lockPath);
      if (seen === undefined) continue; // removed meanwhile: retry
      const holder = parseHolder(seen);
      if (holder && holderLive(lockPath, holder)) throw new StateLockedError(lockPath, holder.pid);
      removeStale(lockPath, seen);
    }
  } finally {
    try {
      unlinkSync(tmp);
    } catch {
      // already gone
    }
    settled(tmp);
  }
  throw new Error(`could not acquire lock ${lockPath}`);
}

/** Releases of the locks this process holds, for the exit hook. */
const heldReleases = new Set<() => void>();
let exitHookInstalled = false;

function releaseOnExit(release: () => void): void {
  heldReleases.add(release);
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on('exit', () => {
    if (stateWriteUnderWay()) return;
    for (const r of [...heldReleases]) r();
  });
}

function ownLock(lockPath: string, content: string): Lock {
  let released = false;
  const release = () => {
    if (released) return;
    released = true;
    heldReleases.delete(release);
    heldHere.delete(lockPath);
    // Only our own lock: never one a successor took over after we were judged gone.
    if (readOr(lockPath) === content) {
      try {
        unlinkSync(lockPath);
      } catch {
        // already gone
      }
    }
  };
  releaseOnExit(release);
  return { path: lockPath, release };
}
