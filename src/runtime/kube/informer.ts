/**
 * runtime/kube/informer — the indexed cache one or more reflectors feed: objects by key, with
 * namespace and label indexes for selector lists, named secondary indexes (`addIndex`), and
 * informer-style subscribers that get
 * ADDED for everything cached when they subscribe, then ADDED/MODIFIED/DELETED with the old
 * object. A subscriber that throws is logged and skipped, never allowed to break the feed.
 * Writes of our own reach the cache before their watch events, so the cache ignores what is
 * older than it already knows: a version below the cached one, a DELETED of an object that was
 * since replaced, a late version of an object we deleted. An object deleted and created again
 * under its name while the watch was away is reported as a delete and an add.
 */
import { type KubeObject, keyOf } from '../../api/meta.ts';
import { type Logger, silentLogger } from '../../log/index.ts';
import { CacheIndexes } from '../indexer.ts';
import { matchesSelector, parseSelector, type Selector, SelectorError } from '../selector.ts';
import { type IndexFunc, type ListOptions, StoreError, type Unsubscribe, type WatchEvent } from '../store.ts';

/** What a reflector writes into. */
export interface CacheSink<T extends KubeObject> {
  /** A complete list: everything not in `items` is gone. */
  replace(items: T[]): void;
  upsert(obj: T): void;
  remove(obj: T): void;
}

/**
 * Whether `a` is a newer resourceVersion than `b`. Kubernetes RVs are opaque strings but are
 * integers in practice; when both are, compare numerically, otherwise any difference counts.
 */
export function isNewerVersion(a: string | undefined, b: string | undefined): boolean {
  if (a === b) return false;
  if (a && b && /^\d+$/.test(a) && /^\d+$/.test(b)) return BigInt(a) > BigInt(b);
  return true;
}

/**
 * Whether `obj` is a different object from `cached` that took over its name: deleted and
 * created again, so the UIDs differ.
 */
function isReplacement(cached: KubeObject, obj: KubeObject): boolean {
  const [a, b] = [cached.metadata.uid, obj.metadata.uid];
  return a !== undefined && b !== undefined && a !== b;
}

/** How many deleted UIDs an informer remembers to recognise late events of deleted objects. */
const DELETED_UIDS_KEPT = 4096;

function labelTerms(obj: KubeObject): string[] {
  return Object.entries(obj.metadata.labels ?? {}).map(([k, v]) => `${k}=${v}`);
}

export class Informer<T extends KubeObject> implements CacheSink<T> {
  readonly name: string;
  private readonly log: Logger;
  private readonly objects = new Map<string, T>();
  private readonly byNamespace = new Map<string, Set<string>>();
  private readonly byLabel = new Map<string, Set<string>>();
  private readonly indexes = new CacheIndexes<T>();
  private readonly handlers = new Set<(e: WatchEvent<T>) => void>();
  private syncedFlag = false;
  private readonly syncWaiters = new Set<() => void>();
  /** UIDs of objects our own writes deleted, oldest first (bounded). */
  private readonly deletedUids = new Set<string>();

  constructor(name: string, log: Logger = silentLogger()) {
    this.name = name;
    this.log = log;
  }

  get(key: string): T | undefined {
    return this.objects.get(key);
  }

  size(): number {
    return this.objects.size;
  }

  /** Cached objects matching namespace and label selector, sorted by key. */
  list(opts: ListOptions = {}): T[] {
    let selector: Selector;
    try {
      selector = parseSelector(opts.labelSelector);
    } catch (e) {
      if (e instanceof SelectorError) throw new StoreError('BadRequest', 400, e.message);
      throw e;
    }
    let candidates: Iterable<string> = this.objects.keys();
    const eq = selector.requirements.find((r) => r.op === 'eq');
    if (eq && eq.op === 'eq') candidates = this.byLabel.get(`${eq.key}=${eq.value}`) ?? [];
    else if (opts.namespace !== undefined) candidates = this.byNamespace.get(opts.namespace) ?? [];
    const out: T[] = [];
    for (const key of candidates) {
      const obj = this.objects.get(key);
      if (!obj) continue;
      if (opts.namespace !== undefined && obj.metadata.namespace !== opts.namespace) continue;
      if (!matchesSelector(selector, obj.metadata.labels)) continue;
      out.push(obj);
    }
    return out.sort((a, b) => (keyOf(a) < keyOf(b) ? -1 : keyOf(a) > keyOf(b) ? 1 : 0));
  }

