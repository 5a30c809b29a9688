/**
 * runtime/objects/collection — one resource type's objects in the engine: reads, and writes
 * with the API server's preconditions (resourceVersion, uid), status subresource, generation,
 * finalizers and deletionTimestamp. Each committed change goes to the collection's history
 * (watchers) and to the engine's listeners.
 */
import type { ObjectMeta } from '../../api/meta.ts';
import { deepClone, deepEqual, isPlainObject, mergePatch, PatchError, parseJsonPatch } from '../patch.ts';
import {
  type FieldPredicate,
  matchesSelector,
  parseFieldSelector,
  parseSelector,
  type Selector,
} from '../selector.ts';
import { StoreError } from '../store.ts';
import { type ErrorDetails, ObjectError } from './errors.ts';
import { EventHistory, type Watcher } from './history.ts';
import {
  isValidName,
  keepServerMetadata,
  kubeJsonPatch,
  omitEmptyMetadata,
  type PatchType,
  patchFailure,
  selectorError,
  specPart,
  storeKey,
  type WriteTarget,
} from './rules.ts';
import {
  apiVersionOf,
  type CollectionHost,
  type EngineEvent,
  type EngineWatch,
  type ListQuery,
  qualifiedName,
  type ResourceType,
  type StoredObject,
  type WatchQuery,
} from './types.ts';

/** The apiserver's generated-name alphabet: no vowels, no digits that read as letters. */
const NAME_ALPHABET = 'bcdfghjklmnpqrstvwxz2456789';

function randomSuffix(): string {
  let out = '';
  for (let i = 0; i < 5; i++) out += NAME_ALPHABET[Math.floor(Math.random() * NAME_ALPHABET.length)];
  return out;
}

/** One resource type's objects and history. All methods are synchronous and return copies. */
export class Collection {
  readonly type: ResourceType;
  private readonly engine: CollectionHost;
  private readonly objects = new Map<string, StoredObject>();
  private readonly history: EventHistory;

