/**
 * runtime/embedded/journal — the standalone state file: one JSON snapshot line followed by one
 * JSON line per committed change, appended and fdatasync'ed before the write is acknowledged.
 * A torn last line (a kill mid-append) was never acknowledged and is ignored; an empty file, a
 * cut snapshot or a record of the wrong shape stops the start with the file and line. Opening always
 * rewrites a fresh snapshot (temp file + fsync + rename + directory fsync), which also
 * compacts the log; the store compacts again whenever the log grows. The snapshot line also
 * carries the installation id, so every rewrite keeps it with the objects it belongs to.
 */
import { constants } from 'node:fs';
import { type FileHandle, open, readFile, rename, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import { installationIdProblem } from '../../provider/installation.ts';
import type { EngineSnapshot } from '../objects/engine.ts';
import type { StoredObject } from '../objects/types.ts';
import { settled, tempPathFor, writingInPlace } from './temp-files.ts';

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
  /** Absent only in a state file written before the id moved into it. */
  installationId?: string;
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
  installation?: string;
}

export class StateFileError extends Error {
  constructor(path: string, message: string) {
    super(`state file ${path}: ${message}`);
    this.name = 'StateFileError';
  }
}

export const objectKey = (o: StoredObject) =>
  o.metadata.namespace ? `${o.metadata.namespace}/${o.metadata.name}` : o.metadata.name;

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/** Why `o` is not a stored object, or undefined when it is one. */
function objectProblem(o: unknown): string | undefined {
  if (!isObject(o)) return 'must be an object';
  const meta = o.metadata;
  if (!isObject(meta)) return 'metadata must be an object';
  if (typeof meta.name !== 'string' || meta.name === '') return 'metadata.name must be a non-empty string';
  if (meta.namespace !== undefined && typeof meta.namespace !== 'string')
    return 'metadata.namespace must be a string';
  return undefined;
}

function manifestsProblem(m: unknown): string | undefined {
  if (!isObject(m)) return 'must be an object';
  for (const [k, a] of Object.entries(m)) {
    const strings = (v: unknown) => Array.isArray(v) && v.every((x) => typeof x === 'string');
    if (!isObject(a) || typeof a.file !== 'string' || !strings(a.labels) || !strings(a.annotations))
      return `[${JSON.stringify(k)}] must be {file, labels, annotations}`;
  }
  return undefined;
}

/** The snapshot line's shape: the field at fault, or undefined. */
function headerProblem(h: Record<string, unknown>): string | undefined {
  if (!Number.isSafeInteger(h.resourceVersion) || (h.resourceVersion as number) < 0)
    return 'resourceVersion must be a non-negative integer';
  if (!isObject(h.objects)) return 'objects must be an object of lists';
  for (const [r, list] of Object.entries(h.objects)) {
    if (!Array.isArray(list)) return `objects[${JSON.stringify(r)}] must be a list`;
    for (const [i, o] of list.entries()) {
      const p = objectProblem(o);
      if (p) return `objects[${JSON.stringify(r)}][${i}]: ${p}`;
    }
  }
  if (h.manifests !== undefined) {
    const p = manifestsProblem(h.manifests);
    if (p) return `manifests${p.startsWith('[') ? '' : ' '}${p}`;
  }
  if (h.installation !== undefined) {
    if (typeof h.installation !== 'string') return 'installation must be a string';
    const p = installationIdProblem(h.installation, 'installation');
    if (p) return p;
  }
  return undefined;
}

/** A journal record's shape: what is wrong, or undefined. */
function recordProblem(rec: unknown): string | undefined {
  if (!isObject(rec)) return 'a record must be an object';
  if ('m' in rec) {
    const p = manifestsProblem(rec.m);
    return p ? `m${p.startsWith('[') ? '' : ' '}${p}` : undefined;
  }
  if (!Number.isSafeInteger(rec.rv)) return 'rv must be an integer';
  if (typeof rec.r !== 'string' || rec.r === '') return 'r must be a resource name';
  if (typeof rec.k !== 'string' || rec.k === '') return 'k must be an object key';
  if (rec.o !== null) {
    const p = objectProblem(rec.o);
    if (p) return `o: ${p}`;
    if (objectKey(rec.o as StoredObject) !== rec.k) return `k "${rec.k}" does not name object o`;
  }
  return undefined;
}

/** Where to start over deliberately, for every error that stops the start. */
const START_FRESH = 'to start a fresh fleet deliberately, stop the operator and delete the file';

/**
 * Parses the lines of a state file. A torn LAST record line is an append cut short by a crash
 * (never acknowledged) and is reported, not fatal; a cut snapshot line is data loss, because
 * the snapshot is only ever replaced whole (rename), so no crash can leave it partial.
 */
