/**
 * health/scheduler — runs keyed jobs on a fixed grid (slot, slot + interval, …) under a
 * concurrency cap, on the injected clock. Shared by the health probes (fired in batches on a
 * coarser grid), the control probes and the egress-IP check: a job never overlaps itself, a
 * stalled event loop skips missed slots instead of bursting, and a run requested out of
 * schedule jumps the queue.
 */
import { IndexedHeap } from '../lease/ordered.ts';
import type { Clock, TimerHandle } from '../runtime/clock.ts';

/**
 * Where a job is between its slots. `idle` jobs wait for their slot; `queued` ones for a free
 * place under the cap; `running` ones for their run to settle; `rerun` ones are running and
 * were asked to run once more as soon as they finish (a requested run is never dropped).
 */
export type JobState = 'idle' | 'queued' | 'running' | 'rerun';

interface Job {
  readonly key: string;
  heapIndex: number;
  /** The next slot, clock ms. */
  due: number;
  intervalMs: number;
  state: JobState;
  /** The slot a queued run was due at, for the lag statistics. */
  queuedDue: number;
}

export interface SchedulerStats {
  /** Runs started. */
  runs: number;
  /** Slots not run because the job's previous run was still going. */
  skipped: number;
  /** Largest start delay behind a slot seen so far, ms. */
  maxLagMs: number;
}

export interface SlotSchedulerOptions {
  clock: Clock;
  /** Runs at once; Infinity for no cap. */
  concurrency: number;
  /**
   * Fire slots on a grid of this many ms (default 0: each slot at its time): the slots due
   * within one step start together, so a busy schedule wakes the event loop once per step
   * instead of once per slot. A slot starts at most this late, at the same phase every interval.
   */
  batchMs?: number;
  /** One run of `key`. A rejection is passed to `onError`; the job stays scheduled. */
  run(key: string): Promise<void>;
  onError?(key: string, err: unknown): void;
}

export class SlotScheduler {
  private readonly clock: Clock;
  private readonly concurrency: number;
  private readonly batchMs: number;
  private readonly runJob: (key: string) => Promise<void>;
  private readonly onError: (key: string, err: unknown) => void;
  private readonly jobs = new Map<string, Job>();
  private readonly heap = new IndexedHeap<Job>((a, b) => a.due < b.due);
  /** Jobs waiting for a place under the cap; requested runs go first. */
  private readonly waiting: Job[] = [];
  private readonly settling = new Set<Promise<void>>();
  private timer: TimerHandle | undefined;
  private timerAt = Number.POSITIVE_INFINITY;
  private active = false;
  private running = 0;
  private readonly counters: SchedulerStats = { runs: 0, skipped: 0, maxLagMs: 0 };

  constructor(opts: SlotSchedulerOptions) {
    this.clock = opts.clock;
    this.concurrency = opts.concurrency;
    this.batchMs = opts.batchMs ?? 0;
    this.runJob = opts.run;
    this.onError = opts.onError ?? (() => undefined);
  }

  /** Runs in progress. */
  get inFlight(): number {
    return this.running;
  }

  /** Runs in progress or waiting for a place under the cap. */
  get busy(): number {
    return this.running + this.waiting.length;
  }

  get size(): number {
    return this.jobs.size;
  }

  stats(): SchedulerStats {
    return { ...this.counters };
  }

  resetStats(): void {
    Object.assign(this.counters, { runs: 0, skipped: 0, maxLagMs: 0 });
  }

  start(): void {
    if (this.active) return;
    this.active = true;
    this.arm();
  }

  /** Stops firing slots, drops queued runs and waits for the runs in progress to settle. */
  async stop(): Promise<void> {
    this.active = false;
    this.disarm();
    for (const job of this.waiting.splice(0)) if (job.state === 'queued') job.state = 'idle';
    await Promise.allSettled([...this.settling]);
  }

  has(key: string): boolean {
    return this.jobs.has(key);
  }

  /** Adds `key` with its first slot at `firstDue`; a job already there is replaced. */
  add(key: string, intervalMs: number, firstDue: number): void {
    this.delete(key);
    const job: Job = { key, heapIndex: -1, due: firstDue, intervalMs, state: 'idle', queuedDue: 0 };
    this.jobs.set(key, job);
    this.heap.push(job);
    this.arm();
  }

