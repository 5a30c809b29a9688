/**
 * runtime/objects/rules — the pure rules of Kubernetes object semantics the collections apply:
 * object keys, what counts as spec for `generation`, which metadata the server owns, valid
 * names, and how selector and patch failures map to API errors.
 */
import type { ObjectMeta } from '../../api/meta.ts';
import { applyJsonPatch, isPlainObject, type JsonPatchOp, PatchError } from '../patch.ts';
import { SelectorError } from '../selector.ts';
import { StoreError } from '../store.ts';
import { ObjectError } from './errors.ts';
import type { ResourceType, StoredObject } from './types.ts';

export const storeKey = (ns: string | undefined, name: string) => (ns ? `${ns}/${name}` : name);

/** Everything that counts as "spec" for generation: the object minus metadata, status and type info. */
export function specPart(type: ResourceType, obj: StoredObject): Record<string, unknown> {
  const { metadata: _m, apiVersion: _a, kind: _k, ...rest } = obj;
  if (type.statusSubresource) delete (rest as Record<string, unknown>).status;
  return rest;
}

export function selectorError(e: unknown): never {
  if (e instanceof SelectorError) throw new StoreError('BadRequest', 400, e.message);
  throw e;
}

/**
 * A patch that cannot be applied. Like the API server: a body that does not decode as the patch
 * type (not an object, not a list of objects) is a 400; an operation that fails — unknown, a
 * path that does not exist, a failed `test` — is a 422 naming nothing.
 */
export function patchFailure(e: unknown, body: unknown, type: PatchType): never {
  if (e instanceof PatchError) {
    const decodes = type === 'json' ? Array.isArray(body) && body.every(isPlainObject) : isPlainObject(body);
    if (!decodes) throw new StoreError('BadRequest', 400, `error decoding patch: ${e.message}`);
    throw new ObjectError('Invalid', 422, e.message, {});
  }
  throw e;
}

export type PatchType = 'merge' | 'json';

export interface WriteTarget {
  /** Namespace from the request path; must match the body's when both are set. */
  namespace?: string;
  /** Name from the request path; must match the body's. */
  name?: string;
  subresource?: 'status';
}

/** A lowercase RFC 1123 subdomain, as the API server requires of object names. */
export function isValidName(name: unknown): boolean {
  return typeof name === 'string' && /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(name) && name.length <= 253;
}

/** Metadata only the server sets: a write carries over the stored values, whatever it sent. */
const SERVER_METADATA: readonly string[] = [
  'name',
  'namespace',
  'uid',
  'creationTimestamp',
  'deletionTimestamp',
  'deletionGracePeriodSeconds',
  'generation',
  'resourceVersion',
];

/** Copies the server-owned metadata (and generateName) of `cur` onto `next`. */
export function keepServerMetadata(next: StoredObject, cur: StoredObject): void {
  const m = next.metadata as ObjectMeta & Record<string, unknown>;
  const c = cur.metadata as ObjectMeta & Record<string, unknown>;
  for (const k of SERVER_METADATA) {
    if (c[k] === undefined) delete m[k];
    else m[k] = c[k];
  }
  delete m.generateName;
  if (c.generateName !== undefined) m.generateName = c.generateName;
}

/**
 * RFC 6902 as the API server applies it, which differs in one place: `replace` of a key an
 * object lacks adds the key instead of failing.
 */
export function kubeJsonPatch(doc: unknown, ops: JsonPatchOp[]): unknown {
  let out = doc;
  for (const op of ops) {
    out = applyJsonPatch(out, [
      op.op === 'replace' && replacesMissingKey(out, op.path) ? { ...op, op: 'add' } : op,
    ]);
  }
  return out;
}

function replacesMissingKey(doc: unknown, path: string): boolean {
  if (!path.startsWith('/')) return false;
  const tokens = path
    .slice(1)
    .split('/')
    .map((t) => t.replaceAll('~1', '/').replaceAll('~0', '~'));
  let cur: unknown = doc;
  for (const t of tokens.slice(0, -1)) {
    if (Array.isArray(cur)) cur = /^(0|[1-9][0-9]*)$/.test(t) ? cur[Number(t)] : undefined;
    else cur = isPlainObject(cur) ? cur[t] : undefined;
  }
  return isPlainObject(cur) && !Object.hasOwn(cur, tokens.at(-1) as string);
}

/** Metadata lists and maps the API server drops when empty (they are `omitempty`). */
const OMIT_EMPTY_METADATA = ['labels', 'annotations', 'finalizers', 'ownerReferences'] as const;

export function omitEmptyMetadata(obj: StoredObject): void {
  const m = obj.metadata as Record<string, unknown>;
  for (const k of OMIT_EMPTY_METADATA) {
    const v = m[k];
    if (
      v === null ||
      (Array.isArray(v) && v.length === 0) ||
      (isPlainObject(v) && Object.keys(v).length === 0)
    )
      delete m[k];
  }
}
