/**
 * The health engine's logic with an injected probe, a FakeClock and the in-memory store:
 * thresholds, transition-only writes, latency suppression, write retries, the UID guard,
 * the control probe, scheduling (spread, no drift, concurrency cap), pruning and metrics.
 */
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  CONDITION_HEALTHY,
  CONDITION_PROVISIONED,
  LABEL_CREDENTIALS_FOR,
} from '../../../src/api/constants.ts';
import type { Condition } from '../../../src/api/meta.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { HealthEngine, type HealthEngineOptions, type HealthVerdict } from '../../../src/health/engine.ts';
import { resolveCheck } from '../../../src/health/policy.ts';
import type { ProbeCheck, ProbeOptions, ProbeResult, ProbeTarget } from '../../../src/health/probe.ts';
import { createMemoryStore, type MemoryStore } from '../../../src/runtime/memory.ts';
import { ObjectEngine } from '../../../src/runtime/objects/engine.ts';
import { StoreError } from '../../../src/runtime/store.ts';
import { FakeClock } from '../../support/clock.ts';

const NS = 'crawl';
const OK = (latencyMs = 10): ProbeResult => ({ ok: true, latencyMs, status: 204 });
const FAIL = (reason: 'ConnectFailed' | 'Timeout' = 'ConnectFailed'): ProbeResult => ({
  ok: false,
  reason,
  message: `${reason} for test`,
  latencyMs: 5,
});

interface Call {
  at: number;
  target: ProbeTarget;
  check: ProbeCheck;
}

/** A scripted probe: results by proxy port; `hold` keeps calls pending until released. */
class FakeProbe {
  calls: Call[] = [];
  results = new Map<number, ProbeResult>();
  fallback: ProbeResult = OK();
  hold = false;
  held: Array<{ port: number; resolve: (r: ProbeResult) => void }> = [];
  inFlight = 0;
  maxInFlight = 0;
  readonly clock: FakeClock;
  constructor(clock: FakeClock) {
    this.clock = clock;
  }
  fn = (target: ProbeTarget, check: ProbeCheck, opts?: ProbeOptions): Promise<ProbeResult> => {
    const signal = opts?.signal;
    this.calls.push({ at: this.clock.now(), target, check });
    this.inFlight++;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    const done = (r: ProbeResult) => {
      this.inFlight--;
      return r;
    };
    if (this.hold) {
      return new Promise<ProbeResult>((resolve) => {
        this.held.push({ port: target.port, resolve });
        signal?.addEventListener('abort', () => resolve(FAIL('Timeout')), { once: true });
      }).then(done);
    }
    return Promise.resolve(done(this.results.get(target.port) ?? this.fallback));
  };
  release(r?: ProbeResult): void {
    for (const h of this.held.splice(0)) h.resolve(r ?? this.results.get(h.port) ?? this.fallback);
  }
  callsFor(port: number): Call[] {
    return this.calls.filter((c) => c.target.port === port);
  }
}

async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise<void>((r) => setImmediate(r));
}

let engines: HealthEngine[] = [];
afterEach(async () => {
  await Promise.all(engines.map((e) => e.stop()));
  engines = [];
});

interface Rig {
  clock: FakeClock;
  store: MemoryStore;
  probe: FakeProbe;
  control: { result: ProbeResult; calls: number };
  engine: HealthEngine;
  verdicts: HealthVerdict[];
  registry: Registry;
  /** Advance the fake clock in steps so probe promises settle between timers. */
  advance(ms: number, step?: number): Promise<void>;
}

