/**
 * gateway/unauthenticated — the gateway's connections that have not authenticated yet
 * (docs/gateway.md, "Unauthenticated connections"). Every accepted connection starts here and
 * leaves at its first request or CONNECT with valid credentials. While here it has a deadline
 * (accepted + timeout, whether or not it sent anything) and counts against its own cap; at the
 * cap the oldest is closed for the newcomer, so a flood without credentials can neither hold
 * the capacity of clients that authenticate nor starve new ones of a chance to. Every entry has
 * the same timeout, so accept order is deadline order: one timer, for the oldest, serves all.
 */
import type { Clock, TimerHandle } from '../runtime/clock.ts';

/** What this needs of a connection: a way to close it. */
export interface Closable {
  destroy(): void;
}

export type UnauthenticatedCloseReason = 'cap' | 'timeout';

export interface UnauthenticatedOptions {
  cap: number;
  timeoutMs: number;
  clock: Clock;
  /** Called for every connection this closes. */
  onClose?: (reason: UnauthenticatedCloseReason) => void;
  /** Called whenever the number of unauthenticated connections changes. */
  onCount?: (size: number) => void;
}

export class UnauthenticatedConnections<S extends Closable> {
  /** Accept order, which is deadline order; the value is the deadline (monotonic ms). */
  private readonly waiting = new Map<S, number>();
  private timer: TimerHandle | undefined;
  private readonly opts: UnauthenticatedOptions;

  constructor(opts: UnauthenticatedOptions) {
    this.opts = opts;
  }

  get size(): number {
    return this.waiting.size;
  }

  /** A new connection: counted, given its deadline; the oldest is closed if the cap is reached. */
  admit(s: S): void {
    while (this.waiting.size >= this.opts.cap) {
      const oldest = this.waiting.keys().next().value as S;
      this.closeOne(oldest, 'cap');
    }
    this.waiting.set(s, this.opts.clock.monotonic() + this.opts.timeoutMs);
    this.opts.onCount?.(this.waiting.size);
    if (this.timer === undefined) this.arm();
  }

  /** The connection authenticated (or closed): it no longer counts, and has no deadline. */
  leave(s: S): void {
    if (this.waiting.delete(s)) this.opts.onCount?.(this.waiting.size);
  }

  /** Stops the timer (the listener is closing; its connections are cut anyway). */
  close(): void {
    if (this.timer !== undefined) this.opts.clock.clearTimeout(this.timer);
    this.timer = undefined;
  }

  private closeOne(s: S, reason: UnauthenticatedCloseReason): void {
    this.leave(s);
    this.opts.onClose?.(reason);
    s.destroy();
  }

  /** One timer, for the oldest deadline; on firing, closes every connection past its deadline. */
  private arm(): void {
    const first = this.waiting.values().next();
    if (first.done) {
      this.timer = undefined;
      return;
    }
    const wait = Math.max(0, first.value - this.opts.clock.monotonic());
    this.timer = this.opts.clock.setTimeout(() => {
      const now = this.opts.clock.monotonic();
      for (const [s, deadline] of this.waiting) {
        if (deadline > now) break;
        this.closeOne(s, 'timeout');
      }
      this.arm();
    }, wait);
  }
}
