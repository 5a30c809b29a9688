/**
 * runtime/objects/owners — ownerReference garbage collection on an ObjectEngine, as the
 * Kubernetes garbage collector does it with background propagation: once an object is gone,
 * every object naming it in `metadata.ownerReferences` whose owners are all gone is deleted —
 * an ordinary delete, so a dependent's finalizers still run first — and a dependent that keeps
 * another owner loses the references to the gone ones; optionally, a dependent written naming
 * only owners that do not exist is deleted too. The standalone store and the Kubernetes REST
 * test server turn it on; deleting a ProxyPool deletes its Proxies this way.
 */
import type { ObjectEngine } from './engine.ts';
import { apiVersionOf, qualifiedName, type StoredObject } from './types.ts';

interface Dependent {
  resource: string;
  namespace: string | undefined;
  name: string;
  uid: string;
}

export interface OwnerCollector {
  /** Stops following the engine. */
  stop(): void;
  /** Resolves once every deletion the collector started so far has been committed. */
  settled(): Promise<void>;
}

/**
 * Follows `engine` from now on. Dependents whose owners vanished while nobody collected (a crash
 * between an owner's deletion and its dependents', a restored state) are deleted at once, but
 * only where the owner's kind is served by this engine — anything else cannot be judged.
 */
export function collectOwnedObjects(
  engine: ObjectEngine,
  opts: {
    /**
     * Also delete an object written naming only owners that do not exist, as the Kubernetes
     * collector does once it has looked each owner up (the REST test server turns it on).
     */
    danglingWrites?: boolean;
  } = {},
): OwnerCollector {
  const live = new Set<string>();
  /** owner uid → dependents naming it. */
  const dependents = new Map<string, Map<string, Dependent>>();
  const servedKinds = new Set(engine.types().map((t) => `${apiVersionOf(t)}|${t.kind}`));
  let work = Promise.resolve();

  const depKey = (d: Dependent) => `${d.resource}|${d.namespace ?? ''}/${d.name}`;
  const track = (resource: string, o: StoredObject, add: boolean) => {
    const uid = o.metadata.uid;
    if (!uid) return;
    if (add) live.add(uid);
    else live.delete(uid);
    const d: Dependent = { resource, namespace: o.metadata.namespace, name: o.metadata.name, uid };
    for (const ref of o.metadata.ownerReferences ?? []) {
      let set = dependents.get(ref.uid);
      if (!set && add) {
        set = new Map();
        dependents.set(ref.uid, set);
      }
      if (add) set?.set(depKey(d), d);
      else {
        set?.delete(depKey(d));
        if (set?.size === 0) dependents.delete(ref.uid);
      }
    }
  };
  const orphaned = (o: StoredObject) => {
    const refs = o.metadata.ownerReferences ?? [];
    return refs.length > 0 && refs.every((r) => !live.has(r.uid));
  };
  /** Only an owner of a kind this engine serves can be known to be gone. */
  const judged = (r: { apiVersion: string; kind: string }) => servedKinds.has(`${r.apiVersion}|${r.kind}`);
  const remove = (d: Dependent) => {
    const c = engine.collection(d.resource);
    const cur = c.get(d.namespace, d.name);
    if (!cur || cur.metadata.uid !== d.uid || cur.metadata.deletionTimestamp) return;
    if (orphaned(cur)) {
      c.delete(d.namespace, d.name, { uid: d.uid });
      return;
    }
    const refs = cur.metadata.ownerReferences ?? [];
    const kept = refs.filter((r) => live.has(r.uid) || !judged(r));
    if (kept.length < refs.length) {
      c.patch(
        'merge',
        { metadata: { resourceVersion: cur.metadata.resourceVersion, ownerReferences: kept } },
        { ...(d.namespace ? { namespace: d.namespace } : {}), name: d.name },
      );
    }
  };
  const dependent = (resource: string, o: StoredObject): Dependent => ({
    resource,
    namespace: o.metadata.namespace,
    name: o.metadata.name,
    uid: o.metadata.uid ?? '',
  });
  // Deletions run after the commit that caused them has reached every listener (the journal
  // records changes in commit order), never nested inside it.
  const later = (ds: Dependent[]) => {
    work = work.then(() => {
      for (const d of ds) remove(d);
    });
  };

  for (const t of engine.types()) {
    for (const o of engine.collection(t).all()) track(qualifiedName(t), o, true);
  }
  const stale: Dependent[] = [];
  for (const t of engine.types()) {
    for (const o of engine.collection(t).all()) {
      const refs = o.metadata.ownerReferences ?? [];
      if (refs.every(judged) && orphaned(o)) stale.push(dependent(qualifiedName(t), o));
    }
  }
  if (stale.length > 0) later(stale);

  const off = engine.onCommit((ev) => {
    const resource = qualifiedName(ev.resource);
    if (ev.old) track(resource, ev.old, false);
    if (ev.type !== 'DELETED') {
      track(resource, ev.object, true);
      // Written naming only owners known to be gone (or never there): nothing will own it.
      const refs = ev.object.metadata.ownerReferences ?? [];
      if (opts.danglingWrites && refs.length > 0 && refs.every(judged) && orphaned(ev.object))
        later([dependent(resource, ev.object)]);
      return;
    }
    const uid = ev.object.metadata.uid;
    const owned = uid ? dependents.get(uid) : undefined;
    if (owned && owned.size > 0) later([...owned.values()]);
  });
  return {
    stop: off,
    settled: async () => {
      let seen: Promise<void>;
      do {
        seen = work;
        await seen;
      } while (seen !== work);
    },
  };
}
