/**
 * lease/view — the eligible proxies matching one (namespace, selector), bucketed by
 * active-lease count, each bucket sorted in grant order: a grant walks the lowest bucket from
 * the front instead of scanning the fleet. For a target that many proxies cool down for, a view
 * also keeps the proxies not cooling for it, so a grant does not walk past the cooling ones.
 * Each view also keeps the census of every proxy it matches, eligible or not (lease/census):
 * the counts a refused grant answers with. A grant with an affinity (a gateway's sticky session)
 * takes the eligible proxy its key ranks first by rendezvous hashing instead, so every process
 * holding the same proxies binds the key to the same one (docs/gateway.md, "Sticky sessions").
 */
import { matchesSelector, type Selector } from '../runtime/selector.ts';
import { Census, reachesTargetRule } from './census.ts';
import { compareEntries, coolingFor, type Entry, type Standing } from './entry.ts';
import { IndexedHeap, SortedList } from './ordered.ts';
import type { NoneLeasableCounts } from './types.ts';

/** Entries bucketed by active-lease count, each bucket in grant order. */
class Buckets {
  private buckets = new Map<number, SortedList<Entry>>();
  /** Non-empty bucket keys, ascending. */
  private counts: number[] = [];

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

  remove(e: Entry): boolean {
    const bucket = this.buckets.get(e.active);
    if (!bucket?.delete(e)) return false;
    if (bucket.size === 0) {
      this.buckets.delete(e.active);
      this.counts.splice(this.counts.indexOf(e.active), 1);
    }
    return true;
  }

  /** The first entry in grant order that `accept` takes (`accept` must not change the buckets). */
  pick(accept: (e: Entry) => boolean): Entry | undefined {
    for (const c of this.counts) {
      const found = this.buckets.get(c)?.find(accept);
      if (found) return found;
    }
    return undefined;
  }
}

/**
 * An entry of a target view waiting for its cooldown for that target to end. A cooldown the
 * store evicts early (its cap on cooldown entries) is still waited out here: erring towards
 * the block a site asked for.
 */
interface Waiting {
  at: number;
  entry: Entry;
  heapIndex: number;
}

/**
 * The entries of a view that are not cooling down for one target, for a target that so many of
 * the view's entries cool down for that walking past them would make every grant O(n). An entry
 * found cooling moves to a heap ordered by the end of its cooldown and comes back when it ends,
 * so each cooldown costs O(log n) once instead of a skip on every grant.
 */
class TargetView {
  readonly listed = new Buckets();
  readonly waiting = new IndexedHeap<Waiting>((a, b) => a.at < b.at);
  /** Where each entry of the view is: listed, or waiting (with its heap item). */
  readonly where = new Map<Entry, Waiting | 'listed'>();
}

/** Entries a grant may skip for a target's cooldowns before the view keeps a target view for it. */
export const DEFAULT_HOT_TARGET_SKIPS = 32;
/** Target views kept per view, least recently used dropped first. */
const MAX_TARGET_VIEWS = 8;

export class View {
  readonly namespace: string | undefined;
  readonly selector: Selector | undefined;
  readonly census = new Census();
  private readonly all = new Buckets();
  private readonly members = new Set<Entry>();
  /** Per-target views, in LRU order (oldest first). */
  private readonly targets = new Map<string, TargetView>();
  /** The last retryAt per target ('' = none) and the store revision it was computed at, in LRU order. */
  private readonly retryAts = new Map<string, { revision: number; at: number | undefined }>();
  private readonly hotSkips: number;

  constructor(
    namespace: string | undefined,
    selector: Selector | undefined,
    hotSkips = DEFAULT_HOT_TARGET_SKIPS,
  ) {
    this.namespace = namespace;
    this.selector = selector;
    this.hotSkips = hotSkips;
  }

  matches(e: Entry): boolean {
    return matchesFilter(e, this.namespace, this.selector);
  }

  add(e: Entry): void {
    this.all.add(e);
    this.members.add(e);
    for (const tv of this.targets.values()) {
      // A waiting entry keeps waiting: its cooldown has not been seen to end yet.
      if (tv.where.get(e) === undefined) {
        tv.listed.add(e);
        tv.where.set(e, 'listed');
      }
    }
  }