  /** Changes the interval; `nextDue` moves the pending slot, else it stays where it was. */
  retime(key: string, intervalMs: number, nextDue?: number): void {
    const job = this.jobs.get(key);
    if (!job) return;
    job.intervalMs = intervalMs;
    if (nextDue === undefined) return;
    job.due = nextDue;
    this.heap.update(job);
    this.arm();
  }

  /** Forgets `key`; a run in progress finishes, but nothing of the job runs again. */
  delete(key: string): void {
    const job = this.jobs.get(key);
    if (!job) return;
    this.jobs.delete(key);
    this.heap.remove(job);
  }

  /** Runs `key` now, out of schedule, ahead of queued slots; after the current run if one is going. */
  runNow(key: string): void {
    const job = this.jobs.get(key);
    if (!job || !this.active) return;
    if (job.state === 'running' || job.state === 'rerun') {
      job.state = 'rerun';
      return;
    }
    this.dispatch(job, this.clock.now(), true);
  }

  private arm(): void {
    if (!this.active) return;
    const top = this.heap.peek();
    if (!top) return;
    const at = this.batchMs > 0 ? Math.ceil(top.due / this.batchMs) * this.batchMs : top.due;
    if (this.timer && this.timerAt <= at) return;
    this.disarm();
    this.timerAt = at;
    this.timer = this.clock.setTimeout(() => this.tick(), Math.max(0, at - this.clock.now()));
  }

  private disarm(): void {
    if (this.timer) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.timerAt = Number.POSITIVE_INFINITY;
  }

  private tick(): void {
    this.timer = undefined;
    this.timerAt = Number.POSITIVE_INFINITY;
    if (!this.active) return;
    const now = this.clock.now();
    for (let job = this.heap.peek(); job && job.due <= now; job = this.heap.peek()) {
      const due = job.due;
      job.due = nextDueAfter(due, job.intervalMs, now, (missed) => {
        this.counters.skipped += missed;
      });
      this.heap.update(job);
      this.dispatch(job, due, false);
    }
    this.arm();
  }

  private dispatch(job: Job, due: number, urgent: boolean): void {
    if (job.state === 'running' || job.state === 'rerun') {
      this.counters.skipped++;
      return;
    }
    if (this.running < this.concurrency) {
      this.launch(job, due);
      return;
    }
    if (job.state === 'queued') return;
    job.state = 'queued';
    job.queuedDue = due;
    if (urgent) this.waiting.unshift(job);
    else this.waiting.push(job);
  }

  private drain(): void {
    while (this.running < this.concurrency && this.waiting.length > 0) {
      const job = this.waiting.shift() as Job;
      if (job.state !== 'queued') continue;
      job.state = 'idle';
      if (this.jobs.get(job.key) !== job || !this.active) continue;
      this.launch(job, job.queuedDue);
    }
  }

  private launch(job: Job, due: number): void {
    const lag = this.clock.now() - due;
    if (lag > this.counters.maxLagMs) this.counters.maxLagMs = lag;
    this.counters.runs++;
    job.state = 'running';
    this.running++;
    const p = this.runJob(job.key)
      .catch((err) => this.onError(job.key, err))
      .finally(() => {
        this.settling.delete(p);
        const again = job.state === 'rerun';
        job.state = 'idle';
        this.running--;
        this.drain();
        if (again && this.active && this.jobs.get(job.key) === job) {
          this.dispatch(job, this.clock.now(), true);
        }
      });
    this.settling.add(p);
  }
}

/**
 * The slot after `due` that is still ahead of `now`: normally due + interval; far behind (a
 * stalled event loop) the missed slots are skipped and reported rather than run in a burst.
 */
export function nextDueAfter(
  due: number,
  intervalMs: number,
  now: number,
  onMissed: (missed: number) => void,
): number {
  const next = due + intervalMs;
  if (next > now) return next;
  const missed = Math.floor((now - due) / intervalMs);
  onMissed(missed);
  return due + (missed + 1) * intervalMs;
}
