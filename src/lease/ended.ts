/**
 * lease/ended — leases that were released or expired recently, so a crawler that learns late
 * that a site blocked it can still report it (docs/api.md: reports after the fact). Kept in end
 * order for a fixed retention and under a count cap, oldest forgotten first.
 */
import type { Entry } from './entry.ts';

export const REPORTABLE_AFTER_END_MS = 15 * 60_000;

export interface EndedLease {
  entry: Entry;
  target: string | undefined;
  endedAt: number;
}

export class EndedLeases {
  /** Insertion order is end order: the oldest is always first. */
  private readonly byId = new Map<string, EndedLease>();
  private readonly retentionMs: number;
  private readonly max: number;

  constructor(retentionMs: number, max: number) {
    this.retentionMs = retentionMs;
    this.max = Math.max(0, max);
  }

  get size(): number {
    return this.byId.size;
  }

  add(id: string, ended: EndedLease): void {
    if (this.max === 0) return;
    this.byId.delete(id);
    this.byId.set(id, ended);
    while (this.byId.size > this.max) {
      const oldest = this.byId.keys().next();
      if (oldest.done) break;
      this.byId.delete(oldest.value);
    }
  }

  get(id: string, now: number): EndedLease | undefined {
    const e = this.byId.get(id);
    return e && e.endedAt + this.retentionMs > now ? e : undefined;
  }

  purge(now: number): void {
    for (const [id, e] of this.byId) {
      if (e.endedAt + this.retentionMs > now) return;
      this.byId.delete(id);
    }
  }

  entries(): IterableIterator<[string, EndedLease]> {
    return this.byId.entries();
  }
}
