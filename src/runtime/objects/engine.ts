/**
 * runtime/objects/engine — an in-memory, synchronous object store with Kubernetes semantics:
 * one global resourceVersion, create/get/list/update/patch/delete with preconditions, status
 * subresource, generation, finalizers and deletionTimestamp, and a retained event history
 * so watchers can resume from a resourceVersion (410 Gone below the compaction point).
 * The memory store, the embedded standalone store and the Kubernetes test server all sit on it,
 * which is what lets one contract suite cover every backend.
 */
import { randomUUID } from 'node:crypto';
import type { ObjectMeta } from '../../api/meta.ts';
import type { Clock } from '../clock.ts';
import { systemClock } from '../clock.ts';
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
  SelectorError,
} from '../selector.ts';
import { StoreError } from '../store.ts';
import { apiVersionOf, qualifiedName, type ResourceType, type StoredObject } from './types.ts';

export type EngineEventType = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface EngineEvent {
  type: EngineEventType;
  /** The object after the change (for DELETED: its last state, carrying the deletion's resourceVersion). */
  object: StoredObject;
  /** The object before the change (MODIFIED, DELETED). */
  old?: StoredObject;
  /** The resourceVersion this change was committed at. */
  rv: number;
  resource: ResourceType;
}

export interface ListQuery {
  namespace?: string;
  labelSelector?: string;
  fieldSelector?: string;
}

export interface WatchQuery extends ListQuery {
  /** Resume after this version; undefined, '' or '0' start with synthetic ADDED for current state. */
  resourceVersion?: string;
}

export interface EngineWatch {
  stop(): void;
}

export interface EngineSnapshot {
  resourceVersion: number;
  objects: Record<string, StoredObject[]>;
}

export interface EngineOptions {
  clock?: Clock;
  /** Events kept per resource for resuming watches; older ones are compacted away. */
  historyLimit?: number;
  uid?: () => string;
}

type Commit = (ev: EngineEvent) => void;

/** The resources of one API server / state file, sharing one resourceVersion sequence. */
export class ObjectEngine {
  readonly clock: Clock;
  readonly historyLimit: number;
  readonly newUid: () => string;
  private rv = 0;
  private readonly collections = new Map<string, Collection>();
  private readonly listeners = new Set<Commit>();

  constructor(opts: EngineOptions = {}) {
    this.clock = opts.clock ?? systemClock;
    this.historyLimit = opts.historyLimit ?? 2000;
    this.newUid = opts.uid ?? randomUUID;
  }

  register(type: ResourceType): Collection {
    const key = qualifiedName(type);
    const existing = this.collections.get(key);
    if (existing) return existing;
    const c = new Collection(this, type);
    this.collections.set(key, c);
    return c;
  }

  /** By qualified name (`proxies.crawl.example.com`, `secrets`) or by the type itself. */
  collection(type: ResourceType | string): Collection {
    const key = typeof type === 'string' ? type : qualifiedName(type);
    const c = this.collections.get(key);
    if (!c) throw new Error(`resource ${key} is not registered`);
    return c;
  }

  types(): ResourceType[] {
    return [...this.collections.values()].map((c) => c.type);
  }

  get resourceVersion(): number {
    return this.rv;
  }

  /** Drops all retained history: watches resuming from an older version get Gone. */
  compact(): void {
    for (const c of this.collections.values()) c.compactTo(this.rv);
  }

  /** Called synchronously for every committed change, in commit order. */
  onCommit(fn: Commit): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  snapshot(): EngineSnapshot {
    const objects: Record<string, StoredObject[]> = {};
    for (const [k, c] of this.collections) objects[k] = c.all();
    return { resourceVersion: this.rv, objects };
  }

  /** Replaces all state (history is gone, so older resourceVersions read as compacted). */
  restore(snap: EngineSnapshot): void {
    this.rv = snap.resourceVersion;
    for (const [k, c] of this.collections) c.load(snap.objects[k] ?? [], this.rv);
  }

  /** @internal */
  nextRv(): number {
    this.rv += 1;
    return this.rv;
  }

  /** @internal */
  emit(ev: EngineEvent): void {
    for (const l of this.listeners) l(ev);
  }

  /** RFC 3339 with second precision, like metav1.Time. */
  now(): string {
    return new Date(this.clock.now()).toISOString().replace(/\.\d+Z$/, 'Z');
  }
}

interface Watcher {
  match: (obj: StoredObject) => boolean;
  handler: (ev: EngineEvent) => void;
}

