import { Registry } from 'prom-client';
import { describe, expect, it, vi } from 'vitest';
import type { TargetCheck } from '../../../src/api/providerhealth.ts';
import type { Checker } from '../../../src/provider/contract.ts';
import { ProviderHealthMonitor, validateSchedule } from '../../../src/providerhealth/monitor.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { FakeClock } from '../../support/clock.ts';
import { captureLog } from '../../support/log.ts';
import { until } from '../../support/wait.ts';

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

  it('warns again when a failing target changes reason, and logs its first ready verdict at debug only', async () => {
    const store = createMemoryStore();
    const kvm = new ScriptedChecker();
    const { log, lines } = capture();
    const monitor = new ProviderHealthMonitor({
      store,
      providers: [{ name: 'kvm-home', type: 'kvm', checker: kvm }],
      intervalMs: 60_000,
      timeoutMs: 5_000,
      log,
    });
    kvm.next = [
      { name: 'nas1', ready: false, reason: 'Unreachable' },
      { name: 'nas2', ready: true, reason: 'Reachable', latencyMillis: 12 },
    ];
    await monitor.checkOnce(signal());
    const firstReady = lines.filter((l) => l.msg === 'Provider target ready');
    expect(firstReady).toEqual([expect.objectContaining({ level: 20, target: 'nas2' })]);

    kvm.next = [
      { name: 'nas1', ready: false, reason: 'SSHHandshakeFailed' },
      { name: 'nas2', ready: true, reason: 'Reachable' },
    ];
    await monitor.checkOnce(signal());
    await monitor.checkOnce(signal());
    const warnings = lines.filter((l) => l.msg === 'WARNING: provider target not ready');
    expect(warnings.map((w) => [w.level, w.target, w.reason])).toEqual([
      [40, 'nas1', 'Unreachable'],
      [40, 'nas1', 'SSHHandshakeFailed'],
    ]);
    // A target that stays ready is not logged again.
    expect(lines.filter((l) => l.msg === 'Provider target ready')).toHaveLength(1);
  });

  it('publishes a fast provider within the round in which another one hangs', async () => {
    const store = createMemoryStore();
    const clock = new FakeClock();
    const fast = new ScriptedChecker();
    fast.next = [{ name: 'apiserver', ready: true, reason: 'Reachable' }];
    // Hangs until the round's deadline, then answers as the real checkers do.
    const hung: Checker = {
      check: ({ signal }) =>
        new Promise<TargetCheck[]>((resolve) =>
          signal.addEventListener('abort', () =>
            resolve([{ name: 'nas1', ready: false, reason: 'Timeout' }]),
          ),
        ),
    };
    const monitor = new ProviderHealthMonitor({
      store,
      providers: [
        { name: 'kubernetes', type: 'kubernetes', checker: fast },
        { name: 'kvm-home', type: 'kvm', checker: hung },
      ],
      intervalMs: 60_000,
      timeoutMs: 5_000,
      clock,
    });
    const started = clock.now();
    const round = monitor.checkOnce(signal());
    await vi.waitFor(() => expect(fast.calls).toBe(1));
    clock.advance(5_000);
    const results = await until('the round to end at its timeout', () =>
      Promise.race([round, Promise.resolve(undefined)]),
    );
    expect(results.map((r) => r.provider)).toEqual(['kubernetes', 'kvm-home']);
    const k8s = await store.providerHealths.read({ name: 'kubernetes' });
    expect(k8s.status?.conditions?.[0]).toMatchObject({ status: 'True', reason: 'AllTargetsReady' });
    // Its own check time, not the end of the round the hung provider held open.
    expect(k8s.status?.lastCheckTime).toBe(new Date(started).toISOString());
    const kvm = await store.providerHealths.read({ name: 'kvm-home' });
    expect(kvm.status?.targets?.[0]).toMatchObject({ ready: false, reason: 'Timeout' });
  });

  it('exports no series before the first check, then the duration of each target', async () => {
    const store = createMemoryStore();
    const clock = new FakeClock();
    const registry = new Registry();
    let release!: () => void;
    const slow: Checker = {
      check: () =>
        new Promise<TargetCheck[]>((resolve) => {
          release = () => resolve([{ name: 'project', ready: true, reason: 'Reachable' }]);
        }),
    };
    const kvm = new ScriptedChecker();
    kvm.next = [{ name: 'nas1', ready: false, reason: 'Unreachable', latencyMillis: 1_250 }];
    const monitor = new ProviderHealthMonitor({
      store,
      providers: [
        { name: 'kvm-home', type: 'kvm', checker: kvm },
        { name: 'gcp-main', type: 'gcp', checker: slow },
      ],
      intervalMs: 60_000,
      timeoutMs: 10_000,
      clock,
      registry,
    });
    const before = await registry.metrics();
    expect(before).not.toMatch(
      /^proxy_operator_provider_(target_up|check_duration_seconds|check_timestamp_seconds)\{/m,
    );

    const round = monitor.checkOnce(signal());
    await until('the slow checker to be called', () => release !== undefined);
    clock.advance(2_500);
    release();
    await round;
    const after = await registry.metrics();
    // A target's own latency when it reports one, else its provider's share of the round.
    expect(after).toMatch(
      /^proxy_operator_provider_check_duration_seconds\{provider="kvm-home",target="nas1"\} 1\.25$/m,
    );
    expect(after).toMatch(
      /^proxy_operator_provider_check_duration_seconds\{provider="gcp-main",target="project"\} 2\.5$/m,
    );
    expect(after).toMatch(/^proxy_operator_provider_target_up\{provider="kvm-home",target="nas1"\} 0$/m);
  });

  it('skips the status write when nothing changed, and retries a failed write next round', async () => {
    const store = createMemoryStore();
    const clock = new FakeClock();
    const kvm = new ScriptedChecker();
    kvm.next = [{ name: 'nas1', ready: true, reason: 'Reachable' }];
    const { log, lines } = capture();
    const patches: string[] = [];
    let failNext = false;
    const client = store.providerHealths;
    const patchStatus = client.patchStatus.bind(client);
    client.patchStatus = async (key, status, opts) => {
      patches.push(key.name);
      if (failNext) {
        failNext = false;
        throw new Error('etcd leader changed');
      }
      return patchStatus(key, status, opts);
    };
    const monitor = new ProviderHealthMonitor({
      store,
      providers: [{ name: 'kvm-home', type: 'kvm', checker: kvm }],
      intervalMs: 60_000,
      timeoutMs: 5_000,
      clock,
      log,
    });
    await monitor.checkOnce(signal());
    expect(patches).toHaveLength(1);
    // Same verdict, same clock: the status would not change, so it is not written.
    await monitor.checkOnce(signal());
    expect(patches).toHaveLength(1);

    kvm.next = [{ name: 'nas1', ready: false, reason: 'Unreachable' }];
    failNext = true;
    await monitor.checkOnce(signal());
    expect(patches).toHaveLength(2);
    expect(lines.filter((l) => l.msg === 'writing provider health failed')).toHaveLength(1);
    expect((await client.read({ name: 'kvm-home' })).status?.targets?.[0]?.ready).toBe(true);

    await monitor.checkOnce(signal());
    expect(patches).toHaveLength(3);
    expect((await client.read({ name: 'kvm-home' })).status?.targets?.[0]).toMatchObject({
      ready: false,
      reason: 'Unreachable',
    });
  });

  it('warns at start about a provider name that cannot be an object name', async () => {
    const store = createMemoryStore();
    const clock = new FakeClock();
    const kvm = new ScriptedChecker();
    kvm.next = [{ name: 'nas1', ready: true, reason: 'Reachable' }];
    const { log, lines } = capture();
    const monitor = new ProviderHealthMonitor({
      store,
      providers: [
        { name: 'KVM_Home', type: 'kvm', checker: kvm },
        { name: 'gcp-main', type: 'gcp' },
      ],
      intervalMs: 60_000,
      timeoutMs: 5_000,
      clock,
      log,
    });
    const ctrl = new AbortController();
    const running = monitor.start(ctrl.signal);
    await vi.waitFor(() => expect(kvm.calls).toBe(1));
    ctrl.abort();
    await running;
    const warnings = lines.filter((l) => l.level === 40 && String(l.msg).includes('not a valid object name'));
    expect(warnings.map((w) => w.provider)).toEqual(['KVM_Home']);
  });

  it('validates the schedule flags', () => {
    expect(validateSchedule(0, 0)).toBeUndefined();
    expect(validateSchedule(5_000, 1_000)).toMatch(/at least 10s/);
    expect(validateSchedule(60_000, 90_000)).toMatch(/at most the interval/);
    expect(validateSchedule(60_000, 15_000)).toBeUndefined();
  });
});
