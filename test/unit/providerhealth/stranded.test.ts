/**
 * A provider renamed or removed from the config while Proxies still name it: each Proxy shows
 * the problem in the lease API, the missing provider gets a not-ready ProviderHealth (removed
 * once no Proxy names it), start-up warns naming it and how many Proxies use it, and /readyz
 * notes it — failing only once the whole fleet is stranded.
 */
import { describe, expect, it } from 'vitest';
import { CONDITION_PROVISIONED, CONDITION_READY, PROVISIONED_REASONS } from '../../../src/api/constants.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { proxyInfo } from '../../../src/lease/feed.ts';
import { ProviderHealthMonitor } from '../../../src/providerhealth/monitor.ts';
import { strandedProviders, strandedReadiness } from '../../../src/providerhealth/stranded.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { captureLog } from '../../support/log.ts';

const managed = (name: string, provider: string): ProxyObject =>
  ({
    apiVersion: 'crawl.example.com/v1alpha1',
    kind: 'Proxy',
    metadata: { name, namespace: 'default', uid: `uid-${name}` },
    spec: { provider },
  }) as ProxyObject;

const external = (name: string): ProxyObject =>
  ({
    apiVersion: 'crawl.example.com/v1alpha1',
    kind: 'Proxy',
    metadata: { name, namespace: 'default', uid: `uid-${name}` },
    spec: { type: 'External', endpoint: { host: '203.0.113.7', port: 8080 } },
  }) as ProxyObject;

const signal = () => new AbortController().signal;

describe('a provider missing from the config', () => {
  it("is the problem each of its Proxies reports in the lease API, as the reconciler's condition says", () => {
    const p = managed('eu-1', 'gcp-old');
    p.status = {
      phase: 'Failed',
      conditions: [
        {
          type: CONDITION_PROVISIONED,
          status: 'False',
          reason: PROVISIONED_REASONS.providerNotConfigured,
          message: 'provider "gcp-old" is not configured',
          lastTransitionTime: '2026-01-01T00:00:00Z',
        },
      ],
    } as ProxyObject['status'];
    expect(proxyInfo(p, undefined).problem).toEqual({
      reason: 'ProviderNotConfigured',
      message: 'provider "gcp-old" is not configured',
    });
  });

  it('groups the Managed Proxies by the missing provider they name', () => {
    const proxies = [
      managed('b', 'gcp-old'),
      managed('a', 'gcp-old'),
      managed('c', 'local'),
      managed('d', 'kvm-gone'),
      external('e'),
    ];
    expect(strandedProviders(proxies, new Set(['local']))).toEqual([
      { provider: 'gcp-old', proxies: ['default/a', 'default/b'] },
      { provider: 'kvm-gone', proxies: ['default/d'] },
    ]);
    expect(strandedProviders(proxies, new Set(['local', 'gcp-old', 'kvm-gone']))).toEqual([]);
  });

  it('is a readiness note while other Proxies serve, and a failure once every Proxy is stranded', () => {
    const configured = new Set(['local']);
    expect(strandedReadiness([managed('a', 'local'), external('e')], configured)).toBeUndefined();
    expect(strandedReadiness([managed('a', 'local'), managed('b', 'gcp-old')], configured)).toBe(
      '1 Proxy(s) use unconfigured provider "gcp-old"',
    );
    expect(() => strandedReadiness([managed('a', 'gcp-old'), managed('b', 'gcp-old')], configured)).toThrow(
      'every Proxy is stranded: 2 Proxy(s) use unconfigured provider "gcp-old"',
    );
  });

  it('is warned about at start and gets a not-ready ProviderHealth until no Proxy names it', async () => {
    const store = createMemoryStore();
    for (const n of ['eu-1', 'eu-2', 'eu-3']) store.seedProxy(managed(n, 'gcp-old'));
    store.seedProxy(managed('home-1', 'local'));
    const { log, lines } = captureLog();
    const monitor = new ProviderHealthMonitor({
      store,
      providers: [{ name: 'local', type: 'local' }],
      intervalMs: 60_000,
      timeoutMs: 5_000,
      log,
    });
    const ctrl = new AbortController();
    const running = monitor.start(ctrl.signal);
    const warning = lines.find((l) => l.level === 40);
    expect(warning).toMatchObject({ provider: 'gcp-old', proxies: 3 });
    expect(warning?.msg).toContain('provider "gcp-old" is not in the providers config but 3 Proxy(s) use it');

    await monitor.checkOnce(signal());
    const health = await store.providerHealths.read({ name: 'gcp-old' });
    const ready = health.status?.conditions?.find((c) => c.type === CONDITION_READY);
    expect(ready).toMatchObject({ status: 'False', reason: 'ProviderNotConfigured' });
    expect(ready?.message).toContain('(default/eu-1, default/eu-2, default/eu-3)');

    // The Proxies move to a configured provider (or go): the object goes with them.
    for (const n of ['eu-1', 'eu-2', 'eu-3']) await store.proxies.delete({ namespace: 'default', name: n });
    await monitor.checkOnce(signal());
    expect(store.providerHealths.list().map((o) => o.metadata.name)).toEqual(['local']);
    ctrl.abort();
    await running;
  });

  it('is still warned about at start when provider checks are off', async () => {
    const store = createMemoryStore();
    store.seedProxy(managed('eu-1', 'gcp-old'));
    const { log, lines } = captureLog();
    await new ProviderHealthMonitor({ store, providers: [], intervalMs: 0, timeoutMs: 0, log }).start(
      signal(),
    );
    expect(lines.some((l) => l.level === 40 && String(l.msg).includes('"gcp-old"'))).toBe(true);
    expect(store.providerHealths.list()).toEqual([]);
  });
});
