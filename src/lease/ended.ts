/**
 * lease/ended — leases that were released or expired recently, so a crawler that learns late
 * that a site blocked it can still report it (docs/lease-api.md: reports after the fact). Kept in end
 * order for a fixed retention and under a count cap, oldest forgotten first.
 *
 * A ring of slots, not a Map walked from its oldest key: a Map keeps deleted keys as holes until
 * it rehashes, and every walk from the front skips them again, so at the cap each release paid
 * for tens of thousands of holes (docs/benchmarks.md, "Lease API"). The ring forgets its oldest
 * slot in constant time; the Map here only answers "which slot holds this id".
 */
import type { Entry } from './entry.ts';

export const REPORTABLE_AFTER_END_MS = 15 * 60_000;

export interface EndedLease {
  entry: Entry;
  target: string | undefined;
  endedAt: number;
}

export class EndedLeases {
  private readonly slotOf = new Map<string, number>();
  /** Per slot; an `undefined` id marks a slot vacated by a re-add of its id. */
  private ids: Array<string | undefined> = [];
  private owners: Array<Entry | undefined> = [];
  private targets: Array<string | undefined> = [];
  private endedAt: number[] = [];
  /** The oldest slot, how many slots from it are in use, and how many of those are vacated. */
  private head = 0;
  private used = 0;
  private vacated = 0;
  private readonly retentionMs: number;
  private readonly max: number;

  constructor(retentionMs: number, max: number) {
    this.retentionMs = retentionMs;
    this.max = Math.max(0, Math.floor(max));
  }

  get size(): number {
    return this.slotOf.size;
  }

  add(id: string, ended: EndedLease): void {
    if (this.max === 0) return;
    const previous = this.slotOf.get(id);
    if (previous !== undefined) {
      this.vacate(previous);
      this.vacated++;
    }
    if (this.used - this.vacated === this.max) this.dropOldestLease();
    // Re-adds are rare (a restore): when their vacated slots fill the ring, close the gaps.
    if (this.used === this.max) this.compact();
    const slot = (this.head + this.used) % this.max;
    this.used++;
    if (slot === this.ids.length) {
      // The ring grows up to its cap as leases end; it never shrinks.
      this.ids.push(id);
      this.owners.push(ended.entry);
      this.targets.push(ended.target);
      this.endedAt.push(ended.endedAt);
    } else {
      this.ids[slot] = id;
      this.owners[slot] = ended.entry;
      this.targets[slot] = ended.target;
      this.endedAt[slot] = ended.endedAt;
    }
    this.slotOf.set(id, slot);
  }

  get(id: string, now: number): EndedLease | undefined {
    const slot = this.slotOf.get(id);
    if (slot === undefined) return undefined;
    const ended = this.at(slot);
    return ended && ended.endedAt + this.retentionMs > now ? ended : undefined;
  }

  purge(now: number): void {
    while (this.used > 0) {
      const slot = this.head;
      if (this.ids[slot] !== undefined && this.endedAt[slot]! + this.retentionMs > now) return;
      this.dropOldestSlot();
    }
  }

  /** Every lease kept, oldest first (expired ones not yet purged included). */
  *entries(): IterableIterator<[string, EndedLease]> {
    for (let i = 0; i < this.used; i++) {
      const slot = (this.head + i) % this.max;
      const id = this.ids[slot];
      const ended = this.at(slot);
      if (id !== undefined && ended) yield [id, ended];
    }
  }

  private at(slot: number): EndedLease | undefined {
    const entry = this.owners[slot];
    if (entry === undefined) return undefined;
    return { entry, target: this.targets[slot], endedAt: this.endedAt[slot]! };
  }

  private dropOldestSlot(): void {
    const slot = this.head;
    const id = this.ids[slot];
    if (id !== undefined) this.slotOf.delete(id);
    else this.vacated--;
    this.vacate(slot);
    this.head = (this.head + 1) % this.max;
    this.used--;
  }

  private dropOldestLease(): void {
    while (this.used > 0) {
      const live = this.ids[this.head] !== undefined;
      this.dropOldestSlot();
      if (live) return;
    }
  }

  /** Moves the kept leases to the front of fresh slots, in order, without the vacated ones. */
  private compact(): void {
    const kept = [...this.entries()];
    this.ids = kept.map(([id]) => id);
    this.owners = kept.map(([, e]) => e.entry);
    this.targets = kept.map(([, e]) => e.target);
    this.endedAt = kept.map(([, e]) => e.endedAt);
    this.head = 0;
    this.used = kept.length;
    this.vacated = 0;
    this.slotOf.clear();
    for (const [slot, [id]] of kept.entries()) this.slotOf.set(id, slot);
  }

  /** Empties a slot; it keeps its place in the ring until the head passes it. */
  private vacate(slot: number): void {
    this.ids[slot] = undefined;
    this.owners[slot] = undefined;
    this.targets[slot] = undefined;
  }
}