  /** See `CacheIndexer.addIndex` (runtime/store). */
  addIndex(name: string, fn: IndexFunc<T>): void {
    this.indexes.add(name, fn, this.objects.values());
  }

  /** See `CacheIndexer.byIndex` (runtime/store). */
  byIndex(name: string, value: string): T[] {
    const out: T[] = [];
    for (const key of this.indexes.keys(name, value)) {
      const obj = this.objects.get(key);
      if (obj) out.push(obj);
    }
    return out;
  }

  replace(items: T[]): void {
    const keep = new Set(items.map((o) => keyOf(o)));
    for (const [key, obj] of [...this.objects]) if (!keep.has(key)) this.remove(obj);
    for (const obj of items) this.upsert(obj);
  }

  upsert(obj: T): void {
    const key = keyOf(obj);
    // A write of ours deleted it; the watch may still deliver versions from before that.
    if (obj.metadata.uid !== undefined && this.deletedUids.has(obj.metadata.uid)) return;
    let prev = this.objects.get(key);
    if (prev && !isNewerVersion(obj.metadata.resourceVersion, prev.metadata.resourceVersion)) return;
    if (prev && isReplacement(prev, obj)) {
      // Deleted and created again under the same name while the watch was away (a relist
      // finds only the new one): consumers see the delete, as a continuous watch shows it.
      this.unindex(key, prev);
      this.objects.delete(key);
      this.emit({ type: 'DELETED', object: prev, old: prev });
      prev = undefined;
    }
    if (prev) this.unindex(key, prev);
    this.objects.set(key, obj);
    this.index(key, obj);
    this.emit(prev ? { type: 'MODIFIED', object: obj, old: prev } : { type: 'ADDED', object: obj });
  }

  remove(obj: T): void {
    const key = keyOf(obj);
    const prev = this.objects.get(key);
    if (!prev || this.holdsNewer(obj)) return;
    this.unindex(key, prev);
    this.objects.delete(key);
    // DELETED carries the final state the server sent (or the last cached one).
    this.emit({ type: 'DELETED', object: obj.metadata.resourceVersion ? obj : prev, old: prev });
  }

  /**
   * Whether the cache holds something newer under `obj`'s key than `obj` itself: a later
   * version, or another object that took the name. A removal naming `obj` is then stale (a late
   * DELETED of an earlier incarnation must not drop the object that replaced it).
   */
  holdsNewer(obj: T): boolean {
    const cached = this.objects.get(keyOf(obj));
    if (!cached) return false;
    if (isReplacement(cached, obj)) return true;
    const [c, o] = [cached.metadata.resourceVersion, obj.metadata.resourceVersion];
    return c !== undefined && o !== undefined && /^\d+$/.test(c) && /^\d+$/.test(o) && BigInt(c) > BigInt(o);
  }

  /**
   * Our own write deleted this object (its UID, or the cached one under its key): it leaves the
   * cache now, and versions of it a lagging watch or an older list still delivers are ignored —
   * a deleted object never comes back under its UID, so they cannot bring it back.
   */
  deleted(key: { namespace?: string; name: string }, uid?: string): void {
    const cached = this.objects.get(keyOf({ metadata: key }));
    const gone = uid ?? cached?.metadata.uid;
    if (gone !== undefined) {
      this.deletedUids.delete(gone);
      this.deletedUids.add(gone);
      if (this.deletedUids.size > DELETED_UIDS_KEPT) {
        const oldest = this.deletedUids.values().next().value;
        if (oldest !== undefined) this.deletedUids.delete(oldest);
      }
    }
    if (cached && (gone === undefined || cached.metadata.uid === gone)) this.remove(cached);
  }

  /** Informer semantics: ADDED for every cached object first (asynchronously), then changes. */
  subscribe(handler: (e: WatchEvent<T>) => void): Unsubscribe {
    let active = true;
    queueMicrotask(() => {
      if (!active) return;
      this.handlers.add(handler);
      for (const obj of this.list()) this.call(handler, { type: 'ADDED', object: obj });
    });
    return () => {
      active = false;
      this.handlers.delete(handler);
    };
  }

