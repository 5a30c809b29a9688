/**
 * Manager: start order (caches → always-on → election → leader-only), /healthz and /readyz over
 * real HTTP, graceful stop (drain within grace, then release), leadership loss, runnable failure;
 * the probe port's header and idle timeouts and connection cap (small values, a real slow-header
 * client on loopback); signals: repeats within the window are one stop, a later one forces.
 */
import { describe, expect, it, vi } from 'vitest';
import { sleep } from '../../../src/runtime/clock.ts';
import {
  type LeaderCallbacks,
  LeaderElectionLost,
  type LeaderElector,
  StandaloneElector,
} from '../../../src/runtime/leader/elector.ts';
import { Manager, type Runnable } from '../../../src/runtime/manager.ts';
import type { ObjectStore } from '../../../src/runtime/store.ts';
import { FakeClock } from '../../support/clock.ts';
import { exchange, openIdle, send, slowHeaders } from '../../support/listeners.ts';
import { until as waitUntil } from '../../support/wait.ts';

type ManagedStore = Pick<ObjectStore, 'start' | 'stop' | 'proxies' | 'providerHealths' | 'secrets'>;

function fakeStore(events: string[]) {
  let markSynced!: () => void;
  const syncedP = new Promise<void>((r) => {
    markSynced = r;
  });
  const synced = (signal?: AbortSignal) =>
    new Promise<void>((resolve, reject) => {
      syncedP.then(resolve);
      signal?.addEventListener('abort', () => reject(signal.reason), { once: true });
    });
  const store = {
    start: async () => {
      events.push('store.start');
    },
    stop: async () => {
      events.push('store.stop');
    },
    proxies: { synced },
    providerHealths: { synced },
    secrets: { synced },
  } as unknown as ManagedStore;
  return {
    store,
    sync: () => {
      events.push('synced');
      markSynced();
    },
  };
}

/** A runnable that records start/stop and takes `drainMs` (Infinity: forever) to finish after its signal aborts. */
function recorder(name: string, needLeaderElection: boolean, events: string[], drainMs = 0): Runnable {
  return {
    name,
    needLeaderElection,
    start: async (signal) => {
      events.push(`${name}.start`);
      await new Promise<void>((r) => signal.addEventListener('abort', () => r(), { once: true }));
      if (drainMs === Number.POSITIVE_INFINITY) await new Promise(() => {}); // never drains
      await sleep(drainMs);
      events.push(`${name}.stopped`);
    },
  };
}

/** An elector the test drives by hand. */
class ManualElector implements LeaderElector {
  readonly identity = 'me';
  leading = false;
  released = 0;
  cb: LeaderCallbacks | undefined;
  private scope: AbortController | undefined;
  private events: string[];
  constructor(events: string[]) {
    this.events = events;
  }
  run(signal: AbortSignal, cb: LeaderCallbacks): Promise<void> {
    this.cb = cb;
    this.events.push('election.run');
    return new Promise((r) => signal.addEventListener('abort', () => r(), { once: true }));
  }
  lead(): void {
    this.leading = true;
    this.scope = new AbortController();
    this.cb!.onStartedLeading(this.scope.signal);
  }
  lose(): void {
    this.leading = false;
    this.scope?.abort();
    this.cb!.onStoppedLeading();
  }
  isLeader(): boolean {
    return this.leading;
  }
  async release(): Promise<void> {
    this.events.push('release');
    this.released++;
    if (this.leading) this.lose();
  }
}

async function probe(m: Manager, path: string): Promise<{ status: number; body: string }> {
  const a = m.healthAddress()!;
  const res = await fetch(`http://127.0.0.1:${a.port}${path}`);
  return { status: res.status, body: await res.text() };
}

const until = (cond: () => boolean) => vi.waitFor(() => expect(cond()).toBe(true));

describe('health probe bind address', () => {
  it('accepts host:port, :port and [v6]:port; rejects garbage naming the value', () => {
    for (const ok of ['127.0.0.1:8081', ':8081', '[::1]:9']) {
      expect(() => new Manager({ healthProbeBindAddress: ok })).not.toThrow();
    }
    expect(() => new Manager({ healthProbeBindAddress: '8081' })).toThrow(
      /health probe bind address: "8081"/,
    );
    expect(() => new Manager({ healthProbeBindAddress: 'h:99999' })).toThrow(/bind address.*65535/);
  });

  it.each(['0', '', undefined])('%j serves no probe endpoint', async (addr) => {
    const m = new Manager(addr === undefined ? {} : { healthProbeBindAddress: addr });
    const run = m.start();
    await m.whenStarted();
    expect(m.healthAddress()).toBeUndefined();
    await m.stop();
    await run;
  });
});

