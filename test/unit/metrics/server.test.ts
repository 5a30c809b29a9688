import { Counter, Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import {
  type AuthVerdict,
  createMetricsRegistry,
  type MetricsServer,
  registerProxyPhaseGauge,
  registerScrapeGauge,
  startMetricsServer,
} from '../../../src/metrics/index.ts';

const servers: MetricsServer[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

async function start(registry: Registry, authorize?: () => Promise<boolean | AuthVerdict>): Promise<string> {
  const s = await startMetricsServer({
    bindAddress: '127.0.0.1:0',
    registry,
    ...(authorize ? { authorize } : {}),
  });
  if (!s) throw new Error('server not started');
  servers.push(s);
  return `http://127.0.0.1:${s.port}`;
}

describe('metrics server', () => {
  it('serves the registry in Prometheus text format on GET /metrics', async () => {
    const registry = createMetricsRegistry();
    const c = new Counter({
      name: 'proxy_operator_test_total',
      help: 'test',
      labelNames: ['x'],
      registers: [registry],
    });
    c.inc({ x: 'a' }, 3);
    const base = await start(registry);
    const res = await fetch(`${base}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('text/plain');
    const body = await res.text();
    expect(body).toContain('proxy_operator_test_total{x="a"} 3');
    // Standard process metrics come with createMetricsRegistry.
    expect(body).toContain('process_cpu_seconds_total');
    expect(body).toContain('nodejs_heap_size_used_bytes');
  });

  it('answers 404 elsewhere and 405 for other methods', async () => {
    const base = await start(new Registry());
    expect((await fetch(`${base}/`)).status).toBe(404);
    expect((await fetch(`${base}/metricsx`)).status).toBe(404);
    const post = await fetch(`${base}/metrics`, { method: 'POST' });
    expect(post.status).toBe(405);
    expect(post.headers.get('allow')).toBe('GET');
  });

  it('is off for "0" and rejects a bad address naming the flag', async () => {
    expect(await startMetricsServer({ bindAddress: '0', registry: new Registry() })).toBeNull();
    await expect(startMetricsServer({ bindAddress: 'nope', registry: new Registry() })).rejects.toThrow(
      /^--metrics-bind-address: "nope"/,
    );
  });

  it('closes cleanly: the port stops answering', async () => {
    const s = (await startMetricsServer({ bindAddress: '127.0.0.1:0', registry: new Registry() }))!;
    const url = `http://127.0.0.1:${s.port}/metrics`;
    expect((await fetch(url)).status).toBe(200);
    await s.close();
    await s.close();
    await expect(fetch(url)).rejects.toThrow();
  });

  it('asks authorize on every scrape: 401 unauthenticated, 403 refused, 200 allowed', async () => {
    const registry = new Registry();
    let verdict: boolean | AuthVerdict = 'unauthenticated';
    const base = await start(registry, async () => verdict);
    const first = await fetch(`${base}/metrics`);
    expect(first.status).toBe(401);
    expect(first.headers.get('www-authenticate')).toMatch(/^Bearer/);
    verdict = false;
    expect((await fetch(`${base}/metrics`)).status).toBe(403);
    verdict = 'forbidden';
    expect((await fetch(`${base}/metrics`)).status).toBe(403);
    verdict = 'allowed';
    expect((await fetch(`${base}/metrics`)).status).toBe(200);
    verdict = true;
    expect((await fetch(`${base}/metrics`)).status).toBe(200);
  });

  it('answers 500 when a collector fails, and keeps serving', async () => {
    const registry = new Registry();
    let broken = true;
    registerScrapeGauge(registry, 'proxy_operator_flaky', 'flaky', [], () => {
      if (broken) throw new Error('cache not synced');
      return [[{}, 1]];
    });
    const base = await start(registry);
    expect((await fetch(`${base}/metrics`)).status).toBe(500);
    broken = false;
    expect(await (await fetch(`${base}/metrics`)).text()).toContain('proxy_operator_flaky 1');
  });
});

describe('registerScrapeGauge', () => {
  it('rebuilds its series from collect() at every scrape, dropping vanished ones', async () => {
    const registry = new Registry();
    let phases: Record<string, number> = { Ready: 3, Provisioning: 1 };
    let collects = 0;
    registerScrapeGauge(registry, 'proxy_operator_proxies', 'Proxies by phase.', ['phase'], () => {
      collects++;
      return Object.entries(phases).map(([phase, n]) => [{ phase }, n] as const);
    });
    registerScrapeGauge(registry, 'proxy_operator_leases_active', 'Active leases.', [], async () => [
      [{}, 7],
    ]);
    const base = await start(registry);

    let body = await (await fetch(`${base}/metrics`)).text();
    expect(body).toContain('proxy_operator_proxies{phase="Ready"} 3');
    expect(body).toContain('proxy_operator_proxies{phase="Provisioning"} 1');
    expect(body).toContain('proxy_operator_leases_active 7');

    phases = { Ready: 4 };
    body = await (await fetch(`${base}/metrics`)).text();
    expect(body).toContain('proxy_operator_proxies{phase="Ready"} 4');
    expect(body).not.toContain('Provisioning');
    expect(collects).toBe(2);
  });
});

describe('registerProxyPhaseGauge', () => {
  it('counts Proxies per phase from the cache at scrape time, every phase always present', async () => {
    const registry = new Registry();
    const proxy = (name: string, phase?: string): ProxyObject =>
      ({
        apiVersion: 'crawl.example.com/v1alpha1',
        kind: 'Proxy',
        metadata: { name, namespace: 'crawl' },
        spec: {},
        ...(phase ? { status: { phase } } : {}),
      }) as unknown as ProxyObject;
    let cache = [proxy('a', 'Ready'), proxy('b', 'Ready'), proxy('c', 'Failed'), proxy('new')];
    registerProxyPhaseGauge(registry, { list: () => cache });
    const base = await start(registry);

    let body = await (await fetch(`${base}/metrics`)).text();
    expect(body).toContain('proxy_operator_proxies{phase="Ready"} 2');
    expect(body).toContain('proxy_operator_proxies{phase="Failed"} 1');
    expect(body).toContain('proxy_operator_proxies{phase="Pending"} 1');
    expect(body).toContain('proxy_operator_proxies{phase="Deleting"} 0');

    cache = [proxy('a', 'Deleting')];
    body = await (await fetch(`${base}/metrics`)).text();
    expect(body).toContain('proxy_operator_proxies{phase="Ready"} 0');
    expect(body).toContain('proxy_operator_proxies{phase="Deleting"} 1');
  });
});
