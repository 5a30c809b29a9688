/**
 * runtime/clock — time as a dependency, so backoff, leases, health thresholds and leader
 * election can be tested with a fake clock (test/support/clock.ts) instead of sleeps.
 */

export interface Clock {
  /** Wall-clock milliseconds since the epoch: for timestamps others read. */
  now(): number;
  /**
   * Milliseconds on a clock that never steps (only differences mean anything): for deadlines
   * that a wall-clock step must neither extend nor cut short.
   */
  monotonic(): number;
  setTimeout(fn: () => void, ms: number): TimerHandle;
  clearTimeout(handle: TimerHandle): void;
}

export interface TimerHandle {
  readonly id: number;
}

let nextId = 1;

export const systemClock: Clock = {
  now: () => Date.now(),
  monotonic: () => performance.now(),
  setTimeout(fn, ms) {
    const t = setTimeout(fn, ms);
    t.unref?.();
    return Object.assign({ id: nextId++ }, { t });
  },
  clearTimeout(handle) {
    clearTimeout((handle as unknown as { t: NodeJS.Timeout }).t);
  },
};

/** Resolves after `ms` on `clock`; rejects with the signal's reason if it aborts first. */
export function sleep(ms: number, signal?: AbortSignal, clock: Clock = systemClock): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = clock.setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clock.clearTimeout(t);
      reject(signal?.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * `AbortSignal.timeout` on the injected clock: aborts with a `TimeoutError` after `ms`.
 * `cancel` drops the timer once the bounded work is done.
 */
export function timeoutSignal(clock: Clock, ms: number): { signal: AbortSignal; cancel(): void } {
  const ctrl = new AbortController();
  const t = clock.setTimeout(
    () => ctrl.abort(new DOMException('The operation was aborted due to timeout', 'TimeoutError')),
    ms,
  );
  return { signal: ctrl.signal, cancel: () => clock.clearTimeout(t) };
}
