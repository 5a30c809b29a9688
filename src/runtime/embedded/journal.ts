/**
 * runtime/embedded/journal — the standalone state file: one JSON snapshot line followed by one
 * JSON line per committed change, appended and fdatasync'ed before the write is acknowledged.
 * A torn last line (a kill mid-append) was never acknowledged and is ignored. Opening always
 * rewrites a fresh snapshot (temp file + fsync + rename + directory fsync), which also
 * compacts the log; the store compacts again whenever the log grows.
 */
import { constants } from 'node:fs';
import { type FileHandle, open, readFile, rename, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { EngineSnapshot } from '../objects/engine.ts';
import type { StoredObject } from '../objects/types.ts';

const STATE_FORMAT = 'egress-proxies-operator/standalone-state';
const STATE_VERSION = 1;

/** Which manifest a stored object came from, and which labels/annotations the manifest set. */
export interface AppliedManifest {
  file: string;
  labels: string[];
  annotations: string[];
}

export interface PersistedState {
  engine: EngineSnapshot;
  manifests: Record<string, AppliedManifest>;
}

/** One change: an object's new state (null: deleted), or the whole manifest bookkeeping map. */
export type JournalRecord =
  | { rv: number; r: string; k: string; o: StoredObject | null }
  | { m: Record<string, AppliedManifest> };

interface Header {
  format: string;
  version: number;
  resourceVersion: number;
  objects: Record<string, StoredObject[]>;
  manifests: Record<string, AppliedManifest>;
}

export class StateFileError extends Error {
  constructor(path: string, message: string) {
    super(`state file ${path}: ${message}`);
    this.name = 'StateFileError';
  }
}

export const objectKey = (o: StoredObject) =>
  o.metadata.namespace ? `${o.metadata.namespace}/${o.metadata.name}` : o.metadata.name;

/** Reads a state file; undefined when it does not exist. `tornTail` reports an ignored partial last line. */
export async function readState(
  path: string,
): Promise<{ state: PersistedState; tornTail: boolean } | undefined> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
  if (text.trim() === '') return undefined; // created empty by hand: start fresh
  const lines = text.split('\n');
  let tornTail = false;
  const parsed: unknown[] = [];
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i] as string;
    if (line === '') continue;
    try {
      parsed.push(JSON.parse(line));
    } catch {
      if (i === lines.length - 1) {
        tornTail = true; // an append cut short by a crash; never acknowledged
        continue;
      }
      throw new StateFileError(path, `line ${i + 1} is not valid JSON (the file is corrupt)`);
    }
  }
  const header = parsed[0] as Header | undefined;
  if (!header || header.format !== STATE_FORMAT) {
    throw new StateFileError(path, `not a standalone state file (expected format "${STATE_FORMAT}")`);
  }
  if (header.version !== STATE_VERSION) {
    throw new StateFileError(
      path,
      `unsupported state version ${header.version} (this build reads ${STATE_VERSION})`,
    );
  }
  const objects = new Map<string, Map<string, StoredObject>>();
  for (const [r, list] of Object.entries(header.objects)) {
    objects.set(r, new Map(list.map((o) => [objectKey(o), o])));
  }
  let rv = header.resourceVersion;
  let manifests = header.manifests ?? {};
  for (const rec of parsed.slice(1) as JournalRecord[]) {
    if ('m' in rec) {
      manifests = rec.m;
      continue;
    }
    if (!objects.has(rec.r)) objects.set(rec.r, new Map());
    const m = objects.get(rec.r) as Map<string, StoredObject>;
    if (rec.o === null) m.delete(rec.k);
    else m.set(rec.k, rec.o);
    rv = Math.max(rv, rec.rv);
  }
  const snapshot: EngineSnapshot = {
    resourceVersion: rv,
    objects: Object.fromEntries([...objects].map(([r, m]) => [r, [...m.values()]])),
  };
  return { state: { engine: snapshot, manifests }, tornTail };
}

async function fsyncDir(dir: string): Promise<void> {
  let fh: FileHandle | undefined;
  try {
    fh = await open(dir, constants.O_RDONLY);
    await fh.sync();
  } catch {
    // Some filesystems refuse directory fsync; the rename is still atomic.
  } finally {
    await fh?.close();
  }
}

/** The open state file: snapshot on open/compaction, appends in between. */
export class Journal {
  readonly path: string;
  private fh: FileHandle | undefined;
  private recordsSinceSnapshot = 0;

  private constructor(path: string) {
    this.path = path;
  }

  /** Writes `state` as a fresh snapshot (atomically) and opens the file for appending. */
  static async create(path: string, state: PersistedState): Promise<Journal> {
    const j = new Journal(path);
    await j.snapshot(state);
    return j;
  }

  get records(): number {
    return this.recordsSinceSnapshot;
  }

  /** Atomically replaces the file with a snapshot of `state`. */
  async snapshot(state: PersistedState): Promise<void> {
    const header: Header = {
      format: STATE_FORMAT,
      version: STATE_VERSION,
      resourceVersion: state.engine.resourceVersion,
      objects: state.engine.objects,
      manifests: state.manifests,
    };
    const tmp = `${this.path}.tmp-${process.pid}`;
    const fh = await open(tmp, 'w', 0o600);
    try {
      await fh.writeFile(`${JSON.stringify(header)}\n`);
      await fh.sync();
    } finally {
      await fh.close();
    }
    try {
      await rename(tmp, this.path);
    } catch (e) {
      await unlink(tmp).catch(() => {});
      throw e;
    }
    await fsyncDir(dirname(this.path));
    await this.fh?.close();
    this.fh = await open(this.path, 'a', 0o600);
    this.recordsSinceSnapshot = 0;
  }

  /** Appends records and waits until they are on disk. */
  async append(records: JournalRecord[]): Promise<void> {
    if (!this.fh) throw new Error('journal is closed');
    if (records.length === 0) return;
    await this.fh.write(records.map((r) => `${JSON.stringify(r)}\n`).join(''));
    await this.fh.datasync();
    this.recordsSinceSnapshot += records.length;
  }

  async close(): Promise<void> {
    await this.fh?.close();
    this.fh = undefined;
  }
}