function rig(opts: Partial<HealthEngineOptions> = {}): Rig {
  const clock = new FakeClock();
  // Seeded uids: each proxy's probe slot is derived from its uid, so a random one would move
  // the slots from run to run (and, now and then, a second probe into the window a test counts).
  let uids = 0;
  const store = createMemoryStore({
    engine: new ObjectEngine({
      clock,
      uid: () => `00000000-0000-4000-8000-${String(++uids).padStart(12, '0')}`,
    }),
  });
  const probe = new FakeProbe(clock);
  const control = { result: OK(), calls: 0 };
  const verdicts: HealthVerdict[] = [];
  const registry = new Registry();
  const engine = new HealthEngine({
    store,
    clock,
    registry,
    probe: probe.fn,
    directProbe: async () => {
      control.calls++;
      return control.result;
    },
    listener: (v) => verdicts.push(v),
    ...opts,
  });
  engines.push(engine);
  return {
    clock,
    store,
    probe,
    control,
    engine,
    verdicts,
    registry,
    async advance(ms, step = 100) {
      for (let done = 0; done < ms; done += step) {
        clock.advance(Math.min(step, ms - done));
        await settle();
      }
    },
  };
}

let portSeq = 4000;
function seedExternal(
  store: MemoryStore,
  name: string,
  extra: Partial<ProxyObject['spec']> = {},
): { proxy: ProxyObject; port: number } {
  const port = portSeq++;
  const proxy = store.seedProxy({
    metadata: { name, namespace: NS },
    spec: { type: 'External', endpoint: { host: '127.0.0.1', port }, ...extra },
  });
  return { proxy, port };
}

function healthyCondition(store: MemoryStore, name: string): Condition | undefined {
  return store.proxies
    .get({ namespace: NS, name })
    ?.status?.conditions?.find((c) => c.type === CONDITION_HEALTHY);
}

