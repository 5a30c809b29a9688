/**
 * lease/view — the eligible proxies matching one (namespace, selector), bucketed by
 * active-lease count, each bucket sorted in grant order: a grant walks the lowest bucket from
 * the front instead of scanning the fleet.
 */
import { matchesSelector, type Selector } from '../runtime/selector.ts';
import { compareEntries, type Entry } from './entry.ts';
import { SortedList } from './ordered.ts';

export class View {
  readonly namespace: string | undefined;
  readonly selector: Selector | undefined;
  private buckets = new Map<number, SortedList<Entry>>();
  /** Non-empty bucket keys, ascending. */
  private counts: number[] = [];

  constructor(namespace: string | undefined, selector: Selector | undefined) {
    this.namespace = namespace;
    this.selector = selector;
  }

  matches(e: Entry): boolean {
    return matchesFilter(e, this.namespace, this.selector);
  }

  add(e: Entry): void {
    let bucket = this.buckets.get(e.active);
    if (!bucket) {
      bucket = new SortedList(compareEntries);
      this.buckets.set(e.active, bucket);
      const i = this.counts.findIndex((c) => c > e.active);
      this.counts.splice(i < 0 ? this.counts.length : i, 0, e.active);
    }
    bucket.insert(e);
  }

  remove(e: Entry): void {
    const bucket = this.buckets.get(e.active);
    if (!bucket?.delete(e)) return;
    if (bucket.size === 0) {
      this.buckets.delete(e.active);
      this.counts.splice(this.counts.indexOf(e.active), 1);
    }
  }

  pick(accept: (e: Entry) => boolean): Entry | undefined {
    for (const c of this.counts) {
      const found = this.buckets.get(c)!.find(accept);
      if (found) return found;
    }
    return undefined;
  }
}

/** Whether `e` is in `namespace` (any when undefined) and matches `selector` (all when undefined). */
export function matchesFilter(
  e: Entry,
  namespace: string | undefined,
  selector: Selector | undefined,
): boolean {
  if (namespace !== undefined && e.namespace !== namespace) return false;
  return selector === undefined || matchesSelector(selector, e.labels);
}

/**
 * The unfiltered view plus one view per distinct (namespace, canonical selector) a client asked
 * for, bounded in LRU order: an entry moves in and out of all of them at once.
 */
export class ViewSet {
  private readonly base = new View(undefined, undefined);
  /** Filtered views by `namespace \0 canonical selector`, in LRU order (oldest first). */
  private readonly filtered = new Map<string, View>();

  private readonly maxViews: number;

  constructor(maxViews: number) {
    this.maxViews = maxViews;
  }

  add(e: Entry): void {
    this.base.add(e);
    for (const v of this.filtered.values()) if (v.matches(e)) v.add(e);
  }

  remove(e: Entry): void {
    this.base.remove(e);
    for (const v of this.filtered.values()) if (v.matches(e)) v.remove(e);
  }

  /** The view for a filter, built from the indexed `entries` when first asked for. */
  get(namespace: string | undefined, selector: Selector | undefined, entries: Iterable<Entry>): View {
    if (namespace === undefined && selector === undefined) return this.base;
    const key = `${namespace ?? ''}\u0000${selector?.canonical ?? ''}`;
    let view = this.filtered.get(key);
    if (view) {
      this.filtered.delete(key);
      this.filtered.set(key, view);
      return view;
    }
    view = new View(namespace, selector);
    for (const e of entries) if (e.indexed && view.matches(e)) view.add(e);
    this.filtered.set(key, view);
    if (this.filtered.size > this.maxViews) {
      const oldest = this.filtered.keys().next().value;
      if (oldest !== undefined) this.filtered.delete(oldest);
    }
    return view;
  }
}
