/**
 * runtime/kube/rest — the REST calls of each resource the store caches (Proxies and
 * ProviderHealths through the custom-objects API, Secrets through the core API), behind one
 * RawApi shape, each call named for its errors and answered as plain JSON.
 */

import { GROUP, VERSION } from '../../api/constants.ts';
import type { KubeObject, ObjectKey, Secret } from '../../api/meta.ts';
import { StoreError } from '../store.ts';
import { callOptions, type KubeClients } from './client.ts';
import { kubeCall } from './errors.ts';
import type { ListPage } from './reflector.ts';

/** Plain JSON, as the watch delivers it: typed client models carry Dates and class prototypes. */
function toPlain<T>(v: unknown): T {
  return JSON.parse(JSON.stringify(v)) as T;
}

/** REST operations on one resource type; namespaced or cluster-scoped. */
export interface RawApi<T extends KubeObject> {
  readonly what: string;
  collectionPath(namespace?: string): string;
  list(
    namespace: string | undefined,
    q: { labelSelector?: string; limit: number; continue?: string },
    signal: AbortSignal,
  ): Promise<ListPage<T>>;
  read(key: ObjectKey, signal?: AbortSignal): Promise<T>;
  create(obj: T, signal?: AbortSignal): Promise<T>;
  replace(obj: T, signal?: AbortSignal): Promise<T>;
  patch(
    key: ObjectKey,
    body: unknown,
    type: 'merge' | 'json',
    status: boolean,
    signal?: AbortSignal,
  ): Promise<T>;
  delete(key: ObjectKey, uid: string | undefined, signal?: AbortSignal): Promise<unknown>;
}

function requireNamespace(what: string, key: ObjectKey): string {
  if (!key.namespace)
    throw new StoreError('Invalid', 422, `${what} ${key.name}: metadata.namespace is required`);
  return key.namespace;
}

export function customApi<T extends KubeObject>(
  c: KubeClients,
  plural: string,
  namespaced: boolean,
): RawApi<T> {
  const co = c.customObjects;
  const base = { group: GROUP, version: VERSION, plural };
  const label = (key: ObjectKey) => `${plural} ${key.namespace ? `${key.namespace}/` : ''}${key.name}`;
  const call = <R>(what: string, fn: () => Promise<unknown>) => kubeCall(what, fn) as Promise<R>;
  return {
    what: plural,
    collectionPath: (ns) =>
      namespaced && ns
        ? `/apis/${GROUP}/${VERSION}/namespaces/${ns}/${plural}`
        : `/apis/${GROUP}/${VERSION}/${plural}`,
    list: (ns, q, signal) => {
      const p = { ...base, labelSelector: q.labelSelector, limit: q.limit, _continue: q.continue };
      return call(`list ${plural}`, () =>
        namespaced && ns
          ? co.listNamespacedCustomObject({ ...p, namespace: ns }, callOptions({ signal }))
          : co.listClusterCustomObject(p, callOptions({ signal })),
      );
    },
    read: (key, signal) =>
      call(`get ${label(key)}`, () =>
        namespaced
          ? co.getNamespacedCustomObject(
              { ...base, namespace: requireNamespace(plural, key), name: key.name },
              callOptions({ signal }),
            )
          : co.getClusterCustomObject({ ...base, name: key.name }, callOptions({ signal })),
      ),
    create: (obj, signal) =>
      call(`create ${label(obj.metadata)}`, () =>
        namespaced
          ? co.createNamespacedCustomObject(
              { ...base, namespace: requireNamespace(plural, obj.metadata), body: obj },
              callOptions({ signal }),
            )
          : co.createClusterCustomObject({ ...base, body: obj }, callOptions({ signal })),
      ),
    replace: (obj, signal) =>
      call(`update ${label(obj.metadata)}`, () =>
        namespaced
          ? co.replaceNamespacedCustomObject(
              {
                ...base,
                namespace: requireNamespace(plural, obj.metadata),
                name: obj.metadata.name,
                body: obj,
              },
              callOptions({ signal }),
            )
          : co.replaceClusterCustomObject(
              { ...base, name: obj.metadata.name, body: obj },
              callOptions({ signal }),
            ),
      ),
    patch: (key, body, type, status, signal) => {
      const o = callOptions({ signal, patch: type });
      const what = `patch ${label(key)}${status ? '/status' : ''}`;
      if (namespaced) {
        const p = { ...base, namespace: requireNamespace(plural, key), name: key.name, body };
        return call(what, () =>
          status ? co.patchNamespacedCustomObjectStatus(p, o) : co.patchNamespacedCustomObject(p, o),
        );
      }
      const p = { ...base, name: key.name, body };
      return call(what, () =>
        status ? co.patchClusterCustomObjectStatus(p, o) : co.patchClusterCustomObject(p, o),
      );
    },
    delete: (key, uid, signal) => {
      const body = uid !== undefined ? { preconditions: { uid } } : undefined;
      return call(`delete ${label(key)}`, () =>
        namespaced
          ? co.deleteNamespacedCustomObject(
              { ...base, namespace: requireNamespace(plural, key), name: key.name, ...(body && { body }) },
              callOptions({ signal }),
            )
          : co.deleteClusterCustomObject(
              { ...base, name: key.name, ...(body && { body }) },
              callOptions({ signal }),
            ),
      );
    },
  };
}

export function secretApi(c: KubeClients): RawApi<Secret> {
  const core = c.core;
  const label = (key: ObjectKey) => `secrets ${key.namespace ?? ''}/${key.name}`;
  return {
    what: 'secrets',
    collectionPath: (ns) => (ns ? `/api/v1/namespaces/${ns}/secrets` : '/api/v1/secrets'),
    list: async (ns, q, signal) => {
      const p = { labelSelector: q.labelSelector, limit: q.limit, _continue: q.continue };
      const out = await kubeCall('list secrets', () =>
        ns
          ? core.listNamespacedSecret({ ...p, namespace: ns }, callOptions({ signal }))
          : core.listSecretForAllNamespaces(p, callOptions({ signal })),
      );
      return toPlain<ListPage<Secret>>(out);
    },
    read: async (key, signal) =>
      toPlain<Secret>(
        await kubeCall(`get ${label(key)}`, () =>
          core.readNamespacedSecret(
            { namespace: requireNamespace('secrets', key), name: key.name },
            callOptions({ signal }),
          ),
        ),
      ),
    create: async (obj, signal) =>
      toPlain<Secret>(
        await kubeCall(`create ${label(obj.metadata)}`, () =>
          core.createNamespacedSecret(
            { namespace: requireNamespace('secrets', obj.metadata), body: obj as never },
            callOptions({ signal }),
          ),
        ),
      ),
    replace: async () => {
      throw new StoreError('BadRequest', 400, 'secrets: update is not supported by this store');
    },
    patch: async (key, body, type, status, signal) => {
      // Only metadata is patched (labels on a referenced credentials Secret); no status.
      if (status) throw new StoreError('BadRequest', 400, 'secrets have no status subresource');
      return toPlain<Secret>(
        await kubeCall(`patch ${label(key)}`, () =>
          core.patchNamespacedSecret(
            { namespace: requireNamespace('secrets', key), name: key.name, body },
            callOptions({ signal, patch: type }),
          ),
        ),
      );
    },
    delete: (key, _uid, signal) =>
      kubeCall(`delete ${label(key)}`, () =>
        core.deleteNamespacedSecret(
          { namespace: requireNamespace('secrets', key), name: key.name },
          callOptions({ signal }),
        ),
      ),
  };
}
