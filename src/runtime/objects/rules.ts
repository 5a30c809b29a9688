/**
 * runtime/objects/rules — the pure rules of Kubernetes object semantics the collections apply:
 * object keys, what counts as spec for `generation`, which metadata the server owns, valid
 * names, and how selector and patch failures map to API errors.
 */
import type { ObjectMeta } from '../../api/meta.ts';
import { PatchError } from '../patch.ts';
import { SelectorError } from '../selector.ts';
import { StoreError } from '../store.ts';
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

export function patchFailure(e: unknown): never {
  if (e instanceof PatchError) {
    throw e.kind === 'bad'
      ? new StoreError('BadRequest', 400, e.message)
      : new StoreError('Invalid', 422, e.message);
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
