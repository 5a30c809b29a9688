/**
 * runtime/leader/elector — the leader-election seam the manager drives, and the standalone
 * elector for single-process mode (there the embedded store's lock file keeps a second process
 * out, so the only process always leads).
 */

export interface LeaderCallbacks {
  /** Called once when leadership is acquired; `signal` aborts when leadership ends. */
  onStartedLeading(signal: AbortSignal): void;
  /** Called once when leadership ends after having started (lost, or released on shutdown). */
  onStoppedLeading(): void;
  /** Called when the observed leader identity changes (including to ourselves). */
  onNewLeader?(identity: string): void;
}

export interface LeaderElector {
  /** This replica's identity as written into the lock. */
  readonly identity: string;
  /**
   * Campaigns until `signal` aborts or leadership is lost; resolves then. It does not release
   * the lock by itself: call `release()` for a graceful hand-over.
   */
  run(signal: AbortSignal, callbacks: LeaderCallbacks): Promise<void>;
  isLeader(): boolean;
  /** The leader's published discovery API URL, when known (cluster mode; see leader/lease). */
  leaderAddress?(): string | undefined;
  /** Stops renewing and gives the lock up so another replica can take over at once. */
  release(): Promise<void>;
}

/** Thrown (as the manager's exit reason) when a leader could not renew in time. */
export class LeaderElectionLost extends Error {
  constructor(message = 'leader election lost', opts?: { cause?: unknown }) {
    super(message, opts);
    this.name = 'LeaderElectionLost';
  }
}

/** Leads immediately and until stopped; for the single-process standalone mode. */
export class StandaloneElector implements LeaderElector {
  readonly identity: string;
  private leading = false;
  private leadership: AbortController | undefined;
  private callbacks: LeaderCallbacks | undefined;

  constructor(identity = 'standalone') {
    this.identity = identity;
  }

  async run(signal: AbortSignal, callbacks: LeaderCallbacks): Promise<void> {
    if (signal.aborted) return;
    this.callbacks = callbacks;
    this.leading = true;
    this.leadership = new AbortController();
    callbacks.onNewLeader?.(this.identity);
    callbacks.onStartedLeading(this.leadership.signal);
    await new Promise<void>((resolve) => {
      const done = () => resolve();
      signal.addEventListener('abort', done, { once: true });
      this.leadership?.signal.addEventListener('abort', done, { once: true });
    });
    this.stopLeading();
  }

  isLeader(): boolean {
    return this.leading;
  }

  async release(): Promise<void> {
    this.stopLeading();
  }

  private stopLeading(): void {
    if (!this.leading) return;
    this.leading = false;
    this.leadership?.abort();
    this.callbacks?.onStoppedLeading();
  }
}
