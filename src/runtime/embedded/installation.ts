/**
 * runtime/embedded/installation — which installation id a standalone state belongs to. The id
 * is kept in the state file's snapshot line, so it cannot be lost apart from the objects whose
 * instances carry it; an earlier build's `<state>.installation-id` file is read once, to move
 * the id into the state. A state that holds objects but no id is refused: generating one would
 * replace every instance and leave the old ones, labelled with the lost id, to nobody.
 */
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { INSTANCE_LABEL_INSTALLATION } from '../../api/constants.ts';
import { installationIdProblem } from '../../provider/installation.ts';

/** Where builds before the id moved into the state file kept it. */
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
        ? `${legacyPath} holds ${legacy}, but state file ${statePath} keeps ${kept}, which is used; the file is no longer read`
        : undefined;
    return { id: kept, source: 'state', ...(warning ? { warning } : {}) };
  }
  if (flag !== undefined) {
    const warning =
      legacy !== undefined && legacy !== flag
        ? `--installation-id ${flag} is used and kept in state file ${statePath}; ${legacyPath} holds ${legacy}, which is not used`
        : undefined;
    return { id: flag, source: 'flag', ...(warning ? { warning } : {}) };
  }
  if (legacy !== undefined) return { id: legacy, source: 'legacy-file' };
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
