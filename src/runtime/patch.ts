/**
 * runtime/patch — JSON merge patch (RFC 7386) and JSON patch (RFC 6902), pure functions on
 * plain JSON values. Both store backends and the Kubernetes test server apply patches through
 * here, so a patch means the same thing in every mode.
 */

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

/** `bad`: the patch document itself is malformed (HTTP 400); `failed`: it cannot apply (422). */
export class PatchError extends Error {
  readonly kind: 'bad' | 'failed';
  constructor(kind: 'bad' | 'failed', message: string) {
    super(message);
    this.name = 'PatchError';
    this.kind = kind;
  }
}

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export function deepClone<T>(v: T): T {
  return v === undefined ? v : (JSON.parse(JSON.stringify(v)) as T);
}

export function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    return a.every((x, i) => deepEqual(x, b[i]));
  }
  if (isPlainObject(a) && isPlainObject(b)) {
    const ka = Object.keys(a).filter((k) => a[k] !== undefined);
    const kb = Object.keys(b).filter((k) => b[k] !== undefined);
    if (ka.length !== kb.length) return false;
    return ka.every((k) => deepEqual(a[k], b[k]));
  }
  return false;
}

/** RFC 7386: objects merge recursively, `null` deletes, everything else replaces. */
export function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isPlainObject(patch)) return deepClone(patch);
  const out: Record<string, unknown> = isPlainObject(target) ? deepClone(target) : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

export interface JsonPatchOp {
  op: 'add' | 'remove' | 'replace' | 'move' | 'copy' | 'test';
  path: string;
  value?: unknown;
  from?: string;
}

/** Validates the shape of a JSON patch document (400 on failure). */
export function parseJsonPatch(body: unknown): JsonPatchOp[] {
  if (!Array.isArray(body)) {
    throw new PatchError('bad', 'json patch must be an array of operations');
  }
  return body.map((raw, i) => {
    if (!isPlainObject(raw)) throw new PatchError('bad', `json patch operation ${i} is not an object`);
    const op = raw.op;
    if (typeof op !== 'string' || !['add', 'remove', 'replace', 'move', 'copy', 'test'].includes(op)) {
      throw new PatchError('bad', `json patch operation ${i}: unknown op ${JSON.stringify(op)}`);
    }
    if (typeof raw.path !== 'string') throw new PatchError('bad', `json patch operation ${i}: missing path`);
    if ((op === 'move' || op === 'copy') && typeof raw.from !== 'string') {
      throw new PatchError('bad', `json patch operation ${i}: missing from`);
    }
    if ((op === 'add' || op === 'replace' || op === 'test') && !('value' in raw)) {
      throw new PatchError('bad', `json patch operation ${i}: missing value`);
    }
    return raw as unknown as JsonPatchOp;
  });
}

function pointer(path: string): string[] {
  if (path === '') return [];
  if (!path.startsWith('/')) throw new PatchError('failed', `invalid JSON pointer "${path}"`);
  return path
    .slice(1)
    .split('/')
    .map((s) => s.replaceAll('~1', '/').replaceAll('~0', '~'));
}

type Container = Record<string, unknown> | unknown[];

function resolveParent(doc: unknown, tokens: string[], path: string): { parent: Container; last: string } {
  let cur: unknown = doc;
  for (const t of tokens.slice(0, -1)) {
    if (Array.isArray(cur)) cur = cur[arrayIndex(cur, t, path, false)];
    else if (isPlainObject(cur) && Object.hasOwn(cur, t)) cur = cur[t];
    else throw new PatchError('failed', `path "${path}" does not exist`);
  }
  if (!Array.isArray(cur) && !isPlainObject(cur))
    throw new PatchError('failed', `path "${path}" does not exist`);
  return { parent: cur, last: tokens[tokens.length - 1] as string };
}

function arrayIndex(arr: unknown[], token: string, path: string, forAdd: boolean): number {
  if (forAdd && token === '-') return arr.length;
  if (!/^(0|[1-9][0-9]*)$/.test(token)) throw new PatchError('failed', `invalid array index in "${path}"`);
  const i = Number(token);
  if (i > arr.length || (!forAdd && i === arr.length)) {
    throw new PatchError('failed', `array index out of range in "${path}"`);
  }
  return i;
}

function getAt(doc: unknown, path: string): unknown {
  let cur: unknown = doc;
  for (const t of pointer(path)) {
    if (Array.isArray(cur)) cur = cur[arrayIndex(cur, t, path, false)];
    else if (isPlainObject(cur) && Object.hasOwn(cur, t)) cur = cur[t];
    else throw new PatchError('failed', `path "${path}" does not exist`);
  }
  return cur;
}

function removeAt(doc: unknown, path: string): { doc: unknown; removed: unknown } {
  const tokens = pointer(path);
  if (tokens.length === 0) return { doc: undefined, removed: doc };
  const { parent, last } = resolveParent(doc, tokens, path);
  if (Array.isArray(parent)) {
    const i = arrayIndex(parent, last, path, false);
    return { doc, removed: parent.splice(i, 1)[0] };
  }
  if (!Object.hasOwn(parent, last)) throw new PatchError('failed', `path "${path}" does not exist`);
  const removed = parent[last];
  delete parent[last];
  return { doc, removed };
}

function addAt(doc: unknown, path: string, value: unknown, replace: boolean): unknown {
  const tokens = pointer(path);
  if (tokens.length === 0) return deepClone(value);
  const { parent, last } = resolveParent(doc, tokens, path);
  if (Array.isArray(parent)) {
    const i = arrayIndex(parent, last, path, !replace);
    if (replace) parent[i] = deepClone(value);
    else parent.splice(i, 0, deepClone(value));
  } else {
    if (replace && !Object.hasOwn(parent, last))
      throw new PatchError('failed', `path "${path}" does not exist`);
    parent[last] = deepClone(value);
  }
  return doc;
}

/** RFC 6902, atomically: returns a new document or throws PatchError('failed') (a failed `test` too). */
export function applyJsonPatch(doc: unknown, ops: JsonPatchOp[]): unknown {
  let out = deepClone(doc);
  ops.forEach((op, i) => {
    switch (op.op) {
      case 'add':
        out = addAt(out, op.path, op.value, false);
        break;
      case 'replace':
        out = addAt(out, op.path, op.value, true);
        break;
      case 'remove':
        out = removeAt(out, op.path).doc;
        break;
      case 'move': {
        const r = removeAt(out, op.from as string);
        out = addAt(r.doc, op.path, r.removed, false);
        break;
      }
      case 'copy':
        out = addAt(out, op.path, getAt(out, op.from as string), false);
        break;
      case 'test': {
        let actual: unknown;
        try {
          actual = getAt(out, op.path);
        } catch {
          throw new PatchError(
            'failed',
            `json patch operation ${i}: test failed, "${op.path}" does not exist`,
          );
        }
        if (!deepEqual(actual, op.value)) {
          throw new PatchError('failed', `json patch operation ${i}: test failed for "${op.path}"`);
        }
        break;
      }
    }
  });
  return out;
}
