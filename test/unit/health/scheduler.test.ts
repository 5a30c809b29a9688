/**
 * The slot scheduler shared by health probes, control probes and the egress-IP check, on a
 * FakeClock: grid without drift, no overlap of a job with itself, requested runs never lost
 * and ahead of the queue, the concurrency cap, and skipping (not bursting) after a stall.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { SlotScheduler } from '../../../src/health/scheduler.ts';
import type { Clock, TimerHandle } from '../../../src/runtime/clock.ts';
import { FakeClock } from '../../support/clock.ts';

interface Rig {
  clock: FakeClock;
  scheduler: SlotScheduler;
  /** Start times by key, relative to the rig's start. */
  starts: Array<{ key: string; at: number }>;
  /** Finishes every run in progress. */
  finishAll(): Promise<void>;
}

const schedulers: SlotScheduler[] = [];
const rigs: Rig[] = [];
afterEach(async () => {
  for (const r of rigs.splice(0)) await r.finishAll();
  for (const s of schedulers.splice(0)) await s.stop();
});

const settle = async () => {
  for (let i = 0; i < 3; i++) await new Promise<void>((r) => setImmediate(r));
};

/** Runs stay in progress until `finishAll` when `hold` is set; otherwise they end at once. */
function rig(concurrency: number, hold: boolean, batchMs?: number): Rig {
  const clock = new FakeClock(0);
  const starts: Rig['starts'] = [];
  const open: Array<() => void> = [];
  const scheduler = new SlotScheduler({
    clock,
    concurrency,
    ...(batchMs === undefined ? {} : { batchMs }),
    run: (key) => {
      starts.push({ key, at: clock.now() });
      return hold ? new Promise<void>((r) => open.push(r)) : Promise.resolve();
    },
  });
  schedulers.push(scheduler);
  const r: Rig = {
    clock,
    scheduler,
    starts,
    async finishAll() {
      for (const resolve of open.splice(0)) resolve();
      await settle();
    },
  };
  rigs.push(r);
  return r;
}

describe('SlotScheduler', () => {
  it('runs each job on its own grid, from its first slot, without drift', async () => {
    const r = rig(10, false);
    r.scheduler.add('a', 1000, 250);
    r.scheduler.add('b', 3000, 0);
    r.scheduler.start();
    for (let i = 0; i < 70; i++) {
      r.clock.advance(100);
      await settle();
    }
    expect(r.starts.filter((s) => s.key === 'a').map((s) => s.at)).toEqual([
      250, 1250, 2250, 3250, 4250, 5250, 6250,
    ]);
    expect(r.starts.filter((s) => s.key === 'b').map((s) => s.at)).toEqual([0, 3000, 6000]);
    expect(r.scheduler.stats()).toMatchObject({ runs: 10, skipped: 0 });
  });

  it('with batchMs, starts the slots due within one step together, at most one step late, at the same phase every interval', async () => {
    const r = rig(10, false, 25);
    r.scheduler.add('a', 1000, 101);
    r.scheduler.add('b', 1000, 113);
    r.scheduler.add('c', 1000, 125);
    r.scheduler.add('d', 1000, 126);
    r.scheduler.start();
    for (let i = 0; i < 300; i++) {
      r.clock.advance(10);
      await settle();
    }
    // Two start times per interval: one wake-up per step, not one per slot.
    const wakeUps = new Set(r.starts.map((s) => s.at));
    const at = (key: string) => r.starts.filter((s) => s.key === key).map((s) => s.at);
    expect(at('a')).toEqual([125, 1125, 2125]);
    expect(at('b')).toEqual([125, 1125, 2125]);
    expect(at('c')).toEqual([125, 1125, 2125]);
    expect(at('d')).toEqual([150, 1150, 2150]);
    expect(wakeUps.size).toBe(6);
    expect(r.scheduler.stats().maxLagMs).toBeLessThanOrEqual(25);
  });

  it('never overlaps a job with itself: a slot during a run is skipped and counted', async () => {
    const r = rig(10, true);
    r.scheduler.add('a', 1000, 0);
    r.scheduler.start();
    r.clock.advance(0);
    r.clock.advance(2500); // slots at 1000 and 2000 pass while the first run is going
    await settle();
    expect(r.starts).toHaveLength(1);
    expect(r.scheduler.stats().skipped).toBe(2);
    await r.finishAll();
    r.clock.advance(500);
    expect(r.starts.map((s) => s.at)).toEqual([0, 3000]);
  });

  it('a run requested during a run happens once, right after it', async () => {
    const r = rig(10, true);
    r.scheduler.add('a', 60_000, 0);
    r.scheduler.start();
    r.clock.advance(0);
    r.clock.advance(10);
    r.scheduler.runNow('a');
    r.scheduler.runNow('a');
    expect(r.starts).toHaveLength(1);
    await r.finishAll();
    expect(r.starts.map((s) => s.at)).toEqual([0, 10]);
    await r.finishAll();
    expect(r.starts).toHaveLength(2);
  });

  it('holds the concurrency cap; a requested run goes ahead of queued slots', async () => {
    const r = rig(2, true);
    for (const [i, k] of ['a', 'b', 'c', 'd'].entries()) r.scheduler.add(k, 1000, i);
    r.scheduler.start();
    r.clock.advance(3);
    expect(r.starts.map((s) => s.key)).toEqual(['a', 'b']);
    expect(r.scheduler.busy).toBe(4);
    r.scheduler.runNow('e'); // unknown: ignored
    r.scheduler.add('e', 1000, 900);
    r.scheduler.runNow('e');
    await r.finishAll();
    expect(r.starts.map((s) => s.key)).toEqual(['a', 'b', 'e', 'c']);
    await r.finishAll();
    await r.finishAll();
    expect(r.starts.map((s) => s.key)).toEqual(['a', 'b', 'e', 'c', 'd']);
    expect(r.scheduler.inFlight).toBe(0);
  });

  it('after a stall it skips the missed slots instead of running them in a burst', async () => {
    // FakeClock fires timers on time; a stalled event loop fires them late, so time and
    // timers are driven separately here.
    const clock = new StallClock();
    const starts: number[] = [];
    const scheduler = new SlotScheduler({
      clock,
      concurrency: 10,
      run: async () => {
        starts.push(clock.t);
      },
    });
    schedulers.push(scheduler);
    scheduler.add('a', 1000, 0);
    scheduler.start();
    clock.fire();
    await settle();
    clock.t = 5500;
    clock.fire();
    await settle();
    expect(starts).toEqual([0, 5500]);
    expect(scheduler.stats().skipped).toBe(4);
    clock.t = 6000;
    clock.fire();
    expect(starts).toEqual([0, 5500, 6000]);
  });
});

class StallClock implements Clock {
  t = 0;
  private readonly timers = new Map<number, () => void>();
  private seq = 0;
  now(): number {
    return this.t;
  }
  monotonic(): number {
    return this.t;
  }
  setTimeout(fn: () => void): TimerHandle {
    const id = ++this.seq;
    this.timers.set(id, fn);
    return { id };
  }
  clearTimeout(handle: TimerHandle): void {
    this.timers.delete(handle.id);
  }
  /** Fires every pending timer now, however late. */
  fire(): void {
    const due = [...this.timers.values()];
    this.timers.clear();
    for (const fn of due) fn();
  }
}
