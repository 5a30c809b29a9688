/**
 * runtime/embedded/persister — group commit for the standalone state file: changes queue as
 * journal records and one append+fdatasync covers many writes; a write resolves only once it is
 * on disk. When the file cannot be written (a full disk, a read-only or failing state
 * directory), the process keeps running on its memory: writes resolve as they are made, the
 * failure is reported once (StateWrites: a log line, /readyz), and the whole state is rewritten
 * as a fresh snapshot with a backoff until it succeeds — never an append after a failed one, so
 * no torn line can end up in the middle of the file.
 */
import type { Logger } from '../../log/index.ts';
import { type Clock, systemClock } from '../clock.ts';
import type { Journal, JournalRecord, PersistedState } from './journal.ts';
import type { WriteHealth } from './state-writes.ts';

interface Waiter {
  target: number;
  resolve: () => void;
}

/** What the persister needs of the journal (a seam for tests that fail writes on demand). */
export type JournalFile = Pick<Journal, 'records' | 'snapshot' | 'append' | 'close'>;

export interface PersisterOptions {
  journal: JournalFile;
  /** The whole state now, and the sequence number it covers. */
  snapshot: () => { state: PersistedState; seq: number };
  log: Logger;
  /** Journal records after which the file is rewritten as a snapshot. */
  compactAfter: number;
  /** Told about every write's outcome; logs state changes and feeds /readyz. */
  health: WriteHealth;
  clock?: Clock;
  /** Backoff between rewrites of a state file that cannot be written (default 500 ms to 10 s). */
  retryMs?: { initial: number; max: number };
}

/** Group-commit persistence: changes queue as journal records; one append+fdatasync covers many writes. */
export class Persister {
  private readonly journal: JournalFile;
  private readonly snapshot: () => { state: PersistedState; seq: number };
  private readonly log: Logger;
  private readonly compactAfter: number;
  private readonly health: WriteHealth;
  private readonly clock: Clock;
  private readonly retryMs: { initial: number; max: number };
  private pending: JournalRecord[] = [];
  private seq = 0;
  private flushed = 0;
  private running: Promise<void> | undefined;
  private waiters: Waiter[] = [];
  private scheduled: Array<{ target: number; fn: () => void }> = [];
  private needSnapshot = false;
  /** The last write failed: changes live in memory only until a snapshot succeeds. */
  private failing = false;
  private failures = 0;
  private retry: ReturnType<Clock['setTimeout']> | undefined;
  private closed = false;

  constructor(o: PersisterOptions) {
    this.journal = o.journal;
    this.snapshot = o.snapshot;
    this.log = o.log;
    this.compactAfter = o.compactAfter;
    this.health = o.health;
    this.clock = o.clock ?? systemClock;
    this.retryMs = o.retryMs ?? { initial: 500, max: 10_000 };
  }

  get sequence(): number {
    return this.seq;
  }

  record(r: JournalRecord): void {
    this.seq += 1;
    if (this.failing) {
      // The next snapshot carries it; until then it lives in memory, like everything else.
      this.needSnapshot = true;
      this.flushed = this.seq;
      // Not inside the engine's commit: its watchers run after it, as they would after a write.
      queueMicrotask(() => this.settle(this.flushed));
      return;
    }
    this.pending.push(r);
    this.kick();
  }

  /** Resolves once everything recorded so far is durable. */
  durable(): Promise<void> {
    if (this.closed) return Promise.reject(new Error('the standalone store is stopped'));
    const target = this.seq;
    if (this.flushed >= target) return Promise.resolve();
    return new Promise((resolve) => {
      this.waiters.push({ target, resolve });
      this.kick();
    });
  }

  /** Runs `fn` (in order) once everything recorded so far is durable. */
  schedule(fn: () => void): void {
    this.scheduled.push({ target: this.seq, fn });
    if (this.flushed >= this.seq) queueMicrotask(() => this.drain());
  }

  private drain(): void {
    while (this.scheduled.length && (this.scheduled[0] as { target: number }).target <= this.flushed) {
      (this.scheduled.shift() as { fn: () => void }).fn();
    }
  }

  /** Starts a write unless one runs; while failing, only the retry timer starts one. */
  private kick(retrying = false): void {
    if (this.failing && !retrying) return;
    if (!this.running && !this.closed) {
      this.running = this.loop().finally(() => {
        this.running = undefined;
        if (this.pending.length || this.waiters.some((w) => w.target > this.flushed)) this.kick();
      });
    }
  }

  private settle(upTo: number): void {
    this.flushed = Math.max(this.flushed, upTo);
    const left: Waiter[] = [];
    for (const w of this.waiters) {
      if (w.target <= upTo) w.resolve();
      else left.push(w);
    }
    this.waiters = left;
    this.drain();
  }

  private async loop(): Promise<void> {
    // Let the writes of the current tick join this batch.
    await new Promise((r) => setImmediate(r));
    while ((this.pending.length || this.needSnapshot) && !this.closed) {
      const snapshotNow = this.needSnapshot || this.journal.records + this.pending.length > this.compactAfter;
      if (snapshotNow) {
        const { state, seq } = this.snapshot();
        this.pending = [];
        // Cleared before the write: a change recorded meanwhile while failing sets it again.
        this.needSnapshot = false;
        try {
          await this.journal.snapshot(state);
        } catch (e) {
          this.needSnapshot = true;
          this.fail(e, seq);
          return;
        }
        this.recovered();
        this.settle(seq);
        continue;
      }
      const batch = this.pending;
      const upTo = this.seq;
      this.pending = [];
      try {
        await this.journal.append(batch);
      } catch (e) {
        // The journal cut the failed batch off again (or left at most a torn last line): the
        // next attempt rewrites the file whole, never appending after a failure.
        this.needSnapshot = true;
        this.fail(e, upTo);
        return;
      }
      this.recovered();
      this.settle(upTo);
    }
  }

  /**
   * A write failed: what it carried stays in memory, its writers are answered (the process
   * serves on), and a snapshot is retried with a backoff until the disk takes it.
   */
  private fail(err: unknown, upTo: number): void {
    this.failing = true;
    this.failures += 1;
    this.health.failed(err);
    this.pending = []; // the snapshot carries them
    this.settle(Math.max(upTo, this.seq));
    const delay = Math.min(this.retryMs.max, this.retryMs.initial * 2 ** (this.failures - 1));
    if (this.retry) this.clock.clearTimeout(this.retry);
    this.retry = this.clock.setTimeout(() => {
      this.retry = undefined;
      // The failed attempt may still be unwinding: retry once it has.
      if (this.running)
        void this.running.then(
          () => this.kick(true),
          () => this.kick(true),
        );
      else this.kick(true);
    }, delay);
  }

  private recovered(): void {
    this.failing = false;
    this.failures = 0;
    this.health.succeeded();
  }

  async close(): Promise<void> {
    await this.durable().catch(() => {});
    while (this.running) await this.running;
    this.closed = true;
    if (this.retry) this.clock.clearTimeout(this.retry);
    // A clean stop leaves one complete snapshot line: a later truncation then always cuts the
    // snapshot, which the next start reports as data loss instead of taking it for a torn tail.
    if (this.journal.records > 0 || this.needSnapshot) {
      try {
        await this.journal.snapshot(this.snapshot().state);
      } catch (e) {
        if (this.failing)
          this.log.error(
            { err: e },
            'stopping with changes the state file could not take: they are lost (the file holds the state from before the write failures began)',
          );
        else
          this.log.warn(
            { err: e },
            'compacting the standalone state file on stop failed; the journal is kept',
          );
      }
    }
    await this.journal.close();
  }
}
