/**
 * runtime/objects/collection — one resource type's objects in the engine: reads, and writes
 * with the API server's preconditions (resourceVersion, uid), status subresource, generation,
 * finalizers and deletionTimestamp. Each committed change goes to the collection's history
 * (watchers) and to the engine's listeners.
 */
import type { ObjectMeta } from '../../api/meta.ts';
import {
  applyJsonPatch,
  deepClone,
  deepEqual,
  isPlainObject,
  mergePatch,
  PatchError,
  parseJsonPatch,
} from '../patch.ts';
import {
  type FieldPredicate,
  matchesSelector,
  parseFieldSelector,
  parseSelector,
  type Selector,
} from '../selector.ts';
import { StoreError } from '../store.ts';
import type { EngineEvent, EngineWatch, ListQuery, ObjectEngine, WatchQuery } from './engine.ts';
import { EventHistory, type Watcher } from './history.ts';
import {
  isValidName,
  keepServerMetadata,
  type PatchType,
  patchFailure,
  selectorError,
  specPart,
  storeKey,
  type WriteTarget,
} from './rules.ts';
import { apiVersionOf, qualifiedName, type ResourceType, type StoredObject } from './types.ts';

/** One resource type's objects and history. All methods are synchronous and return copies. */
export class Collection {
  readonly type: ResourceType;
  private readonly engine: ObjectEngine;
  private readonly objects = new Map<string, StoredObject>();
  private readonly history: EventHistory;

  constructor(engine: ObjectEngine, type: ResourceType) {
    this.engine = engine;
    this.type = type;
    this.history = new EventHistory(engine.historyLimit);
  }

  private label(name: string): string {
    return `${qualifiedName(this.type)} "${name}"`;
  }

  notFound(name: string): StoreError {
    return new StoreError('NotFound', 404, `${this.label(name)} not found`);
  }

  private conflict(
    name: string,
    why = 'the object has been modified; please apply your changes to the latest version and try again',
  ): StoreError {
    return new StoreError('Conflict', 409, `Operation cannot be fulfilled on ${this.label(name)}: ${why}`);
  }

  private invalid(name: string, why: string): StoreError {
    return new StoreError('Invalid', 422, `${this.type.kind} "${name}" is invalid: ${why}`);
  }

  private nsFor(ns: string | undefined): string | undefined {
    return this.type.namespaced ? ns : undefined;
  }

  get(namespace: string | undefined, name: string): StoredObject | undefined {
    const o = this.objects.get(storeKey(this.nsFor(namespace), name));
    return o && deepClone(o);
  }

  /** Like get, but throws NotFound. */
  read(namespace: string | undefined, name: string): StoredObject {
    const o = this.get(namespace, name);
    if (!o) throw this.notFound(name);
    return o;
  }

