/**
 * runtime/indexer — the bookkeeping behind `CacheIndexer` (runtime/store), shared by every
 * backend's cache: index name → value → object keys, updated as the cache changes.
 */
import { type KubeObject, keyOf } from '../api/meta.ts';
import type { IndexFunc } from './store.ts';

interface Index<T> {
  fn: IndexFunc<T>;
  /** value → keys of the objects indexed under it */
  byValue: Map<string, Set<string>>;
  /** object key → the values it is indexed under now */
  valuesOf: Map<string, string[]>;
}

export class CacheIndexes<T extends KubeObject> {
  private readonly indexes = new Map<string, Index<T>>();

  get size(): number {
    return this.indexes.size;
  }

  /**
   * Registers index `name` and fills it from `existing`. False when that very function is
   * already registered under the name (nothing to do); throws for a different function.
   */
  add(name: string, fn: IndexFunc<T>, existing: Iterable<T>): boolean {
    const have = this.indexes.get(name);
    if (have?.fn === fn) return false;
    if (have) throw new Error(`cache index "${name}" is already registered with another function`);
    const index: Index<T> = { fn, byValue: new Map(), valuesOf: new Map() };
    this.indexes.set(name, index);
    for (const obj of existing) put(index, keyOf(obj), obj);
    return true;
  }

  upsert(obj: T): void {
    const key = keyOf(obj);
    for (const index of this.indexes.values()) put(index, key, obj);
  }

  remove(key: string): void {
    for (const index of this.indexes.values()) drop(index, key);
  }

  /** Keys of the objects indexed under `value`, sorted; throws for an unknown index. */
  keys(name: string, value: string): string[] {
    const index = this.indexes.get(name);
    if (!index) throw new Error(`no cache index named "${name}"`);
    return [...(index.byValue.get(value) ?? [])].sort();
  }
}

function valuesOf<T>(fn: IndexFunc<T>, obj: T): string[] {
  try {
    return [...new Set(fn(obj))];
  } catch {
    // An index function that cannot read an object (e.g. a hand-edited one) indexes it nowhere.
    return [];
  }
}

function put<T>(index: Index<T>, key: string, obj: T): void {
  drop(index, key);
  const values = valuesOf(index.fn, obj);
  if (values.length === 0) return;
  index.valuesOf.set(key, values);
  for (const v of values) {
    let keys = index.byValue.get(v);
    if (!keys) {
      keys = new Set();
      index.byValue.set(v, keys);
    }
    keys.add(key);
  }
}

function drop<T>(index: Index<T>, key: string): void {
  for (const v of index.valuesOf.get(key) ?? []) {
    const keys = index.byValue.get(v);
    keys?.delete(key);
    if (keys?.size === 0) index.byValue.delete(v);
  }
  index.valuesOf.delete(key);
}