describe('Manager', () => {
  it('starts caches, then always-on runnables, then leader-only ones once leading; readyz follows', async () => {
    const events: string[] = [];
    const { store, sync } = fakeStore(events);
    const elector = new ManualElector(events);
    const m = new Manager({ store, elector, healthProbeBindAddress: '127.0.0.1:0', gracePeriodMs: 1000 });
    m.add(recorder('api', false, events));
    m.add(recorder('workers', true, events));
    const run = m.start();
    await until(() => m.healthAddress() !== undefined);
    expect(await probe(m, '/healthz')).toEqual({ status: 200, body: 'ok' });
    const notReady = await probe(m, '/readyz');
    expect(notReady.status).toBe(500);
    expect(notReady.body).toContain('caches not synced');
    expect(events).toEqual(['store.start']); // nothing runs before caches sync
    sync();
    await m.whenStarted();
    await until(() => events.includes('election.run'));
    expect(events).toEqual(['store.start', 'synced', 'api.start', 'election.run']);
    expect((await probe(m, '/readyz')).status).toBe(200);
    elector.lead();
    expect(events.at(-1)).toBe('workers.start');
    await m.stop();
    await run;
    expect(events.slice(5)).toEqual(
      expect.arrayContaining(['api.stopped', 'workers.stopped', 'release', 'store.stop']),
    );
    // drain happens before the lease is released, and caches stop last
    expect(events.indexOf('release')).toBeGreaterThan(events.indexOf('workers.stopped'));
    expect(events.indexOf('store.stop')).toBeGreaterThan(events.indexOf('release'));
  });

  it('extra readiness checks and verbose output', async () => {
    const m = new Manager({ healthProbeBindAddress: '127.0.0.1:0' });
    let dbOk = false;
    m.addReadyzCheck('leases', () => {
      if (!dbOk) throw new Error('lease store not loaded');
    });
    const run = m.start();
    await m.whenStarted();
    const bad = await probe(m, '/readyz');
    expect(bad.status).toBe(500);
    expect(bad.body).toContain('[-]leases failed: lease store not loaded');
    expect(bad.body).toContain('[+]started ok');
    dbOk = true;
    expect((await probe(m, '/readyz')).status).toBe(200);
    expect((await probe(m, '/readyz?verbose')).body).toContain('[+]leases ok');
    // A check may pass with a note: still 200, the note in the verbose output.
    m.addReadyzCheck('providers', () => '1 Proxy(s) use unconfigured provider "old"');
    const noted = await probe(m, '/readyz?verbose');
    expect(noted.status).toBe(200);
    expect(noted.body).toContain('[+]providers ok: 1 Proxy(s) use unconfigured provider "old"');
    expect((await probe(m, '/nope')).status).toBe(404);
    await m.stop();
    await run;
  });

  it('gives runnables the grace period to drain, but not longer', async () => {
    const events: string[] = [];
    const clock = new FakeClock();
    const m = new Manager({
      gracePeriodMs: 300,
      elector: new StandaloneElector(),
      healthProbeBindAddress: '127.0.0.1:0',
      clock,
    });
    m.add(recorder('quick', true, events));
    m.add(recorder('stuck', false, events, Number.POSITIVE_INFINITY));
    const run = m.start();
    await until(() => events.includes('quick.start') && events.includes('stuck.start'));
    expect((await probe(m, '/readyz')).status).toBe(200);
    let stopped = false;
    const stopping = m.stop().then(() => {
      stopped = true;
    });
    const during = await probe(m, '/readyz'); // still serving while draining, but not ready
    expect(during.status).toBe(500);
    expect(during.body).toContain('shutting down');
    expect((await probe(m, '/healthz')).status).toBe(200);
    await until(() => events.includes('quick.stopped'));
    clock.advance(299);
    expect((await probe(m, '/healthz')).status).toBe(200); // still draining
    expect(stopped).toBe(false);
    clock.advance(1);
    await stopping;
    await run;
    expect(events).not.toContain('stuck.stopped');
  });

  it('stops leader-only runnables and fails with LeaderElectionLost when leadership is lost', async () => {
    const events: string[] = [];
    const elector = new ManualElector(events);
    const m = new Manager({ elector, gracePeriodMs: 1000 });
    m.add(recorder('api', false, events));
    m.add(recorder('gc', true, events));
    const run = m.start();
    await until(() => events.includes('election.run'));
    elector.lead();
    expect(m.isLeader()).toBe(true);
    elector.lose();
    await expect(run).rejects.toBeInstanceOf(LeaderElectionLost);
    expect(events).toContain('gc.stopped');
    expect(events).toContain('api.stopped');
    expect(elector.released).toBe(0); // nothing to release: we no longer hold it
  });

  it('a failing runnable stops the manager with its error', async () => {
    const events: string[] = [];
    const m = new Manager({ gracePeriodMs: 1000 });
    m.add(recorder('api', false, events));
    m.add({
      name: 'broken',
      needLeaderElection: false,
      start: async () => {
        throw new Error('port in use');
      },
    });
    await expect(m.start()).rejects.toThrow(/runnable broken failed: port in use/);
    expect(events).toContain('api.stopped');
  });

  it('run() turns SIGTERM into a graceful stop', async () => {
    const events: string[] = [];
    const m = new Manager({ gracePeriodMs: 1000 });
    m.add(recorder('api', false, events, 20));
    const run = m.run();
    await m.whenStarted();
    process.kill(process.pid, 'SIGTERM');
    await run;
    expect(events).toEqual(['api.start', 'api.stopped']);
    expect(process.listenerCount('SIGTERM')).toBe(0);
  });

  /** A runnable that stops only when the test lets it: the graceful stop is still under way. */
  function heldOpen(events: string[]): { runnable: Runnable; letStop: () => void } {
    let letStop = () => {};
    const stopped = new Promise<void>((r) => {
      letStop = r;
    });
    return {
      letStop: () => letStop(),
      runnable: {
        name: 'api',
        needLeaderElection: false,
        start: async (signal) => {
          events.push('api.start');
          await new Promise<void>((r) => signal.addEventListener('abort', () => r(), { once: true }));
          await stopped;
          events.push('api.stopped');
        },
      },
    };
  }

  it("run() counts a terminal's Ctrl-C and npm's forwarded copies as one graceful stop", async () => {
    const events: string[] = [];
    const clock = new FakeClock();
    const forceExit = vi.fn();
    const m = new Manager({ gracePeriodMs: 60_000, clock, forceExit });
    const { runnable, letStop } = heldOpen(events);
    m.add(runnable);
    const run = m.run(async () => {
      events.push('afterStop');
    });
    await m.whenStarted();
    // The group's SIGINT, npm's forwarded one, and both again for a second group signal.
    process.emit('SIGINT', 'SIGINT');
    process.emit('SIGINT', 'SIGINT');
    clock.advance(20);
    process.emit('SIGINT', 'SIGINT');
    clock.advance(979);
    process.emit('SIGTERM', 'SIGTERM');
    expect(forceExit).not.toHaveBeenCalled();
    letStop();
    await run;
    expect(events).toEqual(['api.start', 'api.stopped', 'afterStop']);
    expect(forceExit).not.toHaveBeenCalled();
    expect(process.listenerCount('SIGINT')).toBe(0);
    expect(process.listenerCount('SIGTERM')).toBe(0);
  });

  it('run() exits at once on a signal the window or more after the first', async () => {
    const events: string[] = [];
    const clock = new FakeClock();
    const forceExit = vi.fn();
    const m = new Manager({ gracePeriodMs: 60_000, clock, forceExit, signalWindowMs: 500 });
    const { runnable, letStop } = heldOpen(events);
    m.add(runnable);
    const run = m.run();
    await m.whenStarted();
    process.emit('SIGINT', 'SIGINT');
    clock.advance(499);
    process.emit('SIGINT', 'SIGINT');
    expect(forceExit).not.toHaveBeenCalled();
    clock.advance(1);
    process.emit('SIGINT', 'SIGINT');
    expect(forceExit).toHaveBeenCalledExactlyOnceWith(1);
    letStop();
    await run;
  });

  it('run() keeps counting signals while afterStop closes what the manager does not', async () => {
    const clock = new FakeClock();
    const forceExit = vi.fn();
    const m = new Manager({ gracePeriodMs: 60_000, clock, forceExit });
    let closing = () => {};
    let finishClose = () => {};
    const closed = new Promise<void>((r) => {
      finishClose = r;
    });
    const entered = new Promise<void>((r) => {
      closing = r;
    });
    const run = m.run(async () => {
      closing();
      await closed;
    });
    await m.whenStarted();
    process.emit('SIGTERM', 'SIGTERM');
    await entered;
    // Still the first signal's stop: handled, not the default action that kills the process.
    process.emit('SIGINT', 'SIGINT');
    expect(process.listenerCount('SIGINT')).toBe(1);
    expect(forceExit).not.toHaveBeenCalled();
    clock.advance(1000);
    process.emit('SIGINT', 'SIGINT');
    expect(forceExit).toHaveBeenCalledExactlyOnceWith(1);
    finishClose();
    await run;
    expect(process.listenerCount('SIGINT')).toBe(0);
  });

  it("run() rejects with the manager's failure even when afterStop fails too", async () => {
    const m = new Manager({ gracePeriodMs: 1000 });
    m.add({
      name: 'broken',
      needLeaderElection: false,
      start: async () => {
        throw new Error('port in use');
      },
    });
    await expect(
      m.run(async () => {
        throw new Error('close failed');
      }),
    ).rejects.toThrow(/runnable broken failed: port in use/);
    expect(process.listenerCount('SIGINT')).toBe(0);
  });

  it('fails when caches do not sync in time', async () => {
    const events: string[] = [];
    const { store } = fakeStore(events);
    const clock = new FakeClock();
    const m = new Manager({ store, cacheSyncTimeoutMs: 100, clock });
    m.add(recorder('api', false, events));
    const run = m.start();
    await until(() => events.includes('store.start'));
    clock.advance(100);
    await expect(run).rejects.toThrow(/caches did not sync within 100 ms/);
    expect(events).not.toContain('api.start');
    expect(events).toContain('store.stop');
  });
});