  constructor(engine: CollectionHost, type: ResourceType) {
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

  /** `Proxy.crawl.example.com`, `ConfigMap`: how the API server names a kind in messages. */
  private get groupKind(): string {
    return this.type.group ? `${this.type.kind}.${this.type.group}` : this.type.kind;
  }

  /** Status details naming the object by resource (`proxies`) or by kind (`Proxy`). */
  private details(name: string | undefined, by: 'resource' | 'kind'): ErrorDetails {
    return {
      ...(name ? { name } : {}),
      ...(this.type.group ? { group: this.type.group } : {}),
      kind: by === 'kind' ? this.type.kind : this.type.plural,
    };
  }

  /** A 422 naming the fields at fault (`field: Reason: detail`, the way the API server words it). */
  private invalid(
    name: string,
    causes: { field: string; reason: 'Invalid' | 'Required' | 'Forbidden'; detail: string }[],
    by: 'resource' | 'kind' = 'kind',
  ): ObjectError {
    const label = { Invalid: 'Invalid value', Required: 'Required value', Forbidden: 'Forbidden' } as const;
    const list = causes.map((c) => ({
      reason: `FieldValue${c.reason}` as const,
      message: `${label[c.reason]}: ${c.detail}`,
      field: c.field,
    }));
    const what = by === 'kind' ? this.groupKind : qualifiedName(this.type);
    const text = list.map((c) => `${c.field}: ${c.message}`).join(', ');
    return new ObjectError(
      'Invalid',
      422,
      `${what} "${name}" is invalid: ${list.length > 1 ? `[${text}]` : text}`,
      { ...this.details(name, by), causes: list },
    );
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
      if (!ns)
        throw this.invalid(meta.name ?? '', [
          { field: 'metadata.namespace', reason: 'Required', detail: '' },
        ]);
      meta.namespace = ns;
    } else {
      delete meta.namespace;
    }
    if (!meta.name) {
      if (!meta.generateName) {
        throw this.invalid('', [
          { field: 'metadata.name', reason: 'Required', detail: 'name or generateName is required' },
        ]);
      }
      do {
        meta.name = meta.generateName + randomSuffix();
      } while (this.objects.has(storeKey(meta.namespace, meta.name)));
    }
    if (!isValidName(meta.name)) {
      throw this.invalid(String(meta.name), [
        {
          field: 'metadata.name',
          reason: 'Invalid',
          detail: `${JSON.stringify(meta.name)}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'`,
        },
      ]);
    }
    const key = storeKey(meta.namespace, meta.name);
    if (this.objects.has(key)) {
      throw new ObjectError(
        'AlreadyExists',
        409,
        `${this.label(meta.name)} already exists`,
        this.details(meta.name, 'resource'),
      );
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
    omitEmptyMetadata(obj);
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
    // A resource with a scale subresource keeps its replicas a count, whichever endpoint wrote it.
    const path = this.type.scale?.specReplicasPath;
    if (path) {
      let v: unknown = obj;
      for (const seg of path.split('.').filter(Boolean)) v = isPlainObject(v) ? v[seg] : undefined;
      if (v !== undefined && (typeof v !== 'number' || !Number.isInteger(v) || v < 0)) {
        throw this.invalid(obj.metadata.name, [
          {
            field: path,
            reason: 'Invalid',
            detail: `${JSON.stringify(v)}: should be a non-negative integer`,
          },
        ]);
      }
    }
  }

  private existing(target: WriteTarget, body: StoredObject | undefined): StoredObject {
    const name = target.name ?? body?.metadata?.name;
    if (!name) throw this.invalid('', [{ field: 'metadata.name', reason: 'Required', detail: '' }]);
    if (target.name && body?.metadata?.name && body.metadata.name !== target.name) {
      throw new StoreError(
        'BadRequest',
        400,
        `the name of the object (${body.metadata.name}) does not match the name on the URL (${target.name})`,
      );
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

  /**
   * PUT: a `metadata.resourceVersion` must match (409). Custom resources and Leases require one
   * (422); Secrets, ConfigMaps and Pods take an update without one as unconditional.
   */
  update(input: StoredObject, target: WriteTarget = {}): StoredObject {
    if (!isPlainObject(input) || !isPlainObject(input.metadata)) {
      throw new StoreError('BadRequest', 400, `${this.type.kind}: metadata is required`);
    }
    const cur = this.existing(target, input);
    this.preconditions(cur, input.metadata.resourceVersion);
    // The uid an update carries is a precondition too.
    const uid = input.metadata.uid;
    if (uid !== undefined && uid !== '' && uid !== cur.metadata.uid) {
      throw this.conflict(
        cur.metadata.name,
        `Precondition failed: UID in precondition: ${uid}, UID in object meta: ${cur.metadata.uid}`,
      );
    }
    return this.replace(cur, deepClone(input), target.subresource);
  }

  /** A write's resourceVersion: a precondition when set; required unless the type says otherwise. */
  private preconditions(cur: StoredObject, rv: string | undefined): void {
    if (rv === undefined || rv === '') {
      if (!this.type.unconditionalUpdate) {
        throw this.invalid(
          cur.metadata.name,
          [
            {
              field: 'metadata.resourceVersion',
              reason: 'Invalid',
              detail: '0: must be specified for an update',
            },
          ],
          'resource',
        );
      }
    } else if (rv !== cur.metadata.resourceVersion) throw this.conflict(cur.metadata.name);
  }

  /**
   * PATCH: merge (RFC 7386) or JSON (RFC 6902) on the whole object; a `metadata.resourceVersion`
   * in the result that differs from the stored one is a precondition failure (409), an emptied
   * one an unconditional write (refused for custom resources, like an update without one).
   */
  patch(type: PatchType, body: unknown, target: WriteTarget & { name: string }): StoredObject {
    const cur = this.existing(target, undefined);
    let patched: unknown;
    try {
      if (type === 'merge') {
        if (!isPlainObject(body)) throw new PatchError('bad', 'merge patch body must be a JSON object');
        patched = mergePatch(cur, body);
      } else {
        patched = kubeJsonPatch(cur, parseJsonPatch(body));
      }
    } catch (e) {
      patchFailure(e, body, type);
    }
    if (!isPlainObject(patched) || !isPlainObject(patched.metadata)) {
      throw this.invalid(cur.metadata.name, [{ field: 'metadata', reason: 'Required', detail: '' }]);
    }
    const next = patched as StoredObject;
    const m = next.metadata;
    if (m.name !== cur.metadata.name) {
      throw new StoreError(
        'BadRequest',
        400,
        `the name of the object (${String(m.name)}) does not match the name on the URL (${cur.metadata.name})`,
      );
    }
    if (this.type.namespaced && m.namespace !== cur.metadata.namespace) {
      throw new StoreError(
        'BadRequest',
        400,
        'the namespace of the provided object does not match the namespace sent on the request',
      );
    }
    // The patched object is an update: the version it carries (the stored one unless the patch
    // set another) is its precondition, and a patch that empties it makes an unconditional one.
    this.preconditions(cur, m.resourceVersion);
    try {
      return this.replace(cur, next, target.subresource);
    } catch (e) {
      // The patched object does not decode (a malformed time, data that is no base64): the API
      // server blames the patch, not the request body.
      if (e instanceof StoreError && e.reason === 'BadRequest' && !(e instanceof ObjectError)) {
        throw new ObjectError(
          'Invalid',
          422,
          `Invalid value: the patched object does not decode: ${e.message}`,
          {
            causes: [{ reason: 'FieldValueInvalid', message: `Invalid value: ${e.message}`, field: 'patch' }],
          },
        );
      }
      throw e;
    }
  }

  /** Shared tail of update and patch: subresource rules, finalizer rules, generation, no-op detection. */
  private replace(
    cur: StoredObject,
    incoming: StoredObject,
    subresource: 'status' | undefined,
  ): StoredObject {
    const name = cur.metadata.name;
    const uid = incoming.metadata?.uid;
    if (uid !== undefined && uid !== '' && uid !== cur.metadata.uid) {
      // The API server validates the metadata update twice (generic and type-specific rules) and
      // reports each finding both times.
      const cause = {
        field: 'metadata.uid',
        reason: 'Invalid' as const,
        detail: `${JSON.stringify(uid)}: field is immutable`,
      };
      throw this.invalid(name, [cause, cause]);
    }
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
        const cause = {
          field: 'metadata.finalizers',
          reason: 'Forbidden' as const,
          detail: `no new finalizers can be added if the object is being deleted, found new finalizers ${JSON.stringify(added)}`,
        };
        throw this.invalid(name, [cause, cause]);
      }
    }
    omitEmptyMetadata(next);
    const curComparable = { ...cur, metadata: { ...cur.metadata } };
    omitEmptyMetadata(curComparable);
    if (this.type.generation && !deepEqual(specPart(this.type, next), specPart(this.type, cur))) {
      next.metadata.generation = (cur.metadata.generation ?? 0) + 1;
    }
    if (deepEqual(next, curComparable)) return deepClone(cur);
    this.check(next);
    const rv = this.engine.nextRv();
    const key = storeKey(next.metadata.namespace, name);
    if (deleting && !next.metadata.finalizers?.length) {
      // The write that drops the last finalizer is never stored: the object is deleted as it
      // was (the DELETED event shows that state at the deletion's version), and the caller gets
      // what it wrote at the version it wrote it over.
      const gone = deepClone(cur);
      gone.metadata.resourceVersion = String(rv);
      this.objects.delete(key);
      this.record({ type: 'DELETED', object: gone, old: cur, rv, resource: this.type });
      return deepClone(next);
    }
    next.metadata.resourceVersion = String(rv);
    this.objects.set(key, next);
    this.record({ type: 'MODIFIED', object: next, old: cur, rv, resource: this.type });
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
    const failed = (why: string) =>
      new ObjectError(
        'Conflict',
        409,
        `Operation cannot be fulfilled on ${this.groupKind} "${name}": ${why}`,
        this.details(name, 'kind'),
      );
    if (pre.uid !== undefined && pre.uid !== cur.metadata.uid) {
      throw failed(
        `the UID in the precondition (${pre.uid}) does not match the UID in record (${cur.metadata.uid}). The object might have been deleted and then recreated`,
      );
    }
    if (pre.resourceVersion !== undefined && pre.resourceVersion !== cur.metadata.resourceVersion) {
      throw failed(
        `the ResourceVersion in the precondition (${pre.resourceVersion}) does not match the ResourceVersion in record (${cur.metadata.resourceVersion}). The object might have been modified`,
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
