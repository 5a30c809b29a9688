/**
 * Work queue: de-duplication, one worker per key under load, backoff timing, addAfter,
 * drain on shutdown, metrics.
 */
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { sleep } from '../../../src/runtime/clock.ts';
import { backoffDelay, RetryAfterError, WorkQueue } from '../../../src/runtime/workqueue.ts';
import { FakeClock } from '../../support/clock.ts';
import { seededRandom } from '../../support/random.ts';
import { until } from '../../support/wait.ts';

const tick = () => new Promise<void>((r) => setImmediate(r));

describe('WorkQueue basics', () => {
  it('queues a key once however often it is added before a worker takes it', async () => {
    const q = new WorkQueue({ name: 't' });
    q.add('a');
    q.add('b');
    q.add('a');
    expect(q.len()).toBe(2);
    expect(await q.get()).toBe('a');
    expect(await q.get()).toBe('b');
    expect(q.len()).toBe(0);
  });

  it('re-queues a key added while it is processed only after done()', async () => {
    const q = new WorkQueue({ name: 't' });
    q.add('a');
    const k = await q.get();
    q.add('a');
    q.add('a');
    expect(q.len()).toBe(0); // not handed to a second worker
    q.done(k!);
    expect(q.len()).toBe(1);
    expect(await q.get()).toBe('a');
    q.done('a');
    expect(q.len()).toBe(0);
  });

  it('waiting get() receives a key added later', async () => {
    const q = new WorkQueue({ name: 't' });
    const p = q.get();
    q.add('x');
    expect(await p).toBe('x');
  });

  it('rejects bad options with a message naming the field', () => {
    expect(() => new WorkQueue({ name: 't', baseDelayMs: 0 })).toThrow(/baseDelayMs/);
    expect(() => new WorkQueue({ name: 't', baseDelayMs: 10, maxDelayMs: 5 })).toThrow(/maxDelayMs/);
  });
});

describe('WorkQueue timing (FakeClock)', () => {
  it('addRateLimited backs off 1 s doubling to the 5 min cap; forget resets', async () => {
    const clock = new FakeClock();
    const q = new WorkQueue({ name: 't', clock });
    const delays: number[] = [];
    for (let i = 0; i < 12; i++) delays.push(q.nextDelay('k')) && q.addRateLimitedAfter('k', 0);
    expect(delays.slice(0, 5)).toEqual([1000, 2000, 4000, 8000, 16000]);
    expect(delays[8]).toBe(256_000);
    expect(delays[9]).toBe(300_000);
    expect(delays[11]).toBe(300_000);
    expect(q.numRequeues('k')).toBe(12);
    q.forget('k');
    expect(q.numRequeues('k')).toBe(0);
    expect(q.nextDelay('k')).toBe(1000);
    expect(backoffDelay(5000, 1000, 300_000)).toBe(300_000);
  });

  it('a rate-limited key becomes ready exactly after its backoff', async () => {
    const clock = new FakeClock();
    const q = new WorkQueue({ name: 't', clock, baseDelayMs: 100, maxDelayMs: 1000 });
    q.addRateLimited('k'); // 100 ms
    clock.advance(99);
    expect(q.len()).toBe(0);
    clock.advance(1);
    expect(q.len()).toBe(1);
    const k = await q.get();
    q.done(k!);
    q.addRateLimited('k'); // 200 ms
    clock.advance(199);
    expect(q.len()).toBe(0);
    clock.advance(1);
    expect(q.len()).toBe(1);
  });

  it('addAfter keeps the earliest due time and does not duplicate', () => {
    const clock = new FakeClock();
    const q = new WorkQueue({ name: 't', clock });
    q.addAfter('k', 5000);
    q.addAfter('k', 1000);
    q.addAfter('k', 9000);
    clock.advance(999);
    expect(q.len()).toBe(0);
    clock.advance(1);
    expect(q.len()).toBe(1);
    clock.advance(10_000);
    expect(q.len()).toBe(1);
    q.addAfter('now', 0);
    expect(q.len()).toBe(2);
  });

  it('runWorkers: error → backoff retry, success → forget, requeueAfter → later again', async () => {
    const clock = new FakeClock();
    const q = new WorkQueue({ name: 't', clock, baseDelayMs: 1000 });
    const seen: Array<[string, number]> = [];
    let failures = 2;
    const ac = new AbortController();
    const run = q.runWorkers({
      concurrency: 2,
      signal: ac.signal,
      process: async (key) => {
        seen.push([key, clock.now()]);
        if (key === 'flaky' && failures-- > 0) throw new Error('transient');
        if (key === 'poll') return { requeueAfter: 10_000 };
        if (key === 'quota') throw new RetryAfterError('quota', 300_000);
      },
    });
    const t0 = clock.now();
    q.add('flaky');
    q.add('poll');
    q.add('quota');
    await tick();
    expect(q.numRequeues('flaky')).toBe(1);
    clock.advance(1000); // first retry after 1 s
    await tick();
    expect(q.numRequeues('flaky')).toBe(2);
    clock.advance(1999);
    await tick();
    expect(seen.filter(([k]) => k === 'flaky')).toHaveLength(2);
    clock.advance(1); // second retry after 2 s more
    await tick();
    expect(seen.filter(([k]) => k === 'flaky')).toHaveLength(3);
    expect(q.numRequeues('flaky')).toBe(0); // success forgot the backoff
    clock.advance(7000); // t0 + 10 s: the poll comes back
    await tick();
    expect(seen.filter(([k]) => k === 'poll').map(([, t]) => t - t0)).toEqual([0, 10_000]);
    clock.advance(290_000 - 1);
    await tick();
    expect(seen.filter(([k]) => k === 'quota')).toHaveLength(1);
    clock.advance(1); // the fixed 5 min quota delay, not the 1 s backoff
    await tick();
    expect(seen.filter(([k]) => k === 'quota').map(([, t]) => t - t0)).toEqual([0, 300_000]);
    ac.abort();
    await run;
  });
});

