/**
 * lease/target-cooldowns — every per-target cooldown of the fleet in one min-heap by end time, so that
 * ended cooldowns are purged by time (not only when a grant happens to look at them) and the
 * total number of entries stays under a cap: past it, the entry that would end soonest is
 * evicted first (it is the one that costs the least protection to forget). Each cooldown is one
 * object, held by its entry's `targetUntil` map and by the heap.
 */
import type { Entry, TargetCooldown } from './entry.ts';
import { IndexedHeap } from './ordered.ts';
import type { CooldownOrigin } from './types.ts';

export const DEFAULT_MAX_TARGET_COOLDOWNS = 200_000;

export type CooldownObserver = (e: Entry, target: string, sign: 1 | -1) => void;
/** Hears of every cooldown that begins or lengthens, with its new end (gateway/hub pushes them to replicas). */
export type CooldownWatcher = (e: Entry, target: string, until: number) => void;

export class TargetCooldowns {
  private readonly heap = new IndexedHeap<TargetCooldown>((a, b) => a.at < b.at);
  private readonly max: number;
  private readonly onEvict: () => void;
  private readonly onChange: CooldownObserver;
  private readonly watchers = new Set<CooldownWatcher>();

  /** `onChange` hears of every cooldown that begins (1) or is forgotten (-1), whoever set it. */
  constructor(max: number, onEvict: () => void, onChange: CooldownObserver = () => {}) {
    this.max = Math.max(1, max);
    this.onEvict = onEvict;
    this.onChange = onChange;
  }

  get size(): number {
    return this.heap.size;
  }

  /** Adds a watcher besides `onChange`; returns the function that removes it. */
  watch(w: CooldownWatcher): () => void {
    this.watchers.add(w);
    return () => this.watchers.delete(w);
  }

  /**
   * Cools `e` down for `target` until at least `until`; evicts the soonest-ending beyond the cap.
   * `from`: taken on from another proxy on its egress address (undefined: `e`'s own); the
   * cooldown keeps the origin of whatever last lengthened it.
   */
  set(e: Entry, target: string, until: number, from?: CooldownOrigin): void {
    const current = e.targetUntil.get(target);
    if (current) {
      if (until <= current.at) return;
      current.at = until;
      current.from = from;
      this.heap.update(current);
      for (const w of this.watchers) w(e, target, until);
      return;
    }
    const fresh: TargetCooldown = { at: until, target, entry: e, from, heapIndex: -1 };
    e.targetUntil.set(target, fresh);
    this.heap.push(fresh);
    this.onChange(e, target, 1);
    for (const w of this.watchers) w(e, target, until);
    while (this.heap.size > this.max) {
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

  private forget(c: TargetCooldown): void {
    this.heap.remove(c);
    if (c.entry.targetUntil.get(c.target) !== c) return;
    c.entry.targetUntil.delete(c.target);
    this.onChange(c.entry, c.target, -1);
  }
}
