/**
 * metrics/fleet — `proxy_operator_proxies{phase}`, counted from the Proxy cache at every scrape
 * so it can neither drift nor keep series for deleted objects (see docs/operations.md).
 */
import type { Gauge, Registry } from 'prom-client';
import { PROXY_PHASES, type ProxyObject } from '../api/proxy.ts';
import { registerScrapeGauge, type ScrapeSample } from './scrape.ts';

export const PROXIES_METRIC = 'proxy_operator_proxies';

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
