/**
 * metrics/register: building a component twice on one registry never throws "already
 * registered"; event metrics keep one series, scrape-time gauges follow the newest instance.
 */
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { registerProxyPhaseGauge } from '../../../src/metrics/fleet.ts';
import { collectedGauge, counter, counterCells, gauge, histogram } from '../../../src/metrics/register.ts';

describe('metrics registration', () => {
  it('a second counter, histogram or gauge of the same name is the first one', async () => {
    const registry = new Registry();
    const cfg = { name: 'x_total', help: 'x', labelNames: ['a'] as const };
    const c1 = counter(registry, cfg);
    const c2 = counter(registry, cfg);
    expect(c2).toBe(c1);
    c1.inc({ a: '1' });
    c2.inc({ a: '1' });
    expect(await registry.getSingleMetricAsString('x_total')).toContain('x_total{a="1"} 2');
    const h = { name: 'h_seconds', help: 'h', buckets: [1] };
    expect(histogram(registry, h)).toBe(histogram(registry, h));
    expect(gauge(registry, { name: 'g', help: 'g' })).toBe(gauge(registry, { name: 'g', help: 'g' }));
  });

  it('counter cells reach the scrape, added to direct increments, from every caller', async () => {
    const registry = new Registry();
    const cfg = { name: 'req_total', help: 'r', labelNames: ['route', 'code'] as const };
    const c = counter(registry, cfg);
    const first = counterCells(c, ['route', 'code']);
    // A second component built on the same registry counts into the same series.
    const second = counterCells(counter(registry, cfg), ['route', 'code']);
    const ok = first('/v1/leases', '201');
    const refused = first('/v1/leases', '409');
    const okElsewhere = second('/v1/leases', '201');
    for (let i = 0; i < 3; i++) ok.inc();
    refused.inc();
    okElsewhere.inc();
    c.inc({ route: '/v1/leases', code: '201' });
    const text = await registry.getSingleMetricAsString('req_total');
    expect(text).toContain('req_total{route="/v1/leases",code="201"} 5');
    expect(text).toContain('req_total{route="/v1/leases",code="409"} 1');
    // Handed over once: the next scrape adds only what came since.
    ok.inc();
    const again = await registry.getSingleMetricAsString('req_total');
    expect(again).toContain('req_total{route="/v1/leases",code="201"} 6');
    expect(again).toContain('req_total{route="/v1/leases",code="409"} 1');
  });

  it('refuses the same name with another type or other labels', () => {
    const registry = new Registry();
    counter(registry, { name: 'x_total', help: 'x', labelNames: ['a'] });
    expect(() => gauge(registry, { name: 'x_total', help: 'x', labelNames: ['a'] })).toThrow(
      /different type/,
    );
    expect(() => counter(registry, { name: 'x_total', help: 'x', labelNames: ['b'] })).toThrow(
      /labels \[a\]/,
    );
  });

  it('a scrape-time gauge registered again reads the newest source', async () => {
    const registry = new Registry();
    collectedGauge(registry, {
      name: 'live',
      help: 'l',
      collect() {
        this.set(1);
      },
    });
    collectedGauge(registry, {
      name: 'live',
      help: 'l',
      collect() {
        this.set(2);
      },
    });
    expect(await registry.getSingleMetricAsString('live')).toMatch(/^live 2$/m);
  });

  it('the Proxy phase gauge can be registered twice (the second store is counted)', async () => {
    const registry = new Registry();
    const proxy = (phase: string) => ({ status: { phase } }) as unknown as ProxyObject;
    registerProxyPhaseGauge(registry, { list: () => [proxy('Ready')] });
    registerProxyPhaseGauge(registry, { list: () => [proxy('Failed'), proxy('Failed')] });
    const text = await registry.getSingleMetricAsString('proxy_operator_proxies');
    expect(text).toContain('proxy_operator_proxies{phase="Failed"} 2');
    expect(text).toContain('proxy_operator_proxies{phase="Ready"} 0');
  });
});