describe('verdicts', () => {
  it('gives a verdict on the first probe, then follows the thresholds', async () => {
    const r = rig({ defaults: { failureThreshold: 3, successThreshold: 2 } });
    const { port } = seedExternal(r.store, 'a');
    r.engine.start();
    await r.advance(1000);
    expect(r.probe.callsFor(port)).toHaveLength(1);
    expect(r.verdicts).toEqual([
      expect.objectContaining({ key: `${NS}/a`, healthy: true, latencyMillis: 10 }),
    ]);
    expect(healthyCondition(r.store, 'a')).toMatchObject({ status: 'True', reason: 'ProbeSucceeded' });

    r.probe.results.set(port, FAIL('Timeout'));
    await r.advance(2000);
    expect(r.verdicts).toHaveLength(1); // two failures: still healthy
    await r.advance(1000);
    expect(r.verdicts.at(-1)).toMatchObject({ healthy: false, reason: 'Timeout' });
    const cond = healthyCondition(r.store, 'a');
    expect(cond).toMatchObject({ status: 'False', reason: 'Timeout', message: 'Timeout for test' });
    const health = r.store.proxies.get({ namespace: NS, name: 'a' })?.status?.health;
    expect(health).toMatchObject({ consecutiveFailures: 3, lastError: 'Timeout for test' });
    expect(health?.latencyMillis).toBeUndefined();

    r.probe.results.set(port, OK(30));
    await r.advance(1000);
    expect(r.verdicts).toHaveLength(2); // one success of two needed
    await r.advance(1000);
    expect(r.verdicts.at(-1)).toMatchObject({ healthy: true, latencyMillis: 30 });
    expect(healthyCondition(r.store, 'a')).toMatchObject({ status: 'True', reason: 'ProbeSucceeded' });
    expect(r.store.proxies.get({ namespace: NS, name: 'a' })?.status?.health).toMatchObject({
      latencyMillis: 30,
      consecutiveFailures: 0,
    });
  });

  it('an unhealthy first probe marks the proxy unhealthy at once', async () => {
    const r = rig();
    const { port } = seedExternal(r.store, 'a');
    r.probe.results.set(port, FAIL());
    r.engine.start();
    await r.advance(1000);
    expect(r.verdicts).toEqual([expect.objectContaining({ healthy: false, reason: 'ConnectFailed' })]);
    expect(healthyCondition(r.store, 'a')?.status).toBe('False');
  });

  it('writes status only on transitions', async () => {
    const r = rig();
    seedExternal(r.store, 'a');
    const spy = vi.spyOn(r.store.proxies, 'patchStatus');
    r.engine.start();
    await r.advance(10_000);
    expect(r.probe.calls.length).toBeGreaterThanOrEqual(9);
    expect(spy).toHaveBeenCalledTimes(1);
  });

  it('publishes latency only when it moved a lot, and at most once a minute', async () => {
    const r = rig();
    const { port } = seedExternal(r.store, 'a');
    const spy = vi.spyOn(r.store.proxies, 'patchStatus');
    r.probe.results.set(port, OK(100));
    r.engine.start();
    await r.advance(1000);
    expect(spy).toHaveBeenCalledTimes(1);
    r.probe.results.set(port, OK(150)); // small move: nothing
    await r.advance(5000);
    expect(spy).toHaveBeenCalledTimes(1);
    expect(r.verdicts).toHaveLength(1);
    r.probe.results.set(port, OK(900)); // big move, but within a minute of the last write
    await r.advance(5000);
    expect(spy).toHaveBeenCalledTimes(1);
    expect(r.verdicts.at(-1)).toMatchObject({ healthy: true, latencyMillis: 900 }); // lease store hears it
    await r.advance(60_000);
    expect(spy).toHaveBeenCalledTimes(2);
    expect(r.store.proxies.get({ namespace: NS, name: 'a' })?.status?.health?.latencyMillis).toBe(900);
    await r.advance(70_000); // steady at 900: no more writes
    expect(spy).toHaveBeenCalledTimes(2);
  });

  it('retries a failed status write on the next probe', async () => {
    const r = rig();
    seedExternal(r.store, 'a');
    const real = r.store.proxies.patchStatus.bind(r.store.proxies);
    const spy = vi
      .spyOn(r.store.proxies, 'patchStatus')
      .mockRejectedValueOnce(new StoreError('Unavailable', 503, 'api down'))
      .mockImplementation(real);
    r.engine.start();
    await r.advance(1000);
    expect(spy).toHaveBeenCalledTimes(1);
    expect(healthyCondition(r.store, 'a')).toBeUndefined();
    await r.advance(1000);
    expect(spy).toHaveBeenCalledTimes(2);
    expect(healthyCondition(r.store, 'a')?.status).toBe('True');
    await r.advance(3000);
    expect(spy).toHaveBeenCalledTimes(2);
  });

  it('keeps the reconciler’s conditions when both write at once (409, re-read, retry)', async () => {
    const r = rig();
    const proxy = r.store.seedProxy({
      metadata: { name: 'm', namespace: NS },
      spec: { provider: 'local' },
      status: {
        phase: 'Ready',
        address: '127.0.0.1',
        port: 4999,
        conditions: [
          {
            type: CONDITION_PROVISIONED,
            status: 'True',
            reason: 'InstanceRunning',
            lastTransitionTime: '2026-01-01T00:00:00Z',
          },
        ],
      },
    });
    const real = r.store.proxies.patchStatus.bind(r.store.proxies);
    let interleaved = false;
    const spy = vi.spyOn(r.store.proxies, 'patchStatus').mockImplementation(async (key, status, opts) => {
      if (!interleaved) {
        interleaved = true;
        // The reconciler writes between the engine's read and its patch.
        const fresh = await r.store.proxies.read(key);
        await real(
          key,
          {
            conditions: [
              {
                type: CONDITION_PROVISIONED,
                status: 'True',
                reason: 'Replaced',
                lastTransitionTime: '2026-01-01T00:00:01Z',
              },
            ],
            message: 'reconciler was here',
          },
          { resourceVersion: fresh.metadata.resourceVersion },
        );
      }
      return real(key, status, opts);
    });
    r.engine.start();
    await r.advance(1000);
    expect(spy.mock.calls.length).toBeGreaterThanOrEqual(2);
    const status = r.store.proxies.get({ namespace: NS, name: 'm' })?.status;
    expect(status?.message).toBe('reconciler was here');
    expect(status?.conditions?.find((c) => c.type === CONDITION_PROVISIONED)?.reason).toBe('Replaced');
    expect(status?.conditions?.find((c) => c.type === CONDITION_HEALTHY)?.status).toBe('True');
    expect(proxy.metadata.uid).toBeDefined();
  });

  it('drops a result for a Proxy deleted and recreated under the same name', async () => {
    const r = rig();
    const { port } = seedExternal(r.store, 'a');
    r.probe.hold = true;
    r.engine.start();
    await r.advance(1000);
    expect(r.probe.held).toHaveLength(1);
    await r.store.proxies.delete({ namespace: NS, name: 'a' });
    const again = r.store.seedProxy({
      metadata: { name: 'a', namespace: NS },
      spec: { type: 'External', endpoint: { host: '127.0.0.1', port } },
    });
    await settle();
    r.probe.release(FAIL());
    await settle();
    expect(r.verdicts).toEqual([]);
    expect(healthyCondition(r.store, 'a')).toBeUndefined();
    // The new object gets its own verdict from its own probe.
    r.probe.hold = false;
    r.probe.results.set(port, OK());
    await r.advance(1000);
    expect(r.verdicts).toEqual([expect.objectContaining({ uid: again.metadata.uid, healthy: true })]);
  });
});

