/**
 * test/support/mount — small tmpfs file systems mounted by a test (as root), to fill up or
 * remount read-only under a running process. A machine where mounting is impossible fails the
 * test with the reason: a disk-full test that skipped itself would prove nothing while looking
 * green. Every mount is undone by `unmountAll` (call it from afterEach, after the processes
 * using the mount are gone).
 */
import { spawnSync } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, rmdirSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const mounted: string[] = [];

function run(args: string[]): { ok: boolean; output: string } {
  const r = spawnSync(args[0] as string, args.slice(1), { encoding: 'utf8' });
  return { ok: r.status === 0, output: `${r.stdout ?? ''}${r.stderr ?? ''}${r.error?.message ?? ''}`.trim() };
}

/** Mounts a private tmpfs of `size` (e.g. "2m") on a new directory and returns the directory. */
export function mountTmpfs(size: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'tmpfs-'));
  const r = run(['mount', '-t', 'tmpfs', '-o', `size=${size},mode=0700`, 'tmpfs', dir]);
  if (!r.ok) {
    rmdirSync(dir);
    throw new Error(
      `cannot mount a tmpfs (uid ${process.getuid?.()}): ${r.output}. This test must run as root ` +
        '(or with CAP_SYS_ADMIN); it fails rather than skip, since a skipped disk-full test proves nothing',
    );
  }
  mounted.push(dir);
  return dir;
}

/** `mount -o remount,<opts>`; throws with mount's output when it refuses (e.g. EBUSY). */
export function remount(dir: string, opts: 'ro' | 'rw'): void {
  const r = run(['mount', '-o', `remount,${opts}`, dir]);
  if (!r.ok) throw new Error(`mount -o remount,${opts} ${dir}: ${r.output}`);
}

/** Writes zeros to `path` until the file system is full; returns the bytes written. */
export function fillUp(path: string): number {
  const fd = openSync(path, 'w');
  const chunk = Buffer.alloc(64 * 1024);
  let total = 0;
  try {
    for (;;) total += writeSync(fd, chunk);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOSPC') throw err;
  } finally {
    closeSync(fd);
  }
  return total;
}

/** Unmounts (lazily if still busy) and removes every directory `mountTmpfs` made. */
export function unmountAll(): void {
  for (const dir of mounted.splice(0)) {
    if (!run(['umount', dir]).ok) run(['umount', '-l', dir]);
    try {
      rmdirSync(dir);
    } catch {
      // still busy after a lazy unmount: left empty for the system's tmp cleaning
    }
  }
}