  markSynced(): void {
    if (this.syncedFlag) return;
    this.syncedFlag = true;
    for (const w of this.syncWaiters) w();
    this.syncWaiters.clear();
  }

  hasSynced(): boolean {
    return this.syncedFlag;
  }

  synced(signal?: AbortSignal): Promise<void> {
    if (this.syncedFlag) return Promise.resolve();
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const done = () => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      };
      const onAbort = () => {
        this.syncWaiters.delete(done);
        reject(signal?.reason);
      };
      this.syncWaiters.add(done);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  private emit(e: WatchEvent<T>): void {
    for (const h of [...this.handlers]) this.call(h, e);
  }

  private call(h: (e: WatchEvent<T>) => void, e: WatchEvent<T>): void {
    try {
      h(e);
    } catch (err) {
      this.log.error({ err, informer: this.name, type: e.type, key: keyOf(e.object) }, 'watch handler threw');
    }
  }

  private index(key: string, obj: T): void {
    addTo(this.byNamespace, obj.metadata.namespace ?? '', key);
    for (const t of labelTerms(obj)) addTo(this.byLabel, t, key);
    this.indexes.upsert(obj);
  }

  private unindex(key: string, obj: T): void {
    removeFrom(this.byNamespace, obj.metadata.namespace ?? '', key);
    for (const t of labelTerms(obj)) removeFrom(this.byLabel, t, key);
    this.indexes.remove(key);
  }
}

function addTo(m: Map<string, Set<string>>, k: string, key: string): void {
  let s = m.get(k);
  if (!s) {
    s = new Set();
    m.set(k, s);
  }
  s.add(key);
}

function removeFrom(m: Map<string, Set<string>>, k: string, key: string): void {
  const s = m.get(k);
  if (!s) return;
  s.delete(key);
  if (s.size === 0) m.delete(k);
}

/**
 * Lets several reflectors (e.g. one per label selector) feed one cache: an object stays cached
 * while at least one source holds it and passes that source's filter.
 */
export class MultiSourceSink<T extends KubeObject> {
  private readonly target: Informer<T>;
  private readonly members = new Map<string, Set<string>>();

  constructor(target: Informer<T>) {
    this.target = target;
  }

  source(name: string, accept: (obj: T) => boolean): CacheSink<T> {
    const drop = (obj: T) => {
      if (this.target.holdsNewer(obj)) return;
      const key = keyOf(obj);
      const m = this.members.get(key);
      if (!m?.delete(name)) return;
      if (m.size === 0) {
        this.members.delete(key);
        this.target.remove(obj);
      }
    };
    const put = (obj: T) => {
      if (!accept(obj)) return drop(obj);
      const key = keyOf(obj);
      let m = this.members.get(key);
      if (!m) {
        m = new Set();
        this.members.set(key, m);
      }
      m.add(name);
      this.target.upsert(obj);
    };
    return {
      upsert: put,
      remove: drop,
      replace: (items) => {
        const keep = new Set(items.map((o) => keyOf(o)));
        for (const [key, m] of [...this.members]) {
          if (m.has(name) && !keep.has(key)) {
            const cached = this.target.get(key);
            if (cached) drop(cached);
            else m.delete(name);
          }
        }
        for (const obj of items) put(obj);
      },
    };
  }

  /** Our own write deleted it: gone from every source at once (see `Informer.deleted`). */
  deleted(key: { namespace?: string; name: string }, uid?: string): void {
    const k = keyOf({ metadata: key });
    const cached = this.target.get(k);
    if (cached && (uid === undefined || cached.metadata.uid === uid)) this.members.delete(k);
    this.target.deleted(key, uid);
  }

  /** A write we made ourselves, applied before its watch event arrives (read-your-writes). */
  writeThrough(obj: T, sources: Array<{ name: string; accept: (obj: T) => boolean }>): void {
    const key = keyOf(obj);
    const accepting = sources.filter((s) => s.accept(obj)).map((s) => s.name);
    if (accepting.length === 0) return;
    let m = this.members.get(key);
    if (!m) {
      m = new Set();
      this.members.set(key, m);
    }
    for (const s of accepting) m.add(s);
    this.target.upsert(obj);
  }
}