function parseLines(path: string, text: string): { parsed: unknown[]; lineNo: number[]; tornTail: boolean } {
  const lines = text.split('\n');
  const parsed: unknown[] = [];
  const lineNo: number[] = [];
  let tornTail = false;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i] as string;
    if (line.trim() === '') continue;
    try {
      parsed.push(JSON.parse(line));
      lineNo.push(i + 1);
    } catch {
      if (i === lines.length - 1 && parsed.length > 0) {
        tornTail = true; // an append cut short by a crash; never acknowledged
        continue;
      }
      const head = `{"format":"${STATE_FORMAT}"`;
      if (i === lines.length - 1 && parsed.length === 0 && (line.startsWith(head) || head.startsWith(line))) {
        throw new StateFileError(
          path,
          'line 1 (the snapshot) is cut short: the file was truncated and the acknowledged state ' +
            `it held is lost. Restore the file from a backup; ${START_FRESH}`,
        );
      }
      throw new StateFileError(path, `line ${i + 1} is not valid JSON (the file is corrupt)`);
    }
  }
  return { parsed, lineNo, tornTail };
}

/**
 * Reads a state file; undefined when it does not exist. `tornTail` reports an ignored partial
 * last line. An empty file is refused: starting afresh over it would mint new UIDs and
 * credentials and leave every existing instance orphaned.
 */
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
  if (text.trim() === '') {
    throw new StateFileError(
      path,
      'the file is empty (or holds only whitespace), so the state it held is lost; refusing to ' +
        `start a fresh fleet over it. Restore the file from a backup; ${START_FRESH}`,
    );
  }
  const { parsed, lineNo, tornTail } = parseLines(path, text);
  const header = parsed[0];
  if (!isObject(header) || header.format !== STATE_FORMAT) {
    throw new StateFileError(path, `line 1: not a standalone state file (expected format "${STATE_FORMAT}")`);
  }
  if (header.version !== STATE_VERSION) {
    throw new StateFileError(
      path,
      `line 1: unsupported state version ${JSON.stringify(header.version)} (this build reads ${STATE_VERSION})`,
    );
  }
  const problem = headerProblem(header);
  if (problem) throw new StateFileError(path, `line 1: ${problem}`);
  const h = header as unknown as Header;
  const objects = new Map<string, Map<string, StoredObject>>();
  for (const [r, list] of Object.entries(h.objects)) {
    objects.set(r, new Map(list.map((o) => [objectKey(o), o])));
  }
  let rv = h.resourceVersion;
  let manifests = h.manifests ?? {};
  for (let i = 1; i < parsed.length; i++) {
    const p = recordProblem(parsed[i]);
    if (p) throw new StateFileError(path, `line ${lineNo[i]}: ${p}`);
    const rec = parsed[i] as JournalRecord;
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
  const state: PersistedState = { engine: snapshot, manifests };
  if (h.installation !== undefined) state.installationId = h.installation;
  return { state, tornTail };
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

/**
 * The state file: snapshot on open/compaction, appends in between. Each append opens the file,
 * writes, fdatasyncs and closes it: no descriptor stays open for writing between commits, so a
 * snapshot's rename is followed by the next append whatever happened to the old file, and an
 * administrator can remount the state directory read-only while the process runs.
 */
export class Journal {
  readonly path: string;
  private open = true;
  /** Bytes of complete lines in the file: where a failed append is cut back to. */
  private size = 0;
  private recordsSinceSnapshot = 0;

  private constructor(path: string) {
    this.path = path;
  }

  /** Writes `state` as a fresh snapshot (atomically). */
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
    // The id first: `head -c 200 <state>` shows it without reading the objects.
    const header: Header = {
      format: STATE_FORMAT,
      version: STATE_VERSION,
      ...(state.installationId !== undefined ? { installation: state.installationId } : {}),
      resourceVersion: state.engine.resourceVersion,
      objects: state.engine.objects,
      manifests: state.manifests,
    };
    const text = `${JSON.stringify(header)}\n`;
    const tmp = tempPathFor(this.path);
    try {
      const fh = await open(tmp, 'w', 0o600);
      try {
        await fh.writeFile(text);
        await fh.sync();
      } finally {
        await fh.close();
      }
      await rename(tmp, this.path);
    } catch (e) {
      // A full disk leaves a partial temporary file: remove it, or it keeps the space taken.
      await unlink(tmp).catch(() => {});
      throw e;
    } finally {
      settled(tmp);
    }
    await fsyncDir(dirname(this.path));
    this.size = Buffer.byteLength(text);
    this.recordsSinceSnapshot = 0;
  }

  /**
   * Appends records and waits until they are on disk. A write that fails part-way (ENOSPC,
   * EDQUOT, EIO) is cut back to the last complete record, so no torn line stays behind for a
   * later append to follow; the caller rewrites the file whole (snapshot) before appending again.
   */
  async append(records: JournalRecord[]): Promise<void> {
    if (!this.open) throw new Error('journal is closed');
    if (records.length === 0) return;
    const data = Buffer.from(records.map((r) => `${JSON.stringify(r)}\n`).join(''));
    await writingInPlace(async () => {
      const fh = await open(this.path, 'a', 0o600);
      try {
        // One write(2) may take only part of the buffer (a disk filling up): write the rest.
        for (let done = 0; done < data.length; ) {
          done += (await fh.write(data, done, data.length - done)).bytesWritten;
        }
        await fh.datasync();
      } catch (e) {
        await fh.truncate(this.size).catch(() => {}); // best effort: a torn last line is ignored on read
        throw e;
      } finally {
        await fh.close();
      }
    });
    this.size += data.length;
    this.recordsSinceSnapshot += records.length;
  }

  async close(): Promise<void> {
    this.open = false;
  }
}
