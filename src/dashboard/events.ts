/**
 * dashboard/events — the bounded ring of recent fleet events (phase changes, health flips,
 * blocks, replacements): the oldest falls out once `capacity` is reached, and readers ask for
 * what came after the last sequence number they saw.
 */
import type { EventKind, FleetEvent } from './web/types.ts';

export const DEFAULT_EVENT_CAPACITY = 500;

export class EventRing {
  private readonly items: FleetEvent[] = [];
  private seq = 0;
  private readonly capacity: number;

  constructor(capacity = DEFAULT_EVENT_CAPACITY) {
    this.capacity = capacity;
    if (!Number.isInteger(capacity) || capacity < 1)
      throw new Error('event capacity must be a positive integer');
  }

  add(at: number, kind: EventKind, proxy: string | null, message: string): FleetEvent {
    const event: FleetEvent = { seq: ++this.seq, at: new Date(at).toISOString(), kind, proxy, message };
    this.items.push(event);
    // Amortised: drop a batch at once instead of shifting on every add.
    if (this.items.length >= this.capacity * 2) this.items.splice(0, this.items.length - this.capacity);
    return event;
  }

  /**
   * Events with seq > `after`, oldest first, at most `capacity` of them. An `after` beyond the
   * newest (a reader that saw another process's ring, before a restart or a change of leader)
   * reads as 0: everything held.
   */
  since(after: number): FleetEvent[] {
    if (after > this.seq) return this.since(0);
    const kept = this.items.length > this.capacity ? this.items.length - this.capacity : 0;
    const first = this.items.length - (this.seq - after);
    return this.items.slice(Math.max(kept, first, 0));
  }

  get last(): number {
    return this.seq;
  }
}
