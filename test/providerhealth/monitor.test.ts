import { Registry } from 'prom-client';
import { describe, expect, it, vi } from 'vitest';
import type { TargetCheck } from '../../src/api/providerhealth.ts';
import type { Checker } from '../../src/provider/contract.ts';
import { ProviderHealthMonitor, validateSchedule } from '../../src/providerhealth/monitor.ts';
import { createMemoryStore } from '../../src/runtime/memory.ts';
import { FakeClock } from '../support/clock.ts';
import { captureLog } from '../support/log.ts';

const capture = () => captureLog('debug');

class ScriptedChecker implements Checker {
  next: TargetCheck[] = [];
  calls = 0;
  async check(): Promise<TargetCheck[]> {
    this.calls++;
    return this.next;
  }
}

const signal = () => new AbortController().signal;

describe('provider health monitor', () => {
  it('writes one ProviderHealth per provider and reports transitions once', async () => {
    const store = createMemoryStore();
    const kvm = new ScriptedChecker();
    const { log, lines } = capture();
    const registry = new Registry();
    const monitor = new ProviderHealthMonitor({
      store,
      providers: [
        { name: 'kvm-home', type: 'kvm', checker: kvm },
        { name: 'gcp-main', type: 'gcp' },
      ],
      intervalMs: 60_000,
      timeoutMs: 5_000,
      log,
      registry,
    });

    kvm.next = [{ name: 'nas1', ready: false, reason: 'Unreachable', message: 'connection refused' }];
    await monitor.checkOnce(signal());
    await monitor.checkOnce(signal());
    const ph = await store.providerHealths.read({ name: 'kvm-home' });
    expect(ph.metadata.labels).toEqual({ 'app.kubernetes.io/managed-by': 'egress-proxies-operator' });
    expect(ph.status).toMatchObject({ type: 'kvm', targetsReady: '0/1' });
    expect(ph.status?.conditions?.[0]).toMatchObject({ status: 'False', reason: 'TargetsNotReady' });
    const gcp = await store.providerHealths.read({ name: 'gcp-main' });
    expect(gcp.status?.conditions?.[0]).toMatchObject({ status: 'Unknown', reason: 'ChecksNotImplemented' });

    const warnings = lines.filter((l) => l.msg === 'WARNING: provider target not ready');
    expect(warnings).toHaveLength(1);

    kvm.next = [{ name: 'nas1', ready: true, reason: 'Ready', latencyMillis: 40 }];
    await monitor.checkOnce(signal());
    expect(lines.filter((l) => l.msg === 'Provider target ready')).toHaveLength(1);
    const after = await store.providerHealths.read({ name: 'kvm-home' });
    expect(after.status?.conditions?.[0]).toMatchObject({ status: 'True', reason: 'AllTargetsReady' });

    const metrics = await registry.metrics();
    expect(metrics).toMatch(/proxy_operator_provider_target_up\{provider="kvm-home",target="nas1"\} 1/);
    expect(metrics).toMatch(
      /proxy_operator_provider_check_timestamp_seconds\{provider="kvm-home",target="nas1"\}/,
    );
  });

  it('removes objects of providers no longer configured, and all of them when checks are off', async () => {
    const store = createMemoryStore();
    const labels = { 'app.kubernetes.io/managed-by': 'egress-proxies-operator' };
    store.seedProviderHealth({ metadata: { name: 'retired', labels } });
    store.seedProviderHealth({ metadata: { name: 'kvm-home', labels } });
    store.seedProviderHealth({ metadata: { name: 'not-ours' } });
    const ctrl = new AbortController();
    const kvm = new ScriptedChecker();
    const on = new ProviderHealthMonitor({
      store,
      providers: [{ name: 'kvm-home', type: 'kvm', checker: kvm }],
      intervalMs: 60_000,
      timeoutMs: 5_000,
    });
    const running = on.start(ctrl.signal);
    await vi.waitFor(() => {
      const names = store.providerHealths
        .list()
        .map((o) => o.metadata.name)
        .sort();
      expect(names).toEqual(['kvm-home', 'not-ours']);
    });
    ctrl.abort();
    await running;

    const off = new ProviderHealthMonitor({
      store,
      providers: [{ name: 'kvm-home', type: 'kvm', checker: kvm }],
      intervalMs: 0,
      timeoutMs: 0,
    });
    const callsBefore = kvm.calls;
    await off.start(signal());
    expect(store.providerHealths.list().map((o) => o.metadata.name)).toEqual(['not-ours']);
    expect(kvm.calls).toBe(callsBefore);
  });

  it('bounds a round by the timeout and writes no object for an invalid name', async () => {
    const store = createMemoryStore();
    const clock = new FakeClock();
    const hanging: Checker = {
      check: ({ signal }) =>
        new Promise((resolve) =>
          signal.addEventListener('abort', () => resolve([{ name: 'h', ready: false, reason: 'Timeout' }])),
        ),
    };
    const monitor = new ProviderHealthMonitor({
      store,
      providers: [{ name: 'Bad_Name', type: 'kvm', checker: hanging }],
      intervalMs: 10_000,
      timeoutMs: 100,
      clock,
    });
    const round = monitor.checkOnce(signal());
    clock.advance(100); // the round's timeout runs on the injected clock
    const results = await round;
    expect(results[0]?.targets[0]?.reason).toBe('Timeout');
    expect(clock.pendingTimers()).toBe(0);
    expect(store.providerHealths.list()).toEqual([]);
  });

  it('as a runnable checks at once, then once per interval of the injected clock', async () => {
    const store = createMemoryStore();
    const clock = new FakeClock();
    const kvm = new ScriptedChecker();
    kvm.next = [{ name: 'nas1', ready: true, reason: 'Ready' }];
    const monitor = new ProviderHealthMonitor({
      store,
      providers: [{ name: 'kvm-home', type: 'kvm', checker: kvm }],
      intervalMs: 60_000,
      timeoutMs: 5_000,
      clock,
    });
    const ctrl = new AbortController();
    const running = monitor.start(ctrl.signal);
    await vi.waitFor(() => expect(kvm.calls).toBe(1));
    // The round is over (its timeout cancelled) once only the interval timer is left.
    await vi.waitFor(() => expect(clock.pendingTimers()).toBe(1));
    clock.advance(59_999);
    expect(kvm.calls).toBe(1);
    clock.advance(1);
    await vi.waitFor(() => expect(kvm.calls).toBe(2));
    ctrl.abort();
    await running;
  });

  it('a second monitor on the same registry does not throw, and the newest one is exported', async () => {
    const store = createMemoryStore();
    const registry = new Registry();
    const build = (checker: Checker) =>
      new ProviderHealthMonitor({
        store,
        providers: [{ name: 'kvm-home', type: 'kvm', checker }],
        intervalMs: 60_000,
        timeoutMs: 5_000,
        registry,
      });
    const old = new ScriptedChecker();
    old.next = [{ name: 'nas1', ready: true, reason: 'Ready' }];
    await build(old).checkOnce(signal());
    const fresh = new ScriptedChecker();
    fresh.next = [{ name: 'nas2', ready: false, reason: 'Unreachable' }];
    await build(fresh).checkOnce(signal());
    const metrics = await registry.metrics();
    expect(metrics).toMatch(/proxy_operator_provider_target_up\{provider="kvm-home",target="nas2"\} 0/);
    expect(metrics).not.toContain('target="nas1"');
  });

  it('validates the schedule flags', () => {
    expect(validateSchedule(0, 0)).toBeUndefined();
    expect(validateSchedule(5_000, 1_000)).toMatch(/at least 10s/);
    expect(validateSchedule(60_000, 90_000)).toMatch(/at most the interval/);
    expect(validateSchedule(60_000, 15_000)).toBeUndefined();
  });
});