describe('WorkQueue under load', () => {
  it('never runs one key on two workers and processes every key after its last add', async () => {
    const q = new WorkQueue({ name: 'load' });
    const keys = Array.from({ length: 50 }, (_, i) => `ns/k${i}`);
    const active = new Set<string>();
    const lastAdd = new Map<string, number>();
    const lastStart = new Map<string, number>();
    let seq = 0;
    let overlaps = 0;
    let maxConcurrent = 0;
    let processed = 0;
    const ac = new AbortController();
    const random = seededRandom();
    const run = q.runWorkers({
      concurrency: 8,
      signal: ac.signal,
      process: async (key) => {
        if (active.has(key)) overlaps++;
        active.add(key);
        maxConcurrent = Math.max(maxConcurrent, active.size);
        lastStart.set(key, ++seq);
        await sleep(random() * 2);
        if (random() < 0.05) await tick();
        active.delete(key);
        processed++;
        if (random() < 0.02) throw new RetryAfterError('retry soon', 0);
      },
    });
    for (let i = 0; i < 10_000; i++) {
      const key = keys[Math.floor(random() * keys.length)]!;
      lastAdd.set(key, ++seq);
      q.add(key);
      if (i % 50 === 0) await sleep(random() * 3);
    }
    await until(
      'every added key to be processed after its last add',
      () => ![...lastAdd].some(([k, s]) => (lastStart.get(k) ?? 0) < s) && q.len() === 0 && active.size === 0,
      15_000,
    );
    ac.abort();
    await run;
    expect(overlaps).toBe(0);
    expect(maxConcurrent).toBeGreaterThan(1);
    expect(maxConcurrent).toBeLessThanOrEqual(8);
    for (const [key, addSeq] of lastAdd) expect(lastStart.get(key) ?? 0).toBeGreaterThan(addSeq);
    expect(processed).toBeLessThan(10_000); // de-duplication did its job
  });
});

describe('WorkQueue shutdown', () => {
  it('shutDownWithDrain waits for in-flight work, hands out nothing more and refuses adds', async () => {
    const q = new WorkQueue({ name: 't' });
    q.add('a');
    q.add('b');
    const k = await q.get();
    let drained = false;
    const drain = q.shutDownWithDrain().then(() => {
      drained = true;
    });
    // The drain settles by promises alone: once a macrotask has passed, every promise that could
    // settle without `done` has, so `false` here is proof, not a timing window.
    await new Promise((r) => setImmediate(r));
    expect(drained).toBe(false);
    expect(await q.get()).toBeUndefined();
    q.add('c');
    expect(q.len()).toBe(0);
    q.done(k!);
    await drain;
    expect(drained).toBe(true);
  });

  it('aborting runWorkers lets in-flight work finish before it resolves', async () => {
    const q = new WorkQueue({ name: 't' });
    const ac = new AbortController();
    const finished: string[] = [];
    let started!: () => void;
    const startedP = new Promise<void>((r) => {
      started = r;
    });
    const run = q.runWorkers({
      concurrency: 2,
      signal: ac.signal,
      process: async (key) => {
        started();
        await sleep(50);
        finished.push(key);
      },
    });
    q.add('slow');
    await startedP;
    q.add('queued-later'); // second worker takes it at once too
    ac.abort();
    await run;
    expect(finished).toContain('slow');
    expect(await q.get()).toBeUndefined();
  });

  it('delayed keys do not fire after shutdown', async () => {
    const clock = new FakeClock();
    const q = new WorkQueue({ name: 't', clock });
    q.addAfter('k', 1000);
    q.shutDown();
    clock.advance(5000);
    expect(q.len()).toBe(0);
    expect(clock.pendingTimers()).toBe(0);
  });
});

describe('WorkQueue metrics', () => {
  it('exports depth, adds, retries and work duration labelled by queue name', async () => {
    const registry = new Registry();
    const clock = new FakeClock();
    const q = new WorkQueue({ name: 'proxies', clock, registry });
    const other = new WorkQueue({ name: 'other', registry }); // shares the registry
    other.add('z');
    q.add('a');
    q.add('b');
    q.add('a');
    q.addRateLimited('c');
    const text = await registry.metrics();
    expect(text).toContain('proxy_operator_workqueue_depth{name="proxies"} 2');
    expect(text).toContain('proxy_operator_workqueue_adds_total{name="proxies"} 3');
    expect(text).toContain('proxy_operator_workqueue_retries_total{name="proxies"} 1');
    expect(text).toContain('proxy_operator_workqueue_depth{name="other"} 1');
    const ac = new AbortController();
    const run = q.runWorkers({
      concurrency: 1,
      signal: ac.signal,
      process: async () => {
        clock.advance(2000);
      },
    });
    await tick();
    ac.abort();
    await run;
    // a and b, then c whose 1 s backoff ran out while the clock moved.
    const after = await registry.metrics();
    expect(after).toContain('proxy_operator_workqueue_work_duration_seconds_count{name="proxies"} 3');
    expect(after).toContain('proxy_operator_workqueue_work_duration_seconds_sum{name="proxies"} 6');
  });
});
