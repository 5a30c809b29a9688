/**
 * runtime/workqueue — the de-duplicating, rate-limited work queue that sits between event
 * handlers and reconcile workers, with client-go semantics: a key queued twice is queued once;
 * a key re-added while a worker holds it is handed out again only after that worker is done,
 * so no two workers ever hold the same key; failures back off per key, exponentially.
 */
import type { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { type Logger, silentLogger } from '../log/index.ts';
import { counter, gauge, histogram } from '../metrics/register.ts';
import { type Clock, systemClock, type TimerHandle } from './clock.ts';

export interface WorkQueueOptions {
  /** Metric label and log field; one per controller. */
  name: string;
  clock?: Clock;
  registry?: Registry;
  log?: Logger;
  /** First retry delay of `addRateLimited` (default 1 s). */
  baseDelayMs?: number;
  /** Cap of the exponential backoff (default 5 min). */
  maxDelayMs?: number;
}

/** What `process` may return: `requeueAfter` polls again later; `forget: false` keeps the backoff count. */
export interface ProcessResult {
  requeueAfter?: number;
  forget?: boolean;
}

export interface RunWorkersOptions {
  concurrency: number;
  /** Aborting stops handing out keys; in-flight calls finish, then `runWorkers` resolves. */
  signal: AbortSignal;
  process: (key: string) => Promise<ProcessResult | undefined> | Promise<void>;
}

/**
 * The one error that asks for a specific retry delay instead of the exponential backoff
 * (e.g. quota errors: a fixed, slower retry). Every other error backs off.
 */
export class RetryAfterError extends Error {
  readonly retryAfterMs: number;
  constructor(message: string, retryAfterMs: number, opts?: { cause?: unknown }) {
    super(message, opts);
    this.name = 'RetryAfterError';
    this.retryAfterMs = retryAfterMs;
  }
}

/** The retry delay an error asks for: a RetryAfterError with a usable delay. */
export function retryAfterOf(err: unknown): number | undefined {
  if (!(err instanceof RetryAfterError)) return undefined;
  const ms = err.retryAfterMs;
  return Number.isFinite(ms) && ms >= 0 ? ms : undefined;
}

/** Per-item exponential backoff: base × 2^failures, capped. Pure, for tests and reuse. */
export function backoffDelay(failures: number, baseMs: number, maxMs: number): number {
  const exp = baseMs * 2 ** Math.min(failures, 62);
  return Number.isFinite(exp) ? Math.min(exp, maxMs) : maxMs;
}

interface QueueMetrics {
  depth: Gauge<'name'>;
  adds: Counter<'name'>;
  retries: Counter<'name'>;
  duration: Histogram<'name'>;
}

function queueMetrics(registry: Registry): QueueMetrics {
  // Several queues share one registry, each under its own `name` label.
  const labelNames = ['name'] as const;
  return {
    depth: gauge(registry, {
      name: 'proxy_operator_workqueue_depth',
      help: 'Keys waiting in the work queue (not counting delayed ones).',
      labelNames,
    }),
    adds: counter(registry, {
      name: 'proxy_operator_workqueue_adds_total',
      help: 'Keys added to the work queue.',
      labelNames,
    }),
    retries: counter(registry, {
      name: 'proxy_operator_workqueue_retries_total',
      help: 'Rate-limited re-adds (failed work).',
      labelNames,
    }),
    duration: histogram(registry, {
      name: 'proxy_operator_workqueue_work_duration_seconds',
      help: 'Time a worker spent on one key.',
      labelNames,
      buckets: [0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    }),
  };
}

export class WorkQueue {
  readonly name: string;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly baseDelayMs: number;
  private readonly maxDelayMs: number;
  private readonly metrics: QueueMetrics | undefined;

  /** FIFO of keys ready to hand out. */
  private queue: string[] = [];
  private head = 0;
  /** Keys that need processing (queued, or re-added while being processed). */
  private readonly dirty = new Set<string>();
  /** Keys a worker holds right now. */
  private readonly processing = new Set<string>();
  /** Delayed adds: key → earliest due time and its timer. */
  private readonly delayed = new Map<string, { at: number; timer: TimerHandle }>();
  private readonly failures = new Map<string, number>();
  private readonly waiters: Array<(key: string | undefined) => void> = [];
  private readonly idleWaiters: Array<() => void> = [];
  private shuttingDown = false;

  constructor(opts: WorkQueueOptions) {
    this.name = opts.name;
    this.clock = opts.clock ?? systemClock;
    this.log = opts.log ?? silentLogger();
    this.baseDelayMs = opts.baseDelayMs ?? 1_000;
    this.maxDelayMs = opts.maxDelayMs ?? 300_000;
    if (!(this.baseDelayMs > 0)) throw new Error(`workqueue ${opts.name}: baseDelayMs must be > 0`);
    if (!(this.maxDelayMs >= this.baseDelayMs)) {
      throw new Error(`workqueue ${opts.name}: maxDelayMs must be >= baseDelayMs`);
    }
    this.metrics = opts.registry ? queueMetrics(opts.registry) : undefined;
    this.metrics?.depth.set({ name: this.name }, 0);
  }

  /** Keys ready to be handed out. */
  len(): number {
    return this.queue.length - this.head;
  }

  isShuttingDown(): boolean {
    return this.shuttingDown;
  }

  add(key: string): void {
    if (this.shuttingDown) return;
    this.metrics?.adds.inc({ name: this.name });
    if (this.dirty.has(key)) return;
    this.dirty.add(key);
    if (this.processing.has(key)) return; // handed out again by done()
    this.push(key);
  }

  /** Adds the key after `ms`; a key already waiting keeps the earlier of the two times. */
  addAfter(key: string, ms: number): void {
    if (this.shuttingDown) return;
    if (!(ms > 0)) {
      this.add(key);
      return;
    }
    const at = this.clock.now() + ms;
    const existing = this.delayed.get(key);
    if (existing && existing.at <= at) return;
    if (existing) this.clock.clearTimeout(existing.timer);
    const timer = this.clock.setTimeout(() => {
      this.delayed.delete(key);
      this.add(key);
    }, ms);
    this.delayed.set(key, { at, timer });
  }

  /** Adds the key after its per-key exponential backoff and counts one more failure. */
  addRateLimited(key: string): void {
    this.addRateLimitedAfter(key, this.nextDelay(key));
  }

  /** Like `addRateLimited` but with a caller-chosen delay (the failure is still counted). */
  addRateLimitedAfter(key: string, ms: number): void {
    if (this.shuttingDown) return;
    this.failures.set(key, (this.failures.get(key) ?? 0) + 1);
    this.metrics?.retries.inc({ name: this.name });
    this.addAfter(key, ms);
  }

  /** The delay the next `addRateLimited(key)` would use. */
  nextDelay(key: string): number {
    return backoffDelay(this.failures.get(key) ?? 0, this.baseDelayMs, this.maxDelayMs);
  }

  /** Resets the key's backoff (call after success). */
  forget(key: string): void {
    this.failures.delete(key);
  }

  numRequeues(key: string): number {
    return this.failures.get(key) ?? 0;
  }

  /**
   * Waits for a key and marks it as being processed; resolves undefined once the queue shuts
   * down. Every key returned must be passed to `done`.
   */
  get(): Promise<string | undefined> {
    if (this.shuttingDown) return Promise.resolve(undefined);
    const key = this.pop();
    if (key !== undefined) return Promise.resolve(key);
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  /** Releases a key taken with `get`; if it was re-added meanwhile it is queued again now. */
  done(key: string): void {
    this.processing.delete(key);
    if (this.dirty.has(key) && !this.shuttingDown) this.push(key);
    if (this.processing.size === 0) {
      for (const w of this.idleWaiters.splice(0)) w();
    }
  }

  /** Stops intake and hand-out at once; queued and delayed keys are dropped. */
  shutDown(): void {
    if (this.shuttingDown) return;
    this.shuttingDown = true;
    for (const { timer } of this.delayed.values()) this.clock.clearTimeout(timer);
    this.delayed.clear();
    this.queue = [];
    this.head = 0;
    this.dirty.clear();
    this.metrics?.depth.set({ name: this.name }, 0);
    for (const w of this.waiters.splice(0)) w(undefined);
  }

  /** `shutDown`, then wait until every key handed out has been marked done. */
  async shutDownWithDrain(): Promise<void> {
    this.shutDown();
    if (this.processing.size === 0) return;
    await new Promise<void>((resolve) => this.idleWaiters.push(resolve));
  }

  /**
   * Runs `concurrency` workers until `signal` aborts (then drains in-flight work and resolves).
   * A throw re-adds the key with backoff (or after the error's `retryAfterMs`); success forgets
   * the backoff and re-adds after `requeueAfter` when given.
   */
  async runWorkers(opts: RunWorkersOptions): Promise<void> {
    if (!(opts.concurrency >= 1)) throw new Error(`workqueue ${this.name}: concurrency must be >= 1`);
    const onAbort = () => this.shutDown();
    if (opts.signal.aborted) onAbort();
    else opts.signal.addEventListener('abort', onAbort, { once: true });
    try {
      const workers: Promise<void>[] = [];
      for (let i = 0; i < opts.concurrency; i++) workers.push(this.worker(opts.process));
      await Promise.all(workers);
      await this.shutDownWithDrain();
    } finally {
      opts.signal.removeEventListener('abort', onAbort);
    }
  }

  private async worker(process: RunWorkersOptions['process']): Promise<void> {
    for (;;) {
      const key = await this.get();
      if (key === undefined) return;
      const started = this.clock.now();
      try {
        const result = (await process(key)) ?? undefined;
        if (result?.forget !== false) this.forget(key);
        if (result?.requeueAfter !== undefined && result.requeueAfter >= 0) {
          this.addAfter(key, result.requeueAfter);
        }
      } catch (err) {
        const custom = retryAfterOf(err);
        if (custom !== undefined) this.addRateLimitedAfter(key, custom);
        else this.addRateLimited(key);
        this.log.debug(
          { queue: this.name, key, err, retries: this.numRequeues(key) },
          'work failed; retrying with backoff',
        );
      } finally {
        this.metrics?.duration.observe({ name: this.name }, (this.clock.now() - started) / 1000);
        this.done(key);
      }
    }
  }

  private push(key: string): void {
    const waiter = this.waiters.shift();
    if (waiter) {
      this.dirty.delete(key);
      this.processing.add(key);
      waiter(key);
      return;
    }
    this.queue.push(key);
    this.metrics?.depth.set({ name: this.name }, this.len());
  }

  private pop(): string | undefined {
    if (this.head >= this.queue.length) return undefined;
    const key = this.queue[this.head++]!;
    if (this.head > 1024 && this.head * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.head);
      this.head = 0;
    }
    this.dirty.delete(key);
    this.processing.add(key);
    this.metrics?.depth.set({ name: this.name }, this.len());
    return key;
  }
}