describe('control probe', () => {
  it('freezes verdicts while the probe URL is down when fetched directly, and resumes after', async () => {
    const r = rig({ defaults: { failureThreshold: 2 } });
    const { port } = seedExternal(r.store, 'a');
    r.engine.start();
    await r.advance(2000);
    expect(r.verdicts.at(-1)).toMatchObject({ healthy: true });

    r.control.result = FAIL('Timeout');
    r.probe.results.set(port, FAIL('Timeout'));
    await r.advance(10_000);
    expect(r.verdicts).toHaveLength(1); // frozen: still healthy
    const text = await r.registry.metrics();
    expect(text).toContain(
      'proxy_operator_healthcheck_target_up{url="https://www.gstatic.com/generate_204"} 0',
    );
    expect(text).toMatch(/healthcheck_failures_total\{namespace="crawl",proxy="a",reason="TargetDown"\} \d+/);

    r.control.result = OK();
    await r.advance(3000);
    expect(r.verdicts.at(-1)).toMatchObject({ healthy: false, reason: 'Timeout' });
    expect(await r.registry.metrics()).toContain(
      'proxy_operator_healthcheck_target_up{url="https://www.gstatic.com/generate_204"} 1',
    );
  });

  it('does not freeze when the URL was never reachable directly (operator without egress)', async () => {
    const r = rig();
    const { port } = seedExternal(r.store, 'a');
    r.control.result = FAIL('ConnectFailed');
    r.probe.results.set(port, FAIL('Timeout'));
    r.engine.start();
    await r.advance(1000);
    expect(r.verdicts).toEqual([expect.objectContaining({ healthy: false, reason: 'Timeout' })]);
  });

  it('probes each distinct URL directly once per interval', async () => {
    const r = rig();
    seedExternal(r.store, 'a');
    seedExternal(r.store, 'b');
    seedExternal(r.store, 'c', { healthCheck: { url: 'https://example.test/ok', expectStatus: 200 } });
    r.engine.start();
    await r.advance(10_000);
    // two URLs × (1 at start + 10 intervals)
    expect(r.control.calls).toBeGreaterThanOrEqual(20);
    expect(r.control.calls).toBeLessThanOrEqual(22);
  });
});