  remove(e: Entry): void {
    if (!this.all.remove(e)) return;
    this.members.delete(e);
    for (const tv of this.targets.values()) {
      const w = tv.where.get(e);
      if (w === 'listed') {
        tv.listed.remove(e);
        tv.where.delete(e);
      }
      // A waiting entry stays in the heap; when it comes due it is dropped unless it is back.
    }
  }

  /** Why nothing in this view is leasable for `target`; `fleet` is every entry of the store. */
  refusal(target: string | undefined, fleet: Iterable<Entry>): NoneLeasableCounts {
    return this.census.funnel(target, () => this.counted(fleet));
  }

  /** The entries of `fleet` this view counts: in the store and matching the filter. */
  *counted(fleet: Iterable<Entry>): Iterable<Entry> {
    for (const e of fleet) if (e.standing !== undefined && this.matches(e)) yield e;
  }

  /**
   * A refusal's retryAt for `target`: `compute`d once per store `revision` (any change to the
   * store makes a new one), so a burst of refusals with nothing changing in between walks once.
   */
  retryAt(
    target: string | undefined,
    revision: number,
    compute: () => number | undefined,
  ): number | undefined {
    const key = target ?? '';
    const known = this.retryAts.get(key);
    if (known?.revision === revision) return known.at;
    const at = compute();
    this.retryAts.delete(key);
    this.retryAts.set(key, { revision, at });
    if (this.retryAts.size > MAX_TARGET_VIEWS) {
      const oldest = this.retryAts.keys().next().value;
      if (oldest !== undefined) this.retryAts.delete(oldest);
    }
    return at;
  }

  /** The next entry to grant, in grant order, skipping entries cooling down for `target`. */
  pick(target: string | undefined, now: number): Entry | undefined {
    if (target === undefined) return this.all.pick(() => true);
    const tv = this.targets.get(target);
    if (tv) {
      this.targets.delete(target);
      this.targets.set(target, tv);
      return this.pickFrom(tv, target, now);
    }
    let skipped = 0;
    const found = this.all.pick((e) => {
      if (!coolingFor(e, target, now)) return true;
      skipped++;
      return false;
    });
    if (skipped > this.hotSkips) this.keepTargetView(target, now);
    return found;
  }

  /**
   * The entry `affinity` ranks first by rendezvous (highest-random-weight) hashing among those a
   * grant may take for `target`: the ranking depends only on the key and the proxy names, so a
   * proxy leaving moves only the keys it held. O(entries): it runs once per binding, not per grant.
   */
  pickFor(affinity: string, target: string | undefined, now: number): Entry | undefined {
    let best: Entry | undefined;
    let bestScore = -1;
    for (const e of this.members) {
      if (target !== undefined && coolingFor(e, target, now)) continue;
      const score = rendezvousScore(affinity, e.key);
      if (score > bestScore || (score === bestScore && best !== undefined && e.key < best.key)) {
        best = e;
        bestScore = score;
      }
    }
    return best;
  }

  private pickFrom(tv: TargetView, target: string, now: number): Entry | undefined {
    for (let w = tv.waiting.peek(); w && w.at <= now; w = tv.waiting.peek()) {
      tv.waiting.pop();
      const e = w.entry;
      if (tv.where.get(e) !== w) continue;
      tv.where.delete(e);
      if (!this.members.has(e)) continue;
      const until = e.targetUntil.get(target)?.at;
      if (until !== undefined && until > now) this.wait(tv, e, until);
      else {
        tv.listed.add(e);
        tv.where.set(e, 'listed');
      }
    }
    // Entries found cooling move to the heap after the walk: the lists must not change under it.
    const cooling: Array<[Entry, number]> = [];
    const found = tv.listed.pick((e) => {
      const until = e.targetUntil.get(target)?.at;
      if (until === undefined || until <= now) return true;
      cooling.push([e, until]);
      return false;
    });
    for (const [e, until] of cooling) {
      tv.listed.remove(e);
      this.wait(tv, e, until);
    }
    return found;
  }

