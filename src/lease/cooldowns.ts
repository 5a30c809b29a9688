/**
 * lease/cooldowns — every per-target cooldown of the fleet in one min-heap by end time, so that
 * ended cooldowns are purged by time (not only when a grant happens to look at them) and the
 * total number of entries stays under a cap: past it, the entry that would end soonest is
 * evicted first (it is the one that costs the least protection to forget).
 */
import type { Entry } from './entry.ts';
import { IndexedHeap } from './ordered.ts';

interface Item {
  at: number;
  entry: Entry;
  target: string;
  heapIndex: number;
}

export const DEFAULT_MAX_TARGET_COOLDOWNS = 200_000;

export class TargetCooldowns {
  private readonly heap = new IndexedHeap<Item>((a, b) => a.at < b.at);
  /** One item per (entry, target); the entry object is the key, so a recreated proxy starts clean. */
  private readonly items = new Map<Entry, Map<string, Item>>();
  private count = 0;
  private readonly max: number;
  private readonly onEvict: () => void;

  constructor(max: number, onEvict: () => void) {
    this.max = Math.max(1, max);
    this.onEvict = onEvict;
  }

  get size(): number {
    return this.count;
  }

  /** Cools `e` down for `target` until at least `until`; evicts the soonest-ending beyond the cap. */
  set(e: Entry, target: string, until: number): void {
    const current = e.targetUntil.get(target) ?? 0;
    const at = Math.max(until, current);
    e.targetUntil.set(target, at);
    let perEntry = this.items.get(e);
    if (!perEntry) {
      perEntry = new Map();
      this.items.set(e, perEntry);
    }
    const item = perEntry.get(target);
    if (item) {
      item.at = at;
      this.heap.update(item);
    } else {
      const fresh: Item = { at, entry: e, target, heapIndex: -1 };
      perEntry.set(target, fresh);
      this.heap.push(fresh);
      this.count++;
    }
    while (this.count > this.max) {
      const victim = this.heap.peek();
      if (!victim) break;
      this.forget(victim);
      this.onEvict();
    }
  }

  /** Drops every cooldown that has ended by `now`. */
  purge(now: number): void {
    for (let top = this.heap.peek(); top && top.at <= now; top = this.heap.peek()) this.forget(top);
  }

  private forget(item: Item): void {
    this.heap.remove(item);
    this.count--;
    const perEntry = this.items.get(item.entry);
    perEntry?.delete(item.target);
    if (perEntry?.size === 0) this.items.delete(item.entry);
    if (item.entry.targetUntil.get(item.target) === item.at) item.entry.targetUntil.delete(item.target);
  }
}
