/**
 * Every component that registers metrics can be built twice on one registry (a runnable built
 * again, a second queue, a test): no "already registered" throw, event counts keep adding up
 * in one series, and scrape-time gauges read the newest instance.
 */
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { createProxyReconciler } from '../../../src/controller/reconciler.ts';
import { EgressIpChecker } from '../../../src/health/egress.ts';
import { HealthEngine } from '../../../src/health/engine.ts';
import { createHealthMetrics } from '../../../src/health/metrics.ts';
import { registerLeaseMetrics } from '../../../src/lease/metrics.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { providerMetrics } from '../../../src/provider/decorators.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { WorkQueue } from '../../../src/runtime/workqueue.ts';

const store = createMemoryStore();

const components: Array<[string, (registry: Registry) => unknown]> = [
  ['lease metrics', (registry) => registerLeaseMetrics(registry, new LeaseStore())],
  ['health metrics', (registry) => createHealthMetrics(registry)],
  ['health engine', (registry) => new HealthEngine({ store, registry })],
  ['egress-IP check', (registry) => new EgressIpChecker({ store, registry, url: 'http://ip.example/' })],
  ['provider metrics', (registry) => providerMetrics(registry)],
  ['work queue', (registry) => new WorkQueue({ name: 'q', registry })],
  [
    'reconciler',
    (registry) => createProxyReconciler({ store, providers: new Map(), registry, installation: 'twice' }),
  ],
];

describe('building a component twice on one registry', () => {
  it.each(components)('%s: does not throw and registers no second series', async (_name, build) => {
    const registry = new Registry();
    build(registry);
    const names = (await registry.getMetricsAsJSON()).map((m) => m.name).sort();
    expect(names.length).toBeGreaterThan(0);
    expect(() => build(registry)).not.toThrow();
    expect((await registry.getMetricsAsJSON()).map((m) => m.name).sort()).toEqual(names);
  });

  it('two work queues count into one series per queue name', async () => {
    const registry = new Registry();
    new WorkQueue({ name: 'q', registry }).add('a');
    new WorkQueue({ name: 'q', registry }).add('b');
    const text = await registry.getSingleMetricAsString('proxy_operator_workqueue_adds_total');
    expect(text).toContain('proxy_operator_workqueue_adds_total{name="q"} 2');
  });

  it('the active-leases gauge reads the newest lease store', async () => {
    const registry = new Registry();
    const first = new LeaseStore();
    const second = new LeaseStore();
    first.activeLeases = () => 1;
    second.activeLeases = () => 2;
    registerLeaseMetrics(registry, first);
    registerLeaseMetrics(registry, second);
    expect(await registry.getSingleMetricAsString('proxy_operator_leases_active')).toMatch(
      /^proxy_operator_leases_active 2$/m,
    );
  });
});