const storeKey = (ns: string | undefined, name: string) => (ns ? `${ns}/${name}` : name);

function metaOf(obj: StoredObject): ObjectMeta {
  return obj.metadata;
}

/** Everything that counts as "spec" for generation: the object minus metadata, status and type info. */
function specPart(type: ResourceType, obj: StoredObject): Record<string, unknown> {
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

/** One resource type's objects and history. All methods are synchronous and return copies. */
export class Collection {
  readonly type: ResourceType;
  private readonly engine: ObjectEngine;
  private readonly objects = new Map<string, StoredObject>();
  private history: EngineEvent[] = [];
  private compactedRv = 0;
  private readonly watchers = new Set<Watcher>();

  constructor(engine: ObjectEngine, type: ResourceType) {
    this.engine = engine;
    this.type = type;
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
    const meta = metaOf(obj) as ObjectMeta & { generateName?: string; deletionGracePeriodSeconds?: number };
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
    if (
      typeof meta.name !== 'string' ||
      !/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(meta.name) ||
      meta.name.length > 253
    ) {
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
      const m = next.metadata as ObjectMeta & Record<string, unknown>;
      const c = cur.metadata as ObjectMeta & Record<string, unknown>;
      for (const k of [
        'name',
        'namespace',
        'uid',
        'creationTimestamp',
        'deletionTimestamp',
        'deletionGracePeriodSeconds',
        'generation',
        'resourceVersion',
      ]) {
        if (c[k] === undefined) delete m[k];
        else m[k] = c[k];
      }
      delete m.generateName;
      if (c.generateName !== undefined) m.generateName = c.generateName;
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

  private record(ev: EngineEvent): void {
    this.history.push(ev);
    if (this.history.length > this.engine.historyLimit) {
      const dropped = this.history.splice(0, this.history.length - this.engine.historyLimit);
      this.compactedRv = (dropped[dropped.length - 1] as EngineEvent).rv;
    }
    for (const w of this.watchers) deliver(w, ev);
    this.engine.emit(ev);
  }

  /**
   * Streams changes matching the query. From a resourceVersion: replays retained events after
   * it, then goes live; throws Gone (410) when that version is compacted away.
   */
  watch(q: WatchQuery, handler: (ev: EngineEvent) => void): EngineWatch {
    const match = this.matcher(q);
    const w: Watcher = { match, handler };
    const from = q.resourceVersion;
    if (from === undefined || from === '' || from === '0') {
      for (const o of this.all()) {
        if (match(o)) {
          handler({ type: 'ADDED', object: o, rv: Number(o.metadata.resourceVersion), resource: this.type });
        }
      }
    } else {
      const n = Number(from);
      if (!Number.isInteger(n) || n < 0) {
        throw new StoreError('BadRequest', 400, `invalid resourceVersion ${JSON.stringify(from)}`);
      }
      if (n < this.compactedRv) {
        throw new StoreError('Gone', 410, `too old resource version: ${n} (${this.compactedRv})`);
      }
      for (const ev of this.history) if (ev.rv > n) deliver(w, ev);
    }
    this.watchers.add(w);
    return { stop: () => this.watchers.delete(w) };
  }

  /** Lowest resourceVersion a watch can still resume from. */
  get compactedResourceVersion(): number {
    return this.compactedRv;
  }

  /** @internal */
  compactTo(rv: number): void {
    this.history = this.history.filter((e) => e.rv > rv);
    this.compactedRv = Math.max(this.compactedRv, rv);
  }

  /** @internal */
  load(objs: StoredObject[], rv: number): void {
    this.objects.clear();
    for (const o of objs)
      this.objects.set(storeKey(this.nsFor(o.metadata.namespace), o.metadata.name), deepClone(o));
    this.history = [];
    this.compactedRv = rv;
  }
}

/** Applies the watcher's filter, turning selector transitions into ADDED / DELETED like the apiserver. */
function deliver(w: Watcher, ev: EngineEvent): void {
  const now = w.match(ev.object);
  let out: EngineEvent | undefined;
  if (ev.type === 'MODIFIED') {
    const before = ev.old ? w.match(ev.old) : false;
    if (now && before) out = ev;
    else if (now) out = { ...ev, type: 'ADDED' };
    else if (before) out = { ...ev, type: 'DELETED' };
  } else if (now) {
    out = ev;
  }
  if (!out) return;
  try {
    w.handler({ ...out, object: deepClone(out.object), old: out.old && deepClone(out.old) });
  } catch {
    // A watcher's failure must never break a commit; watchers log their own errors.
  }
}