describe('the health probe listener', () => {
  const limits = { headersTimeoutMs: 300, requestTimeoutMs: 600, idleTimeoutMs: 400, maxConnections: 3 };

  async function started(over: Partial<typeof limits> = {}) {
    const m = new Manager({
      healthProbeBindAddress: '127.0.0.1:0',
      healthProbeLimits: { ...limits, ...over },
    });
    const run = m.start();
    await m.whenStarted();
    const port = m.healthAddress()!.port;
    return {
      port,
      stop: async () => {
        await m.stop();
        await run;
      },
    };
  }

  it('refuses limits a listener cannot have, naming the field', () => {
    expect(
      () =>
        new Manager({
          healthProbeBindAddress: '127.0.0.1:0',
          healthProbeLimits: { ...limits, idleTimeoutMs: 0 },
        }),
    ).toThrow(/health probe listener: idleTimeoutMs must be a positive integer/);
  });

  it('closes a slow-header client after the header timeout with 408', async () => {
    const s = await started();
    try {
      const r = await slowHeaders(s.port, { everyMs: 50, timeoutMs: 5_000 });
      expect(r.received).toMatch(/^HTTP\/1\.1 408 /);
      // It kept sending header lines all along: only the head timeout can have ended it.
      expect(r.linesSent).toBeGreaterThan(2);
      expect(r.closedAfterMs).toBeLessThan(3_000);
    } finally {
      await s.stop();
    }
  });

  it('closes a connection that never sends a byte', async () => {
    const s = await started();
    try {
      expect(await (await openIdle(s.port)).closed).toBeLessThan(3_000);
    } finally {
      await s.stop();
    }
  });

  it('refuses connections beyond the cap and serves again once one closes', async () => {
    const s = await started({ idleTimeoutMs: 10_000, headersTimeoutMs: 5_000, requestTimeoutMs: 10_000 });
    const held = await Promise.all([openIdle(s.port), openIdle(s.port), openIdle(s.port)]);
    try {
      const extra = await exchange(s.port, 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n', {
        timeoutMs: 5_000,
      });
      expect(extra.received).toBe('');
      held[0]?.socket.destroy();
      await waitUntil('a connection below the cap to be served', async () => {
        const res = await send(`http://127.0.0.1:${s.port}/healthz`).catch(() => undefined);
        return res?.status === 200;
      });
    } finally {
      for (const h of held) h.socket.destroy();
      await s.stop();
    }
  });
});
