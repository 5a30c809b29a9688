/**
 * runtime/objects/engine — an in-memory, synchronous object store with Kubernetes semantics:
 * one global resourceVersion, create/get/list/update/patch/delete with preconditions, status
 * subresource, generation, finalizers and deletionTimestamp, and a retained event history
 * so watchers can resume from a resourceVersion (410 Gone below the compaction point).
 * The memory store, the embedded standalone store and the Kubernetes test server all sit on it,
 * which is what lets one contract suite cover every backend.
 */
import { randomUUID } from 'node:crypto';
import type { Clock } from '../clock.ts';
import { systemClock } from '../clock.ts';
import { Collection } from './collection.ts';
import {
  type CollectionHost,
  type EngineEvent,
  qualifiedName,
  type ResourceType,
  type StoredObject,
} from './types.ts';

export { Collection } from './collection.ts';
export { type PatchType, patchFailure, selectorError, type WriteTarget } from './rules.ts';

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
export class ObjectEngine implements CollectionHost {
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
