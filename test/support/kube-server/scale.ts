/**
 * kube-server/scale — the `scale` subresource of a custom resource, as the API server serves it
 * (autoscaling/v1 Scale): GET reads replicas and the selector at the CRD's paths, PUT and PATCH
 * (merge or JSON patch, what `kubectl scale` and an HPA send) write spec replicas back to the
 * object, with the Scale's resourceVersion as a precondition when given.
 */
import type { Collection } from '../../../src/runtime/objects/engine.ts';
import type { StoredObject } from '../../../src/runtime/objects/types.ts';
import { applyJsonPatch, isPlainObject, mergePatch, parseJsonPatch } from '../../../src/runtime/patch.ts';
import { StoreError } from '../../../src/runtime/store.ts';
import { HttpError } from './status.ts';

export interface Scale {
  apiVersion: 'autoscaling/v1';
  kind: 'Scale';
  metadata: Record<string, unknown>;
  spec: { replicas: number };
  status: { replicas: number; selector?: string };
}

function at(obj: unknown, path: string): unknown {
  let cur = obj;
  for (const seg of path.split('.').filter(Boolean)) {
    if (!isPlainObject(cur)) return undefined;
    cur = cur[seg];
  }
  return cur;
}

function nested(path: string, value: unknown): Record<string, unknown> {
  const segs = path.split('.').filter(Boolean);
  let out: unknown = value;
  for (const seg of segs.reverse()) out = { [seg]: out };
  return out as Record<string, unknown>;
}

function scaleOf(c: Collection, obj: StoredObject): Scale {
  const paths = c.type.scale;
  if (!paths) throw new StoreError('NotFound', 404, 'the server could not find the requested resource');
  const m = obj.metadata;
  const selector = at(obj, paths.labelSelectorPath);
  return {
    apiVersion: 'autoscaling/v1',
    kind: 'Scale',
    metadata: {
      name: m.name,
      namespace: m.namespace,
      uid: m.uid,
      resourceVersion: m.resourceVersion,
      creationTimestamp: m.creationTimestamp,
    },
    spec: { replicas: Number(at(obj, paths.specReplicasPath) ?? 0) },
    status: {
      replicas: Number(at(obj, paths.statusReplicasPath) ?? 0),
      ...(typeof selector === 'string' ? { selector } : {}),
    },
  };
}

function invalid(name: string, why: string): StoreError {
  return new StoreError('Invalid', 422, `Scale.autoscaling "${name}" is invalid: ${why}`);
}

/** Writes a (patched or replaced) Scale back: spec replicas, preconditioned on its resourceVersion. */
function writeScale(c: Collection, namespace: string | undefined, name: string, next: unknown): Scale {
  if (!isPlainObject(next) || !isPlainObject(next.spec)) throw invalid(name, 'spec: Required value');
  const replicas = next.spec.replicas;
  // A negative count reaches the object, whose own check refuses it as the apiserver does.
  if (typeof replicas !== 'number' || !Number.isInteger(replicas)) {
    throw invalid(
      name,
      `spec.replicas: Invalid value: ${JSON.stringify(replicas)}: must be a non-negative integer`,
    );
  }
  const paths = c.type.scale;
  if (!paths) throw new StoreError('NotFound', 404, 'the server could not find the requested resource');
  const rv = isPlainObject(next.metadata) ? next.metadata.resourceVersion : undefined;
  const body = nested(paths.specReplicasPath, replicas);
  if (typeof rv === 'string' && rv !== '') body.metadata = { resourceVersion: rv };
  const out = c.patch('merge', body, { ...(namespace ? { namespace } : {}), name });
  return scaleOf(c, out);
}

/** GET, PUT or PATCH on `<resource>/<name>/scale`. */
export function handleScale(
  c: Collection,
  method: string,
  target: { namespace?: string; name: string },
  body: () => unknown,
  patchKind: () => 'merge' | 'json' | 'apply',
): Scale {
  const { namespace, name } = target;
  const cur = c.read(namespace, name);
  if (method === 'GET') return scaleOf(c, cur);
  if (method === 'PUT') return writeScale(c, namespace, name, body());
  if (method === 'PATCH') {
    const kind = patchKind();
    if (kind === 'apply')
      throw new HttpError(415, 'UnsupportedMediaType', 'apply patches on scale are not modelled');
    const current = scaleOf(c, cur);
    const patch = body();
    let next: unknown;
    if (kind === 'json') next = applyJsonPatch(current, parseJsonPatch(patch));
    else {
      if (!isPlainObject(patch)) throw new StoreError('BadRequest', 400, 'patch body must be a JSON object');
      next = mergePatch(current, patch);
    }
    return writeScale(c, namespace, name, next);
  }
  throw new HttpError(
    405,
    'MethodNotAllowed',
    'the server does not allow this method on the requested resource',
  );
}
