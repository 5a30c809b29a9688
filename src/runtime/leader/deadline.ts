/**
 * runtime/leader/deadline — an AbortSignal that fires after `ms` on the injected Clock (not
 * `AbortSignal.timeout`, which only knows the wall clock), so lease requests time out in the
 * same time the election is judged in, fake or real.
 */
import type { Clock } from '../clock.ts';

export interface Deadline {
  signal: AbortSignal;
  /** Stops the timer; call when the guarded work is done. */
  cancel(): void;
}

export function clockDeadline(clock: Clock, ms: number, parent?: AbortSignal): Deadline {
  const ac = new AbortController();
  const timer = clock.setTimeout(
    () => ac.abort(new DOMException(`deadline of ${ms} ms exceeded`, 'TimeoutError')),
    Math.max(1, ms),
  );
  return {
    signal: parent ? AbortSignal.any([parent, ac.signal]) : ac.signal,
    cancel: () => clock.clearTimeout(timer),
  };
}
