/**
 * runtime/embedded/installation — which installation id a standalone state belongs to. The id
 * is kept in the state file's snapshot line, so it cannot be lost apart from the objects whose
 * instances carry it. `<state>.installation-id` (where earlier builds kept it) is now a copy:
 * read to move the id into a state that lacks it, and rewritten to match, so `cat` shows the id
 * and a deliberately deleted state file starts over as the same installation. A state that
 * holds objects but no id is refused: generating one would replace every instance and leave the
 * old ones, labelled with the lost id, to nobody.
 */
import { randomUUID } from 'node:crypto';
import { closeSync, fsyncSync, openSync, readFileSync, renameSync, unlinkSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { INSTANCE_LABEL_INSTALLATION } from '../../api/constants.ts';
import { installationIdProblem } from '../../provider/installation.ts';
import { settled, tempPathFor } from './temp-files.ts';

/** The copy of the id beside the state file (where earlier builds kept the only one). */
export function legacyInstallationIdPath(statePath: string): string {
  return `${statePath}.installation-id`;
}

/** Where the id in use came from. */
export type InstallationSource = 'state' | 'flag' | 'legacy-file' | 'generated';

export interface ResolvedInstallation {
  id: string;
  source: InstallationSource;
  /** Something the operator should know but that does not stop the start. */
  warning?: string;
  /** What `<state>.installation-id` held at start (undefined: no such file). */
  copy?: string;
}

export interface InstallationInputs {
  statePath: string;
  /** The id in the state file's snapshot line; undefined for a new state or an older build's. */
  kept: string | undefined;
  /** `--installation-id`, already validated. */
  flag: string | undefined;
  /** How many objects the state file holds (0 for a new state). */
  objects: number;
}

/** The id of `<state>.installation-id`, if that file exists; a malformed one is an error naming it. */
export function readLegacyInstallationId(statePath: string): string | undefined {
  const path = legacyInstallationIdPath(statePath);
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new Error(`installation id file ${path}: ${(err as Error).message}`, { cause: err });
  }
  const id = text.trim();
  const problem = installationIdProblem(id, `installation id file ${path}`);
  if (problem) {
    throw new Error(`${problem}; restore it, or delete it only if no instance of this installation exists`);
  }
  return id;
}

/**
 * Decides the id, or throws saying what to do. The state's own id wins and a disagreeing
 * `--installation-id` is an error: the instances already carry the kept id. Without a kept id
 * (a new state, or one written by an older build) the flag wins over a legacy file because the
 * older build used the flag whenever it was given; either is then written into the state.
 */
export function resolveInstallationId(inputs: InstallationInputs): ResolvedInstallation {
  const { statePath, kept, flag, objects } = inputs;
  const legacyPath = legacyInstallationIdPath(statePath);
  const legacy = readLegacyInstallationId(statePath);
  if (kept !== undefined) {
    if (flag !== undefined && flag !== kept) {
      throw new Error(
        `--installation-id ${flag} disagrees with the installation id ${kept} kept in state file ${statePath}: ` +
          `the instances of this state are labelled ${INSTANCE_LABEL_INSTALLATION}=${kept}. Drop the flag ` +
          `or pass --installation-id ${kept}; a different installation needs its own state file`,
      );
    }
    const warning =
      legacy !== undefined && legacy !== kept
        ? `${legacyPath} holds ${legacy}, but state file ${statePath} keeps ${kept}, which is used; the file is rewritten to match`
        : undefined;
    return {
      id: kept,
      source: 'state',
      ...(warning ? { warning } : {}),
      ...(legacy ? { copy: legacy } : {}),
    };
  }
  if (flag !== undefined) {
    const warning =
      legacy !== undefined && legacy !== flag
        ? `--installation-id ${flag} is used and kept in state file ${statePath}; ${legacyPath} held ${legacy} and is rewritten`
        : undefined;
    return { id: flag, source: 'flag', ...(warning ? { warning } : {}), ...(legacy ? { copy: legacy } : {}) };
  }
  if (legacy !== undefined) return { id: legacy, source: 'legacy-file', copy: legacy };
  if (objects > 0) {
    throw new Error(
      `state file ${statePath} holds ${objects} object(s) but no installation id, and ${legacyPath} does ` +
        'not exist; refusing to start as a new installation, which would replace every instance and leave ' +
        `the old ones to nobody. Restore ${legacyPath} (or the state file) from a backup, or pass ` +
        `--installation-id <id> with the old id (the ${INSTANCE_LABEL_INSTALLATION} label of its instances)`,
    );
  }
  return { id: randomUUID(), source: 'generated' };
}

/**
 * Writes the copy beside the state file (temporary file, fsync, rename, fsync of the directory):
 * a crash leaves the old copy or the new one. Only a convenience, so a failure is the caller's
 * to log, not a reason to stop.
 */
export function writeInstallationIdCopy(statePath: string, id: string): void {
  const path = legacyInstallationIdPath(statePath);
  const tmp = tempPathFor(path);
  try {
    const fd = openSync(tmp, 'w', 0o644);
    try {
      writeSync(fd, `${id}\n`);
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
  } finally {
    settled(tmp);
  }
  const dir = openSync(dirname(path), 'r');
  try {
    fsyncSync(dir);
  } finally {
    closeSync(dir);
  }
}
