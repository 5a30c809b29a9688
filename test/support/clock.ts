/**
 * test/support/clock — a deterministic Clock for tests: time moves only when the test calls
 * `advance`, so periods, timeouts and backoffs are driven without waiting on the wall clock.
 */
import type { Clock, TimerHandle } from '../../src/runtime/clock.ts';

let nextId = 1;

export class FakeClock implements Clock {
  private current: number;
  /** Moves with `advance` only, never with `stepWall`; timers run on it. */
  private mono = 0;
  private timers = new Map<number, { at: number; fn: () => void }>();

  constructor(start = Date.parse('2026-01-01T00:00:00Z')) {
    this.current = start;
  }

  now(): number {
    return this.current;
  }

  monotonic(): number {
    return this.mono;
  }

  /** Steps the wall clock alone (an NTP correction, a VM resumed): timers and monotonic time stay. */
  stepWall(ms: number): void {
    this.current += ms;
  }

  setTimeout(fn: () => void, ms: number): TimerHandle {
    const id = nextId++;
    this.timers.set(id, { at: this.mono + Math.max(0, ms), fn });
    return { id };
  }

  clearTimeout(handle: TimerHandle): void {
    this.timers.delete(handle.id);
  }

  /** Move time forward, firing due timers in order (timers set by timers fire too). */
  advance(ms: number): void {
    const target = this.mono + ms;
    for (;;) {
      let dueId: number | undefined;
      let dueAt = Number.POSITIVE_INFINITY;
      for (const [id, t] of this.timers) {
        if (t.at <= target && t.at < dueAt) {
          dueAt = t.at;
          dueId = id;
        }
      }
      if (dueId === undefined) break;
      const timer = this.timers.get(dueId)!;
      this.timers.delete(dueId);
      this.moveTo(Math.max(this.mono, timer.at));
      timer.fn();
    }
    this.moveTo(target);
  }

  private moveTo(mono: number): void {
    this.current += mono - this.mono;
    this.mono = mono;
  }

  pendingTimers(): number {
    return this.timers.size;
  }
}
