/**
 * runtime/clock — time as a dependency, so backoff, leases, health thresholds and leader
 * election can be tested with a fake clock instead of sleeps.
 */

export interface Clock {
  now(): number;
  setTimeout(fn: () => void, ms: number): TimerHandle;
  clearTimeout(handle: TimerHandle): void;
}

export interface TimerHandle {
  readonly id: number;
}

let nextId = 1;

export const systemClock: Clock = {
  now: () => Date.now(),
  setTimeout(fn, ms) {
    const t = setTimeout(fn, ms);
    t.unref?.();
    return Object.assign({ id: nextId++ }, { t });
  },
  clearTimeout(handle) {
    clearTimeout((handle as unknown as { t: NodeJS.Timeout }).t);
  },
};

/** Deterministic clock for tests: time moves only when `advance` is called. */
export class FakeClock implements Clock {
  private current: number;
  private timers = new Map<number, { at: number; fn: () => void }>();

  constructor(start = Date.parse('2026-01-01T00:00:00Z')) {
    this.current = start;
  }

  now(): number {
    return this.current;
  }

  setTimeout(fn: () => void, ms: number): TimerHandle {
    const id = nextId++;
    this.timers.set(id, { at: this.current + Math.max(0, ms), fn });
    return { id };
  }

  clearTimeout(handle: TimerHandle): void {
    this.timers.delete(handle.id);
  }

  /** Move time forward, firing due timers in order (timers set by timers fire too). */
  advance(ms: number): void {
    const target = this.current + ms;
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
      this.current = Math.max(this.current, timer.at);
      timer.fn();
    }
    this.current = target;
  }

  pendingTimers(): number {
    return this.timers.size;
  }
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