describe('scheduling', () => {
  it('spreads proxies evenly over the interval with a stable offset and no drift', async () => {
    const r = rig({ concurrency: 1000 });
    const ports: number[] = [];
    for (let i = 0; i < 200; i++) ports.push(seedExternal(r.store, `p${i}`).port);
    r.engine.start();
    await r.advance(5000, 10);
    const buckets = new Array(10).fill(0);
    for (const c of r.probe.calls.filter((c) => c.at >= r.clock.now() - 1000)) {
      buckets[Math.floor((c.at % 1000) / 100)]++;
    }
    // 200 proxies over 10 buckets of 100 ms: about 20 each, never all at once.
    for (const b of buckets) {
      expect(b).toBeGreaterThan(5);
      expect(b).toBeLessThan(45);
    }
    for (const port of ports) {
      const times = r.probe.callsFor(port).map((c) => c.at);
      expect(times.length).toBeGreaterThanOrEqual(4);
      // Calls are recorded at 10 ms step granularity; drift would accumulate across intervals.
      for (let i = 1; i < times.length; i++)
        expect(Math.abs(times[i]! - times[i - 1]! - 1000)).toBeLessThanOrEqual(10);
      expect(Math.abs(times.at(-1)! - times[0]! - (times.length - 1) * 1000)).toBeLessThanOrEqual(10);
    }
  });

  it('honours per-proxy interval and check overrides', async () => {
    const r = rig();
    const { port } = seedExternal(r.store, 'slow', {
      healthCheck: { intervalSeconds: 3, url: 'http://example.test/x', expectStatus: 200 },
    });
    r.engine.start();
    await r.advance(9000);
    const calls = r.probe.callsFor(port);
    expect(calls).toHaveLength(3);
    expect(calls[0]?.check).toEqual({ url: 'http://example.test/x', expectStatus: 200, timeoutMs: 5000 });
  });

  it('never runs more probes at once than the concurrency cap, and catches up', async () => {
    const r = rig({ concurrency: 5 });
    for (let i = 0; i < 40; i++) seedExternal(r.store, `p${i}`);
    r.probe.hold = true;
    r.engine.start();
    await r.advance(1000, 10);
    expect(r.probe.inFlight).toBe(5);
    for (let i = 0; i < 20 && r.verdicts.length < 40; i++) {
      r.probe.release();
      await settle();
    }
    expect(r.probe.maxInFlight).toBe(5);
    expect(r.verdicts).toHaveLength(40);
  });

  it('requestProbe probes at once, out of schedule', async () => {
    const r = rig();
    const { port } = seedExternal(r.store, 'a');
    r.engine.start();
    await r.advance(1000);
    const before = r.probe.callsFor(port).length;
    r.probe.results.set(port, FAIL());
    r.engine.requestProbe(`${NS}/a`);
    await settle();
    expect(r.probe.callsFor(port).length).toBe(before + 1);
    expect(r.engine.verdict(`${NS}/a`)).toMatchObject({ healthy: true });
  });
});