  private wait(tv: TargetView, e: Entry, until: number): void {
    const w: Waiting = { at: until, entry: e, heapIndex: -1 };
    tv.where.set(e, w);
    tv.waiting.push(w);
  }

  private keepTargetView(target: string, now: number): void {
    const tv = new TargetView();
    for (const e of this.members) {
      const until = e.targetUntil.get(target)?.at;
      if (until !== undefined && until > now) this.wait(tv, e, until);
      else {
        tv.listed.add(e);
        tv.where.set(e, 'listed');
      }
    }
    this.targets.set(target, tv);
    if (this.targets.size > MAX_TARGET_VIEWS) {
      const oldest = this.targets.keys().next().value;
      if (oldest !== undefined) this.targets.delete(oldest);
    }
  }
}

/** FNV-1a of affinity and proxy key: cheap, stable across processes and versions. */
export function rendezvousScore(affinity: string, key: string): number {
  const s = `${affinity}\n${key}`;
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h;
}

/**
 * Whether `e` is in `namespace` (any when undefined) and matches `selector` (all when undefined),
 * on its labels and its location's topology keys.
 */
export function matchesFilter(
  e: Entry,
  namespace: string | undefined,
  selector: Selector | undefined,
): boolean {
  if (namespace !== undefined && e.namespace !== namespace) return false;
  return selector === undefined || matchesSelector(selector, e.selectable);
}

/**
 * The unfiltered view plus one view per distinct (namespace, canonical selector) a client asked
 * for, bounded in LRU order: an entry moves in and out of all of them at once.
 */
export class ViewSet {
  private readonly base: View;
  /** Filtered views by `namespace \0 canonical selector`, in LRU order (oldest first). */
  private readonly filtered = new Map<string, View>();

  private readonly maxViews: number;
  private readonly hotSkips: number;

  constructor(maxViews: number, hotSkips = DEFAULT_HOT_TARGET_SKIPS) {
    this.maxViews = maxViews;
    this.hotSkips = hotSkips;
    this.base = new View(undefined, undefined, hotSkips);
  }

  add(e: Entry): void {
    this.base.add(e);
    for (const v of this.filtered.values()) if (v.matches(e)) v.add(e);
  }

  remove(e: Entry): void {
    this.base.remove(e);
    for (const v of this.filtered.values()) if (v.matches(e)) v.remove(e);
  }

  /** Counts `e` in (1) or out (-1) of the census of every view it matches. */
  count(e: Entry, s: Standing, sign: 1 | -1): void {
    this.base.census.count(e, s, sign);
    for (const v of this.filtered.values()) if (v.matches(e)) v.census.count(e, s, sign);
  }

  /** A target cooldown of `e` began (1) or ended (-1): the tallies of its views follow. */
  cooling(e: Entry, target: string, sign: 1 | -1): void {
    if (!reachesTargetRule(e.standing)) return;
    const full = e.standing === 'atCapacity';
    this.base.census.tallyOne(target, full, sign);
    for (const v of this.filtered.values()) if (v.matches(e)) v.census.tallyOne(target, full, sign);
  }

  /** The view for a filter, built from the counted and indexed `entries` when first asked for. */
  get(namespace: string | undefined, selector: Selector | undefined, entries: Iterable<Entry>): View {
    if (namespace === undefined && selector === undefined) return this.base;
    const key = `${namespace ?? ''}\u0000${selector?.canonical ?? ''}`;
    let view = this.filtered.get(key);
    if (view) {
      this.filtered.delete(key);
      this.filtered.set(key, view);
      return view;
    }
    view = new View(namespace, selector, this.hotSkips);
    for (const e of entries) {
      if (e.standing === undefined || !view.matches(e)) continue;
      view.census.count(e, e.standing, 1);
      if (e.indexed) view.add(e);
    }
    this.filtered.set(key, view);
    if (this.filtered.size > this.maxViews) {
      const oldest = this.filtered.keys().next().value;
      if (oldest !== undefined) this.filtered.delete(oldest);
    }
    return view;
  }
}
