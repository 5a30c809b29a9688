/**
 * runtime/embedded/persister — group commit for the standalone state file: changes queue as
 * journal records and one append+fdatasync covers many writes; a write resolves only once it is
 * on disk. A failed append is repaired by rewriting the whole file as a snapshot next time.
 */
import { errorMessage } from '../../log/errors.ts';
import type { Logger } from '../../log/index.ts';
import type { Journal, JournalRecord } from './journal.ts';

interface Waiter {
  target: number;
  resolve: () => void;
  reject: (e: unknown) => void;
}

/** Group-commit persistence: changes queue as journal records; one append+fdatasync covers many writes. */
export class Persister {
  private readonly journal: Journal;
  private readonly snapshot: () => { state: Parameters<Journal['snapshot']>[0]; seq: number };
  private readonly log: Logger;
  private readonly compactAfter: number;
  private pending: JournalRecord[] = [];
  private seq = 0;
  private flushed = 0;
  private running: Promise<void> | undefined;
  private waiters: Waiter[] = [];
  private scheduled: Array<{ target: number; fn: () => void }> = [];
  private needSnapshot = false;
  private closed = false;

  constructor(
    journal: Journal,
    snapshot: () => { state: Parameters<Journal['snapshot']>[0]; seq: number },
    log: Logger,
    compactAfter: number,
  ) {
    this.journal = journal;
    this.snapshot = snapshot;
    this.log = log;
    this.compactAfter = compactAfter;
  }

  get sequence(): number {
    return this.seq;
  }

  record(r: JournalRecord): void {
    this.pending.push(r);
    this.seq += 1;
    this.kick();
  }

  /** Resolves once everything recorded so far is durable. */
  durable(): Promise<void> {
    if (this.closed) return Promise.reject(new Error('the standalone store is stopped'));
    const target = this.seq;
    if (this.flushed >= target) return Promise.resolve();
    return new Promise((resolve, reject) => {
      this.waiters.push({ target, resolve, reject });
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

  private kick(): void {
    if (!this.running && !this.closed) {
      this.running = this.loop().finally(() => {
        this.running = undefined;
        if (this.pending.length || this.waiters.some((w) => w.target > this.flushed)) this.kick();
      });
    }
  }

  private settle(upTo: number, err?: unknown): void {
    this.flushed = Math.max(this.flushed, upTo);
    const left: Waiter[] = [];
    for (const w of this.waiters) {
      if (w.target <= upTo) {
        if (err) w.reject(err);
        else w.resolve();
      } else {
        left.push(w);
      }
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
        try {
          await this.journal.snapshot(state);
          this.needSnapshot = false;
          this.settle(seq);
        } catch (e) {
          this.needSnapshot = true;
          this.log.error({ err: e }, 'writing the standalone state file failed');
          this.settle(seq, new Error(`state file write failed: ${errorMessage(e)}`));
          return;
        }
        continue;
      }
      const batch = this.pending;
      const upTo = this.seq;
      this.pending = [];
      try {
        await this.journal.append(batch);
        this.settle(upTo);
      } catch (e) {
        // The file may now hold a partial batch: rewrite it whole on the next attempt.
        this.needSnapshot = true;
        this.log.error({ err: e }, 'appending to the standalone state file failed');
        this.settle(upTo, new Error(`state file write failed: ${errorMessage(e)}`));
        return;
      }
    }
  }

  async close(): Promise<void> {
    await this.durable().catch(() => {});
    while (this.running) await this.running;
    this.closed = true;
    // A clean stop leaves one complete snapshot line: a later truncation then always cuts the
    // snapshot, which the next start reports as data loss instead of taking it for a torn tail.
    if (this.journal.records > 0 || this.needSnapshot) {
      try {
        await this.journal.snapshot(this.snapshot().state);
      } catch (e) {
        this.log.warn({ err: e }, 'compacting the standalone state file on stop failed; the journal is kept');
      }
    }
    await this.journal.close();
  }
}