describe('membership and metrics', () => {
  it('probes only proxies with an address and prunes deleted ones with their metric series', async () => {
    const r = rig();
    const { port } = seedExternal(r.store, 'ext');
    r.store.seedProxy({
      metadata: { name: 'pending', namespace: NS },
      spec: { provider: 'local' },
      status: { phase: 'Provisioning' },
    });
    r.engine.start();
    await r.advance(2000);
    expect(r.engine.stats().targets).toBe(1);
    expect(new Set(r.probe.calls.map((c) => c.target.port))).toEqual(new Set([port]));
    r.probe.results.set(port, FAIL());
    await r.advance(1000);
    let text = await r.registry.metrics();
    expect(text).toContain(
      'proxy_operator_healthcheck_duration_seconds_count{namespace="crawl",proxy="ext"}',
    );
    expect(text).toContain(
      'healthcheck_failures_total{namespace="crawl",proxy="ext",reason="ConnectFailed"} 1',
    );

    // The pending one becomes Ready: it is seeded into the schedule.
    await r.store.proxies.patchStatus(
      { namespace: NS, name: 'pending' },
      { phase: 'Ready', address: '127.0.0.1', port: 5999 },
    );
    await r.advance(1000);
    expect(r.probe.callsFor(5999)).toHaveLength(1);

    await r.store.proxies.delete({ namespace: NS, name: 'ext' });
    await settle();
    const n = r.probe.callsFor(port).length;
    await r.advance(3000);
    expect(r.probe.callsFor(port)).toHaveLength(n);
    text = await r.registry.metrics();
    expect(text).not.toContain('proxy="ext"');
    expect(r.engine.stats().targets).toBe(1);
  });

  it('keeps probing a proxy through a replacement and follows the switch to the new address', async () => {
    const r = rig();
    r.store.seedProxy({
      metadata: { name: 'm', namespace: NS },
      spec: { provider: 'local' },
      status: { phase: 'Ready', address: '127.0.0.1', port: 5901 },
    });
    r.engine.start();
    await r.advance(1000);
    const key = { namespace: NS, name: 'm' };
    await r.store.proxies.patchStatus(key, { phase: 'Replacing' });
    await settle();
    const before = r.probe.callsFor(5901).length;
    await r.advance(2000);
    // The old instance still serves leases, so its health must stay current.
    expect(r.probe.callsFor(5901).length).toBeGreaterThan(before);
    await r.store.proxies.patchStatus(key, { phase: 'Ready', address: '127.0.0.1', port: 5902 });
    await settle();
    await r.advance(2000);
    expect(r.probe.callsFor(5902).length).toBeGreaterThan(0);
  });

  it('probes with the proxy credentials from its Secret', async () => {
    const r = rig();
    r.store.seedSecret({
      metadata: { name: 'ext-auth', namespace: NS },
      stringData: { username: 'alice', password: 'pw-123' },
    });
    const { port } = seedExternal(r.store, 'ext', { credentialsSecretRef: { name: 'ext-auth' } });
    r.engine.start();
    await r.advance(1000);
    expect(r.probe.callsFor(port)[0]?.target.credentials).toEqual({ username: 'alice', password: 'pw-123' });
  });

  it('picks up rotated credentials when the Secret changes', async () => {
    const r = rig();
    const secret = (password: string) => ({
      metadata: { name: 'ext-auth', namespace: NS, labels: { [LABEL_CREDENTIALS_FOR]: 'ext' } },
      stringData: { username: 'alice', password },
    });
    r.store.seedSecret(secret('old-pw'));
    const { port } = seedExternal(r.store, 'ext', { credentialsSecretRef: { name: 'ext-auth' } });
    r.engine.start();
    await r.advance(1000);
    await r.store.secrets.delete({ namespace: NS, name: 'ext-auth' });
    r.store.seedSecret(secret('new-pw'));
    await settle();
    await r.advance(1000);
    expect(r.probe.callsFor(port).map((c) => c.target.credentials?.password)).toEqual(['old-pw', 'new-pw']);
  });

  it('emits a health.probe span per probe only when tracing is enabled', async () => {
    const names: string[] = [];
    const fakeTracer = {
      startSpan: (name: string) => {
        names.push(name);
        return { setAttribute() {}, setStatus() {}, end() {} };
      },
    };
    const off = rig();
    seedExternal(off.store, 'a');
    off.engine.start();
    await off.advance(2000);
    const on = rig({ traceProbes: true, tracer: fakeTracer as unknown as HealthEngineOptions['tracer'] });
    seedExternal(on.store, 'a');
    on.engine.start();
    await on.advance(2000);
    expect(names).toEqual(['health.probe', 'health.probe']);
  });

  it('rejects bad defaults with an error naming the field', () => {
    const store = createMemoryStore();
    expect(() => new HealthEngine({ store, defaults: { failureThreshold: 0 } })).toThrow(/failureThreshold/);
    expect(() => new HealthEngine({ store, defaults: { url: 'ftp://x/' } })).toThrow(/defaults\.url/);
    expect(() => new HealthEngine({ store, concurrency: 0 })).toThrow(/concurrency/);
  });
});

describe('resolveCheck', () => {
  const base = {
    url: 'https://t/',
    expectStatus: 204,
    intervalMs: 1000,
    failureThreshold: 3,
    successThreshold: 1,
  };
  const px = (hc?: ProxyObject['spec']['healthCheck']): ProxyObject => ({
    apiVersion: 'x',
    kind: 'Proxy',
    metadata: { name: 'a' },
    spec: hc ? { healthCheck: hc } : {},
  });
  it('defaults the timeout to min(5 s, interval × failureThreshold × 2/3)', () => {
    expect(resolveCheck(base, px()).timeoutMs).toBe(2000);
    expect(resolveCheck(base, px({ intervalSeconds: 10 })).timeoutMs).toBe(5000);
    expect(resolveCheck(base, px({ timeoutSeconds: 7, intervalSeconds: 10 })).timeoutMs).toBe(7000);
    expect(resolveCheck({ ...base, timeoutMs: 900 }, px()).timeoutMs).toBe(900);
  });
});