  /** All objects (copies), sorted by namespace/name. */
  all(): StoredObject[] {
    return [...this.objects.entries()]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([, o]) => deepClone(o));
  }

  list(q: ListQuery = {}): { items: StoredObject[]; resourceVersion: string } {
    const match = this.matcher(q);
    // Filter before copying: callers list small subsets of large collections.
    const hits = [...this.objects.entries()].filter(([, o]) => match(o));
    hits.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return { items: hits.map(([, o]) => deepClone(o)), resourceVersion: String(this.engine.resourceVersion) };
  }

  matcher(q: ListQuery): (obj: StoredObject) => boolean {
    let sel: Selector;
    let fields: FieldPredicate;
    try {
      sel = parseSelector(q.labelSelector);
      fields = parseFieldSelector(q.fieldSelector);
    } catch (e) {
      selectorError(e);
    }
    const ns = this.nsFor(q.namespace);
    return (o) =>
      (ns === undefined || o.metadata.namespace === ns) &&
      matchesSelector(sel, o.metadata.labels) &&
      fields(o);
  }

  create(input: StoredObject, target: WriteTarget = {}): StoredObject {
    if (!isPlainObject(input) || !isPlainObject(input.metadata)) {
      throw new StoreError('BadRequest', 400, `${this.type.kind}: metadata is required`);
    }
    const obj = deepClone(input);
    const meta = obj.metadata as ObjectMeta & { generateName?: string; deletionGracePeriodSeconds?: number };
    if (this.type.namespaced) {
      const ns = target.namespace ?? meta.namespace;
      if (target.namespace && meta.namespace && meta.namespace !== target.namespace) {
        throw new StoreError(
          'BadRequest',
          400,
          'the namespace of the provided object does not match the namespace sent on the request',
        );
      }
      if (!ns) throw this.invalid(meta.name ?? '', 'metadata.namespace: Required value');
      meta.namespace = ns;
    } else {
      delete meta.namespace;
    }
    if (!meta.name) {
      if (!meta.generateName) {
        throw this.invalid('', 'metadata.name: Required value: name or generateName is required');
      }
      do {
        meta.name = meta.generateName + Math.random().toString(36).slice(2, 7).padEnd(5, 'x');
      } while (this.objects.has(storeKey(meta.namespace, meta.name)));
    }
    if (!isValidName(meta.name)) {
      throw this.invalid(
        String(meta.name),
        `metadata.name: Invalid value: ${JSON.stringify(meta.name)}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'`,
      );
    }
    const key = storeKey(meta.namespace, meta.name);
    if (this.objects.has(key)) {
      throw new StoreError('AlreadyExists', 409, `${this.label(meta.name)} already exists`);
    }
    obj.apiVersion = apiVersionOf(this.type);
    obj.kind = this.type.kind;
    meta.uid = this.engine.newUid();
    meta.creationTimestamp = this.engine.now();
    delete meta.deletionTimestamp;
    delete meta.deletionGracePeriodSeconds;
    delete meta.resourceVersion;
    if (this.type.generation) meta.generation = 1;
    else delete meta.generation;
    if (this.type.statusSubresource) delete obj.status;
    this.type.normalize?.(obj);
    this.check(obj);
    meta.resourceVersion = String(this.engine.nextRv());
    this.objects.set(key, obj);
    this.record({ type: 'ADDED', object: obj, rv: Number(meta.resourceVersion), resource: this.type });
    return deepClone(obj);
  }

  private check(obj: StoredObject): void {
    const err = this.type.validate?.(obj);
    if (err) throw err;
  }

  private existing(target: WriteTarget, body: StoredObject | undefined): StoredObject {
    const name = target.name ?? body?.metadata?.name;
    if (!name) throw this.invalid('', 'metadata.name: Required value');
    if (target.name && body?.metadata?.name && body.metadata.name !== target.name) {
      throw new StoreError('BadRequest', 400, 'the name of the object does not match the name on the URL');
    }
    const ns = this.nsFor(target.namespace ?? body?.metadata?.namespace);
    if (
      target.namespace &&
      body?.metadata?.namespace &&
      body.metadata.namespace !== target.namespace &&
      this.type.namespaced
    ) {
      throw new StoreError(
        'BadRequest',
        400,
        'the namespace of the provided object does not match the namespace sent on the request',
      );
    }
    const cur = this.objects.get(storeKey(ns, name));
    if (!cur) throw this.notFound(name);
    return cur;
  }

  /** PUT: `metadata.resourceVersion` is required and must match (422 / 409). */
  update(input: StoredObject, target: WriteTarget = {}): StoredObject {
    if (!isPlainObject(input) || !isPlainObject(input.metadata)) {
      throw new StoreError('BadRequest', 400, `${this.type.kind}: metadata is required`);
    }
    const cur = this.existing(target, input);
    const rv = input.metadata.resourceVersion;
    if (rv === undefined || rv === '') {
      throw this.invalid(
        cur.metadata.name,
        'metadata.resourceVersion: Invalid value: 0x0: must be specified for an update',
      );
    }
    if (rv !== cur.metadata.resourceVersion) throw this.conflict(cur.metadata.name);
    return this.replace(cur, deepClone(input), target.subresource);
  }

  /**
   * PATCH: merge (RFC 7386) or JSON (RFC 6902) on the whole object; a `metadata.resourceVersion`
   * in the result that differs from the stored one is a precondition failure (409).
   */
  patch(type: PatchType, body: unknown, target: WriteTarget & { name: string }): StoredObject {
    const cur = this.existing(target, undefined);
    let patched: unknown;
    try {
      if (type === 'merge') {
        if (!isPlainObject(body)) throw new PatchError('bad', 'merge patch body must be a JSON object');
        patched = mergePatch(cur, body);
      } else {
        patched = applyJsonPatch(cur, parseJsonPatch(body));
      }
    } catch (e) {
      patchFailure(e);
    }
    if (!isPlainObject(patched) || !isPlainObject(patched.metadata)) {
      throw this.invalid(cur.metadata.name, 'metadata: Required value');
    }
    const next = patched as StoredObject;
    const rv = next.metadata.resourceVersion;
    if (rv !== undefined && rv !== cur.metadata.resourceVersion) throw this.conflict(cur.metadata.name);
    return this.replace(cur, next, target.subresource);
  }

  /** Shared tail of update and patch: subresource rules, finalizer rules, generation, no-op detection. */
  private replace(
    cur: StoredObject,
    incoming: StoredObject,
    subresource: 'status' | undefined,
  ): StoredObject {
    const name = cur.metadata.name;
    let next: StoredObject;
    if (subresource === 'status') {
      if (!this.type.statusSubresource) throw this.notFound(`${name}/status`);
      next = deepClone(cur);
      if (incoming.status === undefined || incoming.status === null) delete next.status;
      else next.status = deepClone(incoming.status);
    } else {
      next = deepClone(incoming);
      if (this.type.statusSubresource) {
        if (cur.status === undefined) delete next.status;
        else next.status = deepClone(cur.status);
      }
      keepServerMetadata(next, cur);
      next.apiVersion = cur.apiVersion;
      next.kind = cur.kind;
      this.type.normalize?.(next);
    }
    const deleting = cur.metadata.deletionTimestamp !== undefined;
    if (deleting) {
      const before = new Set(cur.metadata.finalizers ?? []);
      const added = (next.metadata.finalizers ?? []).filter((f) => !before.has(f));
      if (added.length > 0) {
        throw this.invalid(
          name,
          `metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers ${JSON.stringify(added)}`,
        );
      }
    }
    if (next.metadata.finalizers?.length === 0) delete next.metadata.finalizers;
    const curComparable = { ...cur, metadata: { ...cur.metadata } };
    if (curComparable.metadata.finalizers?.length === 0) delete curComparable.metadata.finalizers;
    if (this.type.generation && !deepEqual(specPart(this.type, next), specPart(this.type, cur))) {
      next.metadata.generation = (cur.metadata.generation ?? 0) + 1;
    }
    if (deepEqual(next, curComparable)) return deepClone(cur);
    this.check(next);
    const rv = this.engine.nextRv();
    next.metadata.resourceVersion = String(rv);
    const key = storeKey(next.metadata.namespace, name);
    if (deleting && !next.metadata.finalizers?.length) {
      this.objects.delete(key);
      this.record({ type: 'DELETED', object: next, old: cur, rv, resource: this.type });
    } else {
      this.objects.set(key, next);
      this.record({ type: 'MODIFIED', object: next, old: cur, rv, resource: this.type });
    }
    return deepClone(next);
  }

  /**
   * DELETE: with finalizers, marks the object (deletionTimestamp, grace 0, generation+1) and
   * returns it; repeated deletes change nothing. Without, removes it.
   */
  delete(
    namespace: string | undefined,
    name: string,
    pre: { uid?: string; resourceVersion?: string } = {},
  ): { object: StoredObject; deleted: boolean } {
    const key = storeKey(this.nsFor(namespace), name);
    const cur = this.objects.get(key);
    if (!cur) throw this.notFound(name);
    if (pre.uid !== undefined && pre.uid !== cur.metadata.uid) {
      throw this.conflict(
        name,
        `Precondition failed: UID in precondition: ${pre.uid}, UID in object meta: ${cur.metadata.uid}`,
      );
    }
    if (pre.resourceVersion !== undefined && pre.resourceVersion !== cur.metadata.resourceVersion) {
      throw this.conflict(
        name,
        `Precondition failed: ResourceVersion in precondition: ${pre.resourceVersion}, ResourceVersion in meta: ${cur.metadata.resourceVersion}`,
      );
    }
    if (cur.metadata.finalizers?.length) {
      if (cur.metadata.deletionTimestamp !== undefined) return { object: deepClone(cur), deleted: false };
      const next = deepClone(cur);
      next.metadata.deletionTimestamp = this.engine.now();
      (next.metadata as Record<string, unknown>).deletionGracePeriodSeconds = 0;
      if (this.type.generation) next.metadata.generation = (cur.metadata.generation ?? 0) + 1;
      const rv = this.engine.nextRv();
      next.metadata.resourceVersion = String(rv);
      this.objects.set(key, next);
      this.record({ type: 'MODIFIED', object: next, old: cur, rv, resource: this.type });
      return { object: deepClone(next), deleted: false };
    }
    const rv = this.engine.nextRv();
    const gone = deepClone(cur);
    gone.metadata.resourceVersion = String(rv);
    this.objects.delete(key);
    this.record({ type: 'DELETED', object: gone, old: cur, rv, resource: this.type });
    return { object: deepClone(gone), deleted: true };
  }

  /**
   * Streams changes matching the query. From a resourceVersion: replays retained events after
   * it, then goes live; throws Gone (410) when that version is compacted away.
   */
  watch(q: WatchQuery, handler: (ev: EngineEvent) => void): EngineWatch {
    const w: Watcher = { match: this.matcher(q), handler };
    const from = q.resourceVersion;
    if (from !== undefined && from !== '' && from !== '0') return this.history.resume(w, from);
    for (const o of this.all()) {
      if (w.match(o)) {
        handler({ type: 'ADDED', object: o, rv: Number(o.metadata.resourceVersion), resource: this.type });
      }
    }
    return this.history.follow(w);
  }

  /** Lowest resourceVersion a watch can still resume from. */
  get compactedResourceVersion(): number {
    return this.history.compactedResourceVersion;
  }

  /** @internal */
  compactTo(rv: number): void {
    this.history.compactTo(rv);
  }

  /** @internal */
  load(objs: StoredObject[], rv: number): void {
    this.objects.clear();
    for (const o of objs)
      this.objects.set(storeKey(this.nsFor(o.metadata.namespace), o.metadata.name), deepClone(o));
    this.history.reset(rv);
  }

  private record(ev: EngineEvent): void {
    this.history.record(ev);
    this.engine.emit(ev);
  }
}
