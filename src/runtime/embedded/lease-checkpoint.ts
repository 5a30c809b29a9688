/**
 * runtime/embedded/lease-checkpoint — the standalone home of the lease checkpoint: a file
 * beside the state file (`<state>.leases`), kept apart from the object journal because it is
 * replaced whole every few seconds rather than appended to. Written atomically (temporary file,
 * fsync, rename, fsync of the directory): a crash leaves the previous checkpoint or the new
 * one, never a mix, and a save cut short by a full disk leaves no temporary file behind. The
 * state lock already keeps a second process away from it. A damaged one is kept aside by
 * renaming it to `<state>.leases.damaged-<stamp>` (lease/checkpoint decides when).
 */
import { open, readFile, rename, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import { asideStamp, type CheckpointStorage } from '../../lease/checkpoint.ts';
import type { WriteHealth } from './state-writes.ts';
import { settled, tempPathFor } from './temp-files.ts';

export function leaseCheckpointPath(statePath: string): string {
  return `${statePath}.leases`;
}

export class FileCheckpoint implements CheckpointStorage {
  readonly where: string;
  private readonly path: string;
  private readonly health: WriteHealth | undefined;

  /** `health`: told about every save, so a disk that stops taking them fails readiness. */
  constructor(path: string, health?: WriteHealth) {
    this.path = path;
    this.where = path;
    this.health = health;
  }

  async load(): Promise<string | undefined> {
    try {
      return await readFile(this.path, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw err;
    }
  }

  async setAside(at: number): Promise<string> {
    const aside = `${this.path}.damaged-${asideStamp(at)}`;
    await rename(this.path, aside);
    await this.syncDir();
    return aside;
  }

  async save(text: string): Promise<void> {
    try {
      await this.write(text);
    } catch (err) {
      this.health?.failed(err);
      throw err;
    }
    this.health?.succeeded();
  }

  private async write(text: string): Promise<void> {
    const tmp = tempPathFor(this.path);
    try {
      const fh = await open(tmp, 'w', 0o600);
      try {
        await fh.writeFile(text, 'utf8');
        await fh.datasync();
      } finally {
        await fh.close();
      }
      await rename(tmp, this.path);
    } catch (err) {
      // A full disk leaves a partial temporary file: remove it, or it keeps the space taken.
      await unlink(tmp).catch(() => {});
      throw err;
    } finally {
      settled(tmp);
    }
    await this.syncDir();
  }

  /** Makes a rename in the checkpoint's directory durable. */
  private async syncDir(): Promise<void> {
    const dir = await open(dirname(this.path), 'r');
    try {
      await dir.sync();
    } finally {
      await dir.close();
    }
  }
}
