/**
 * runtime/embedded/installation — the standalone installation id: generated once and kept in a
 * small file beside the state file (`<state>.installation-id`), so a restart keeps labelling,
 * collecting and hashing as the same installation. Written atomically (temporary file, fsync,
 * rename, fsync of the directory): a crash leaves either no file or the whole id.
 */
import { randomUUID } from 'node:crypto';
import { closeSync, fsyncSync, openSync, readFileSync, renameSync, unlinkSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { installationIdProblem } from '../../provider/installation.ts';

/** Where the installation id of the state file `statePath` is kept. */
export function installationIdPath(statePath: string): string {
  return `${statePath}.installation-id`;
}

export interface StandaloneInstallation {
  id: string;
  path: string;
  /** True when this call generated the id (first start, or first start after an upgrade). */
  created: boolean;
}

/**
 * Reads the id kept beside `statePath`, or generates and keeps one when there is none. A file
 * that exists but holds no valid id is an error naming it: quietly becoming a new installation
 * would leave every instance of the old one to nobody.
 */
export function loadOrCreateInstallationId(statePath: string): StandaloneInstallation {
  const path = installationIdPath(statePath);
  let text: string | undefined;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') {
      throw new Error(`installation id file ${path}: ${(err as Error).message}`, { cause: err });
    }
  }
  if (text !== undefined) {
    const id = text.trim();
    const problem = installationIdProblem(id, `installation id file ${path}`);
    if (problem) {
      throw new Error(`${problem}; restore it, or delete it only if no instance of this installation exists`);
    }
    return { id, path, created: false };
  }
  const id = randomUUID();
  writeAtomically(path, `${id}\n`);
  return { id, path, created: true };
}

function writeAtomically(path: string, content: string): void {
  const tmp = `${path}.tmp-${process.pid}`;
  try {
    const fd = openSync(tmp, 'w', 0o644);
    try {
      writeSync(fd, content);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, path);
  } catch (err) {
    try {
      unlinkSync(tmp);
    } catch {
      // Nothing was written, or it was renamed already.
    }
    throw new Error(`installation id file ${path}: ${(err as Error).message}`, { cause: err });
  }
  const dir = openSync(dirname(path), 'r');
  try {
    fsyncSync(dir);
  } finally {
    closeSync(dir);
  }
}
