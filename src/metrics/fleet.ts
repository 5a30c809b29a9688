/**
 * metrics/fleet — `proxy_operator_proxies{phase}` and `proxy_operator_proxies_healthy`, counted
 * from the Proxy cache at every scrape so they can neither drift nor keep series for deleted
 * objects (see docs/operations.md).
 */
import type { Gauge, Registry } from 'prom-client';
import { isConditionTrue } from '../api/conditions.ts';
import { PROXY_PHASES, type ProxyObject } from '../api/proxy.ts';
import { registerScrapeGauge, type ScrapeSample } from './scrape.ts';

export const PROXIES_METRIC = 'proxy_operator_proxies';
export const HEALTHY_PROXIES_METRIC = 'proxy_operator_proxies_healthy';

/**
 * Registers the per-phase Proxy gauge over `proxies.list()` (the store's synchronous cache
 * read). Every phase is always exported, 0 included, so ratios in alerts never divide by a
 * missing series; a Proxy not yet given a phase counts as Pending.
 */
export function registerProxyPhaseGauge(
  registry: Registry,
  proxies: { list(): readonly ProxyObject[] },
): Gauge<'phase'> {
  return registerScrapeGauge(registry, PROXIES_METRIC, 'Proxies by status.phase.', ['phase'], () => {
    const counts = new Map<string, number>(PROXY_PHASES.map((p) => [p, 0]));
    for (const p of proxies.list()) {
      const phase = p.status?.phase ?? 'Pending';
      counts.set(phase, (counts.get(phase) ?? 0) + 1);
    }
    return [...counts].map(([phase, n]): ScrapeSample<'phase'> => [{ phase }, n]);
  });
}

/**
 * Registers the count of Proxies whose `Healthy` condition is True (the health engine writes it
 * on every verdict change), so a dashboard can set healthy against Ready.
 */
export function registerHealthyProxiesGauge(
  registry: Registry,
  proxies: { list(): readonly ProxyObject[] },
): Gauge<never> {
  return registerScrapeGauge(
    registry,
    HEALTHY_PROXIES_METRIC,
    'Proxies whose Healthy condition is True.',
    [],
    () => {
      let healthy = 0;
      for (const p of proxies.list()) if (isConditionTrue(p.status?.conditions, 'Healthy')) healthy++;
      return [[{}, healthy]];
    },
  );
}
